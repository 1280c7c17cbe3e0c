//! Which v0 Configurations a node serves as device plugins, and which DiscoveryConfigurations
//! wait for them: the one place where a namespace's objects meet what other namespaces and
//! the cluster's DiscoveryConfigurations get. Every rule is explicit, none is a sort order:
//!
//! - Only namespaces the operator lists are served (`legacyDevicePlugin.namespaces`); a v0
//!   Configuration elsewhere is ignored, whatever its name.
//! - A device-plugin resource name (`akri.sh/<name>`) is cluster-wide: of two v0
//!   Configurations of one name, the older serves it; a newer one never takes it over (nor
//!   one created in the same second: neither serves then, and both are said).
//! - A DiscoveryConfiguration is the cluster's: a v0 Configuration with its name is not
//!   served (its `akri.sh/<name>` would shadow the DiscoveryConfiguration's extended
//!   resource and write its Instances), unless the DiscoveryConfiguration says it was made of
//!   that one (`akri.sh/migrated-from`, as `akri-migrate` writes it, renamed or not). Then
//!   the DiscoveryConfiguration is held back on a node that serves both while the v0
//!   Configuration exists or any of its Instances naming the node is left (they go once no container holds
//!   their slots, at once for a deleted Configuration), so that one device is never offered
//!   twice; its status says so. The move is then one step: delete the v0 Configuration.

use crate::node_discovery::{Sink, Wanted};
use akri_api::v0::Configuration;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The v0 Configurations a node serves, and why it serves the others not (by
/// `<namespace>/<name>`).
#[derive(Debug, Default)]
pub struct ServedV0 {
    pub configs: Vec<Arc<Configuration>>,
    pub refused: BTreeMap<String, String>,
}

/// The v0 Configurations of `v0` this node serves: in `namespaces`, not named like a
/// DiscoveryConfiguration of `wanted` that was not made of them, the older of a name.
pub fn served_v0(
    v0: &[Arc<Configuration>],
    namespaces: &BTreeSet<String>,
    wanted: &[Wanted],
) -> ServedV0 {
    let mut served = ServedV0::default();
    let mut by_name: BTreeMap<&str, Vec<&Arc<Configuration>>> = BTreeMap::new();
    for config in v0 {
        let (Some(namespace), Some(name)) = (&config.metadata.namespace, &config.metadata.name)
        else {
            continue;
        };
        let key = format!("{namespace}/{name}");
        if !namespaces.contains(namespace) {
            let why = format!(
                "namespace {namespace} is not one the legacy device plugins serve (legacyDevicePlugin.namespaces)"
            );
            served.refused.insert(key, why);
            continue;
        }
        let unlinked = (wanted.iter())
            .filter(|w| w.sink == Sink::Dra && w.name == *name)
            .find(|w| w.migrated_from.as_deref() != Some(key.as_str()));
        if let Some(dra) = unlinked {
            let why = format!(
                "the DiscoveryConfiguration {} has its name and was not made of it ({}); it serves akri.sh/{name}",
                dra.name,
                match &dra.migrated_from {
                    Some(from) => format!("it was made of {from}"),
                    None => "no akri.sh/migrated-from".into(),
                }
            );
            served.refused.insert(key, why);
            continue;
        }
        by_name.entry(name).or_default().push(config);
    }
    for (name, mut configs) in by_name {
        configs.sort_by_key(|c| c.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let first = configs[0].metadata.creation_timestamp.as_ref();
        let tied = (configs.iter().skip(1))
            .filter(|c| c.metadata.creation_timestamp.as_ref() == first)
            .count();
        let older = if tied > 0 { None } else { Some(configs[0]) };
        for config in &configs {
            let key = key_of(config);
            match older {
                Some(older) if Arc::ptr_eq(older, config) => served.configs.push((*config).clone()),
                Some(older) => {
                    let why = format!(
                        "the older v0 Configuration {} serves akri.sh/{name}",
                        key_of(older)
                    );
                    served.refused.insert(key, why);
                }
                None => {
                    let why = format!(
                        "another v0 Configuration of the name akri.sh/{name} was created in the same second; neither is served (delete one)"
                    );
                    served.refused.insert(key, why);
                }
            }
        }
    }
    served
}

fn key_of(config: &Configuration) -> String {
    format!(
        "{}/{}",
        config.metadata.namespace.as_deref().unwrap_or_default(),
        config.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Which of the wanted v1 configurations to hold back, with the reason for their status:
/// those made of a v0 Configuration (`migrated_from`) that is served (`v0`, `(namespace,
/// name)`) or whose legacy Instances are left in a served namespace (`legacy_instances`,
/// `(namespace, name)` per configuration name).
pub fn held_back(
    wanted: &[Wanted],
    v0: &[(String, String)],
    namespaces: &BTreeSet<String>,
    legacy_instances: &BTreeMap<String, Vec<(String, String)>>,
) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for config in wanted.iter().filter(|w| w.sink == Sink::Dra) {
        let Some((namespace, name)) =
            (config.migrated_from.as_deref()).and_then(|f| f.split_once('/'))
        else {
            continue;
        };
        let reason = if v0.iter().any(|(ns, n)| ns == namespace && n == name) {
            format!(
                "held back on this node: the v0 Configuration {namespace}/{name} it was made of \
                 serves its devices as device plugins here; delete it to move them to DRA"
            )
        } else if let Some(instances) = (legacy_instances.get(name))
            .map(|i| {
                (i.iter())
                    .filter(|(ns, _)| ns == namespace && namespaces.contains(ns))
                    .map(|(ns, n)| format!("{ns}/{n}"))
                    .collect::<Vec<_>>()
            })
            .filter(|i| !i.is_empty())
        {
            format!(
                "held back on this node: Instances of the deleted v0 Configuration \
                 {namespace}/{name} it was made of are left ({}); containers hold their \
                 device-plugin slots, and the devices move to DRA once they are freed",
                instances.join(", ")
            )
        } else {
            continue;
        };
        held.insert(config.name.clone(), reason);
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn wanted(name: &str, sink: Sink, migrated_from: Option<&str>) -> Wanted {
        Wanted {
            key: name.into(),
            sink,
            group: "debugecho.akri.sh".into(),
            name: name.into(),
            handler: "debugEcho".into(),
            details: String::new(),
            properties: Vec::new(),
            capacity: 1,
            unique_devices: true,
            container_access: None,
            migrated_from: migrated_from.map(String::from),
        }
    }

    fn v0(namespace: &str, name: &str, created_second: i64) -> Arc<Configuration> {
        let mut config: Configuration = serde_json::from_value(serde_json::json!({
            "metadata": { "namespace": namespace, "name": name },
            "spec": { "discoveryHandler": { "name": "debugEcho" } },
        }))
        .unwrap();
        config.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + created_second).unwrap(),
        ));
        Arc::new(config)
    }

    fn served_keys(served: &ServedV0) -> Vec<String> {
        served.configs.iter().map(|c| key_of(c)).collect()
    }

    #[test]
    fn only_the_listed_namespaces_are_served() {
        let namespaces = BTreeSet::from(["site-a".to_string()]);
        let served = served_v0(
            &[v0("site-a", "cams", 0), v0("tenant", "usb", 0)],
            &namespaces,
            &[],
        );
        assert_eq!(served_keys(&served), ["site-a/cams"]);
        assert!(
            served.refused["tenant/usb"].contains("legacyDevicePlugin.namespaces"),
            "{:?}",
            served.refused
        );
    }

    #[test]
    fn of_one_name_the_older_serves_and_a_newer_never_takes_it_over() {
        let namespaces = BTreeSet::from(["a".to_string(), "b".to_string(), "z".to_string()]);
        // z sorts last and is the oldest: it keeps the name.
        let configs = [
            v0("a", "cams", 20),
            v0("z", "cams", 10),
            v0("b", "cams", 30),
        ];
        let served = served_v0(&configs, &namespaces, &[]);
        assert_eq!(served_keys(&served), ["z/cams"]);
        assert!(served.refused["a/cams"].contains("the older v0 Configuration z/cams"));
        assert!(served.refused["b/cams"].contains("the older v0 Configuration z/cams"));
        // Created in the same second: neither.
        let tied = served_v0(&[v0("a", "cams", 5), v0("b", "cams", 5)], &namespaces, &[]);
        assert!(tied.configs.is_empty());
        assert!(tied.refused["a/cams"].contains("same second"));
    }

    #[test]
    fn a_discovery_configurations_name_is_served_only_by_the_v0_configuration_it_was_made_of() {
        let namespaces = BTreeSet::from(["site-a".to_string(), "tenant".to_string()]);
        let wanted = [
            wanted("cams", Sink::Dra, Some("site-a/cams")),
            wanted("usb", Sink::Dra, None),
        ];
        let configs = [
            v0("tenant", "cams", 0),
            v0("site-a", "cams", 1),
            v0("tenant", "usb", 0),
        ];
        let served = served_v0(&configs, &namespaces, &wanted);
        assert_eq!(served_keys(&served), ["site-a/cams"]);
        assert!(served.refused["tenant/cams"].contains("it was made of site-a/cams"));
        assert!(served.refused["tenant/usb"].contains("no akri.sh/migrated-from"));
    }

    #[test]
    fn a_v1_configuration_waits_only_for_the_v0_configuration_it_was_made_of() {
        let namespaces = BTreeSet::from(["site-a".to_string(), "site-b".to_string()]);
        let wanted = [
            wanted("cams", Sink::Dra, Some("site-a/cams")),
            wanted("usb", Sink::Dra, None),
            // What `akri-migrate --rename` makes: another name, the same link.
            wanted("lobby", Sink::Dra, Some("site-a/old-lobby")),
            wanted("moved", Sink::Dra, Some("site-b/moved")),
            wanted("forged", Sink::Dra, Some("tenant/forged")),
            wanted("cams", Sink::Legacy, None),
        ];
        let v0 = [
            ("site-a".to_string(), "cams".to_string()),
            ("site-a".to_string(), "old-lobby".to_string()),
            ("site-a".to_string(), "usb".to_string()),
        ];
        let instances = BTreeMap::from([
            (
                "moved".to_string(),
                vec![("site-b".to_string(), "moved-def456".to_string())],
            ),
            (
                "forged".to_string(),
                vec![("tenant".to_string(), "forged-1".to_string())],
            ),
            (
                "usb".to_string(),
                vec![("site-a".to_string(), "usb-1".to_string())],
            ),
        ]);
        let held = held_back(&wanted, &v0, &namespaces, &instances);
        assert_eq!(held.keys().collect::<Vec<_>>(), ["cams", "lobby", "moved"]);
        assert!(held["cams"].contains("the v0 Configuration site-a/cams it was made of"));
        assert!(held["lobby"].contains("site-a/old-lobby"));
        assert!(
            held["moved"].contains("(site-b/moved-def456)"),
            "{}",
            held["moved"]
        );
        assert!(held_back(&wanted, &[], &namespaces, &BTreeMap::new()).is_empty());
    }
}
