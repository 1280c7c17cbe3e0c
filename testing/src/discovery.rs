//! What node agents made of a DiscoveryConfiguration, read from the API server: for tests that
//! run a discovery handler beside the kubelet-plugin's agent. Read as JSON (`DynamicObject`),
//! so this crate needs no Akri types.

#[cfg(feature = "components")]
use crate::{ControlPlane, ControlPlaneOptions, Error};
#[cfg(feature = "components")]
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use std::collections::BTreeMap;
#[cfg(feature = "components")]
use std::time::Duration;

/// Where a handler's test runs the kubelet-plugin's agent: a control plane of its own with
/// Akri's CRDs, a namespace for Instances (where the driver-controller's mirrors of the
/// configurations are kept, hence the feature) and a Node.
#[cfg(feature = "components")]
pub struct AgentCluster {
    pub cp: ControlPlane,
    pub client: kube::Client,
    /// The namespace the agent writes Instances to.
    pub namespace: String,
    /// The node the agent runs as.
    pub node: String,
}

#[cfg(feature = "components")]
impl AgentCluster {
    /// Starts the control plane and installs `crds` (Akri's: `akri_api::crds::all()`).
    pub async fn start(crds: &[CustomResourceDefinition]) -> Result<AgentCluster, Error> {
        let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
        cp.install_crds(crds).await?;
        let client = cp.client().await?;
        let namespace = cp.create_namespace("akri").await?;
        // Where the driver-controller mirrors the configurations the agent reads.
        crate::components::spawn_spec_mirror(&client, &namespace);
        let node = ControlPlane::unique_name("node");
        cp.create_node(&node).await?;
        Ok(AgentCluster {
            cp,
            client,
            namespace,
            node,
        })
    }

    /// This node's entry of `configuration`'s `status.discoveryErrors` ([`discovery_error`]).
    pub async fn discovery_error(&self, configuration: &str) -> Option<String> {
        discovery_error(&self.client, configuration, &self.node).await
    }

    /// The broker properties of `configuration`'s Instances ([`instance_properties`]).
    pub async fn instance_properties(&self, configuration: &str) -> Vec<BTreeMap<String, String>> {
        instance_properties(&self.client, &self.namespace, configuration).await
    }

    /// Kills `handler`, the binary of the handler `name` serving `configuration` here, in the
    /// middle of its stream: the configuration's status must then name the handler for this
    /// node. Then starts it again with `restart`, and the error must clear. The restarted
    /// handler is returned.
    pub async fn kill_and_restart_handler(
        &self,
        configuration: &str,
        name: &str,
        mut handler: tokio::process::Child,
        restart: impl FnOnce() -> tokio::process::Child,
    ) -> tokio::process::Child {
        handler.kill().await.expect("the handler is killed");
        let message = self.error_appears(configuration).await;
        assert!(message.contains(name), "names the handler: {message}");
        let handler = restart();
        self.error_clears(configuration).await;
        handler
    }

    /// Waits (up to 60 s) for this node's entry in `configuration`'s discovery errors, and
    /// returns its message.
    pub async fn error_appears(&self, configuration: &str) -> String {
        crate::eventually_within(
            &format!("an error of {configuration} in its status"),
            Duration::from_secs(60),
            async || self.discovery_error(configuration).await,
        )
        .await
    }

    /// Waits (up to 90 s) until `configuration`'s status has no error for this node.
    pub async fn error_clears(&self, configuration: &str) {
        crate::eventually_within(
            &format!("the error of {configuration} cleared"),
            Duration::from_secs(90),
            async || {
                self.discovery_error(configuration)
                    .await
                    .is_none()
                    .then_some(())
            },
        )
        .await
    }

    /// Creates or changes a DiscoveryConfiguration ([`apply_configuration`]).
    pub async fn apply_configuration(&self, name: &str, handler: &str, details: &str) {
        apply_configuration(&self.client, name, handler, details)
            .await
            .expect("the DiscoveryConfiguration is applied");
    }
}

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

/// A v0 Configuration (as JSON) of the debugEcho handler's `descriptions`, with `capacity`
/// slots each and `brokerProperties` `RESOLUTION=1080p`: the legacy path's test subject.
pub fn v0_debug_echo(
    name: &str,
    descriptions: &[&str],
    capacity: usize,
    unique_devices: bool,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "akri.sh/v0", "kind": "Configuration",
        "metadata": { "name": name },
        "spec": {
            "discoveryHandler": {
                "name": "debugEcho",
                "discoveryDetails": format!("descriptions: [{}]", descriptions.join(", ")),
            },
            "capacity": capacity,
            "uniqueDevices": unique_devices,
            "brokerProperties": { "RESOLUTION": "1080p" },
        },
    })
}

/// An Instance (as JSON) as Akri's agent leaves it for a shared device `instance` of
/// Configuration `configuration` (uid `configuration_uid`) seen by `node`, capacity 2: no
/// label of ours, `node`'s finalizer, owned by the Configuration, the free slot's key dropped,
/// slot `held` taken by `node` (instance level).
pub fn akri_written_instance(
    configuration: &str,
    configuration_uid: Option<&str>,
    instance: &str,
    node: &str,
    held: &str,
) -> serde_json::Value {
    let digest = instance.rsplit('-').next().unwrap_or_default();
    serde_json::json!({
        "apiVersion": "akri.sh/v0", "kind": "Instance",
        "metadata": {
            "name": instance,
            "finalizers": [node],
            "ownerReferences": [{
                "apiVersion": "akri.sh/v0", "kind": "Configuration", "name": configuration,
                "uid": configuration_uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "configurationName": configuration,
            "cdiName": format!("akri.sh/{configuration}={digest}"),
            "capacity": 2, "shared": true, "nodes": [node],
            "brokerProperties": { "DEBUG_ECHO_DESCRIPTION": "cam0" },
            "deviceUsage": { held: node },
        },
    })
}
