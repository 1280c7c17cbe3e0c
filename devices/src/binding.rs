//! Binding checks (KEP-5007): which of a claim's devices wait for a node's word, which node,
//! and where the driver-controller tells that node.
//!
//! A node must not watch every ResourceClaim of the cluster to find the few its shared devices
//! wait on (claims carry nothing a node could select on). The driver-controller, which keeps
//! every allocated claim in a store anyway, routes them: each node's waiting claims go into a
//! ConfigMap of that node's own ([`checks_config_map`]) in the Instances' namespace, which
//! only that node watches, by name. So a node hears of its own waiting claims and of nothing
//! else, whatever the size of the cluster.

use crate::{BINDING_CONDITION, BINDING_FAILURE_CONDITION, DRIVER_DOMAIN};
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim};

/// Label on the binding-check ConfigMaps (value: `"true"`).
pub const CHECKS_LABEL: &str = "akri.sh/binding-checks";

/// Annotation on a binding-check ConfigMap: the node it is for (a name may be too long for
/// a label value).
pub const CHECKS_NODE_ANNOTATION: &str = "akri.sh/node";

/// The name of `node`'s binding-check ConfigMap: `binding-checks-<16 hex digits>`, a Blake2b
/// digest of the node name (node names may be 253 characters, too long with a prefix). Its
/// data: claim UID -> `<namespace>/<name>`.
pub fn checks_config_map(node: &str) -> String {
    format!("binding-checks-{}", crate::node_digest(node))
}

/// The results of an allocated claim that wait for a binding check: of an Akri driver, with
/// [`BINDING_CONDITION`], and no condition of ours set on their `status.devices` entry yet.
/// Two requests sharing a device (consumable capacity) wait once.
pub fn waiting_results(claim: &ResourceClaim) -> Vec<DeviceRequestAllocationResult> {
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Vec::new();
    };
    let entries = claim.status.as_ref().and_then(|s| s.devices.as_ref());
    let decided =
        |result: &DeviceRequestAllocationResult| {
            entries.into_iter().flatten().any(|entry| {
                entry.driver == result.driver
                    && entry.pool == result.pool
                    && entry.device == result.device
                    && entry.share_id == result.share_id
                    && entry.conditions.iter().flatten().any(|c| {
                        c.type_ == BINDING_CONDITION || c.type_ == BINDING_FAILURE_CONDITION
                    })
            })
        };
    let mut waiting: Vec<DeviceRequestAllocationResult> = allocation
        .devices
        .iter()
        .flat_map(|d| d.results.iter().flatten())
        .filter(|r| r.driver.ends_with(&format!(".{DRIVER_DOMAIN}")))
        .filter(|r| (r.binding_conditions.iter().flatten()).any(|c| c == BINDING_CONDITION))
        .filter(|r| !decided(r))
        .cloned()
        .collect();
    waiting.dedup_by(|a, b| (&a.pool, &a.device, &a.share_id) == (&b.pool, &b.device, &b.share_id));
    waiting
}

/// The one node an allocation's node selector names: what the scheduler writes for a device
/// that binds to the node it chose (`bindsToNode`), a `metadata.name In [<node>]` field
/// requirement (or a `kubernetes.io/hostname` label one) in a single term.
pub fn chosen_node(claim: &ResourceClaim) -> Option<&str> {
    let selector = claim
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .node_selector
        .as_ref()?;
    let [term] = selector.node_selector_terms.as_slice() else {
        return None;
    };
    let fields = term.match_fields.iter().flatten();
    let labels =
        (term.match_expressions.iter().flatten()).filter(|r| r.key == "kubernetes.io/hostname");
    let mut named = fields
        .filter(|r| r.key == "metadata.name")
        .chain(labels)
        .filter(|r| r.operator == "In")
        .filter_map(|r| match r.values.as_deref() {
            Some([node]) => Some(node.as_str()),
            _ => None,
        });
    let node = named.next()?;
    named.all(|other| other == node).then_some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(allocation: serde_json::Value, devices: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "c", "namespace": "apps", "uid": "u1" },
            "spec": {},
            "status": { "allocation": allocation, "devices": devices },
        }))
        .unwrap()
    }

    fn result(driver: &str, device: &str, conditions: &[&str]) -> serde_json::Value {
        serde_json::json!({
            "request": "r", "driver": driver, "pool": "p", "device": device,
            "bindingConditions": conditions,
        })
    }

    fn on_node(node: &str) -> serde_json::Value {
        serde_json::json!({ "nodeSelectorTerms": [{ "matchFields": [
            { "key": "metadata.name", "operator": "In", "values": [node] },
        ] }] })
    }

    #[test]
    fn a_claim_waits_for_its_akri_devices_with_our_condition_until_one_is_set() {
        let allocation = serde_json::json!({
            "devices": { "results": [
                result("onvif.akri.sh", "cam-1", &[BINDING_CONDITION]),
                result("onvif.akri.sh", "cam-2", &[BINDING_CONDITION]),
                result("onvif.akri.sh", "cam-3", &[]),
                result("gpu.example.com", "gpu-0", &[BINDING_CONDITION]),
            ] },
            "nodeSelector": on_node("edge-1"),
        });
        let decided = serde_json::json!([{
            "driver": "onvif.akri.sh", "pool": "p", "device": "cam-2",
            "conditions": [{ "type": BINDING_FAILURE_CONDITION, "status": "True", "reason": "Timeout",
                "message": "", "lastTransitionTime": "2026-11-28T00:00:00Z" }],
        }]);
        let c = claim(allocation, decided);
        let waiting: Vec<_> = waiting_results(&c).into_iter().map(|r| r.device).collect();
        assert_eq!(waiting, ["cam-1"]);
        assert_eq!(chosen_node(&c), Some("edge-1"));
    }

    #[test]
    fn only_a_selector_naming_one_node_chooses_it() {
        let with = |selector: serde_json::Value| {
            claim(
                serde_json::json!({ "devices": { "results": [] }, "nodeSelector": selector }),
                serde_json::json!([]),
            )
        };
        assert_eq!(chosen_node(&with(on_node("a"))), Some("a"));
        let hostname = serde_json::json!({ "nodeSelectorTerms": [{ "matchExpressions": [
            { "key": "kubernetes.io/hostname", "operator": "In", "values": ["b"] },
        ] }] });
        assert_eq!(chosen_node(&with(hostname)), Some("b"));
        let two = serde_json::json!({ "nodeSelectorTerms": [{ "matchFields": [
            { "key": "metadata.name", "operator": "In", "values": ["a", "b"] },
        ] }] });
        assert_eq!(chosen_node(&with(two)), None);
        let terms = serde_json::json!({ "nodeSelectorTerms": [
            { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["a"] }] },
            { "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["b"] }] },
        ] });
        assert_eq!(chosen_node(&with(terms)), None);
    }

    #[test]
    fn a_nodes_config_map_name_is_short_and_its_own() {
        let long = "n".repeat(253);
        assert_eq!(checks_config_map(&long).len(), "binding-checks-".len() + 16);
        assert_ne!(checks_config_map("edge-1"), checks_config_map("edge-2"));
        assert_eq!(checks_config_map("edge-1"), checks_config_map("edge-1"));
    }
}
