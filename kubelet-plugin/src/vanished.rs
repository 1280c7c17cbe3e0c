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
    let (reason, note) = if device_taints {
        (
            "DeviceVanishedWhileHeld",
            format!(
                "Device {device} of {driver} is no longer reported by its discovery handler while a claim holds it: it stays published with the {} taint (NoSchedule, NoExecute after the grace, which evicts its pods) until no claim holds it.",
                akri_devices::NOT_DISCOVERED_TAINT
            ),
        )
    } else {
        (
            "DeviceVanishedHoldersNotEvicted",
            format!(
                "Device {device} of {driver} is no longer reported by its discovery handler while a claim holds it. This API server does not keep device taints (feature gate DRADeviceTaints), so the device left its slice and the pods that hold it are not evicted; they see it Unhealthy in their status."
            ),
        )
    };
    tracing::warn!(%driver, %device, device_taints, "a held device vanished");
    tokio::spawn(crate::node_events::warn(
        client.clone(),
        node.to_string(),
        node_uid.to_string(),
        reason,
        note,
    ));
}
