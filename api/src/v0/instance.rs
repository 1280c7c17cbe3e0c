//! `Instance` (`akri.sh/v0`, short name `akrii`): one discovered device, the nodes that can reach
//! it, and who holds each of its usage slots.
//!
//! The JSON is Akri v0.13's, field for field; see the [compatibility contract](super).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::device_usage::{DeviceUsage, DeviceUsageError};
use super::schema::count;

/// The state of an Akri Instance, as the agent (here: the legacy device plugin) writes it.
#[allow(
    clippy::duplicated_attributes,
    reason = "two printcolumn(...) share `type_ = \"string\"`, which clippy takes for a duplicate"
)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "akri.sh",
    version = "v0",
    kind = "Instance",
    plural = "instances",
    singular = "instance",
    shortname = "akrii",
    // `kubectl get akri` lists Instances with the akri.sh/v1 kinds (an addition to Akri's CRD).
    category = "akri",
    namespaced,
    derive = "PartialEq",
    doc = "An Akri Instance: one device found through a Configuration, the nodes that can reach it, and the usage of its slots.",
    printcolumn(
        name = "Config",
        type_ = "string",
        description = "The Configuration this Instance belongs to",
        json_path = ".spec.configurationName"
    ),
    printcolumn(
        name = "Shared",
        type_ = "boolean",
        description = "Describes whether this Instance is shared",
        json_path = ".spec.shared"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "string",
        description = "Nodes that expose this Instance",
        json_path = ".spec.nodes"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct InstanceSpec {
    /// The name of the Configuration (in the same namespace) that found the device.
    pub configuration_name: String,

    /// The fully qualified CDI name of the device (`<vendor>/<class>=<device>`).
    pub cdi_name: String,

    /// The number of usage slots: the Configuration's `capacity` when the Instance was made.
    #[schemars(schema_with = "count")]
    pub capacity: usize,

    /// Properties given to the brokers as environment variables: the Configuration's
    /// `brokerProperties` plus the properties the discovery handler reported for the device.
    #[serde(default)]
    pub broker_properties: BTreeMap<String, String>,

    /// Whether the device can be reached from several nodes (a network device) rather than from
    /// one node only (a local device).
    #[serde(default)]
    pub shared: bool,

    /// The nodes that can reach the device. A set: no name appears twice.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub nodes: Vec<String>,

    /// Who holds each usage slot, by slot id: `""` (free), `<node>` (that node's Instance-level
    /// device plugin) or `C:<vdev>:<node>` (that node's Configuration-level device plugin, for
    /// its virtual device `<vdev>`). Each key is a field of its own for server-side apply, so
    /// nodes can claim different slots without conflicts.
    // Read and write the values with `DeviceUsage` (`super::device_usage`), or with
    // `slot_usage` / `slot_usages` below.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-map-type" = "granular"))]
    pub device_usage: BTreeMap<String, String>,
}

impl InstanceSpec {
    /// The usage of slot `slot`: `None` if the Instance has no such slot, an error if its value
    /// is malformed.
    pub fn slot_usage(&self, slot: &str) -> Option<Result<DeviceUsage, DeviceUsageError>> {
        self.device_usage.get(slot).map(|value| value.parse())
    }

    /// Every slot with its parsed usage, in slot-id order.
    pub fn slot_usages(
        &self,
    ) -> impl Iterator<Item = (&str, Result<DeviceUsage, DeviceUsageError>)> {
        self.device_usage
            .iter()
            .map(|(slot, value)| (slot.as_str(), value.parse()))
    }

    /// Whether `node` is one of the nodes that can reach the device.
    pub fn is_reachable_from(&self, node: &str) -> bool {
        self.nodes.iter().any(|n| n == node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> InstanceSpec {
        serde_json::from_value(serde_json::json!({
            "configurationName": "akri-onvif",
            "cdiName": "akri.sh/akri-onvif=8120fe",
            "capacity": 3,
            "nodes": ["node-a", "node-b"],
            "deviceUsage": {
                "akri-onvif-8120fe-0": "",
                "akri-onvif-8120fe-1": "node-a",
                "akri-onvif-8120fe-2": "C:0:node-b",
                "akri-onvif-8120fe-3": "C::node-b",
            },
        }))
        .unwrap()
    }

    #[test]
    fn defaults_are_akris() {
        let spec = spec();
        assert!(!spec.shared);
        assert!(spec.broker_properties.is_empty());
    }

    #[test]
    fn slot_usage_parses_one_slot() {
        let spec = spec();
        assert_eq!(
            spec.slot_usage("akri-onvif-8120fe-0"),
            Some(Ok(DeviceUsage::Free))
        );
        assert_eq!(
            spec.slot_usage("akri-onvif-8120fe-2"),
            Some(Ok(DeviceUsage::Configuration {
                vdev: "0".into(),
                node: "node-b".into()
            }))
        );
        assert!(matches!(
            spec.slot_usage("akri-onvif-8120fe-3"),
            Some(Err(DeviceUsageError::EmptyVirtualDevice { .. }))
        ));
        assert_eq!(spec.slot_usage("akri-onvif-8120fe-9"), None);
    }

    #[test]
    fn slot_usages_walks_all_slots_in_order() {
        let spec = spec();
        let slots: Vec<_> = spec.slot_usages().map(|(slot, _)| slot).collect();
        assert_eq!(
            slots,
            [
                "akri-onvif-8120fe-0",
                "akri-onvif-8120fe-1",
                "akri-onvif-8120fe-2",
                "akri-onvif-8120fe-3"
            ]
        );
        let held_by_a = spec
            .slot_usages()
            .filter(|(_, usage)| usage.as_ref().is_ok_and(|u| u.is_held_by("node-a")))
            .count();
        assert_eq!(held_by_a, 1);
    }

    #[test]
    fn reachability() {
        let spec = spec();
        assert!(spec.is_reachable_from("node-b"));
        assert!(!spec.is_reachable_from("node-c"));
    }
}
