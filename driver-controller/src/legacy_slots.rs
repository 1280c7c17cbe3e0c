//! The legacy path's slots of gone nodes. A node frees only its own `deviceUsage` slots (the
//! chart's Instance admission policy: reaching a device is what a node says of itself, so it
//! cannot be what lets it free a slot another node's container holds). A node that is deleted,
//! or lost (not Ready past the grace: [`akri_devices::node_lost`]), never frees its own, so
//! they would stay taken for good; this controller, which sees the Nodes, frees them. A lost
//! node's once the grace has passed; a deleted node's once a read confirms that no Node has
//! its name (a new node's plugin may take a slot before its Node reaches the store).
//!
//! It reads from stores (the Nodes, trimmed to their Ready condition, and the Instances the
//! legacy device plugins serve, in the namespaces they serve), looks every [`CHECK`] (a node
//! becomes lost by the clock, not by an event), and writes only to free a slot: one JSON
//! patch that first tests the slot still holds what was seen ([`akri_api::v0::slot_patch`]),
//! so a slot its node took again meanwhile is left alone.

use crate::metrics::Metrics;
use akri_api::v0::{DeviceUsage, Instance, slot_patch};
use akri_api::v1::{INSTANCE_SOURCE_CONFIGURATION, instance_source_selector};
use akri_devices::node_lost;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use std::time::Duration;

/// How often the slots are looked at.
const CHECK: Duration = Duration::from_secs(2);

/// Which slots are looked after.
#[derive(Clone, Debug, Default)]
pub struct LegacySlotsConfig {
    /// The namespaces whose v0 Configurations the legacy device plugins serve (their
    /// Instances are there); none: nothing runs.
    pub namespaces: Vec<String>,
    /// How long a node stays not Ready before its slots are freed.
    pub node_lost_grace: Duration,
}

/// How a slot's holder stands, as the Node store has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// Its Node is there and not lost: the slot is its node's to free.
    Present,
    /// Not Ready past the grace.
    Lost,
    /// No Node of its name in the store: deleted, or too new for the store (a read decides).
    Unknown,
}

/// A slot held by a node that is not [`Holder::Present`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoneSlot {
    pub namespace: String,
    pub instance: String,
    pub slot: String,
    pub held: DeviceUsage,
    pub holder: Holder,
}

/// The slots of `instances` held by nodes that are not present. A value that does not parse
/// is nobody's to free (the legacy device plugins refuse to serve it and say so).
pub fn plan<'a>(
    instances: impl IntoIterator<Item = &'a Instance>,
    holder: impl Fn(&str) -> Holder,
) -> Vec<GoneSlot> {
    let mut gone = Vec::new();
    for instance in instances {
        for (slot, usage) in instance.spec.slot_usages() {
            let Ok(usage) = usage else { continue };
            let Some(node) = usage.node() else { continue };
            let stands = holder(node);
            if stands == Holder::Present {
                continue;
            }
            gone.push(GoneSlot {
                namespace: instance.namespace().unwrap_or_default(),
                instance: instance.name_any(),
                slot: slot.to_string(),
                held: usage.clone(),
                holder: stands,
            });
        }
    }
    gone
}

/// Frees the slots of gone nodes until dropped; with no namespace, never returns.
pub async fn run(client: kube::Client, config: LegacySlotsConfig, metrics: Metrics) {
    if config.namespaces.is_empty() {
        return std::future::pending().await;
    }
    let (nodes, node_stream) = akri_runtime::reflect_as(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        slim_node,
    );
    let mut streams = vec![node_stream.map(drop).boxed()];
    let selector = instance_source_selector(INSTANCE_SOURCE_CONFIGURATION);
    let mut instances = Vec::new();
    for namespace in &config.namespaces {
        let (store, stream) = akri_runtime::reflect(
            Api::<Instance>::namespaced(client.clone(), namespace),
            watcher::Config::default().labels(&selector),
        );
        instances.push(store);
        streams.push(stream.map(drop).boxed());
    }
    let watching = futures::stream::select_all(streams).for_each(|()| std::future::ready(()));
    let checking = async {
        let _ = nodes.wait_until_ready().await;
        for store in &instances {
            let _ = store.wait_until_ready().await;
        }
        let mut tick = tokio::time::interval(CHECK);
        loop {
            tick.tick().await;
            check(&client, &config, &nodes, &instances, &metrics).await;
        }
    };
    tokio::select! {
        () = watching => {}
        () = checking => {}
    }
}

/// One look: frees what [`plan`] finds, each deleted node confirmed by a read first.
async fn check(
    client: &kube::Client,
    config: &LegacySlotsConfig,
    nodes: &Store<Node>,
    instances: &[Store<Instance>],
    metrics: &Metrics,
) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let state: Vec<_> = instances.iter().flat_map(Store::state).collect();
    let gone = plan(state.iter().map(|i| i.as_ref()), |node| {
        match nodes.get(&ObjectRef::new(node)) {
            Some(n) if node_lost(&n, config.node_lost_grace, now) => Holder::Lost,
            Some(_) => Holder::Present,
            None => Holder::Unknown,
        }
    });
    let node_api = Api::<Node>::all(client.clone());
    for slot in gone {
        let node = slot.held.node().unwrap_or_default();
        if slot.holder == Holder::Unknown {
            match node_api.get_metadata_opt(node).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(error) => {
                    tracing::warn!(%node, %error, "cannot tell whether the node is gone; its slots stay held");
                    continue;
                }
            }
        }
        let api = Api::<Instance>::namespaced(client.clone(), &slot.namespace);
        let patch: json_patch::Patch = serde_json::from_value(slot_patch([(
            slot.slot.as_str(),
            &slot.held,
            &DeviceUsage::Free,
        )]))
        .expect("test and replace operations are valid JSON patch");
        match api
            .patch(
                &slot.instance,
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(namespace = %slot.namespace, instance = %slot.instance, slot = %slot.slot, holder = %slot.held, why = ?slot.holder, "freed a gone node's slot");
                metrics.wrote("instance", "free-slot", 1);
            }
            // Taken again or freed meanwhile, or the Instance is gone: the next look decides.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => {}
            Err(error) => {
                tracing::warn!(namespace = %slot.namespace, instance = %slot.instance, slot = %slot.slot, %error, "cannot free a gone node's slot")
            }
        }
    }
}

/// What the driver-controller reads of a Node (here and in its node store): its name and
/// Ready condition.
pub(crate) fn slim_node(node: Node) -> Node {
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .filter(|c| c.type_ == "Ready")
        .collect();
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name,
            uid: node.metadata.uid,
            resource_version: node.metadata.resource_version,
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(NodeStatus {
            conditions: Some(ready),
            ..NodeStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(name: &str, usage: &[(&str, &str)]) -> Instance {
        let usage: std::collections::BTreeMap<_, _> = usage.iter().copied().collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance",
            "metadata": { "name": name, "namespace": "cams" },
            "spec": {
                "configurationName": "cams", "cdiName": "akri.sh/c=x", "capacity": usage.len(),
                "shared": true, "nodes": [], "brokerProperties": {}, "deviceUsage": usage,
            },
        }))
        .unwrap()
    }

    #[test]
    fn only_the_slots_of_nodes_not_present_are_gone() {
        let instances = [
            instance(
                "cam",
                &[
                    ("cam-0", "here"),
                    ("cam-1", "lost"),
                    ("cam-2", ""),
                    ("cam-3", "C:1:deleted"),
                    ("cam-4", "C:bad value"),
                ],
            ),
            instance("usb", &[("usb-0", "C:0:here")]),
        ];
        let gone = plan(&instances, |node| match node {
            "here" => Holder::Present,
            "lost" => Holder::Lost,
            _ => Holder::Unknown,
        });
        let seen: Vec<_> = gone
            .iter()
            .map(|g| {
                (
                    g.instance.as_str(),
                    g.slot.as_str(),
                    g.held.to_string(),
                    g.holder,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("cam", "cam-1", "lost".to_string(), Holder::Lost),
                ("cam", "cam-3", "C:1:deleted".to_string(), Holder::Unknown),
            ]
        );
        assert!(gone.iter().all(|g| g.namespace == "cams"));
    }
}
