//! A control plane with simulated nodes, each a kubelet peer (the kubelet's own device
//! manager and pod-resources server) and a node agent serving Akri v0 Configurations as
//! device plugins; shared by the legacy tests and the legacy benchmark.

use akri_api::v0::{Configuration, Instance};
use akri_kubelet_plugin::agent::AgentConfig;
use akri_kubelet_plugin::legacy::LegacyOptions;
pub use akri_testing::components::SimNode;
use akri_testing::{ControlPlane, ControlPlaneOptions, KubeletPeer, from_json};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

pub use akri_testing::eventually;

/// How long a node stays NotReady before the driver-controller frees its slots.
pub const NODE_LOST_GRACE: Duration = Duration::from_secs(6);

pub struct Cluster {
    pub cp: ControlPlane,
    pub client: kube::Client,
    pub ns: String,
    pub nodes: Vec<SimNode>,
}

/// The namespace whose v0 Configurations the agents serve (`--legacy-namespaces`), on a
/// control plane of each cluster's own.
pub const SERVED: &str = "legacy";

/// The DRA sinks' namespace where they write nothing (their configurations are mirrored
/// there, as the driver-controller does in the release namespace).
const UNUSED: &str = "unused-by-the-legacy-path";

/// A control plane of its own (every agent serves the v0 Configurations of [`SERVED`]) with
/// `nodes` simulated nodes; slots with no container are freed after `reclaim_grace`.
pub async fn cluster(nodes: usize, reclaim_grace: Duration) -> Cluster {
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace_named(SERVED).await.unwrap();
    // The DRA sinks' configurations, where the driver-controller mirrors them.
    akri_testing::components::spawn_spec_mirror(&client, UNUSED);
    let mut started = Vec::new();
    for _ in 0..nodes {
        started.push(start_node(&cp, &client, reclaim_grace).await);
    }
    Cluster {
        cp,
        client,
        ns,
        nodes: started,
    }
}

/// A cluster of one node whose DRA sink writes its Instances to [`SERVED`], beside the v0
/// Configurations' (where a v1 configuration made of one would have them).
pub async fn cluster_of_both_paths(reclaim_grace: Duration) -> Cluster {
    let mut c = cluster(0, reclaim_grace).await;
    akri_testing::components::spawn_spec_mirror(&c.client, &c.ns);
    let node = start_node_in(&c.cp, &c.client, &c.ns, reclaim_grace).await;
    c.nodes.push(node);
    c
}

pub async fn start_node(
    cp: &ControlPlane,
    client: &kube::Client,
    reclaim_grace: Duration,
) -> SimNode {
    start_node_in(cp, client, UNUSED, reclaim_grace).await
}

/// [`start_node`] with the Node name given (one that Instances already name).
pub async fn start_named(
    cp: &ControlPlane,
    client: &kube::Client,
    name: &str,
    reclaim_grace: Duration,
) -> SimNode {
    SimNode::start_named(cp, client, name, UNUSED, |config, peer| {
        legacy(config, peer, reclaim_grace)
    })
    .await
}

/// [`start_node`] whose DRA sink writes its Instances to `instance_namespace`.
pub async fn start_node_in(
    cp: &ControlPlane,
    client: &kube::Client,
    instance_namespace: &str,
    reclaim_grace: Duration,
) -> SimNode {
    SimNode::start(cp, client, instance_namespace, |config, peer| {
        legacy(config, peer, reclaim_grace)
    })
    .await
}

/// [`start_node`] as a rolling update's pod `pod_uid` (its plugins' sockets its own).
pub async fn start_pod(
    cp: &ControlPlane,
    client: &kube::Client,
    reclaim_grace: Duration,
    pod_uid: &str,
) -> SimNode {
    SimNode::start(cp, client, UNUSED, |config, peer| {
        legacy(config, peer, reclaim_grace);
        config.pod_uid = Some(pod_uid.to_string());
    })
    .await
}

/// Both sinks, shared debugEcho devices, the legacy device plugins on the peer's kubelet.
fn legacy(config: &mut AgentConfig, peer: &KubeletPeer, reclaim_grace: Duration) {
    config.debug_echo_mut().shared = true;
    config.consumable_capacity = Some(false);
    config.startup_wait = Duration::from_secs(5);
    // A pass at rest every 2 s (30 s in the product): tests wait for passes, not for time.
    config.resync = Duration::from_secs(2);
    config.legacy = Some(LegacyOptions {
        device_plugin_dir: peer.device_plugin_dir(),
        pod_resources_socket: Some(peer.pod_resources_socket()),
        reclaim_grace,
        reclaim_interval: Duration::from_millis(200),
        namespaces: [SERVED.to_string()].into(),
        broker_property_names: ["RESOLUTION".to_string()].into(),
    });
}

impl Cluster {
    /// Creates the v0 Configuration `name` over cameras `cam0`, `cam1` with capacity 2;
    /// returns its two Instance names (sorted) once both exist with every slot.
    pub async fn cameras(&self, name: &str, unique: bool) -> [String; 2] {
        self.configuration(name, &["cam0", "cam1"], 2, unique).await
    }

    /// Creates a DiscoveryConfiguration `name` of the debugEcho device `cam0` (capacity 1),
    /// made of the v0 Configuration `<namespace>/<name>` in `migrated_from` (its
    /// `akri.sh/migrated-from`, as `akri-migrate` writes it) or of none.
    pub async fn discovery_configuration(&self, name: &str, migrated_from: Option<String>) {
        let annotations: BTreeMap<String, String> = migrated_from
            .map(|from| (akri_api::v1::MIGRATED_FROM_ANNOTATION.to_string(), from))
            .into_iter()
            .collect();
        let configuration: akri_api::v1::DiscoveryConfiguration = from_json(serde_json::json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": name, "annotations": annotations },
            "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [cam0]" }, "capacity": 1 },
        }));
        Api::<akri_api::v1::DiscoveryConfiguration>::all(self.client.clone())
            .create(&PostParams::default(), &configuration)
            .await
            .unwrap();
    }

    /// The DRA path's Instances in the cluster's namespace ([`cluster_of_both_paths`]).
    pub async fn dra_instances(&self) -> Vec<Instance> {
        let selector = akri_api::v1::instance_source_selector(
            akri_api::v1::INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
        );
        (self
            .instances()
            .list(&kube::api::ListParams::default().labels(&selector)))
        .await
        .unwrap()
        .items
    }

    /// Creates a v0 Configuration of debugEcho devices; returns the Instance names (sorted)
    /// once each exists with every node and slot.
    pub async fn configuration<const N: usize>(
        &self,
        name: &str,
        descriptions: &[&str; N],
        capacity: usize,
        unique: bool,
    ) -> [String; N] {
        let config: Configuration = from_json(akri_testing::discovery::v0_debug_echo(
            name,
            descriptions,
            capacity,
            unique,
        ));
        Api::<Configuration>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
        let nodes = self.nodes.len();
        eventually("every Instance with every node and slot", async || {
            let list = self.instances().list(&Default::default()).await.ok()?;
            let mut ready: Vec<String> = list
                .items
                .iter()
                .filter(|i| i.spec.configuration_name == name)
                .filter(|i| i.spec.nodes.len() == nodes && i.spec.device_usage.len() == capacity)
                .filter_map(|i| i.metadata.name.clone())
                .collect();
            ready.sort();
            ready.try_into().ok()
        })
        .await
    }

    /// Two cameras of capacity 2, one slot of the first held by pod `on-b` on `node`; returns
    /// that camera's Instance and its instance-level resource.
    pub async fn one_slot_held_by(&self, node: &SimNode) -> (String, String) {
        let config = ControlPlane::unique_name("cams");
        let [cam1, _] = self.cameras(&config, true).await;
        let il = format!("akri.sh/{cam1}");
        registered(node, &il, 2).await;
        self.pod("on-b", &[("broker", &il, 1)]).await;
        node.peer
            .allocate(&self.ns, "on-b", "broker")
            .await
            .unwrap();
        (cam1, il)
    }

    /// The driver-controller's freeing of gone nodes' slots ([`SERVED`]'s, a lost node's
    /// after [`NODE_LOST_GRACE`]): a node frees only its own.
    pub fn slot_freer(&self) -> tokio::task::JoinHandle<()> {
        akri_testing::components::spawn_legacy_slot_freer(&self.client, &[SERVED], NODE_LOST_GRACE)
    }

    pub fn instances(&self) -> Api<Instance> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// `deviceUsage` of an Instance, read now.
    pub async fn device_usage(&self, instance: &str) -> BTreeMap<String, String> {
        self.instances()
            .get(instance)
            .await
            .unwrap()
            .spec
            .device_usage
    }

    /// `deviceUsage` of an Instance, values sorted, with `C:<vdev>:<node>` shown as
    /// `C:<node>` when `hide_vdev` (unique virtual device ids are the plugin's choice).
    pub async fn usage(&self, instance: &str, hide_vdev: bool) -> Vec<String> {
        let mut values: Vec<String> = self
            .device_usage(instance)
            .await
            .values()
            .map(
                |v| match v.strip_prefix("C:").and_then(|r| r.split_once(':')) {
                    Some((_, node)) if hide_vdev => format!("C:{node}"),
                    _ => v.clone(),
                },
            )
            .collect();
        values.sort();
        values
    }

    pub async fn slot_free(&self, instance: &str, i: u32) -> bool {
        let usage = self.device_usage(instance).await;
        usage[&slot(instance, i)].is_empty()
    }

    pub async fn pod(&self, name: &str, containers: &[(&str, &str, u32)]) {
        let containers: Vec<Value> = containers
            .iter()
            .map(|(container, resource, n)| {
                json!({
                    "name": container, "image": "broker",
                    "resources": { "limits": { *resource: n.to_string() } },
                })
            })
            .collect();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name },
            "spec": { "containers": containers },
        }))
        .unwrap();
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }
}

/// What a node's kubelet holds of `resource`: (capacity, healthy ids).
pub async fn kubelet_view(peer: &KubeletPeer, resource: &str) -> (i64, Vec<String>) {
    let capacity = peer.device_capacity().await.unwrap()["capacity"][resource]
        .as_i64()
        .unwrap_or(0);
    let healthy = peer
        .allocatable_devices()
        .await
        .unwrap()
        .remove(resource)
        .unwrap_or_default();
    (capacity, healthy)
}

/// Waits until `node`'s kubelet shows `capacity` devices of `resource`, `healthy` of them
/// healthy (ids checked when given as names).
pub async fn expect_view(node: &SimNode, resource: &str, capacity: i64, healthy: Healthy<'_>) {
    let what = format!(
        "{resource} on {}: {capacity} devices, {healthy:?}",
        node.name
    );
    eventually(&what, async || {
        let (c, h) = kubelet_view(&node.peer, resource).await;
        let ok = c == capacity
            && match &healthy {
                Healthy::Count(n) => h.len() == *n,
                Healthy::Ids(ids) => h == *ids,
            };
        ok.then_some(())
    })
    .await;
}

/// Waits until the kubelet knows `resource` with `count` healthy devices. Tests admit pods
/// directly through the kubelet (no scheduler), and the kubelet admits a pod asking for a
/// resource no plugin registered yet without giving it anything.
pub async fn registered(node: &SimNode, resource: &str, count: usize) {
    eventually(
        &format!("{resource} registered on {}", node.name),
        async || {
            let (_, healthy) = kubelet_view(&node.peer, resource).await;
            (healthy.len() == count).then_some(())
        },
    )
    .await;
}

#[derive(Debug)]
pub enum Healthy<'a> {
    Count(usize),
    Ids(Vec<&'a str>),
}

pub fn slot(instance: &str, i: u32) -> String {
    format!("{instance}-{i}")
}

/// The slot an allocation gave (Akri's `akri.agent.slot-<slot>` annotation).
pub fn allocated_slot(options: &Value) -> String {
    options["annotations"]
        .as_object()
        .and_then(|a| a.keys().find_map(|k| k.strip_prefix("akri.agent.slot-")))
        .unwrap_or_else(|| panic!("no slot annotation in {options}"))
        .to_string()
}

impl Cluster {
    /// Releases `pod` on `node` and waits until its `slot` of `instance` is no longer the
    /// node's: the reclaimer freed it (or the other node took it since).
    pub async fn release_and_reclaim(&self, node: &SimNode, pod: &str, instance: &str, slot: &str) {
        node.peer.release(&self.ns, pod).await.unwrap();
        // A plain loop: `eventually`'s async closure would make racing tasks' futures not
        // `Send`.
        let start = std::time::Instant::now();
        loop {
            let usage = self.device_usage(instance).await;
            if usage.get(slot) != Some(&node.name) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{slot} not reclaimed from {}",
                node.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
