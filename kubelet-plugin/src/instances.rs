//! Instances on the DRA path: one per discovered device, written with server-side apply under
//! a field manager per node, so that nodes sharing a device each own their own entry of
//! `nodes` and never overwrite each other.

use crate::node_devices::KnownDevice;
use akri_api::v0::{Instance, InstanceSpec};
use akri_api::v1::{INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Writes this node's Instances.
pub struct InstanceWriter {
    api: Api<Instance>,
    node: String,
    field_manager: String,
    grace: Duration,
    /// Instances this node stopped seeing, and since when: removed after `grace`, so a
    /// flapping device does not churn Instances (and brokers).
    vanished: BTreeMap<String, Instant>,
}

impl InstanceWriter {
    pub fn new(client: kube::Client, namespace: &str, node: &str, grace: Duration) -> Self {
        InstanceWriter {
            api: Api::namespaced(client, namespace),
            node: node.to_string(),
            field_manager: akri_devices::node_field_manager(node),
            grace,
            vanished: BTreeMap::new(),
        }
    }

    /// Applies the Instances of `known` devices (with this node in `nodes`), and takes this
    /// node out of Instances it no longer sees once the grace period passed; the last node
    /// deletes the Instance.
    pub async fn sync(&mut self, known: &[(KnownDevice, i32, bool)]) -> Result<(), kube::Error> {
        let params = PatchParams::apply(&self.field_manager).force();
        let mut seen = BTreeSet::new();
        for (device, capacity, shared) in known {
            seen.insert(device.instance.clone());
            self.vanished.remove(&device.instance);
            let (_, left_out) = akri_devices::property_attributes(&device.device.properties);
            let annotations = (!left_out.is_empty()).then(|| {
                BTreeMap::from([(
                    akri_devices::UNPUBLISHED_PROPERTIES.to_string(),
                    left_out.join(","),
                )])
            });
            let instance = Instance {
                metadata: ObjectMeta {
                    name: Some(device.instance.clone()),
                    labels: Some(BTreeMap::from([(
                        INSTANCE_SOURCE_LABEL.to_string(),
                        INSTANCE_SOURCE_DISCOVERY_CONFIGURATION.to_string(),
                    )])),
                    annotations,
                    ..ObjectMeta::default()
                },
                spec: InstanceSpec {
                    configuration_name: device.configuration.clone(),
                    cdi_name: format!("{}={}", akri_devices::DRIVER_DOMAIN, device.instance),
                    capacity: (*capacity).max(1) as usize,
                    broker_properties: device.device.properties.clone(),
                    shared: *shared,
                    nodes: vec![self.node.clone()],
                    device_usage: Default::default(),
                },
            };
            crate::api_call(
                self.api
                    .patch(&device.instance, &params, &Patch::Apply(&instance)),
            )
            .await?;
        }

        // Instances this node wrote before that it no longer sees.
        let mine = crate::api_call(self.api.list(&ListParams::default().labels(&format!(
            "{INSTANCE_SOURCE_LABEL}={INSTANCE_SOURCE_DISCOVERY_CONFIGURATION}"
        ))))
        .await?;
        let now = Instant::now();
        for instance in mine.items {
            let name = instance.metadata.name.clone().unwrap_or_default();
            if seen.contains(&name) || !instance.spec.nodes.contains(&self.node) {
                continue;
            }
            let since = *self.vanished.entry(name.clone()).or_insert(now);
            if now.duration_since(since) < self.grace {
                continue;
            }
            self.vanished.remove(&name);
            let others: Vec<&String> = instance
                .spec
                .nodes
                .iter()
                .filter(|n| **n != self.node)
                .collect();
            if others.is_empty() {
                match crate::api_call(self.api.delete(&name, &DeleteParams::default())).await {
                    Ok(_) => tracing::info!(instance = %name, "deleted Instance: no node sees it"),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e),
                }
            } else {
                // Give up our entry of `nodes` (and our other fields) by applying nothing.
                let empty = serde_json::json!({
                    "apiVersion": "akri.sh/v0", "kind": "Instance", "metadata": { "name": name },
                });
                crate::api_call(self.api.patch(&name, &params, &Patch::Apply(&empty))).await?;
            }
        }
        Ok(())
    }

    /// Whether some Instance is waiting for its grace period (the caller should sync again).
    pub fn pending(&self) -> bool {
        !self.vanished.is_empty()
    }
}
