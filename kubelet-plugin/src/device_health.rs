//! The health a node's DRA drivers report of their devices ([`dra_plugin::health`]): devices
//! published and answering are healthy; a device gone while a claim holds it is unhealthy
//! until it returns or is released.

use crate::node_devices::KnownDevice;
use k8s_openapi::api::resource::v1::Device;
use std::collections::BTreeSet;

/// A driver's devices' health: published devices are healthy; a device published before and
/// gone now is unhealthy (pods that still hold it learn it from the kubelet) until it
/// returns, and forgotten once nothing holds it (nobody asks about it any more).
#[derive(Debug, Default)]
pub(crate) struct Health {
    ever_published: BTreeSet<String>,
    /// Published before, gone now, still held.
    pub gone: BTreeSet<String>,
}

impl Health {
    /// `now`: the devices published now; `held`: those prepared claims hold. Returns the
    /// devices to forget; [`Health::gone`] is then what is unhealthy.
    pub fn update(&mut self, now: BTreeSet<String>, held: &BTreeSet<String>) -> BTreeSet<String> {
        let forget: BTreeSet<String> = (self.ever_published.iter())
            .filter(|name| !now.contains(*name) && !held.contains(*name))
            .cloned()
            .collect();
        self.ever_published.retain(|name| !forget.contains(name));
        self.gone = self.ever_published.difference(&now).cloned().collect();
        self.ever_published.extend(now);
        forget
    }
}

/// What a driver tells the kubelet of its devices' health.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct HealthPlan {
    /// Published and their handler answers.
    pub healthy: Vec<String>,
    /// Gone while a claim still holds them.
    pub unhealthy: Vec<String>,
    /// Gone and held by nothing: nobody asks about them any more.
    pub forget: Vec<String>,
}

/// The health of a driver's devices: healthy those `local` has whose configuration is
/// `answering`, unhealthy those `gone` that claims still hold: planned on a pass
/// ([`crate::device_plan`]), and vouched between passes
/// ([`crate::dra_sink::DraSink::vouch`]).
pub(crate) fn plan(
    local: &[(Device, KnownDevice)],
    answering: &BTreeSet<String>,
    gone: &BTreeSet<String>,
) -> HealthPlan {
    HealthPlan {
        healthy: (local.iter())
            .filter(|(_, known)| answering.contains(&known.configuration))
            .map(|(device, _)| device.name.clone())
            .collect(),
        unhealthy: gone.iter().cloned().collect(),
        forget: Vec::new(),
    }
}

/// Tells the kubelet, through a driver's `health` reporter, what `plan` says of its devices in
/// `pool`.
pub(crate) fn tell(health: &dra_plugin::health::HealthReporter, pool: &str, plan: &HealthPlan) {
    for name in &plan.forget {
        health.remove(pool, name);
    }
    for name in &plan.healthy {
        health.set(pool, name, true, "");
    }
    for name in &plan.unhealthy {
        health.set(
            pool,
            name,
            false,
            "its discovery handler no longer reports it",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_gone_device_is_unhealthy_while_held_and_forgotten_once_released() {
        let mut health = Health::default();
        assert!(health.update(set(&["a", "b"]), &set(&[])).is_empty());
        assert!(health.gone.is_empty());

        // b goes while a claim holds it: unhealthy, and the claims now matter.
        assert!(health.update(set(&["a"]), &set(&["b"])).is_empty());
        assert_eq!(health.gone, set(&["b"]));

        // Released: forgotten, nothing left to wait for.
        assert_eq!(health.update(set(&["a"]), &set(&[])), set(&["b"]));
        assert!(health.gone.is_empty());

        // A device that comes back is healthy again, not gone.
        health.update(set(&["a"]), &set(&["a"]));
        assert!(health.update(set(&["a", "b"]), &set(&[])).is_empty());
        assert!(health.gone.is_empty());
    }

    #[test]
    fn a_device_gone_and_unheld_is_forgotten_at_once() {
        let mut health = Health::default();
        health.update(set(&["a", "b"]), &set(&[]));
        assert_eq!(health.update(set(&["a"]), &set(&[])), set(&["b"]));
        assert!(health.gone.is_empty());
    }
}
