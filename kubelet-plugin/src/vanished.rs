//! This node's side of [`dra_plugin::vanished`]: which devices the prepared claims hold, and
//! telling the operator when a held device vanishes.

use dra_plugin::checkpoint::PreparedClaims;
use std::collections::BTreeSet;

/// The devices of `pool` that claims prepared on this node hold. A node-local device can only
/// be used by pods on its node, so the node's prepared claims are all its holders (a claim
/// allocated but not yet prepared fails its prepare instead, with the device gone).
pub fn held_devices(prepared: &PreparedClaims, pool: &str) -> BTreeSet<String> {
    prepared
        .values()
        .flat_map(|claim| &claim.devices)
        .filter(|device| device.pool_name == pool)
        .map(|device| device.device_name.clone())
        .collect()
}

/// Logs, and records a Warning Event on the Node, that `device` vanished while a claim holds
/// it, and what follows: with device taints it stays tainted until released; without them
/// its holders keep running on a device that is gone.
pub fn announce(
    client: &kube::Client,
    node: &str,
    node_uid: &str,
    driver: &str,
    device: &str,
    device_taints: bool,
) {
    let (reason, mut note) = akri_devices::vanished_while_held(
        driver,
        device,
        "is no longer reported by its discovery handler",
        device_taints,
    );
    if !device_taints {
        note.push_str(" They see it Unhealthy in their status.");
    }
    tracing::warn!(%driver, %device, device_taints, "a held device vanished");
    tokio::spawn(crate::node_events::warn(
        client.clone(),
        node.to_string(),
        node_uid.to_string(),
        reason,
        note,
    ));
}
