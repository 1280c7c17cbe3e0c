//! Nodes that are gone in all but name: not Ready past a grace (a powered-off edge box whose
//! Node object stays). The driver-controller stops offering shared devices there, and the
//! legacy device plugins free the slots such a node held.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::time::Duration;

/// Whether a node is lost: not Ready (`False`, or `Unknown` when its kubelet stopped
/// reporting) for longer than `grace`. Its kubelet-plugin cannot take it out of the Instances
/// it saw or free the slots it held, so others do; it counts again once Ready. A node
/// without a Ready condition yet (just registered) is not lost.
pub fn node_lost(node: &Node, grace: Duration, now: Timestamp) -> bool {
    let Some(ready) = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
    else {
        return false;
    };
    if ready.status == "True" {
        return false;
    }
    let grace = SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX);
    ready
        .last_transition_time
        .as_ref()
        .is_none_or(|since| since.0.saturating_add(grace).is_ok_and(|t| t <= now))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: Option<(&str, i64)>) -> Node {
        let conditions = ready.map(|(status, at)| {
            vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "Ready".into(),
                status: status.into(),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::from_second(at).unwrap(),
                )),
                ..Default::default()
            }]
        });
        Node {
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_is_lost_when_not_ready_past_the_grace() {
        let grace = Duration::from_secs(60);
        let now = Timestamp::from_second(1_000_000).unwrap();
        assert!(
            !node_lost(&node(None), grace, now),
            "no Ready condition yet"
        );
        assert!(!node_lost(&node(Some(("True", 0))), grace, now));
        assert!(!node_lost(
            &node(Some(("False", 1_000_000 - 59))),
            grace,
            now
        ));
        assert!(node_lost(
            &node(Some(("False", 1_000_000 - 60))),
            grace,
            now
        ));
        assert!(node_lost(&node(Some(("Unknown", 0))), grace, now));
    }
}
