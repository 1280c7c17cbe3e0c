//! Akri's agent as the kubelet sees it, for tests of the move off Akri: the instance-level
//! device plugin of one device, `akri.sh/<instance>` with slots `<instance>-<n>`, as Akri's
//! agent registers it. Dropping it is what uninstalling Akri does to the node: the plugin's
//! socket goes and nothing is cleaned up. And Akri's CRDs, as its chart installs them.

use device_plugin::plugin::Device;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kubelet_proto::deviceplugin::v1beta1::ContainerAllocateResponse;
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// One device's instance-level plugin.
struct InstancePlugin {
    devices: watch::Sender<Vec<Device>>,
    envs: HashMap<String, String>,
}

#[tonic::async_trait]
impl device_plugin::DevicePlugin for InstancePlugin {
    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.subscribe()
    }

    async fn allocate(
        &self,
        requests: &[Vec<String>],
    ) -> Result<Vec<ContainerAllocateResponse>, tonic::Status> {
        Ok(requests
            .iter()
            .map(|_| ContainerAllocateResponse {
                envs: self.envs.clone(),
                ..Default::default()
            })
            .collect())
    }
}

/// Serves `akri.sh/<instance>` on the kubelet whose device-plugin directory is `dir`:
/// `capacity` slots, those in `free` healthy (Akri offers a slot another node holds as
/// unhealthy); a container allocated one gets `envs`, as Akri's brokers get the device's
/// properties. Runs until dropped.
pub fn serve_instance(
    dir: &Path,
    instance: &str,
    capacity: i32,
    free: &[i32],
    envs: &[(&str, &str)],
) -> Result<device_plugin::ServedPlugin, device_plugin::server::Error> {
    let devices = (0..capacity)
        .map(|n| {
            let id = format!("{instance}-{n}");
            match free.contains(&n) {
                true => Device::healthy(id),
                false => Device::unhealthy(id),
            }
        })
        .collect();
    let plugin = InstancePlugin {
        devices: watch::channel(devices).0,
        envs: (envs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    device_plugin::ServedPlugin::start(
        &device_plugin::PluginConfig {
            dir: dir.to_path_buf(),
            resource_name: format!("akri.sh/{instance}"),
            socket_name: format!("akri-{instance}.sock"),
        },
        Arc::new(plugin),
    )
}

/// Akri's CRDs as its chart installs them (Helm's field manager): Akri's Instance schema has
/// no list type on `nodes` and no map type on `deviceUsage`.
pub async fn akris_crds(client: &kube::Client) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PostParams {
        field_manager: Some("helm".into()),
        ..Default::default()
    };
    let crd = |kind: &str, plural: &str, spec: serde_json::Value| -> CustomResourceDefinition {
        crate::from_json(json!({
            "metadata": { "name": format!("{plural}.akri.sh") },
            "spec": {
                "group": "akri.sh", "scope": "Namespaced",
                "names": { "kind": kind, "plural": plural, "singular": kind.to_lowercase() },
                "versions": [{ "name": "v0", "served": true, "storage": true, "schema": { "openAPIV3Schema": {
                    "type": "object", "properties": { "spec": spec },
                } } }],
            },
        }))
    };
    let string_map = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    for crd in [
        crd(
            "Configuration",
            "configurations",
            json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
        ),
        crd(
            "Instance",
            "instances",
            json!({ "type": "object", "properties": {
            "configurationName": { "type": "string" }, "cdiName": { "type": "string" },
            "capacity": { "type": "integer" }, "brokerProperties": string_map,
            "shared": { "type": "boolean" }, "nodes": { "type": "array", "items": { "type": "string" } },
            "deviceUsage": string_map,
        } }),
        ),
    ] {
        crds.create(&params, &crd).await.unwrap();
    }
    for name in ["configurations.akri.sh", "instances.akri.sh"] {
        crate::eventually_within(
            &format!("{name} established"),
            Duration::from_secs(60),
            async || {
                let crd = crds.get(name).await.ok()?;
                let conditions = crd.status?.conditions?;
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            },
        )
        .await;
    }
}
