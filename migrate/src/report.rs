//! What a migration found: errors (nothing is written), lossy fields (nothing is written
//! unless `--allow-lossy`), renames, workloads to move, and notes. Each finding names the
//! file, the document index, the object and the field, for stderr and for `--report`.

use serde::Serialize;
use std::fmt;

/// Where a document came from: a file (`-` for stdin, `cluster` for the live cluster), the
/// index of the document in it (from 0), and the item of a `kind: List` document.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Origin {
    pub file: String,
    pub document: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, document {}", self.file, self.document)?;
        if let Some(item) = self.item {
            write!(f, ", items[{item}]")?;
        }
        Ok(())
    }
}

/// How much a finding matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    /// The input cannot be migrated as it is: nothing is written.
    Error,
    /// A v0 field with no v1 equivalent, dropped: nothing is written unless `--allow-lossy`.
    Lossy,
    /// A Configuration whose DiscoveryConfiguration has another name.
    Renamed,
    /// A workload that requests Akri's extended resources, and what replaces the request.
    Workload,
    /// Kept in another form, or left alone on purpose.
    Note,
}

/// One thing the migration has to say about one field of one document.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Finding {
    #[serde(flatten)]
    pub origin: Origin,
    /// `<namespace>/<name>` of the object (`<kind> <namespace>/<name>` for workloads).
    pub object: String,
    /// The field path, e.g. `spec.brokerProperties.RESOLUTION`; empty for the whole object.
    pub field: String,
    pub kind: Kind,
    pub reason: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Error => "error",
            Kind::Lossy => "lossy",
            Kind::Renamed => "renamed",
            Kind::Workload => "workload",
            Kind::Note => "note",
        };
        write!(f, "{kind}: {}", self.origin)?;
        if !self.object.is_empty() {
            write!(f, " ({})", self.object)?;
        }
        if !self.field.is_empty() {
            write!(f, ", field {}", self.field)?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// The findings of one run, in the order of their documents.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    /// Adds a finding about `field` of the object `object` from `origin`.
    pub fn add(
        &mut self,
        origin: &Origin,
        object: &str,
        field: impl Into<String>,
        kind: Kind,
        reason: impl Into<String>,
    ) {
        self.findings.push(Finding {
            origin: origin.clone(),
            object: object.to_string(),
            field: field.into(),
            kind,
            reason: reason.into(),
        });
    }

    pub fn count(&self, kind: Kind) -> usize {
        self.findings.iter().filter(|f| f.kind == kind).count()
    }

    /// Sorted by document, so that the report reads in the order of the input whatever the
    /// order of the checks that found things.
    pub fn sort(&mut self) {
        self.findings.sort();
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes") + "\n"
    }
}

/// A JSON field path from its parts: `spec.discoveryHandler.discoveryProperties[2].name`.
pub fn field_path<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut path = String::new();
    for part in parts {
        if part.starts_with('[') || path.is_empty() {
            path.push_str(part);
        } else {
            path.push('.');
            path.push_str(part);
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_read_as_one_line_each() {
        let mut report = Report::default();
        let origin = Origin {
            file: "cams.yaml".into(),
            document: 2,
            item: None,
        };
        report.add(
            &origin,
            "default/cams",
            "spec.brokerProperties",
            Kind::Lossy,
            "dropped",
        );
        assert_eq!(
            report.findings[0].to_string(),
            "lossy: cams.yaml, document 2 (default/cams), field spec.brokerProperties: dropped"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["findings"][0]["file"], "cams.yaml");
        assert_eq!(json["findings"][0]["document"], 2);
        assert_eq!(json["findings"][0]["field"], "spec.brokerProperties");
        assert_eq!(json["findings"][0]["kind"], "lossy");
    }

    #[test]
    fn field_paths_join_keys_and_indexes() {
        assert_eq!(
            field_path(["spec", "discoveryProperties", "[2]", "name"]),
            "spec.discoveryProperties[2].name"
        );
    }
}
