//! What the broker-controller's suites share: the components from [`akri_testing::components`],
//! and a node whose debugEcho devices are shared (seen by every node, as IP cameras are).

#![allow(dead_code, reason = "each suite uses some of these")]

use akri_kubelet_plugin::agent::AgentConfig;
pub use akri_testing::components::{
    SimNode, akri_and_apps, instances, spawn_broker_controller, spawn_broker_controller_serving,
    spawn_driver_controller, wait_reported,
};
use akri_testing::{ControlPlane, KubeletPeer};

/// Starts a node whose agent writes Instances to `instance_namespace`, its debugEcho devices
/// shared, after `configure` had its say; returns once the agent's DRA plugin is registered
/// with the node's kubelet (so a pod can be prepared there).
pub async fn start_node(
    cp: &ControlPlane,
    client: &kube::Client,
    instance_namespace: &str,
    configure: impl FnOnce(&mut AgentConfig, &KubeletPeer),
) -> SimNode {
    SimNode::start(cp, client, instance_namespace, |config, peer| {
        config.debug_echo_mut().shared = true;
        configure(config, peer);
    })
    .await
    .registered()
    .await
}
