//! What the broker-controller's suites (and the migration's equivalence test) share: both
//! controllers started in the test's runtime, reacting within 100 ms, and the Instances of a
//! configuration with the nodes that reach them, and a simulated node (kubelet peer + node
//! agent with the embedded debugEcho handler).

#![allow(dead_code, reason = "each suite uses some of these")]

use akri_api::v1::Instance;
use akri_broker_controller::controller::{self, ControllerConfig};
use akri_broker_controller::metrics::Metrics;
use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_testing::{ControlPlane, KubeletPeer};
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The driver-controller (DeviceClasses, shared devices) for the Instances in `namespace`.
pub fn spawn_driver_controller(client: &kube::Client, namespace: &str) -> JoinHandle<()> {
    let mut config = akri_driver_controller::controller::ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    let client = client.clone();
    tokio::spawn(async move {
        akri_driver_controller::controller::run(client, config, Default::default())
            .await
            .expect("driver-controller runs")
    })
}

/// The broker-controller for the Instances in `namespace`, and its metrics.
pub fn spawn_broker_controller(
    client: &kube::Client,
    namespace: &str,
) -> (JoinHandle<()>, Metrics) {
    let mut config = ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    let metrics = Metrics::default();
    let task = tokio::spawn(controller::run(client.clone(), config, metrics.clone()));
    (task, metrics)
}

/// The Instances of `configuration` in `namespace` (name -> sorted nodes that reach it), once
/// `ready` says they are all there.
pub async fn instances(
    client: &kube::Client,
    namespace: &str,
    configuration: &str,
    ready: impl Fn(&BTreeMap<String, Vec<String>>) -> bool,
) -> BTreeMap<String, Vec<String>> {
    let api = Api::<Instance>::namespaced(client.clone(), namespace);
    let what = format!("the Instances of {configuration} in {namespace}");
    akri_testing::eventually(&what, Duration::from_secs(90), async || {
        let list = api.list(&Default::default()).await.ok()?;
        let found: BTreeMap<String, Vec<String>> = list
            .items
            .iter()
            .filter(|i| i.spec.configuration_name == configuration)
            .map(|i| {
                let mut nodes = i.spec.nodes.clone();
                nodes.sort();
                (i.name_any(), nodes)
            })
            .collect();
        ready(&found).then_some(found)
    })
    .await
}

/// A node: a Node object, the kubelet's own managers (peer) and the node agent.
pub struct SimNode {
    pub name: String,
    pub peer: KubeletPeer,
    /// The agent's state directory (its debugEcho availability file can go there).
    pub dir: tempfile::TempDir,
    _agent: agent::Agent,
}

/// Starts a node whose agent writes Instances to `instance_namespace`, its debugEcho devices
/// shared, after `configure` had its say; returns once the agent's DRA plugin is registered
/// with the node's kubelet (so a pod can be prepared there).
pub async fn start_node(
    cp: &ControlPlane,
    client: &kube::Client,
    instance_namespace: &str,
    configure: impl FnOnce(&mut AgentConfig, &KubeletPeer, &std::path::Path),
) -> SimNode {
    let name = ControlPlane::unique_name("node");
    cp.create_node(&name).await.unwrap();
    let peer = KubeletPeer::start(cp, &name).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::embedded(&name, instance_namespace, dir.path()).kubelet_dirs(
        peer.registry_dir(),
        peer.plugins_dir(),
        peer.cdi_dir(),
    );
    config.debug_echo_mut().shared = true;
    configure(&mut config, &peer, dir.path());
    let agent = agent::start(client.clone(), config)
        .await
        .expect("agent starts");
    peer.wait_for_driver("debugecho.akri.sh", Duration::from_secs(60))
        .await
        .expect("the kubelet-plugin registers");
    SimNode {
        name,
        peer,
        dir,
        _agent: agent,
    }
}
