//! Whether any node has a configuration's discovery handler, from the nodes' handler Leases
//! ([`akri_devices::handlers`]): a configuration naming a handler no node has (a typo, a wrong
//! case, a handler not enabled) is not Ready, and says which handlers the nodes have.

use super::Context;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeMap, BTreeSet};

impl Context {
    /// Each node's handlers, as its Lease says, for the nodes that exist.
    pub(super) fn node_handlers(&self) -> BTreeMap<String, BTreeSet<String>> {
        (self.handler_leases.state().iter())
            .filter_map(|lease| akri_devices::handlers::node_handlers(lease))
            .filter(|(node, _)| self.nodes.get(&ObjectRef::<Node>::new(node)).is_some())
            .collect()
    }
}

/// Why no node can discover for `handler`, in one sentence; `None` when a node has it, when
/// the configuration has Instances (some node found its devices, so it has the handler), or
/// when no node has said which handlers it has (none started yet, or all of a version before
/// the Leases).
pub(super) fn missing_handler(
    handler: &str,
    instances: i32,
    nodes: &BTreeMap<String, BTreeSet<String>>,
) -> Option<String> {
    if instances > 0 || nodes.is_empty() || nodes.values().any(|h| h.contains(handler)) {
        return None;
    }
    let known: BTreeSet<&String> = nodes.values().flatten().collect();
    let names = match known.is_empty() {
        true => "none".to_string(),
        false => (known.iter().map(|n| n.as_str()))
            .collect::<Vec<_>>()
            .join(", "),
    };
    let hint = (known.iter())
        .find(|n| n.eq_ignore_ascii_case(handler))
        .map(|n| format!("; did you mean '{n}'? (names are case-sensitive)"))
        .unwrap_or_default();
    Some(format!(
        "no node has a discovery handler named '{handler}' (the {} nodes that run the agent have: {names}){hint}",
        nodes.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handler_no_node_has_is_named_with_the_ones_they_have() {
        let nodes = |entries: &[(&str, &[&str])]| -> BTreeMap<String, BTreeSet<String>> {
            (entries.iter())
                .map(|(n, h)| (n.to_string(), h.iter().map(|s| s.to_string()).collect()))
                .collect()
        };
        let two = nodes(&[("a", &["debugEcho", "onvif"]), ("b", &["udev"])]);
        type Case<'a> = (
            &'a str,
            i32,
            &'a BTreeMap<String, BTreeSet<String>>,
            Option<&'a str>,
        );
        let cases: [Case; 6] = [
            ("onvif", 0, &two, None),
            (
                "onvfi",
                0,
                &two,
                Some(
                    "no node has a discovery handler named 'onvfi' (the 2 nodes that run the agent have: debugEcho, onvif, udev)",
                ),
            ),
            (
                "debugecho",
                0,
                &two,
                Some(
                    "no node has a discovery handler named 'debugecho' (the 2 nodes that run the agent have: debugEcho, onvif, udev); did you mean 'debugEcho'? (names are case-sensitive)",
                ),
            ),
            // Some node found its devices: it has the handler (its Lease may be late).
            ("opcua", 3, &two, None),
            // No node has said: nothing is known.
            ("opcua", 0, &BTreeMap::new(), None),
            (
                "opcua",
                0,
                &nodes(&[("a", &[])]),
                Some(
                    "no node has a discovery handler named 'opcua' (the 1 nodes that run the agent have: none)",
                ),
            ),
        ];
        for (handler, instances, nodes, expected) in cases {
            assert_eq!(
                missing_handler(handler, instances, nodes).as_deref(),
                expected,
                "{handler}, {instances} Instances"
            );
        }
    }
}
