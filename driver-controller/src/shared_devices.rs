//! Shared devices (seen by several nodes, e.g. network cameras) are published once, here,
//! with the nodes that can reach them, instead of once per node: publishing one camera in
//! three node pools would offer its slots three times.
//!
//! Where the API server has per-device node selection, a configuration's shared devices are
//! one pool, each device carrying a node selector built from its Instance's `nodes`. Where it
//! does not, each Instance is a pool of its own whose slices carry the node selector: a device
//! must never move from one pool to another when its nodes change, because allocations
//! name the pool, and the scheduler would take the moved device for a free one.

use akri_api::v0::Instance;
use akri_devices::{InstanceDevice, Sharing};
use dra_plugin::slices::PoolScope;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::Device;
use std::collections::BTreeSet;

/// One pool of shared devices to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedPool {
    pub pool: String,
    pub scope: PoolScope,
    pub devices: Vec<Device>,
}

/// The pool of a configuration's shared devices (per-device node selection).
pub fn configuration_pool(configuration: &str) -> String {
    format!("akri.sh/configuration/{configuration}")
}

/// The pool of one shared Instance (pool-wide node selection).
pub fn instance_pool(instance: &str) -> String {
    format!("akri.sh/instance/{instance}")
}

/// The node label selectors match: the kubelet sets it to the node's hostname, which is the
/// node name unless the kubelet runs with `--hostname-override`. Not the name itself: a
/// field selector takes one value per requirement, and the scheduler (like slice
/// validation) accepts only one selector term, so naming several nodes needs a label.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// A selector (one term, as DRA requires) for exactly these nodes.
pub fn node_selector(nodes: &[String]) -> NodeSelector {
    let mut values = nodes.to_vec();
    values.sort();
    values.dedup();
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: HOSTNAME_LABEL.into(),
                operator: "In".into(),
                values: Some(values),
            }]),
            match_fields: None,
        }],
    }
}

/// A selector (one term) for the nodes that have all these labels.
pub fn label_selector(labels: &std::collections::BTreeMap<String, String>) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(
                labels
                    .iter()
                    .map(|(key, value)| NodeSelectorRequirement {
                        key: key.clone(),
                        operator: "In".into(),
                        values: Some(vec![value.clone()]),
                    })
                    .collect(),
            ),
            match_fields: None,
        }],
    }
}

/// The nodes a selector of [`node_selector`] names.
pub fn selected_nodes(selector: &NodeSelector) -> Vec<String> {
    selector
        .node_selector_terms
        .iter()
        .flat_map(|term| {
            term.match_fields
                .iter()
                .chain(term.match_expressions.iter())
                .flatten()
        })
        .flat_map(|requirement| requirement.values.clone().unwrap_or_default())
        .collect()
}

/// The pools of a configuration's shared Instances, offered on their nodes but the `lost`
/// ones, or on the nodes `offered` selects instead (a configuration whose devices need no
/// kubelet-plugin). With `per_device_node_selection` that is always exactly one pool
/// (possibly empty, which unpublishes it); otherwise one pool per Instance that some node
/// sees.
pub fn pools(
    configuration: &str,
    capacity: i32,
    sharing: Sharing,
    per_device_node_selection: bool,
    instances: &[&Instance],
    lost: &BTreeSet<String>,
    offered: Option<&NodeSelector>,
) -> Vec<SharedPool> {
    let mut visible: Vec<(&Instance, Vec<String>)> = instances
        .iter()
        .filter(|i| i.spec.shared)
        .map(|i| {
            let nodes: Vec<String> = i
                .spec
                .nodes
                .iter()
                .filter(|n| !lost.contains(*n))
                .cloned()
                .collect();
            (*i, nodes)
        })
        .filter(|(_, nodes)| !nodes.is_empty())
        .collect();
    visible.sort_by_key(|(i, _)| i.metadata.name.clone());
    let devices_of = |instance: &Instance| -> Vec<Device> {
        let name = instance.metadata.name.as_deref().unwrap_or_default();
        akri_devices::devices(
            &InstanceDevice {
                instance: name,
                configuration,
                capacity,
                properties: &instance.spec.broker_properties,
            },
            sharing,
        )
    };
    if per_device_node_selection {
        let devices = visible
            .iter()
            .flat_map(|(instance, nodes)| {
                let selector = offered.cloned().unwrap_or_else(|| node_selector(nodes));
                devices_of(instance).into_iter().map(move |mut device| {
                    device.node_selector = Some(selector.clone());
                    device
                })
            })
            .collect();
        vec![SharedPool {
            pool: configuration_pool(configuration),
            scope: PoolScope::PerDevice,
            devices,
        }]
    } else {
        visible
            .iter()
            .map(|(instance, nodes)| SharedPool {
                pool: instance_pool(instance.metadata.name.as_deref().unwrap_or_default()),
                scope: PoolScope::Nodes(offered.cloned().unwrap_or_else(|| node_selector(nodes))),
                devices: devices_of(instance),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use akri_api::v0::InstanceSpec;
    use kube::api::ObjectMeta;

    fn instance(name: &str, shared: bool, nodes: &[&str]) -> Instance {
        Instance {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: InstanceSpec {
                configuration_name: "cams".into(),
                cdi_name: String::new(),
                capacity: 2,
                broker_properties: [("IP".to_string(), "10.0.0.1".to_string())].into(),
                shared,
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                device_usage: Default::default(),
            },
        }
    }

    fn selected(selector: &NodeSelector) -> Vec<String> {
        selected_nodes(selector)
    }

    #[test]
    fn per_device_selection_is_one_pool_with_each_devices_nodes() {
        let a = instance("cams-aaaaaa", true, &["n2", "n1"]);
        let b = instance("cams-bbbbbb", true, &["n3"]);
        let local = instance("cams-cccccc", false, &["n1"]);
        let gone = instance("cams-dddddd", true, &[]);
        let pools = pools(
            "cams",
            2,
            Sharing::ConsumableCapacity,
            true,
            &[&b, &a, &local, &gone],
            &BTreeSet::new(),
            None,
        );
        assert_eq!(pools.len(), 1);
        let pool = &pools[0];
        assert_eq!(pool.pool, "akri.sh/configuration/cams");
        let names: Vec<&str> = pool.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["cams-aaaaaa", "cams-bbbbbb"],
            "shared and seen only"
        );
        assert_eq!(
            selected(pool.devices[0].node_selector.as_ref().unwrap()),
            ["n1", "n2"]
        );
        assert_eq!(
            selected(pool.devices[1].node_selector.as_ref().unwrap()),
            ["n3"]
        );
        assert_eq!(pool.devices[0].allow_multiple_allocations, Some(true));
    }

    #[test]
    fn without_per_device_selection_each_instance_is_a_pool() {
        let a = instance("cams-aaaaaa", true, &["n1", "n2"]);
        let pools = pools(
            "cams",
            2,
            Sharing::SlotDevices,
            false,
            &[&a],
            &BTreeSet::new(),
            None,
        );
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].pool, "akri.sh/instance/cams-aaaaaa");
        let PoolScope::Nodes(selector) = &pools[0].scope else {
            panic!("pool-wide selector expected: {:?}", pools[0].scope)
        };
        assert_eq!(selected(selector), ["n1", "n2"]);
        assert_eq!(
            selector.node_selector_terms.len(),
            1,
            "slices allow one term"
        );
        let names: Vec<&str> = pools[0].devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["cams-aaaaaa-0", "cams-aaaaaa-1"]);
        assert!(pools[0].devices.iter().all(|d| d.node_selector.is_none()));
    }

    #[test]
    fn an_empty_configuration_still_has_its_pool_so_it_gets_unpublished() {
        let pools = pools(
            "cams",
            1,
            Sharing::ConsumableCapacity,
            true,
            &[],
            &BTreeSet::new(),
            None,
        );
        assert_eq!(pools.len(), 1);
        assert!(pools[0].devices.is_empty());
    }

    #[test]
    fn lost_nodes_are_left_out_and_an_instance_only_they_see_goes() {
        let a = instance("cams-aaaaaa", true, &["n1", "n2"]);
        let b = instance("cams-bbbbbb", true, &["n2"]);
        let lost: BTreeSet<String> = ["n2".to_string()].into();
        for per_device in [true, false] {
            let pools = pools(
                "cams",
                1,
                Sharing::ConsumableCapacity,
                per_device,
                &[&a, &b],
                &lost,
                None,
            );
            let selectors: Vec<Vec<String>> = pools
                .iter()
                .flat_map(|p| match &p.scope {
                    PoolScope::Nodes(selector) => vec![selected(selector)],
                    _ => p
                        .devices
                        .iter()
                        .map(|d| selected(d.node_selector.as_ref().unwrap()))
                        .collect(),
                })
                .collect();
            assert_eq!(selectors, [["n1"]], "per device: {per_device}");
        }
    }

    #[test]
    fn devices_offered_by_labels_go_to_those_nodes_while_some_node_discovers_them() {
        let a = instance("cams-aaaaaa", true, &["n1"]);
        let gone = instance("cams-bbbbbb", true, &[]);
        let offered = label_selector(&[("network".to_string(), "cameras".to_string())].into());
        for per_device in [true, false] {
            let pools = pools(
                "cams",
                1,
                Sharing::ConsumableCapacity,
                per_device,
                &[&a, &gone],
                &BTreeSet::new(),
                Some(&offered),
            );
            let selectors: Vec<&NodeSelector> = pools
                .iter()
                .flat_map(|p| match &p.scope {
                    PoolScope::Nodes(selector) => vec![selector],
                    _ => p.devices.iter().flat_map(|d| &d.node_selector).collect(),
                })
                .collect();
            assert_eq!(selectors, [&offered], "per device: {per_device}");
            let term = &offered.node_selector_terms[0];
            let requirement = &term.match_expressions.as_ref().unwrap()[0];
            assert_eq!(
                (requirement.key.as_str(), requirement.values.as_deref()),
                ("network", Some(&["cameras".to_string()][..]))
            );
        }
    }
}
