//! What the node wants, planned from what it knows, with no I/O: which configurations it
//! discovers for (a v1 DiscoveryConfiguration for the DRA sink, a v0 Configuration for the
//! legacy one), which v0 Configurations its device plugins serve and why not the others,
//! which v1 configurations wait for a v0 namesake ([`crate::same_name`]), and which v0
//! Configurations still carry the finalizer Akri's agent left for it. The loop
//! ([`crate::node_loop`]) computes it on every pass and brings discovery in line with it;
//! what the node then writes of the devices discovered (slices, Instances, device-plugin
//! lists, status entries) is the pass's second, equally pure part: [`crate::device_plan`].

use crate::node_discovery::{Sink, Wanted};
use crate::same_name;
use akri_api::v0::Configuration;
use akri_api::v1::DiscoveryConfiguration;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What the node knows when it plans: its stores, as the watches keep them.
pub struct Known<'a> {
    pub node: &'a str,
    /// Every DiscoveryConfiguration (empty without the DRA sink).
    pub v1: &'a [Arc<DiscoveryConfiguration>],
    /// Every v0 Configuration (empty without the legacy sink).
    pub v0: &'a [Arc<Configuration>],
    /// The namespaces the legacy sink serves; `None` without it.
    pub legacy_namespaces: Option<&'a BTreeSet<String>>,
    /// Every legacy Instance naming this node that the device plugins know of, `(namespace,
    /// name)` per configuration name: a device another node alone sees is not this node's to
    /// offer twice.
    pub legacy_instances: &'a BTreeMap<String, Vec<(String, String)>>,
}

/// What the node wants now.
#[derive(Debug, Default)]
pub struct NodePlan {
    /// The configurations to discover for, of both sinks, without those held back.
    pub wanted: Vec<Wanted>,
    /// The v0 Configurations the device plugins serve.
    pub served_v0: Vec<Arc<Configuration>>,
    /// Why each other v0 Configuration is not served, by `<namespace>/<name>`.
    pub refused_v0: BTreeMap<String, String>,
    /// v1 configurations held back on this node for a v0 namesake, with why (their status).
    pub held_back: BTreeMap<String, String>,
    /// v0 Configurations, served or not, carrying the finalizer Akri's agent left for this
    /// node ([`crate::legacy::LegacySink`] releases it).
    pub akri_finalizers: Vec<Arc<Configuration>>,
}

impl NodePlan {
    pub fn of(known: &Known) -> NodePlan {
        let mut wanted: Vec<Wanted> = known.v1.iter().filter_map(|c| Wanted::of_v1(c)).collect();
        let Some(namespaces) = known.legacy_namespaces else {
            return NodePlan {
                wanted,
                ..NodePlan::default()
            };
        };
        let served = same_name::served_v0(known.v0, namespaces, &wanted);
        let v0_names: Vec<(String, String)> = (served.configs.iter())
            .filter_map(|c| Some((c.metadata.namespace.clone()?, c.metadata.name.clone()?)))
            .collect();
        let held = same_name::held_back(&wanted, &v0_names, namespaces, known.legacy_instances);
        wanted.extend(served.configs.iter().filter_map(|c| Wanted::of_v0(c)));
        wanted.retain(|w| w.sink != Sink::Dra || !held.contains_key(&w.name));
        let akri_finalizers = (known.v0.iter())
            .filter(|c| (c.metadata.finalizers.iter().flatten()).any(|f| f == known.node))
            .cloned()
            .collect();
        NodePlan {
            wanted,
            served_v0: served.configs,
            refused_v0: served.refused,
            held_back: held,
            akri_finalizers,
        }
    }

    /// Whether `sink` has a configuration to discover for.
    pub fn wants(&self, sink: Sink) -> bool {
        self.wanted.iter().any(|w| w.sink == sink)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1(name: &str, migrated_from: Option<&str>) -> Arc<DiscoveryConfiguration> {
        let mut annotations = serde_json::Map::new();
        if let Some(from) = migrated_from {
            annotations.insert(akri_api::v1::MIGRATED_FROM_ANNOTATION.into(), from.into());
        }
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name, "annotations": annotations },
                "spec": { "discoveryHandler": { "name": "debugEcho" } },
            }))
            .unwrap(),
        )
    }

    fn v0(namespace: &str, name: &str, finalizers: &[&str]) -> Arc<Configuration> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "akri.sh/v0", "kind": "Configuration",
                "metadata": {
                    "namespace": namespace, "name": name, "finalizers": finalizers,
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                },
                "spec": { "discoveryHandler": { "name": "debugEcho" } },
            }))
            .unwrap(),
        )
    }

    fn keys(plan: &NodePlan) -> Vec<(Sink, String)> {
        (plan.wanted.iter())
            .map(|w| (w.sink, w.key.clone()))
            .collect()
    }

    fn names(configs: &[Arc<Configuration>]) -> Vec<String> {
        (configs.iter())
            .map(|c| c.metadata.name.clone().unwrap())
            .collect()
    }

    struct Case {
        name: &'static str,
        v1: Vec<Arc<DiscoveryConfiguration>>,
        v0: Vec<Arc<Configuration>>,
        legacy: Option<&'static [&'static str]>,
        /// Legacy Instances left: (configuration, namespace, instance).
        instances: &'static [(&'static str, &'static str, &'static str)],
        wanted: Vec<(Sink, &'static str)>,
        served: &'static [&'static str],
        refused: &'static [&'static str],
        held: &'static [&'static str],
        finalizers: &'static [&'static str],
    }

    #[test]
    fn what_a_node_wants_from_both_kinds_of_configuration() {
        let cases = [
            Case {
                name: "DRA only: every DiscoveryConfiguration, no v0 read",
                v1: vec![v1("cams", None), v1("usb", None)],
                v0: vec![v0("site", "old", &["node-a"])],
                legacy: None,
                instances: &[],
                wanted: vec![(Sink::Dra, "cams"), (Sink::Dra, "usb")],
                served: &[],
                refused: &[],
                held: &[],
                finalizers: &[],
            },
            Case {
                name: "legacy only: the listed namespaces' v0 Configurations",
                v1: vec![],
                v0: vec![v0("site", "cams", &[]), v0("tenant", "usb", &[])],
                legacy: Some(&["site"]),
                instances: &[],
                wanted: vec![(Sink::Legacy, "site/cams")],
                served: &["cams"],
                refused: &["tenant/usb"],
                held: &[],
                finalizers: &[],
            },
            Case {
                name: "a v1 namesake not made of it keeps the name; the v0 one is refused",
                v1: vec![v1("cams", None)],
                v0: vec![v0("site", "cams", &[])],
                legacy: Some(&["site"]),
                instances: &[],
                wanted: vec![(Sink::Dra, "cams")],
                served: &[],
                refused: &["site/cams"],
                held: &[],
                finalizers: &[],
            },
            Case {
                name: "made of a served v0 Configuration: held back while it serves",
                v1: vec![v1("cams", Some("site/cams"))],
                v0: vec![v0("site", "cams", &[])],
                legacy: Some(&["site"]),
                instances: &[],
                wanted: vec![(Sink::Legacy, "site/cams")],
                served: &["cams"],
                refused: &[],
                held: &["cams"],
                finalizers: &[],
            },
            Case {
                name: "its v0 Configuration deleted, Instances left: still held back",
                v1: vec![v1("cams", Some("site/cams"))],
                v0: vec![],
                legacy: Some(&["site"]),
                instances: &[("cams", "site", "cams-1a2b3c")],
                wanted: vec![],
                served: &[],
                refused: &[],
                held: &["cams"],
                finalizers: &[],
            },
            Case {
                name: "Instances left in a namespace not served hold nothing back",
                v1: vec![v1("cams", Some("site/cams"))],
                v0: vec![],
                legacy: Some(&["site"]),
                instances: &[("cams", "tenant", "cams-1a2b3c")],
                wanted: vec![(Sink::Dra, "cams")],
                served: &[],
                refused: &[],
                held: &[],
                finalizers: &[],
            },
            Case {
                name: "Akri's finalizers for this node, on served and refused v0 Configurations",
                v1: vec![],
                v0: vec![
                    v0("site", "cams", &["node-a"]),
                    v0("tenant", "usb", &["node-b", "node-a"]),
                    v0("site", "other", &["node-b"]),
                ],
                legacy: Some(&["site"]),
                instances: &[],
                wanted: vec![(Sink::Legacy, "site/cams"), (Sink::Legacy, "site/other")],
                served: &["cams", "other"],
                refused: &["tenant/usb"],
                held: &[],
                finalizers: &["cams", "usb"],
            },
        ];
        for case in cases {
            let namespaces: Option<BTreeSet<String>> = case
                .legacy
                .map(|l| l.iter().map(|n| n.to_string()).collect());
            let mut instances: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
            for (config, namespace, name) in case.instances {
                (instances.entry(config.to_string()).or_default())
                    .push((namespace.to_string(), name.to_string()));
            }
            let plan = NodePlan::of(&Known {
                node: "node-a",
                v1: &case.v1,
                v0: &case.v0,
                legacy_namespaces: namespaces.as_ref(),
                legacy_instances: &instances,
            });
            let wanted: Vec<(Sink, String)> = (case.wanted.iter())
                .map(|(s, k)| (*s, k.to_string()))
                .collect();
            assert_eq!(keys(&plan), wanted, "{}: wanted", case.name);
            assert_eq!(names(&plan.served_v0), case.served, "{}: served", case.name);
            let refused: Vec<&String> = plan.refused_v0.keys().collect();
            assert_eq!(refused, case.refused, "{}: refused", case.name);
            let held: Vec<&String> = plan.held_back.keys().collect();
            assert_eq!(held, case.held, "{}: held back", case.name);
            assert_eq!(
                names(&plan.akri_finalizers),
                case.finalizers,
                "{}: finalizers",
                case.name
            );
        }
    }
}
