//! A v1 DiscoveryConfiguration and a v0 Configuration of one name: what `akri-migrate` makes
//! of a v0 Configuration keeps its name, discovers the same devices, and would name their
//! Instances alike. Served side by side, one device would be offered twice (a device-plugin
//! slot and a DRA claim), and in one namespace the two paths would write one Instance in
//! turn. So on a node that serves both, the v1 configuration is held back while the v0 one
//! exists or any of its Instances is left (they go once no container holds their slots, at
//! once for a deleted Configuration); its status says so. The move is then one step: delete
//! the v0 Configuration, and the devices go to DRA as their slots are freed.

use crate::node_discovery::{Sink, Wanted};
use std::collections::BTreeMap;

/// Which of the wanted v1 configurations to hold back, with the reason for their status:
/// `v0` are the v0 Configurations' `(namespace, name)`, `legacy_instances` the legacy
/// Instances' `(namespace, name)` per configuration name.
pub fn held_back(
    wanted: &[Wanted],
    v0: &[(String, String)],
    legacy_instances: &BTreeMap<String, Vec<(String, String)>>,
) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for config in wanted.iter().filter(|w| w.sink == Sink::Dra) {
        let name = &config.name;
        let reason = if let Some((namespace, _)) = v0.iter().find(|(_, n)| n == name) {
            format!(
                "held back on this node: the v0 Configuration {namespace}/{name} of the same name \
                 serves its devices as device plugins here; delete it to move them to DRA"
            )
        } else if let Some(instances) = legacy_instances.get(name).filter(|i| !i.is_empty()) {
            let listed: Vec<String> = instances
                .iter()
                .map(|(ns, n)| format!("{ns}/{n}"))
                .collect();
            format!(
                "held back on this node: Instances of the deleted v0 Configuration of the same \
                 name are left ({}); containers hold their device-plugin slots, and the devices \
                 move to DRA once they are freed",
                listed.join(", ")
            )
        } else {
            continue;
        };
        held.insert(name.clone(), reason);
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(name: &str, sink: Sink) -> Wanted {
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
        }
    }

    #[test]
    fn a_v1_configuration_waits_for_its_v0_namesake_and_its_instances() {
        let wanted = [
            wanted("cams", Sink::Dra),
            wanted("usb", Sink::Dra),
            wanted("moved", Sink::Dra),
            wanted("cams", Sink::Legacy),
        ];
        let v0 = [("site-a".to_string(), "cams".to_string())];
        let instances = BTreeMap::from([
            (
                "cams".to_string(),
                vec![("site-a".to_string(), "cams-abc123".to_string())],
            ),
            (
                "moved".to_string(),
                vec![("site-b".to_string(), "moved-def456".to_string())],
            ),
        ]);
        let held = held_back(&wanted, &v0, &instances);
        assert_eq!(held.keys().collect::<Vec<_>>(), ["cams", "moved"]);
        assert!(
            held["cams"].contains("the v0 Configuration site-a/cams of the same name"),
            "{}",
            held["cams"]
        );
        assert!(
            held["moved"].contains("(site-b/moved-def456)"),
            "{}",
            held["moved"]
        );
        assert!(held_back(&wanted, &[], &BTreeMap::new()).is_empty());
    }
}
