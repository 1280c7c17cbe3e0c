//! Nodes deleted for good. A node's kubelet-plugin owns its entry of each Instance's `nodes`
//! and of each configuration's `status.discoveryErrors`, and removes them itself; a node that
//! is deleted never will, so its devices would keep selecting it and its error would keep the
//! configuration Degraded. The controller gives those entries up on the node's behalf: it
//! applies nothing under the node's field manager (which removes what that manager alone
//! owns), and deletes the Instances no remaining node sees, as the last kubelet-plugin would.

use super::{Context, Error};
use akri_api::v1::{DiscoveryConfiguration, Instance};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use std::collections::BTreeSet;
use std::sync::Arc;

impl Context {
    /// Removes the entries of deleted nodes from the configuration's Instances and status.
    /// Returns whether it wrote anything (the watches then bring the result).
    pub(super) async fn forget_gone_nodes(
        &self,
        config: &DiscoveryConfiguration,
        instances: &[Arc<Instance>],
    ) -> Result<bool, Error> {
        let errors = config
            .status
            .as_ref()
            .map(|s| s.discovery_errors.as_slice())
            .unwrap_or_default();
        let named: BTreeSet<&str> = instances
            .iter()
            .flat_map(|i| i.spec.nodes.iter())
            .chain(errors.iter().map(|e| &e.node))
            .map(String::as_str)
            .collect();
        let gone = self.gone_nodes(named).await?;
        if gone.is_empty() {
            return Ok(false);
        }
        let api = Api::<Instance>::namespaced(self.client.clone(), &self.config.instance_namespace);
        for instance in instances {
            let name = instance.name_any();
            let (lost, kept): (Vec<&String>, Vec<&String>) = instance
                .spec
                .nodes
                .iter()
                .partition(|n| gone.contains(n.as_str()));
            if lost.is_empty() {
                continue;
            }
            let result = if kept.is_empty() {
                // Only if nobody added a node since we read it.
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: instance.resource_version(),
                        uid: instance.uid(),
                    }),
                    ..DeleteParams::default()
                };
                tracing::info!(instance = %name, nodes = ?lost, "deleting an Instance only deleted nodes saw");
                api.delete(&name, &params).await.map(|_| ())
            } else {
                let mut result = Ok(());
                for node in lost {
                    let nothing = serde_json::json!({
                        "apiVersion": "akri.sh/v0", "kind": "Instance", "metadata": { "name": name },
                    });
                    tracing::info!(instance = %name, %node, "removing a deleted node from an Instance");
                    result = api
                        .patch(&name, &node_params(node), &Patch::Apply(&nothing))
                        .await
                        .map(|_| ());
                    if result.is_err() {
                        break;
                    }
                }
                result
            };
            match result {
                Ok(()) => self.metrics.wrote("instance", "forget-node", 1),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(cause) => {
                    return Err(Error::Write {
                        kind: "Instance",
                        name,
                        cause,
                    });
                }
            }
        }
        let configuration = config.name_any();
        let configs = Api::<DiscoveryConfiguration>::all(self.client.clone());
        for node in errors
            .iter()
            .map(|e| &e.node)
            .filter(|n| gone.contains(n.as_str()))
        {
            let nothing = serde_json::json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": configuration },
                "status": { "discoveryErrors": [] },
            });
            tracing::info!(%configuration, %node, "removing a deleted node's discovery error");
            configs
                .patch_status(&configuration, &node_params(node), &Patch::Apply(&nothing))
                .await
                .map_err(|cause| Error::Write {
                    kind: "DiscoveryConfiguration status",
                    name: configuration.clone(),
                    cause,
                })?;
            self.metrics.wrote("status", "forget-node", 1);
        }
        Ok(true)
    }

    /// The names no Node has. Not in the store is not enough: a new node's kubelet-plugin may
    /// write an Instance before the Node's event reaches us, so each is confirmed by a read.
    async fn gone_nodes<'a>(&self, named: BTreeSet<&'a str>) -> Result<BTreeSet<&'a str>, Error> {
        let api = Api::<Node>::all(self.client.clone());
        let mut gone = BTreeSet::new();
        for node in named {
            if self.nodes.get(&ObjectRef::new(node)).is_some() {
                continue;
            }
            match api.get_metadata_opt(node).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    gone.insert(node);
                }
                Err(cause) => {
                    return Err(Error::Read {
                        kind: "Node",
                        name: node.to_string(),
                        cause,
                    });
                }
            }
        }
        Ok(gone)
    }
}

fn node_params(node: &str) -> PatchParams {
    PatchParams::apply(&akri_devices::node_field_manager(node))
}
