//! The names of the DiscoveryConfigurations: v0 Configurations are namespaced, v1
//! DiscoveryConfigurations are cluster-scoped (each is a DeviceClass and an `akri.sh/<name>`
//! extended resource), so Configurations of one name in several namespaces need different
//! names. Every rename is deterministic (the same input gives the same names) and reported;
//! a name that cannot be a DiscoveryConfiguration's is an error, never mangled silently.

use crate::report::{Kind, Origin, Report};
use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

/// A v0 Configuration, by namespace and name.
pub type Key = (String, String);

/// `--rename <namespace>/<name>=<new name>`: the user's choice of a DiscoveryConfiguration name.
#[derive(Clone, Debug, PartialEq)]
pub struct Rename {
    pub namespace: String,
    pub name: String,
    pub to: String,
}

impl FromStr for Rename {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = || format!("{s:?}: expected <namespace>/<name>=<new name>");
        let (from, to) = s.split_once('=').ok_or_else(usage)?;
        let (namespace, name) = from.split_once('/').ok_or_else(usage)?;
        if namespace.is_empty() || name.is_empty() || to.is_empty() {
            return Err(usage());
        }
        Ok(Rename {
            namespace: namespace.into(),
            name: name.into(),
            to: to.into(),
        })
    }
}

/// The DiscoveryConfiguration name of each Configuration in `sources` (with where it was
/// read), or an error in `report` for those that have none.
pub fn plan(
    sources: &BTreeMap<Key, Origin>,
    renames: &[Rename],
    report: &mut Report,
) -> BTreeMap<Key, String> {
    let chosen: BTreeMap<Key, &str> = renames
        .iter()
        .map(|r| ((r.namespace.clone(), r.name.clone()), r.to.as_str()))
        .collect();
    let mut by_name: BTreeMap<&str, Vec<&Key>> = BTreeMap::new();
    for key in sources.keys().filter(|k| !chosen.contains_key(*k)) {
        by_name.entry(key.1.as_str()).or_default().push(key);
    }
    // Names taken by a Configuration that keeps its own: a rename must not take one.
    let mut taken: BTreeSet<String> = by_name
        .iter()
        .filter(|(_, keys)| keys.len() == 1)
        .map(|(name, _)| name.to_string())
        .chain(chosen.values().map(|to| to.to_string()))
        .collect();
    let mut names = BTreeMap::new();
    for (key, origin) in sources {
        let object = format!("{}/{}", key.0, key.1);
        let (name, renamed) = match chosen.get(key) {
            Some(to) => (to.to_string(), Some("--rename".to_string())),
            None if by_name[key.1.as_str()].len() == 1 => (key.1.clone(), None),
            None => {
                let namespaces: Vec<&str> = by_name[key.1.as_str()]
                    .iter()
                    .map(|k| k.0.as_str())
                    .collect();
                let name = shared_name_rename(&key.0, &key.1, &taken);
                taken.insert(name.clone());
                let why = format!(
                    "Configurations named {} exist in namespaces {}, and DiscoveryConfigurations are cluster-scoped",
                    key.1,
                    namespaces.join(", ")
                );
                (name, Some(why))
            }
        };
        if let Err(e) = akri_devices::validate_configuration_name(&name) {
            let hint = if renamed.is_some() {
                String::new()
            } else {
                format!("; choose one with --rename {object}=<name>")
            };
            report.add(
                origin,
                &object,
                "metadata.name",
                Kind::Error,
                format!("{name:?} cannot be a DiscoveryConfiguration name: {e}{hint}"),
            );
            continue;
        }
        if let Some(why) = renamed {
            report.add(
                origin,
                &object,
                "metadata.name",
                Kind::Renamed,
                format!(
                    "its DiscoveryConfiguration is {name} ({why}): its devices are requested as akri.sh/{name} or with deviceClassName: {name}"
                ),
            );
        }
        names.insert(key.clone(), name);
    }
    let mut seen: BTreeMap<&str, &Key> = BTreeMap::new();
    for (key, name) in &names {
        if let Some(other) = seen.insert(name, key) {
            report.add(
                &sources[key],
                &format!("{}/{}", key.0, key.1),
                "metadata.name",
                Kind::Error,
                format!(
                    "its DiscoveryConfiguration would be {name}, as {}/{}'s: give another with --rename",
                    other.0, other.1
                ),
            );
        }
    }
    names
}

/// `<name>-<namespace>`, or when that is too long or taken, the name cut to fit and a digest
/// of `<namespace>/<name>`.
fn shared_name_rename(namespace: &str, name: &str, taken: &BTreeSet<String>) -> String {
    let plain = format!("{name}-{namespace}");
    if plain.len() <= akri_devices::MAX_CONFIGURATION_NAME && !taken.contains(&plain) {
        return plain;
    }
    let digest = format!("{:08x}", fnv1a(format!("{namespace}/{name}").as_bytes()));
    let keep = akri_devices::MAX_CONFIGURATION_NAME - 1 - digest.len();
    let prefix = name.get(..keep.min(name.len())).unwrap_or(name);
    format!("{}-{digest}", prefix.trim_end_matches('-'))
}

/// FNV-1a, 32 bits: a digest that stays the same across Rust releases, so names do too.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(keys: &[(&str, &str)]) -> BTreeMap<Key, Origin> {
        keys.iter()
            .enumerate()
            .map(|(i, (ns, name))| {
                let origin = Origin {
                    file: "in.yaml".into(),
                    document: i,
                    item: None,
                };
                ((ns.to_string(), name.to_string()), origin)
            })
            .collect()
    }

    fn key(ns: &str, name: &str) -> Key {
        (ns.into(), name.into())
    }

    #[test]
    fn a_name_in_one_namespace_is_kept() {
        let mut report = Report::default();
        let names = plan(&sources(&[("a", "cams"), ("b", "mics")]), &[], &mut report);
        assert_eq!(names[&key("a", "cams")], "cams");
        assert_eq!(names[&key("b", "mics")], "mics");
        assert!(report.findings.is_empty());
    }

    #[test]
    fn a_name_in_several_namespaces_is_renamed_in_each_and_reported() {
        let mut report = Report::default();
        let input = sources(&[("lab", "cams"), ("prod", "cams"), ("x", "cams-prod")]);
        let names = plan(&input, &[], &mut report);
        assert_eq!(names[&key("lab", "cams")], "cams-lab");
        // `cams-prod` is another Configuration's name: the digest form is used.
        let prod = &names[&key("prod", "cams")];
        assert!(
            prod.starts_with("cams-") && prod.len() == "cams-".len() + 8,
            "{prod}"
        );
        assert_eq!(names[&key("x", "cams-prod")], "cams-prod");
        assert_eq!(report.count(Kind::Renamed), 2);
        assert!(
            report.findings[0].reason.contains("namespaces lab, prod"),
            "{report:?}"
        );
        // Deterministic: the same input, the same names.
        assert_eq!(plan(&input, &[], &mut Report::default()), names);
    }

    #[test]
    fn an_invalid_name_is_an_error_not_mangled() {
        let mut report = Report::default();
        let names = plan(&sources(&[("a", "Lobby.Cams")]), &[], &mut report);
        assert!(names.is_empty());
        assert_eq!(report.count(Kind::Error), 1);
        assert!(
            report.findings[0]
                .reason
                .contains("--rename a/Lobby.Cams=<name>"),
            "{report:?}"
        );
        let rename: Rename = "a/Lobby.Cams=lobby-cams".parse().unwrap();
        let mut report = Report::default();
        let names = plan(&sources(&[("a", "Lobby.Cams")]), &[rename], &mut report);
        assert_eq!(names[&key("a", "Lobby.Cams")], "lobby-cams");
        assert_eq!(report.count(Kind::Renamed), 1);
    }

    #[test]
    fn long_names_are_cut_with_a_digest() {
        let long = "c".repeat(50);
        let mut report = Report::default();
        let names = plan(&sources(&[("a", &long), ("b", &long)]), &[], &mut report);
        let a = &names[&key("a", &long)];
        assert_eq!(a.len(), akri_devices::MAX_CONFIGURATION_NAME);
        assert_ne!(a, &names[&key("b", &long)]);
    }

    #[test]
    fn renames_that_meet_are_an_error() {
        let renames = ["a/x=same".parse().unwrap(), "b/y=same".parse().unwrap()];
        let mut report = Report::default();
        plan(&sources(&[("a", "x"), ("b", "y")]), &renames, &mut report);
        assert_eq!(report.count(Kind::Error), 1, "{report:?}");
    }
}
