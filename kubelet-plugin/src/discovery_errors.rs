//! This node's entries of `status.discoveryErrors`: why a configuration's discovery fails here.

use crate::device_plan::{self, StatusState};
use akri_api::v1::DiscoveryConfiguration;
use kube::api::{Api, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};

/// What fails on this node now, and what it last wrote.
#[derive(Default)]
pub struct DiscoveryErrors {
    /// Configurations whose discovery (the handler's stream) fails here, with why.
    pub discovery: BTreeMap<String, String>,
    /// Configurations whose discovery properties cannot be read now, with why (shown before
    /// a discovery error).
    pub properties: BTreeMap<String, String>,
    /// Configurations not discovered here on purpose, with why (shown first): a v1
    /// configuration held back for its v0 namesake ([`crate::same_name`]).
    pub held_back: BTreeMap<String, String>,
    /// Configurations one of whose Instances the API server refused, with why (shown last:
    /// the configuration's other Instances are written).
    pub instances: BTreeMap<String, String>,
    /// What this node last wrote into each configuration's `status.discoveryErrors`.
    reported: BTreeMap<String, String>,
}

impl DiscoveryErrors {
    /// How many configurations fail on this node now.
    pub fn failing(&self) -> usize {
        self.discovery
            .keys()
            .chain(self.properties.keys())
            .chain(self.instances.keys())
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The entries this node wants in `status.discoveryErrors`, by configuration
    /// ([`device_plan::status_entries`]).
    pub(crate) fn entries(&self) -> BTreeMap<String, String> {
        device_plan::status_entries(&StatusState {
            held_back: &self.held_back,
            properties: &self.properties,
            discovery: &self.discovery,
            instances: &self.instances,
        })
    }

    /// Writes this node's entry of `status.discoveryErrors` where it changed: present while
    /// a configuration's discovery fails here, gone once it works. Each node applies only its
    /// own entry (server-side apply, one field manager per node), so nodes never collide.
    pub async fn report(&mut self, client: &kube::Client, node: &str) {
        let api = Api::<DiscoveryConfiguration>::all(client.clone());
        let params = PatchParams::apply(&akri_devices::node_field_manager(node)).force();
        let entries = self.entries();
        let names: BTreeSet<String> = (entries.keys().chain(self.reported.keys()))
            .cloned()
            .collect();
        for name in names {
            let now = entries.get(&name);
            if self.reported.get(&name) == now {
                continue;
            }
            let entries = match now {
                Some(message) => {
                    serde_json::json!([{ "node": node, "message": message }])
                }
                None => serde_json::json!([]),
            };
            let patch = serde_json::json!({
                "apiVersion": "akri.sh/v1",
                "kind": "DiscoveryConfiguration",
                "metadata": { "name": name },
                "status": { "discoveryErrors": entries },
            });
            match crate::api_call(api.patch_status(&name, &params, &Patch::Apply(&patch))).await {
                Ok(_) => match now {
                    Some(message) => {
                        self.reported.insert(name, message.clone());
                    }
                    None => {
                        self.reported.remove(&name);
                    }
                },
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    self.reported.remove(&name);
                    self.discovery.remove(&name);
                    self.properties.remove(&name);
                }
                Err(error) => {
                    tracing::warn!(configuration = %name, %error, "reporting the discovery error failed")
                }
            }
        }
    }
}
