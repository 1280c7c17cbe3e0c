//! A configuration naming a discovery handler that no node has: its status says so, with the
//! handlers the nodes have, from the Leases the nodes' agents write (as the chart's node
//! identity) and the API server keeps.

use crate::support::{Cluster, eventually};
use akri_api::v1::{CONDITION_READY, DiscoveryConfiguration};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn a_configuration_naming_a_handler_no_node_has_is_not_ready_and_says_why() {
    let c = Cluster::start(2, false).await;
    let configs = Api::<DiscoveryConfiguration>::all(c.client.clone());
    let name = akri_testing::ControlPlane::unique_name("typo");
    // The agents' embedded handler is `debugEcho`.
    configs
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name },
                "spec": { "discoveryHandler": { "name": "debugecho", "discoveryDetails": "descriptions: [t0]" } },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let ready = async |reason: &str| {
        let config = configs.get(&name).await.ok()?;
        let status = config.status?;
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)?;
        (ready.reason == reason).then(|| (ready.status.clone(), ready.message.clone()))
    };
    // The message follows the Leases as they come: wait until it counts both nodes (the
    // controller may reconcile first with one node's Lease in its store).
    let (status, message) = eventually(
        "Ready=False, NoDiscoveryHandler, both nodes counted",
        async || {
            (ready("NoDiscoveryHandler").await)
                .filter(|(_, message)| message.contains("the 2 nodes"))
        },
    )
    .await;
    assert_eq!(status, "False");
    assert_eq!(
        message,
        "no node has a discovery handler named 'debugecho' (the 2 nodes that run the agent have: debugEcho); did you mean 'debugEcho'? (names are case-sensitive): nothing can be discovered for it"
    );

    // A configuration naming the handler the nodes have discovers and is Ready.
    let right = c.discovery("right", &["t0"], 1, true).await;
    c.wait_published(&right, 2).await;
    let config = configs.get(&right).await.unwrap();
    let ready = (config.status.unwrap().conditions.into_iter())
        .find(|c| c.type_ == CONDITION_READY)
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Published")
    );
}
