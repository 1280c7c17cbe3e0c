//! Writing the result: one YAML stream on stdout, or one file per v0 Configuration in a
//! directory (`<namespace>.<name>.yaml`; namespaces have no dots, so the name is unambiguous).
//! The same input always gives the same bytes.

use crate::convert::Migrated;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The v1 objects of one Configuration: its DiscoveryConfiguration, then its BrokerTemplate.
pub fn objects(migrated: &Migrated) -> Vec<Value> {
    let mut objects = vec![serde_json::to_value(&migrated.discovery).expect("serializes")];
    if let Some(brokers) = &migrated.brokers {
        objects.push(serde_json::to_value(brokers).expect("serializes"));
    }
    objects
}

/// A YAML stream of `objects`, each document after `---`, headed by `comment`.
pub fn yaml(comment: &str, objects: &[Value]) -> String {
    let mut out = String::new();
    for line in comment.lines() {
        out.push_str(&format!("# {line}\n"));
    }
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(object).expect("JSON values serialize as YAML"));
    }
    out
}

/// The YAML of one migrated Configuration.
pub fn migrated_yaml(migrated: &Migrated) -> String {
    let (namespace, name) = &migrated.key;
    yaml(
        &format!("akri.sh/v0 Configuration {namespace}/{name}, migrated by akri-migrate"),
        &objects(migrated),
    )
}

/// The file of one migrated Configuration in an output directory.
pub fn file_name(dir: &Path, migrated: &Migrated) -> PathBuf {
    let (namespace, name) = &migrated.key;
    dir.join(format!("{namespace}.{name}.yaml"))
}

/// Writes `text` to `path` whole or not at all.
pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    node_io::files::write_atomically(path, text.as_bytes(), 0o644)
}
