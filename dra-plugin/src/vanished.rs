//! Devices that vanish while claims hold them: kept in the pool with a taint, not dropped.
//!
//! A device that simply leaves its ResourceSlice leaves its holders running on something that
//! is gone, and nobody is told. Instead, while a claim holds it, the device stays published:
//! at once with a `NoSchedule` taint (no new claim gets it), and after a grace with a
//! `NoExecute` taint, which the kube-controller-manager's device-taint eviction controller
//! turns into evicting the pods that use it, so their controllers replace them on a device
//! that exists. It leaves the pool when no claim holds it; a device that comes back is
//! published as it is reported, untainted.
//!
//! Where the API server drops device taints (the `DRADeviceTaints` gate is off, as by default
//! on 1.34) a tainted device would be an ordinary allocatable one, so it is not kept: the
//! caller learns which held devices vanished unprotected and says so.
//!
//! Pure bookkeeping: the caller says what is reported now, what is held and what time it is.

use k8s_openapi::api::resource::v1::{Device, DeviceTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// `DeviceTaint.effect` values.
pub const NO_SCHEDULE: &str = "NoSchedule";
/// See [`NO_SCHEDULE`].
pub const NO_EXECUTE: &str = "NoExecute";

/// Keeps vanished, held devices of one pool.
#[derive(Debug)]
pub struct VanishedDevices {
    key: String,
    grace: Duration,
    taints: bool,
    /// The devices reported at the last call, by name, as JSON: only one that vanishes while
    /// held is read back, and a controller's pools hold thousands (as structs, kilobytes
    /// each).
    last: BTreeMap<String, Box<str>>,
    /// Held devices that are no longer reported, as they were last reported, and since when.
    gone: BTreeMap<String, (Device, Timestamp)>,
}

/// What to publish now.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// The reported devices, then the vanished held ones with their taint, sorted by name.
    pub devices: Vec<Device>,
    /// Held devices that vanished at this call.
    pub newly_vanished: Vec<String>,
    /// When a taint turns `NoExecute`: call again then.
    pub next_change: Option<Timestamp>,
}

impl VanishedDevices {
    /// Taints with `key`, turning `NoExecute` after `grace`; `taints` says whether the API
    /// server keeps device taints (see [`crate::api_support::device_taints`]).
    pub fn new(key: &str, grace: Duration, taints: bool) -> Self {
        VanishedDevices {
            key: key.to_string(),
            grace,
            taints,
            last: BTreeMap::new(),
            gone: BTreeMap::new(),
        }
    }

    /// Picks up what a previous process published (the pool's stored devices), so a restart
    /// neither drops a tainted device nor restarts its grace: a device carrying this taint is
    /// vanished since the taint's time; the others count as reported before.
    pub fn seed(&mut self, stored: impl IntoIterator<Item = Device>) {
        for mut device in stored {
            let ours = device
                .taints
                .as_ref()
                .and_then(|t| t.iter().find(|t| t.key == self.key).cloned());
            strip(&mut device, &self.key);
            match ours {
                Some(taint) => {
                    let added = taint.time_added.map_or_else(Timestamp::now, |t| t.0);
                    let since = if taint.effect == NO_EXECUTE {
                        added - self.grace_signed()
                    } else {
                        added
                    };
                    self.gone.insert(device.name.clone(), (device, since));
                }
                None => {
                    self.last
                        .insert(device.name.clone(), crate::slices::to_json(&device));
                }
            }
        }
    }

    /// The devices to publish, given those `reported` now and the names of those a claim
    /// `held` holds.
    pub fn plan(&mut self, reported: Vec<Device>, held: &BTreeSet<String>, now: Timestamp) -> Plan {
        let reported: BTreeMap<String, Device> =
            reported.into_iter().map(|d| (d.name.clone(), d)).collect();
        let mut plan = Plan::default();
        let last = std::mem::take(&mut self.last);
        for (name, device) in last {
            if !reported.contains_key(&name) && held.contains(&name) {
                let device = serde_json::from_str(&device).unwrap_or_else(|_| Device {
                    name: name.clone(),
                    ..Device::default()
                });
                // Whole seconds: the API server stores taint times so, and a publisher that
                // compares with what is stored must see the same value.
                let since = Timestamp::from_second(now.as_second()).unwrap_or(now);
                self.gone.insert(name.clone(), (device, since));
                plan.newly_vanished.push(name);
            }
        }
        self.gone
            .retain(|name, _| held.contains(name) && !reported.contains_key(name));

        self.last = reported
            .iter()
            .map(|(n, d)| (n.clone(), crate::slices::to_json(d)))
            .collect();
        plan.devices = reported.into_values().collect();
        if self.taints {
            for (device, since) in self.gone.values() {
                let evict_at = *since + self.grace_signed();
                let (effect, added) = if now >= evict_at {
                    (NO_EXECUTE, evict_at)
                } else {
                    plan.next_change = Some(plan.next_change.map_or(evict_at, |t| t.min(evict_at)));
                    (NO_SCHEDULE, *since)
                };
                let mut device = device.clone();
                device
                    .taints
                    .get_or_insert_with(Vec::new)
                    .push(DeviceTaint {
                        key: self.key.clone(),
                        effect: effect.to_string(),
                        time_added: Some(Time(added)),
                        value: None,
                    });
                plan.devices.push(device);
            }
            plan.devices.sort_by(|a, b| a.name.cmp(&b.name));
        }
        plan
    }

    /// Whether `name` is kept only because a claim holds it.
    #[cfg(test)]
    pub(crate) fn is_vanished(&self, name: &str) -> bool {
        self.gone.contains_key(name)
    }

    /// Whether any device is kept only because a claim holds it: the caller must plan again
    /// when a claim is released.
    pub fn any_vanished(&self) -> bool {
        !self.gone.is_empty()
    }

    fn grace_signed(&self) -> SignedDuration {
        SignedDuration::try_from(self.grace).unwrap_or(SignedDuration::MAX)
    }
}

fn strip(device: &mut Device, key: &str) {
    if let Some(taints) = &mut device.taints {
        taints.retain(|t| t.key != key);
        if taints.is_empty() {
            device.taints = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "example.com/vanished";

    fn device(name: &str) -> Device {
        Device {
            name: name.into(),
            ..Device::default()
        }
    }

    fn held(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    /// (name, effect of our taint or "").
    fn shown(plan: &Plan) -> Vec<(String, String)> {
        plan.devices
            .iter()
            .map(|d| {
                let effect = d
                    .taints
                    .iter()
                    .flatten()
                    .find(|t| t.key == KEY)
                    .map_or(String::new(), |t| t.effect.clone());
                (d.name.clone(), effect)
            })
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(n, e)| (n.to_string(), e.to_string()))
            .collect()
    }

    #[test]
    fn a_held_device_that_vanishes_is_tainted_then_evicting_then_dropped_when_released() {
        let mut v = VanishedDevices::new(KEY, Duration::from_secs(60), true);
        v.plan(vec![device("a"), device("b")], &held(&["a"]), at(0));

        let plan = v.plan(vec![device("b")], &held(&["a"]), at(10));
        assert_eq!(shown(&plan), pairs(&[("a", NO_SCHEDULE), ("b", "")]));
        assert_eq!(plan.newly_vanished, ["a"]);
        assert_eq!(plan.next_change, Some(at(70)));

        let plan = v.plan(vec![device("b")], &held(&["a"]), at(69));
        assert_eq!(shown(&plan), pairs(&[("a", NO_SCHEDULE), ("b", "")]));
        assert!(plan.newly_vanished.is_empty());

        let plan = v.plan(vec![device("b")], &held(&["a"]), at(70));
        assert_eq!(shown(&plan), pairs(&[("a", NO_EXECUTE), ("b", "")]));
        assert!(v.is_vanished("a") && v.any_vanished());
        let taint = &plan.devices[0].taints.as_ref().unwrap()[0];
        assert_eq!(taint.time_added, Some(Time(at(70))));
        assert_eq!(plan.next_change, None);

        let plan = v.plan(vec![device("b")], &held(&[]), at(80));
        assert_eq!(shown(&plan), pairs(&[("b", "")]));
        assert!(!v.is_vanished("a") && !v.any_vanished());
    }

    #[test]
    fn an_unheld_device_that_vanishes_leaves_at_once() {
        let mut v = VanishedDevices::new(KEY, Duration::from_secs(60), true);
        v.plan(vec![device("a"), device("b")], &held(&["b"]), at(0));
        let plan = v.plan(vec![device("b")], &held(&["b"]), at(1));
        assert_eq!(shown(&plan), pairs(&[("b", "")]));
        assert!(plan.newly_vanished.is_empty());
    }

    #[test]
    fn a_device_that_comes_back_is_published_as_reported_untainted() {
        let mut v = VanishedDevices::new(KEY, Duration::from_secs(60), true);
        v.plan(vec![device("a")], &held(&["a"]), at(0));
        v.plan(vec![], &held(&["a"]), at(1));
        let plan = v.plan(vec![device("a")], &held(&["a"]), at(100));
        assert_eq!(shown(&plan), pairs(&[("a", "")]));
        assert!(plan.devices[0].taints.is_none());
        // And vanishing again starts a new grace.
        let plan = v.plan(vec![], &held(&["a"]), at(200));
        assert_eq!(shown(&plan), pairs(&[("a", NO_SCHEDULE)]));
        assert_eq!(plan.next_change, Some(at(260)));
    }

    #[test]
    fn without_device_taints_a_vanished_device_leaves_and_is_named() {
        let mut v = VanishedDevices::new(KEY, Duration::from_secs(60), false);
        v.plan(vec![device("a")], &held(&["a"]), at(0));
        let plan = v.plan(vec![], &held(&["a"]), at(1));
        assert!(plan.devices.is_empty());
        assert_eq!(plan.newly_vanished, ["a"]);
        assert_eq!(plan.next_change, None);
    }

    #[test]
    fn a_restart_keeps_tainted_devices_and_their_grace() {
        let mut before = VanishedDevices::new(KEY, Duration::from_secs(60), true);
        before.plan(vec![device("a"), device("b")], &held(&["a", "b"]), at(0));
        before.plan(vec![device("b")], &held(&["a", "b"]), at(10));
        let stored = before
            .plan(vec![device("b")], &held(&["a", "b"]), at(20))
            .devices;

        let mut after = VanishedDevices::new(KEY, Duration::from_secs(60), true);
        after.seed(stored.clone());
        let plan = after.plan(vec![device("b")], &held(&["a", "b"]), at(30));
        assert_eq!(plan.devices, stored, "the restart changes nothing");
        assert_eq!(plan.next_change, Some(at(70)));
        let evicting = after
            .plan(vec![device("b")], &held(&["a", "b"]), at(70))
            .devices;

        // Seeded with a NoExecute taint, the device stays NoExecute at the same time.
        let mut again = VanishedDevices::new(KEY, Duration::from_secs(60), true);
        again.seed(evicting.clone());
        assert_eq!(
            again
                .plan(vec![device("b")], &held(&["a", "b"]), at(90))
                .devices,
            evicting
        );
        // And a seeded, reported device that then vanishes is noticed.
        let plan = again.plan(vec![], &held(&["a", "b"]), at(95));
        assert_eq!(plan.newly_vanished, ["b"]);
    }

    #[test]
    fn other_taints_of_a_device_are_kept() {
        let mut v = VanishedDevices::new(KEY, Duration::from_secs(60), true);
        let mut a = device("a");
        a.taints = Some(vec![DeviceTaint {
            key: "other.example.com/x".into(),
            effect: NO_SCHEDULE.into(),
            ..DeviceTaint::default()
        }]);
        v.plan(vec![a], &held(&["a"]), at(0));
        let plan = v.plan(vec![], &held(&["a"]), at(1));
        let keys: Vec<_> = plan.devices[0]
            .taints
            .iter()
            .flatten()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(keys, ["other.example.com/x", KEY]);
    }
}
