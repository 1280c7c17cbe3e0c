//! Binding conditions (KEP-5007) with the real scheduler: a shared device is bound to the
//! node the scheduler chose only once that node's kubelet-plugin has checked it answers there.

use crate::support::{self, Cluster, eventually, from_json};
use akri_devices::{BINDING_CONDITION, BINDING_FAILURE_CONDITION};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::time::Duration;

/// A claim of `count` devices of `class` and a pod holding it, on `node` only when given (a
/// required node affinity: the scheduler still allocates, unlike `spec.nodeName`).
async fn pod_on(cluster: &Cluster, class: &str, count: i64, node: Option<&str>) -> String {
    let name = akri_testing::ControlPlane::unique_name("bound");
    Api::<ResourceClaim>::namespaced(cluster.client.clone(), &cluster.namespace)
        .create(
            &PostParams::default(),
            &from_json(json!({
                "metadata": { "name": name },
                "spec": { "devices": { "requests": [
                    { "name": "camera", "exactly": { "deviceClassName": class, "count": count } },
                ] } },
            })),
        )
        .await
        .unwrap();
    let affinity = node.map(|node| {
        json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{ "matchFields": [
                { "key": "metadata.name", "operator": "In", "values": [node] },
            ] }],
        } } })
    });
    cluster
        .create_pod(json!({
            "metadata": { "name": name },
            "spec": {
                "affinity": affinity,
                "resourceClaims": [{ "name": "c", "resourceClaimName": name }],
                "containers": [{ "name": "c", "image": "none", "resources": { "claims": [{ "name": "c" }] } }],
            },
        }))
        .await
}

/// The binding conditions of our entry in a claim's status.
async fn conditions(cluster: &Cluster, claim: &str) -> Vec<Condition> {
    let claim = Api::<ResourceClaim>::namespaced(cluster.client.clone(), &cluster.namespace)
        .get(claim)
        .await
        .unwrap();
    let entries = claim.status.and_then(|s| s.devices).unwrap_or_default();
    entries
        .into_iter()
        .flat_map(|e| e.conditions.unwrap_or_default())
        .filter(|c| c.type_ == BINDING_CONDITION || c.type_ == BINDING_FAILURE_CONDITION)
        .collect()
}

/// Two nodes list two shared cameras, but one of them no longer sees them (its handler stopped
/// reporting it; the shared grace keeps it listed, as for a camera rebooting): a pod that
/// can only go there is not bound (the node's check fails the binding, the scheduler says
/// why), a pod that may go anywhere ends on the node that reaches the camera, and its claim
/// shows that node's word. Where the API server has no binding conditions (1.34) the
/// configuration's status says what is missing.
#[tokio::test]
async fn a_shared_device_binds_only_on_a_node_that_reaches_it() {
    let cluster = Cluster::start_with_agents(
        2,
        true,
        |c| c.binding_conditions = None,
        |agent| agent.instance_grace.shared = Duration::from_secs(300),
    )
    .await;
    let config = cluster.discovery("gate", &["cam0", "cam1"], 1, true).await;
    cluster.wait_published(&config, 2).await;
    let instance = akri_devices::instance_name(&config, "cam0", true, "");
    let other = akri_devices::instance_name(&config, "cam1", true, "");
    eventually("the devices on both nodes", async || {
        let nodes = support::shared_device_nodes(&cluster.client, &instance).await?;
        let others = support::shared_device_nodes(&cluster.client, &other).await?;
        (nodes.len() == 2 && others.len() == 2).then_some(())
    })
    .await;
    if !cluster.support.binding_conditions {
        let ready = cluster.ready_condition(&config).await;
        assert!(ready.message.contains("no binding conditions"), "{ready:?}");
        return;
    }
    let (reaching, lost) = (&cluster.nodes[0], &cluster.nodes[1]);

    // The second node's handler stops reporting the cameras; they stay listed there (grace).
    std::fs::write(&cluster.availability_files()[1], "cam0\ncam1").unwrap();
    for device in [&instance, &other] {
        cluster.wait_unreported(1, device).await;
    }
    let nodes = support::shared_device_nodes(&cluster.client, &instance)
        .await
        .unwrap();
    assert!(nodes.contains(lost), "still listed there: {nodes:?}");

    let pinned = pod_on(&cluster, &config, 1, Some(lost)).await;
    let events = Api::<Event>::namespaced(cluster.client.clone(), &cluster.namespace);
    let refused = eventually("the scheduler says the binding failed", async || {
        let events = events.list(&ListParams::default()).await.ok()?.items;
        events.into_iter().find_map(|e| {
            let about = e.regarding.as_ref()?.name.as_deref() == Some(pinned.as_str());
            let note = e.note.unwrap_or_default();
            (about && note.contains("NotReported")).then_some(note)
        })
    })
    .await;
    assert!(
        refused.contains(&format!("node {lost}'s discovery handler does not report")),
        "{refused}"
    );
    assert_eq!(cluster.bound_node(&pinned).await, None, "not bound there");
    cluster.delete_pod(&pinned).await;

    // Both cameras in one claim: each device's condition is the node's to set.
    let free = pod_on(&cluster, &config, 2, None).await;
    // Each try on the node that lost it fails and deallocates; the scheduler picks again among
    // both (a tie), backing off up to 10 s between tries: allow for a few unlucky picks.
    let node =
        akri_testing::eventually_within("the pod bound", Duration::from_secs(240), async || {
            cluster.bound_node(&free).await
        })
        .await;
    assert_eq!(&node, reaching, "bound where the camera answers");
    let shown = conditions(&cluster, &free).await;
    assert_eq!(shown.len(), 2, "one per device: {shown:?}");
    for condition in &shown {
        assert_eq!(
            (condition.type_.as_str(), condition.status.as_str()),
            (BINDING_CONDITION, "True")
        );
        assert!(
            condition
                .message
                .contains(&format!("node {reaching}'s discovery handler reports")),
            "{shown:?}"
        );
    }
    let pod = Api::<Pod>::namespaced(cluster.client.clone(), &cluster.namespace)
        .get(&free)
        .await
        .unwrap();
    assert!(pod.spec.unwrap().node_name.is_some());
}

/// One camera with two slots (consumable capacity) on two nodes, a pod pinned to each, the
/// second made while the first is allocated and not yet bound: both are bound at once. With
/// binding conditions on such a device the second waited five minutes: during the first
/// claim's binding wait the scheduler counts its slot twice (allocated and in flight), finds
/// the camera full for the second pod, and nothing makes it try that pod again when the wait
/// ends. So devices shared through consumable capacity get no binding check, and the
/// configuration's status says so; a camera of capacity 1 still gets one.
#[tokio::test]
async fn a_camera_with_two_slots_serves_pods_on_two_nodes_at_once() {
    let cluster =
        Cluster::start_with_agents(2, true, |c| c.binding_conditions = None, |_| {}).await;
    let config = cluster.discovery("pair", &["cam0"], 2, true).await;
    // Without consumable capacity (1.34) the two slots are two devices, each checked.
    let consumable = cluster.support.consumable_capacity;
    let devices = if consumable { 1 } else { 2 };
    cluster.wait_published(&config, devices).await;
    let instance = akri_devices::instance_name(&config, "cam0", true, "");
    eventually("the camera on both nodes", async || {
        let nodes = support::shared_device_nodes(&cluster.client, &instance).await?;
        (nodes.len() == 2).then_some(())
    })
    .await;
    if cluster.support.binding_conditions && consumable {
        let ready = cluster.ready_condition(&config).await;
        // As the user guide quotes it.
        let why = "its shared devices are not checked from the chosen node at binding: several claims share each of them through consumable capacity, and the scheduler counts the slots of a claim waiting for its check twice, so another node's pod could wait five minutes (capacity 1 or uniqueDevices: false devices are checked)";
        assert!(ready.message.contains(why), "{ready:?}");
        let guide = include_str!("../../../docs/user-guide.md").replace('\n', " ");
        assert!(guide.contains(why), "the user guide quotes the message");
    }

    let first = pod_on(&cluster, &config, 1, Some(&cluster.nodes[0])).await;
    let claims = Api::<ResourceClaim>::namespaced(cluster.client.clone(), &cluster.namespace);
    eventually("the first claim allocated", async || {
        claims.get(&first).await.ok()?.status?.allocation
    })
    .await;
    let second = pod_on(&cluster, &config, 1, Some(&cluster.nodes[1])).await;
    for (pod, node) in [(&first, &cluster.nodes[0]), (&second, &cluster.nodes[1])] {
        let bound = akri_testing::bound_pod(
            &cluster.client,
            &cluster.namespace,
            pod,
            Duration::from_secs(60),
        )
        .await;
        assert_eq!(bound.spec.and_then(|s| s.node_name).as_ref(), Some(node));
    }
}
