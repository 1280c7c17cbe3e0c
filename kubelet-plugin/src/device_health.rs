//! The health a node's DRA drivers report of their devices ([`dra_plugin::health`]): devices
//! published and answering are healthy; a device gone while a claim holds it is unhealthy
//! until it returns or is released.

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

/// Vouches for a driver's devices in `pool`: healthy those `local` has whose configuration
/// is `answering`, unhealthy those gone that claims still hold.
pub(crate) fn vouch(
    health: &dra_plugin::health::HealthReporter,
    gone: &BTreeSet<String>,
    pool: &str,
    local: &[(
        k8s_openapi::api::resource::v1::Device,
        crate::node_devices::KnownDevice,
    )],
    answering: &BTreeSet<String>,
) {
    for (device, known) in local {
        if answering.contains(&known.configuration) {
            health.set(pool, &device.name, true, "");
        }
    }
    for name in gone {
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
