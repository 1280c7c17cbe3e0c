//! Events on this node's Node object: what an operator must hear of even if nobody reads the
//! plugin's log (`kubectl describe node` shows them).

/// A Warning Event on the node: `note` says what happened and what was done.
pub async fn warn(
    client: kube::Client,
    node: String,
    uid: String,
    reason: &'static str,
    note: String,
) {
    let reporter = kube::runtime::events::Reporter {
        controller: "akri-kubelet-plugin".into(),
        instance: Some(node.clone()),
    };
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node),
        uid: Some(uid),
        ..Default::default()
    };
    akri_runtime::warn_event(client, reporter, reference, reason, note).await;
}
