//! What node agents made of a DiscoveryConfiguration, read from the API server: for tests that
//! run a discovery handler beside the kubelet-plugin's agent. Read as JSON (`DynamicObject`),
//! so this crate needs no Akri types.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use std::collections::BTreeMap;

fn configurations(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("akri.sh", "v1", "DiscoveryConfiguration");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "discoveryconfigurations"),
    )
}

/// `node`'s entry of the configuration's `status.discoveryErrors`: why its discovery fails
/// there. `None` when there is none (or the configuration cannot be read).
pub async fn discovery_error(
    client: &kube::Client,
    configuration: &str,
    node: &str,
) -> Option<String> {
    let object = configurations(client).get(configuration).await.ok()?;
    object.data["status"]["discoveryErrors"]
        .as_array()?
        .iter()
        .find(|e| e["node"] == node)
        .and_then(|e| e["message"].as_str())
        .map(str::to_string)
}

/// The broker properties of each Instance of `configuration` in `namespace`, in name order
/// (an empty list when they cannot be read).
pub async fn instance_properties(
    client: &kube::Client,
    namespace: &str,
    configuration: &str,
) -> Vec<BTreeMap<String, String>> {
    let gvk = GroupVersionKind::gvk("akri.sh", "v0", "Instance");
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(&gvk, "instances"),
    );
    let Ok(list) = api.list(&ListParams::default()).await else {
        return Vec::new();
    };
    let mut instances: Vec<&DynamicObject> = list
        .items
        .iter()
        .filter(|i| i.data["spec"]["configurationName"] == configuration)
        .collect();
    instances.sort_by_key(|i| i.metadata.name.clone());
    instances
        .into_iter()
        .map(|i| {
            serde_json::from_value(i.data["spec"]["brokerProperties"].clone()).unwrap_or_default()
        })
        .collect()
}

/// Creates or changes (server-side apply) the DiscoveryConfiguration `name` of `handler` with
/// `details`.
pub async fn apply_configuration(
    client: &kube::Client,
    name: &str,
    handler: &str,
    details: &str,
) -> Result<(), kube::Error> {
    let object = serde_json::json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": name },
        "spec": { "discoveryHandler": { "name": handler, "discoveryDetails": details } },
    });
    configurations(client)
        .patch(
            name,
            &kube::api::PatchParams::apply("akri-test").force(),
            &kube::api::Patch::Apply(object),
        )
        .await?;
    Ok(())
}
