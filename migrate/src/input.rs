//! Reading the input: YAML or JSON files (several documents separated by `---`), directories
//! of them, stdin (`-`), or objects read from the cluster, sorted into v0 Configurations and
//! workloads. Anything else is an error naming its file and document.

use crate::report::{Kind, Origin, Report};
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};

/// One object of the input.
#[derive(Clone, Debug)]
pub struct Document {
    pub origin: Origin,
    pub value: Value,
}

impl Document {
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// Its namespace; `default_namespace` when the document does not say (as kubectl does).
    pub fn namespace<'a>(&'a self, default_namespace: &'a str) -> &'a str {
        self.value["metadata"]["namespace"]
            .as_str()
            .unwrap_or(default_namespace)
    }
}

/// The objects of the input, by what the migration does with them.
#[derive(Debug, Default)]
pub struct Input {
    /// `akri.sh/v0` Configurations.
    pub configurations: Vec<Document>,
    /// Objects with a pod spec (Pods, Deployments, Jobs, ...).
    pub workloads: Vec<Document>,
    /// Whether some workloads came from files (and could be rewritten there).
    pub files: Vec<PathBuf>,
}

/// Reads `paths` (files, directories, `-`) into `input`; what cannot be read is an error in
/// `report`. A directory is read in name order, recursively, for `.yaml`, `.yml` and `.json`.
pub fn read_paths(paths: &[PathBuf], input: &mut Input, report: &mut Report) {
    for path in paths {
        if path == Path::new("-") {
            let mut text = String::new();
            match std::io::stdin().read_to_string(&mut text) {
                Ok(_) => read_text("-", &text, input, report),
                Err(e) => report.add(&origin("-", 0), "", "", Kind::Error, e.to_string()),
            }
        } else if path.is_dir() {
            match files_under(path) {
                Ok(files) => {
                    for file in files {
                        read_file(&file, input, report);
                    }
                }
                Err(e) => report.add(
                    &origin(&path.display().to_string(), 0),
                    "",
                    "",
                    Kind::Error,
                    format!("cannot read the directory: {e}"),
                ),
            }
        } else {
            read_file(path, input, report);
        }
    }
}

fn origin(file: &str, document: usize) -> Origin {
    Origin {
        file: file.to_string(),
        document,
        item: None,
    }
}

fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            found.extend(files_under(&entry)?);
        } else if matches!(
            entry.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            found.push(entry);
        }
    }
    Ok(found)
}

fn read_file(path: &Path, input: &mut Input, report: &mut Report) {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let workloads = input.workloads.len();
            read_text(&file, &text, input, report);
            if input.workloads.len() > workloads {
                input.files.push(path.to_path_buf());
            }
        }
        Err(e) => report.add(
            &origin(&file, 0),
            "",
            "",
            Kind::Error,
            format!("cannot read: {e}"),
        ),
    }
}

/// The documents of a YAML stream (JSON is YAML), empty ones left out; a document that is
/// not YAML stops the file there (the parser cannot find the next one reliably).
pub fn documents(file: &str, text: &str, report: &mut Report) -> Vec<Document> {
    let mut found = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let at = origin(file, index);
        let yaml: Result<serde_yaml::Value, _> = serde::Deserialize::deserialize(document);
        let yaml = match yaml {
            Ok(yaml) => yaml,
            Err(e) => {
                report.add(&at, "", "", Kind::Error, format!("not YAML: {e}"));
                break;
            }
        };
        if yaml.is_null() {
            continue;
        }
        match serde_json::to_value(&yaml) {
            Ok(value) => found.push(Document { origin: at, value }),
            Err(e) => report.add(
                &at,
                "",
                "",
                Kind::Error,
                format!("not a Kubernetes object (its keys must be strings): {e}"),
            ),
        }
    }
    found
}

fn read_text(file: &str, text: &str, input: &mut Input, report: &mut Report) {
    for document in documents(file, text, report) {
        sort(document, input, report);
    }
}

/// Puts one document where it belongs: a `kind: List` (what `kubectl get -o yaml` writes) is
/// its items.
pub fn sort(document: Document, input: &mut Input, report: &mut Report) {
    let at = &document.origin;
    let Some(object) = document.value.as_object() else {
        report.add(
            at,
            "",
            "",
            Kind::Error,
            "not an object: expected a Kubernetes object with apiVersion and kind",
        );
        return;
    };
    let (Some(api_version), Some(kind)) = (
        object.get("apiVersion").and_then(Value::as_str),
        object.get("kind").and_then(Value::as_str),
    ) else {
        report.add(
            at,
            "",
            "",
            Kind::Error,
            "apiVersion and kind are missing: expected a Kubernetes object",
        );
        return;
    };
    let name = document.name().to_string();
    match (api_version, kind) {
        (_, "List") if document.origin.item.is_none() => {
            let items = object.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            for (item, value) in items.into_iter().enumerate() {
                let origin = Origin { item: Some(item), ..document.origin.clone() };
                sort(Document { origin, value }, input, report);
            }
        }
        ("akri.sh/v0", "Configuration") => input.configurations.push(document),
        ("akri.sh/v0", "Instance") => report.add(
            at,
            &name,
            "",
            Kind::Note,
            "an Instance is not migrated: the node agents discover the device again and write its Instance",
        ),
        ("akri.sh/v1", _) => report.add(
            at,
            &name,
            "apiVersion",
            Kind::Error,
            format!("{kind} is already akri.sh/v1: akri-migrate reads akri.sh/v0 Configurations"),
        ),
        ("akri.sh/v0", kind) => report.add(
            at,
            &name,
            "kind",
            Kind::Error,
            format!("akri.sh/v0 has no kind {kind}: akri-migrate reads Configurations (and skips Instances)"),
        ),
        (version, _) if version.starts_with("akri.sh/") => report.add(
            at,
            &name,
            "apiVersion",
            Kind::Error,
            format!("unknown apiVersion {version}: akri-migrate reads akri.sh/v0 Configurations"),
        ),
        (_, kind) if akri_api::workload::pod_spec_path(kind).is_some() => {
            input.workloads.push(document)
        }
        // Services, ConfigMaps, claim templates (ours included) live beside workloads.
        (version, kind) => report.add(
            at,
            &name,
            "",
            Kind::Note,
            format!("{kind} ({version}) left alone: neither an akri.sh/v0 Configuration nor a workload"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> (Input, Report) {
        let mut input = Input::default();
        let mut report = Report::default();
        read_text("in.yaml", text, &mut input, &mut report);
        (input, report)
    }

    #[test]
    fn documents_are_sorted_by_kind_and_keep_their_index() {
        let (input, report) = read(
            "apiVersion: akri.sh/v0\nkind: Configuration\nmetadata: {name: a}\n---\n---\n\
             apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n---\n\
             apiVersion: v1\nkind: List\nitems:\n- {apiVersion: akri.sh/v0, kind: Configuration, metadata: {name: b}}\n",
        );
        assert!(report.findings.is_empty(), "{report:?}");
        let names: Vec<_> = input
            .configurations
            .iter()
            .map(|d| (d.name(), d.origin.to_string()))
            .collect();
        assert_eq!(
            names,
            [
                ("a", "in.yaml, document 0".to_string()),
                ("b", "in.yaml, document 3, items[0]".to_string())
            ]
        );
        assert_eq!(input.workloads[0].origin.document, 2);
    }

    #[test]
    fn bad_input_is_an_error_naming_the_document_and_other_kinds_are_left_alone() {
        let (_, mut report) = read(
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n---\n\
             apiVersion: akri.sh/v2\nkind: Configuration\n---\nkey: [unclosed\n",
        );
        report.sort();
        let errors: Vec<String> = report.findings.iter().map(|f| f.to_string()).collect();
        assert_eq!(errors.len(), 3, "{errors:#?}");
        assert!(
            errors[0].starts_with("note: in.yaml, document 0 (s): Service (v1) left alone"),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].contains("document 1") && errors[1].contains("unknown apiVersion akri.sh/v2"),
            "{}",
            errors[1]
        );
        assert!(
            errors[2].contains("document 2") && errors[2].contains("not YAML"),
            "{}",
            errors[2]
        );
    }
}
