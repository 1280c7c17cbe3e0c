//! Which discovery handlers each node has: a Lease per node in the Instances' namespace,
//! written by the node's agent when its handlers change, read by the driver-controller.
//!
//! A DiscoveryConfiguration names its handler by name (`onvif`, `udev`, `debugEcho`), and a
//! node that has no handler of that name simply finds nothing: without this, a typo, a wrong
//! case or a handler not enabled looked like a configuration that works and finds no device.
//! The controller says instead that no node has the handler, and which ones they have.
//!
//! A Lease because its `holderIdentity` can carry the whole node name, which the admission
//! policy compares with the node of the writer's token (a name may be 253 characters, too long
//! for a label, and CEL has no hash to check a digest): a node writes only its own.

use k8s_openapi::api::coordination::v1::Lease;
use std::collections::BTreeSet;

/// Label on the handler Leases (value: `"true"`): what the driver-controller watches.
pub const HANDLERS_LABEL: &str = "akri.sh/discovery-handlers-of-node";

/// Annotation on a handler Lease: the node's handlers' names, sorted, comma-separated.
pub const HANDLERS_ANNOTATION: &str = "akri.sh/discovery-handlers";

/// The handler Lease of `node`: `akri-node-<16 hex digits>` (a digest of the node name).
pub fn lease_name(node: &str) -> String {
    format!("akri-node-{}", crate::node_digest(node))
}

/// The Lease `node` applies when its handlers are `handlers`.
pub fn lease(node: &str, handlers: &BTreeSet<String>) -> Lease {
    let names: Vec<&str> = handlers.iter().map(String::as_str).collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": lease_name(node),
            "labels": { HANDLERS_LABEL: "true" },
            "annotations": { HANDLERS_ANNOTATION: names.join(",") },
        },
        "spec": { "holderIdentity": node },
    }))
    .expect("a valid Lease")
}

/// The node and its handlers as a handler Lease says them; `None` for a Lease that says no
/// node.
pub fn node_handlers(lease: &Lease) -> Option<(String, BTreeSet<String>)> {
    let node = lease.spec.as_ref()?.holder_identity.clone()?;
    let handlers = (lease.metadata.annotations.as_ref())
        .and_then(|a| a.get(HANDLERS_ANNOTATION))
        .map(|names| {
            (names.split(','))
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Some((node, handlers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_says_its_node_and_handlers_back() {
        let long = format!("{}.{}", "n".repeat(63), "m".repeat(189));
        for (node, handlers) in [
            ("node-a", vec!["debugEcho", "onvif"]),
            (long.as_str(), vec!["udev"]),
            ("node-b", vec![]),
        ] {
            let handlers: BTreeSet<String> = handlers.into_iter().map(String::from).collect();
            let lease = lease(node, &handlers);
            let name = lease.metadata.name.clone().unwrap();
            assert_eq!(name.len(), "akri-node-".len() + 16, "{name}");
            assert_eq!(node_handlers(&lease), Some((node.to_string(), handlers)));
        }
        assert_eq!(node_handlers(&Lease::default()), None);
    }
}
