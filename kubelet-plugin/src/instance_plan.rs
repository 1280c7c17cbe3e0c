//! What a pass of the [`InstanceWriter`](crate::instances::InstanceWriter) writes, decided
//! apart from the API server as `slices::plan` is: from the devices this node sees and the
//! Instances stored that name it. Another node's unshared Instance of the same name is not
//! known here (a node reads only its own): the write finds it
//! ([`InstanceWriter`](crate::instances::InstanceWriter) then renames the device).

use crate::node_devices::KnownDevice;
use akri_api::v0::{Instance, InstanceSpec};
use akri_api::v1::{INSTANCE_NODES_LABELLED, INSTANCE_SOURCE_LABEL, instance_node_label};
use kube::api::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The most Instances a node keeps of one configuration by default
/// (`--max-instances-per-configuration`): far above a site's cameras or USB devices, far
/// below what a handler fed fresh ids every scan piles up within the shared grace (20 a scan
/// made 420 in 40 s, about 30,000 at 300 s).
pub const MAX_INSTANCES_PER_CONFIGURATION: usize = 1024;

pub use crate::node_devices::Seen;

/// What to do for one device this node sees.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// The stored Instance says everything this node would apply: no write.
    Unchanged(Instance),
    /// Apply `instance`. `unforced` for an unshared Instance new to this node: a field
    /// another node's device set otherwise is then a conflict, and that Instance stays.
    Apply { instance: Instance, unforced: bool },
    /// A device new to this node whose configuration has [`Writer::max_per_configuration`]
    /// Instances here already (those within their grace included): not written, so that a
    /// handler reporting fresh ids every scan (a LAN peer answering probes with new uuids)
    /// cannot pile up Instances, brokers and slices. The caller says so in the status.
    Limited { configuration: String, kept: usize },
}

/// What to do with an Instance this node no longer sees, once its grace is over.
#[derive(Debug, PartialEq)]
pub enum Departure {
    /// This node is its only node: delete it.
    Delete(String),
    /// Other nodes still see it: give up this node's entry.
    Leave(String),
}

#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// One step per device seen, in order.
    pub steps: Vec<Step>,
    pub departures: Vec<Departure>,
}

/// How long an Instance outlives its device's disappearance from this node, so that a device
/// that comes back keeps its Instance (and the brokers and claims that follow it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grace {
    /// Node-local devices: a USB device that flaps.
    pub unshared: Duration,
    /// Shared (network) devices: an IP camera rebooting takes 60-120 s; Akri keeps their
    /// Instances 300 s.
    pub shared: Duration,
}

impl Grace {
    /// One grace for every Instance.
    pub const fn uniform(grace: Duration) -> Self {
        Grace {
            unshared: grace,
            shared: grace,
        }
    }

    /// The grace of an Instance that is `shared` or not.
    pub fn of(&self, shared: bool) -> Duration {
        match shared {
            true => self.shared,
            false => self.unshared,
        }
    }
}

/// Where the Instances are written from.
pub struct Writer<'a> {
    pub node: &'a str,
    /// [`INSTANCE_SOURCE_LABEL`]'s value.
    pub source: &'a str,
    pub grace: Grace,
    /// The configurations that exist, where known: an Instance of another one (its
    /// configuration deleted) departs without a grace, which is for devices that flap.
    pub live: Option<&'a BTreeSet<String>>,
    /// The most Instances this node keeps of one configuration ([`Step::Limited`]).
    pub max_per_configuration: usize,
}

impl Writer<'_> {
    /// The pass's plan. `vanished` (the Instances this node stopped seeing, and since when)
    /// is brought up to date: a device seen again leaves it, one gone longer than the grace
    /// departs.
    pub fn plan(
        &self,
        seen: &[Seen],
        stored: &BTreeMap<String, Instance>,
        vanished: &mut BTreeMap<String, Instant>,
        now: Instant,
    ) -> Plan {
        let mut plan = Plan::default();
        let names: BTreeSet<&str> = seen.iter().map(|(d, _, _)| d.instance.as_str()).collect();
        for (device, _, _) in seen {
            vanished.remove(&device.instance);
        }
        self.depart(stored, &names, vanished, now, &mut plan);
        // What this node keeps of each configuration after this pass's departures: the bound
        // a new device must fit under.
        let departing: BTreeSet<&str> = (plan.departures.iter())
            .map(|d| match d {
                Departure::Delete(n) | Departure::Leave(n) => n.as_str(),
            })
            .collect();
        let mut kept: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, instance) in stored {
            if !departing.contains(name.as_str()) {
                *kept
                    .entry(instance.spec.configuration_name.as_str())
                    .or_default() += 1;
            }
        }
        for (device, capacity, shared) in seen {
            let current = stored.get(&device.instance);
            if current.is_none() {
                let kept = kept.entry(device.configuration.as_str()).or_default();
                if *kept >= self.max_per_configuration {
                    plan.steps.push(Step::Limited {
                        configuration: device.configuration.clone(),
                        kept: *kept,
                    });
                    continue;
                }
                *kept += 1;
            }
            let desired = self.instance(device, *capacity, *shared);
            plan.steps.push(match current {
                Some(current) if says_already(current, &desired, self.node) => {
                    Step::Unchanged(current.clone())
                }
                current => Step::Apply {
                    instance: desired,
                    unforced: current.is_none() && !*shared,
                },
            });
        }
        plan
    }

    /// The departures of the Instances this node no longer sees (`names` are those it does).
    fn depart(
        &self,
        stored: &BTreeMap<String, Instance>,
        names: &BTreeSet<&str>,
        vanished: &mut BTreeMap<String, Instant>,
        now: Instant,
        plan: &mut Plan,
    ) {
        for (name, instance) in stored {
            if names.contains(name.as_str()) {
                continue;
            }
            let since = *vanished.entry(name.clone()).or_insert(now);
            let deleted = self
                .live
                .is_some_and(|live| !live.contains(&instance.spec.configuration_name));
            if !deleted && now.duration_since(since) < self.grace.of(instance.spec.shared) {
                continue;
            }
            let alone = instance.spec.nodes.iter().all(|n| n == self.node);
            // A held slot (the legacy path): its container may still run. Deleted, the slot's
            // holder would be forgotten and the Instance, back with its device, recreated with
            // every slot free. It stays until the slot is freed (no container behind it). A
            // slot this node holds keeps it in an Instance others share too: its slots are
            // reclaimed from the Instances that name it, so gone from `nodes` it would hold
            // the slot for ever (and the last node could never delete the Instance).
            let held = instance.spec.device_usage.values().any(|u| !u.is_empty());
            let holds = (instance.spec.slot_usages())
                .any(|(_, usage)| matches!(usage, Ok(u) if u.node() == Some(self.node)));
            if (alone && held) || holds {
                continue;
            }
            vanished.remove(name);
            plan.departures.push(match alone {
                true => Departure::Delete(name.clone()),
                false => Departure::Leave(name.clone()),
            });
        }
    }

    /// The labels this node applies: the path, its node label, and that it labels.
    fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (INSTANCE_SOURCE_LABEL.to_string(), self.source.to_string()),
            (INSTANCE_NODES_LABELLED.to_string(), "true".to_string()),
        ]);
        labels.extend(instance_node_label(self.node).map(|l| (l, "true".to_string())));
        labels
    }

    /// The Instance this node applies for `device`.
    pub fn instance(&self, device: &KnownDevice, capacity: i32, shared: bool) -> Instance {
        let (_, left_out) = akri_devices::property_attributes(&device.device.properties);
        let annotations = (!left_out.is_empty()).then(|| {
            BTreeMap::from([(
                akri_devices::UNPUBLISHED_PROPERTIES.to_string(),
                left_out.join(","),
            )])
        });
        Instance {
            metadata: ObjectMeta {
                name: Some(device.instance.clone()),
                labels: Some(self.labels()),
                annotations,
                ..ObjectMeta::default()
            },
            spec: InstanceSpec {
                configuration_name: device.configuration.clone(),
                cdi_name: format!("{}={}", akri_devices::DRIVER_DOMAIN, device.instance),
                capacity: capacity.max(1) as usize,
                broker_properties: device.device.properties.clone(),
                shared,
                nodes: vec![self.node.to_string()],
                device_usage: Default::default(),
            },
        }
    }
}

/// Whether the stored Instance `current` already says everything `desired` (what `node`
/// applies) does: its labels and annotations, its spec, `node` among its `nodes`.
pub fn says_already(current: &Instance, desired: &Instance, node: &str) -> bool {
    let (c, d) = (&current.spec, &desired.spec);
    let has_all = |current: &Option<BTreeMap<String, String>>,
                   desired: &Option<BTreeMap<String, String>>| {
        desired
            .iter()
            .flatten()
            .all(|(k, v)| current.as_ref().and_then(|c| c.get(k)) == Some(v))
    };
    c.nodes.iter().any(|n| n == node)
        && c.configuration_name == d.configuration_name
        && c.cdi_name == d.cdi_name
        && c.capacity == d.capacity
        && c.shared == d.shared
        && c.broker_properties == d.broker_properties
        && has_all(&current.metadata.labels, &desired.metadata.labels)
        && has_all(&current.metadata.annotations, &desired.metadata.annotations)
        // An annotation this node no longer sets must go: only an apply removes it.
        && (desired.metadata.annotations.is_some()
            || !current
                .metadata
                .annotations
                .iter()
                .flatten()
                .any(|(k, _)| k == akri_devices::UNPUBLISHED_PROPERTIES))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::discovery::DiscoveredDevice;
    use akri_api::v1::INSTANCE_SOURCE_DISCOVERY_CONFIGURATION;

    /// An Instance as `nodes` wrote it: each node's label on it.
    pub(crate) fn instance(nodes: &[&str], annotation: Option<&str>) -> Instance {
        let mut labels = BTreeMap::from([
            (
                INSTANCE_SOURCE_LABEL.to_string(),
                INSTANCE_SOURCE_DISCOVERY_CONFIGURATION.to_string(),
            ),
            (INSTANCE_NODES_LABELLED.to_string(), "true".to_string()),
        ]);
        labels.extend(
            nodes
                .iter()
                .flat_map(|n| instance_node_label(n))
                .map(|l| (l, "true".into())),
        );
        Instance {
            metadata: ObjectMeta {
                name: Some("cam-abcdef".into()),
                labels: Some(labels),
                annotations: annotation.map(|a| {
                    BTreeMap::from([(akri_devices::UNPUBLISHED_PROPERTIES.to_string(), a.into())])
                }),
                ..ObjectMeta::default()
            },
            spec: InstanceSpec {
                configuration_name: "cam".into(),
                cdi_name: "akri.sh=cam-abcdef".into(),
                capacity: 2,
                broker_properties: [("IP".to_string(), "10.0.0.1".to_string())].into(),
                shared: true,
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                device_usage: Default::default(),
            },
        }
    }

    fn seen(name: &str, shared: bool) -> Seen {
        let device = KnownDevice {
            configuration: "cam".into(),
            instance: name.into(),
            device: DiscoveredDevice {
                id: name.into(),
                properties: [("IP".to_string(), "10.0.0.1".to_string())].into(),
                ..DiscoveredDevice::default()
            },
        };
        (device, 2, shared)
    }

    const WRITER: Writer = Writer {
        node: "a",
        source: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
        grace: Grace {
            unshared: Duration::from_secs(30),
            shared: Duration::from_secs(300),
        },
        live: None,
        max_per_configuration: 1024,
    };

    #[test]
    fn what_is_stored_as_wanted_is_not_written_and_new_unshared_ones_go_unforced() {
        let mut stored = BTreeMap::new();
        stored.insert("cam-abcdef".to_string(), instance(&["b", "a"], None));
        // Written before nodes labelled their Instances: applied again, with the labels.
        let mut unlabelled = instance(&["a"], None);
        unlabelled.metadata.labels = Some(BTreeMap::from([(
            INSTANCE_SOURCE_LABEL.to_string(),
            INSTANCE_SOURCE_DISCOVERY_CONFIGURATION.to_string(),
        )]));
        stored.insert("cam-010101".to_string(), unlabelled);
        let seen = [
            seen("cam-abcdef", true),
            seen("cam-123456", true),
            seen("cam-777777", false),
            seen("cam-010101", true),
        ];
        let mut vanished = BTreeMap::new();
        let plan = WRITER.plan(&seen, &stored, &mut vanished, Instant::now());
        assert!(matches!(&plan.steps[0], Step::Unchanged(i) if i.spec.nodes == ["b", "a"]));
        assert!(
            matches!(&plan.steps[1], Step::Apply { instance, unforced: false } if instance.spec.nodes == ["a"]),
            "a shared Instance is applied forced: every node owns its entry"
        );
        assert!(
            matches!(&plan.steps[2], Step::Apply { unforced: true, .. }),
            "an unshared Instance new to this node is applied unforced"
        );
        assert!(
            matches!(&plan.steps[3], Step::Apply { instance, unforced: false }
                if instance.metadata.labels.as_ref().unwrap().contains_key("a.nodes.akri.sh/instance")),
            "an Instance without this node's label gets it"
        );
        assert!(plan.departures.is_empty());
    }

    /// A handler reporting fresh ids every scan (a LAN peer answering probes with new uuids):
    /// the Instances it leaves within their grace count, and new devices past the limit are
    /// not written; those it keeps, and other configurations, are.
    #[test]
    fn devices_past_the_limit_of_their_configuration_are_not_written() {
        let writer = Writer {
            max_per_configuration: 2,
            ..WRITER
        };
        let mut other = seen("mic-1", true);
        other.0.configuration = "mic".into();
        let mut vanished = BTreeMap::new();
        let start = Instant::now();
        // Scan 1 and 2: two ids each, the first scan's still within the grace.
        let stored = BTreeMap::from([
            ("cam-1".to_string(), named("cam-1", &["a"], true)),
            ("cam-2".to_string(), named("cam-2", &["a"], true)),
        ]);
        let plan = writer.plan(
            &[seen("cam-2", true), seen("cam-3", true), other],
            &stored,
            &mut vanished,
            start,
        );
        assert!(
            matches!(&plan.steps[0], Step::Unchanged(_) | Step::Apply { .. }),
            "kept"
        );
        assert_eq!(
            plan.steps[1],
            Step::Limited {
                configuration: "cam".into(),
                kept: 2
            }
        );
        assert!(
            matches!(&plan.steps[2], Step::Apply { .. }),
            "another configuration"
        );
        // cam-1 departs once its grace is over: room for one new device again.
        let later = start + Duration::from_secs(300);
        let plan = writer.plan(
            &[
                seen("cam-2", true),
                seen("cam-3", true),
                seen("cam-4", true),
            ],
            &stored,
            &mut vanished,
            later,
        );
        assert_eq!(plan.departures, [Departure::Delete("cam-1".into())]);
        assert!(
            matches!(&plan.steps[1], Step::Apply { .. }),
            "{:?}",
            plan.steps[1]
        );
        assert!(matches!(&plan.steps[2], Step::Limited { kept: 2, .. }));
    }

    /// A node watches its Instances by its label, and the admission policy tells its label
    /// from other nodes' by the name in the key: the longest names fit no key, and go without.
    #[test]
    fn an_instance_carries_its_nodes_label_where_the_name_fits_one() {
        let (device, capacity, shared) = seen("cam-abcdef", true);
        let labels = |node: &str| {
            let writer = Writer { node, ..WRITER };
            let instance = writer.instance(&device, capacity, shared);
            instance.metadata.labels.unwrap_or_default()
        };
        let fits = format!("{}.{}", "n".repeat(63), "m".repeat(175));
        let too_long = format!("{fits}m");
        assert_eq!(fits.len(), 239);
        for (node, node_label) in [
            ("a", Some("a.nodes.akri.sh/instance".to_string())),
            (&fits, Some(format!("{fits}.nodes.akri.sh/instance"))),
            (&too_long, None),
        ] {
            let mut expected = BTreeMap::from([
                (
                    INSTANCE_SOURCE_LABEL.to_string(),
                    "DiscoveryConfiguration".to_string(),
                ),
                (INSTANCE_NODES_LABELLED.to_string(), "true".to_string()),
            ]);
            expected.extend(node_label.map(|l| (l, "true".to_string())));
            assert_eq!(labels(node), expected, "node of {} characters", node.len());
        }
    }

    #[test]
    fn a_vanished_device_departs_after_the_grace_and_only_the_last_node_deletes() {
        let stored = BTreeMap::from([
            ("alone".to_string(), named("alone", &["a"], false)),
            ("with-b".to_string(), named("with-b", &["a", "b"], false)),
            ("back".to_string(), named("back", &["a"], false)),
        ]);
        let mut vanished = BTreeMap::new();
        let start = Instant::now();
        let plan = WRITER.plan(&[], &stored, &mut vanished, start);
        assert!(
            plan.departures.is_empty(),
            "within the grace nothing departs"
        );
        assert_eq!(vanished.len(), 3);
        // "back" is seen again before the grace ends: it is no longer vanished.
        let later = start + Duration::from_secs(31);
        let plan = WRITER.plan(&[seen("back", false)], &stored, &mut vanished, later);
        assert_eq!(
            plan.departures,
            [
                Departure::Delete("alone".into()),
                Departure::Leave("with-b".into())
            ]
        );
        assert!(
            vanished.is_empty(),
            "departed or seen again: none left waiting"
        );
    }

    /// A rebooting IP camera (60-120 s) keeps its Instance, and so its brokers: a shared
    /// Instance waits for the shared grace (Akri's 300 s), an unshared one only its own.
    #[test]
    fn a_shared_instance_outlives_a_reboot_that_an_unshared_one_does_not() {
        let stored = BTreeMap::from([
            ("camera".to_string(), named("camera", &["a"], true)),
            ("usb".to_string(), named("usb", &["a"], false)),
        ]);
        let mut vanished = BTreeMap::new();
        let start = Instant::now();
        WRITER.plan(&[], &stored, &mut vanished, start);
        let rebooted = start + Duration::from_secs(120);
        let plan = WRITER.plan(&[], &stored, &mut vanished, rebooted);
        assert_eq!(plan.departures, [Departure::Delete("usb".into())]);
        let back = WRITER.plan(&[seen("camera", true)], &stored, &mut vanished, rebooted);
        assert!(
            back.departures.is_empty() && !vanished.contains_key("camera"),
            "seen again: it waits no more"
        );

        // Gone for good: it departs once the shared grace is over.
        vanished.clear();
        let stored = BTreeMap::from([("camera".to_string(), named("camera", &["a"], true))]);
        WRITER.plan(&[], &stored, &mut vanished, start);
        let within = start + Duration::from_secs(299);
        let plan = WRITER.plan(&[], &stored, &mut vanished, within);
        assert!(plan.departures.is_empty());
        let after = start + Duration::from_secs(300);
        let plan = WRITER.plan(&[], &stored, &mut vanished, after);
        assert_eq!(plan.departures, [Departure::Delete("camera".into())]);
    }

    /// The last node of an Instance whose slot a container still holds keeps it (deleted, the
    /// slot would come back free); a node that holds a slot stays in an Instance others share
    /// too (its slot reclaim reads only the Instances that name it: gone from `nodes`, its
    /// slot would be held for ever, and the last node could never delete the Instance); a
    /// slot another node holds is no reason to stay.
    #[test]
    fn an_instance_with_a_held_slot_is_not_deleted_or_left_until_the_slot_is_free() {
        let mut held = named("held", &["a"], false);
        held.spec.device_usage = BTreeMap::from([
            ("held-0".to_string(), "a".to_string()),
            ("held-1".to_string(), String::new()),
        ]);
        let mut shared = named("shared", &["a", "b"], false);
        shared.spec.device_usage = BTreeMap::from([
            ("shared-0".to_string(), "C:0:a".to_string()),
            ("shared-1".to_string(), String::new()),
        ]);
        let mut others = named("others", &["a", "b"], false);
        others.spec.device_usage = BTreeMap::from([
            ("others-0".to_string(), "b".to_string()),
            ("others-1".to_string(), String::new()),
        ]);
        let stored = BTreeMap::from([
            ("held".to_string(), held.clone()),
            ("shared".to_string(), shared.clone()),
            ("others".to_string(), others),
        ]);
        let mut vanished = BTreeMap::new();
        let start = Instant::now();
        WRITER.plan(&[], &stored, &mut vanished, start);
        let later = start + Duration::from_secs(60);
        let plan = WRITER.plan(&[], &stored, &mut vanished, later);
        assert_eq!(plan.departures, [Departure::Leave("others".into())]);
        assert!(vanished.contains_key("held"), "still waiting: passes go on");
        assert!(
            vanished.contains_key("shared"),
            "still waiting: passes go on"
        );

        held.spec
            .device_usage
            .insert("held-0".into(), String::new());
        shared
            .spec
            .device_usage
            .insert("shared-0".into(), String::new());
        let stored = BTreeMap::from([("held".to_string(), held), ("shared".to_string(), shared)]);
        let plan = WRITER.plan(&[], &stored, &mut vanished, later);
        assert_eq!(
            plan.departures,
            [
                Departure::Delete("held".into()),
                Departure::Leave("shared".into())
            ]
        );
    }

    /// The grace is for devices that flap: an Instance whose configuration is deleted departs
    /// at once (a held slot still keeps it).
    #[test]
    fn an_instance_of_a_deleted_configuration_departs_without_a_grace() {
        let mut held = named("held", &["a"], true);
        held.spec.device_usage = BTreeMap::from([("held-0".to_string(), "a".to_string())]);
        let stored = BTreeMap::from([
            ("gone".to_string(), named("gone", &["a"], true)),
            ("held".to_string(), held),
        ]);
        let live = BTreeSet::from(["other".to_string()]);
        let writer = Writer {
            live: Some(&live),
            ..WRITER
        };
        let mut vanished = BTreeMap::new();
        let plan = writer.plan(&[], &stored, &mut vanished, Instant::now());
        assert_eq!(plan.departures, [Departure::Delete("gone".into())]);
        let live = BTreeSet::from(["cam".to_string()]);
        let writer = Writer {
            live: Some(&live),
            ..WRITER
        };
        let plan = writer.plan(&[], &stored, &mut BTreeMap::new(), Instant::now());
        assert!(
            plan.departures.is_empty(),
            "its configuration exists: the grace applies"
        );
    }

    fn named(name: &str, nodes: &[&str], shared: bool) -> Instance {
        let mut i = instance(nodes, None);
        i.metadata.name = Some(name.into());
        i.spec.shared = shared;
        i
    }

    #[test]
    fn an_instance_that_says_it_all_is_not_written_again() {
        let desired = instance(&["a"], None);
        assert!(says_already(&instance(&["b", "a"], None), &desired, "a"));
        assert!(
            !says_already(&instance(&["b"], None), &desired, "a"),
            "not among its nodes"
        );
        let mut changed = instance(&["a"], None);
        changed
            .spec
            .broker_properties
            .insert("IP".into(), "10.0.0.2".into());
        assert!(!says_already(&changed, &desired, "a"), "a property differs");
        let mut unlabelled = instance(&["a"], None);
        unlabelled.metadata.labels = None;
        assert!(!says_already(&unlabelled, &desired, "a"));
        assert!(
            !says_already(&instance(&["a"], Some("X")), &desired, "a"),
            "an annotation to remove"
        );
        let annotated = instance(&["a"], Some("X"));
        assert!(says_already(&instance(&["a"], Some("X")), &annotated, "a"));
        assert!(!says_already(&instance(&["a"], Some("Y")), &annotated, "a"));
    }
}
