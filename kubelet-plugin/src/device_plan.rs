//! What the node writes of what it discovered, planned with no I/O: per served DRA driver its
//! pool (held devices that vanished kept, tainted) and its devices' health; the Instances of
//! each path (the DRA one, and per listed namespace the legacy one); the device plugins'
//! device lists; and this node's `status.discoveryErrors` entries.
//!
//! [`NodePlan`](crate::node_plan::NodePlan) decides what to discover; this decides what to
//! write of it. The loop ([`crate::node_loop`]) has each sink read its part of the state
//! ([`crate::sink::ApplyPlan::observe`]), plans here, and hands each sink its part of the
//! plan to apply. The state includes what earlier passes left: since when a held device is
//! gone, since when an Instance's device is, which devices were ever published. The plan
//! brings that memory up to date; everything else it only reads.

use crate::device_health::{self, Health, HealthPlan};
use crate::discovery::DiscoveredDevice;
use crate::instance_plan::{self, Seen};
use crate::node_devices::{ConfigDevices, KnownDevice};
use akri_api::v0::{Configuration, Instance};
use akri_legacy_device_plugin::plugins::{ConfigurationDevices, DeviceEdits};
use dra_plugin::vanished::VanishedDevices;
use k8s_openapi::api::resource::v1::Device;
use k8s_openapi::jiff::Timestamp;
use kubelet_proto::deviceplugin::v1beta1 as api;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

/// What a pass plans from: each sink's part of the node's state, and the time.
#[derive(Default)]
pub(crate) struct NodeState<'a> {
    /// The DRA drivers whose pools are published this pass (those whose devices changed).
    pub pools: Vec<PoolState<'a>>,
    /// The Instances of each path this pass writes.
    pub instances: Vec<InstancesState<'a>>,
    /// The device plugins' inputs (the legacy sink).
    pub device_plugins: Option<DevicePluginState>,
}

/// A DRA driver's pool on this node.
pub(crate) struct PoolState<'a> {
    pub driver: String,
    /// The node-local devices discovery reports now, as DRA devices.
    pub local: Vec<(Device, KnownDevice)>,
    /// The devices the claims prepared on this node hold.
    pub held: BTreeSet<String>,
    /// The configurations whose handler answers: their devices are healthy.
    pub answering: BTreeSet<String>,
    /// The held devices that vanished, and since when (from earlier passes).
    pub vanished: &'a mut VanishedDevices,
    /// The devices ever published, and which of them are gone (from earlier passes).
    pub health: &'a mut Health,
}

/// Which Instances: the DRA path's, or the legacy path's of a namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum InstancePath {
    Dra,
    Legacy(String),
}

/// The Instances of one path on this node.
pub(crate) struct InstancesState<'a> {
    pub path: InstancePath,
    /// How they are written (labels, grace, limit, the configurations that exist).
    pub writer: instance_plan::Writer<'a>,
    /// The devices this node sees, with their configuration's capacity and sharing.
    pub seen: Vec<Seen>,
    /// The stored Instances that name this node.
    pub stored: BTreeMap<String, Instance>,
    /// The Instances whose device this node stopped seeing, and since when.
    pub vanished: &'a mut BTreeMap<String, Instant>,
}

/// What the device plugins serve from.
pub(crate) struct DevicePluginState {
    /// The v0 Configurations served ([`crate::node_plan::NodePlan::served_v0`]).
    pub served: Vec<Arc<Configuration>>,
    /// Per namespace, the configurations' devices and the devices with their Instance names.
    pub namespaces: BTreeMap<String, (Vec<ConfigDevices>, Vec<Seen>)>,
    /// The `brokerProperties` names handed to containers.
    pub broker_property_names: BTreeSet<String>,
}

/// What the node writes this pass.
#[derive(Debug, Default)]
pub(crate) struct DevicePlan {
    pub pools: Vec<PoolPlan>,
    pub instances: Vec<InstancesPlan>,
    /// The device plugins' lists; `None`: the legacy sink did not observe (not serving yet).
    pub device_plugins: Option<Vec<ConfigurationDevices>>,
}

/// The writes of one path's Instances.
#[derive(Debug)]
pub(crate) struct InstancesPlan {
    pub path: InstancePath,
    pub plan: instance_plan::Plan,
    /// What the plan was made from (a departure the API server refuses is said of its
    /// configuration).
    pub stored: BTreeMap<String, Instance>,
}

/// A driver's pool: what to publish and what to say of its devices' health.
#[derive(Debug, PartialEq)]
pub(crate) struct PoolPlan {
    pub driver: String,
    /// The devices to publish, the vanished held ones with their taint.
    pub slices: dra_plugin::vanished::Plan,
    pub health: HealthPlan,
}

impl DevicePlan {
    /// The plan of everything `state` says; its memory (vanished devices, graces, health) is
    /// brought up to date.
    pub fn of(state: NodeState, now: Timestamp, instant: Instant) -> DevicePlan {
        let pools = (state.pools.into_iter())
            .map(|pool| pool_plan(pool, now))
            .collect();
        let instances = (state.instances.into_iter())
            .map(|i| InstancesPlan {
                plan: (i.writer).plan(&i.seen, &i.stored, i.vanished, instant),
                path: i.path,
                stored: i.stored,
            })
            .collect();
        DevicePlan {
            pools,
            instances,
            device_plugins: state.device_plugins.as_ref().map(device_plugins),
        }
    }

    /// Takes the plan of `path`'s Instances out of the plan.
    pub fn take_instances(&mut self, path: &InstancePath) -> Option<InstancesPlan> {
        let at = self.instances.iter().position(|i| i.path == *path)?;
        Some(self.instances.remove(at))
    }
}

fn pool_plan(pool: PoolState, now: Timestamp) -> PoolPlan {
    let reported: Vec<Device> = pool.local.iter().map(|(d, _)| d.clone()).collect();
    let slices = pool.vanished.plan(reported, &pool.held, now);
    let published: BTreeSet<String> = pool.local.iter().map(|(d, _)| d.name.clone()).collect();
    let forget = pool.health.update(published, &pool.held);
    PoolPlan {
        driver: pool.driver,
        slices,
        health: HealthPlan {
            forget: forget.into_iter().collect(),
            ..device_health::plan(&pool.local, &pool.answering, &pool.health.gone)
        },
    }
}

/// What the device plugins serve: per served Configuration its devices and what a container
/// allocated one gets, of the `brokerProperties` only the allowed names.
fn device_plugins(state: &DevicePluginState) -> Vec<ConfigurationDevices> {
    let mut served = Vec::new();
    for (namespace, (configs, seen)) in &state.namespaces {
        for config in configs {
            let v0 = (state.served.iter()).find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && c.metadata.name.as_deref() == Some(&config.configuration)
            });
            let Some(v0) = v0 else {
                continue;
            };
            let mut broker_properties = v0.spec.broker_properties.clone();
            broker_properties.retain(|name, _| state.broker_property_names.contains(name));
            let instances = (seen.iter())
                .filter(|(d, _, _)| d.configuration == config.configuration)
                .map(|(d, _, _)| (d.instance.clone(), edits(&broker_properties, &d.device)))
                .collect();
            served.push(ConfigurationDevices {
                namespace: namespace.clone(),
                name: config.configuration.clone(),
                unique_devices: config.unique_devices,
                instances,
            });
        }
    }
    served
}

/// What a container allocated a device gets: the Configuration's `brokerProperties` and the
/// device's properties as environment (the device's win, as in its Instance), its mounts and
/// device nodes.
fn edits(broker_properties: &BTreeMap<String, String>, device: &DiscoveredDevice) -> DeviceEdits {
    let mut envs = broker_properties.clone();
    envs.extend(device.properties.clone());
    DeviceEdits {
        envs,
        mounts: (device.mounts.iter())
            .map(|m| api::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        devices: (device.device_specs.iter())
            .map(|d| api::DeviceSpec {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
    }
}

/// Why configurations fail on this node, by configuration: what its
/// `status.discoveryErrors` entry for the node says.
pub(crate) struct StatusState<'a> {
    /// Not discovered here on purpose: held back for a v0 namesake ([`crate::same_name`]).
    pub held_back: &'a BTreeMap<String, String>,
    /// Its discovery properties cannot be read.
    pub properties: &'a BTreeMap<String, String>,
    /// Its discovery (the handler's stream) fails.
    pub discovery: &'a BTreeMap<String, String>,
    /// One of its Instances was refused by the API server on this pass's write, or was left
    /// out (the limit): its other Instances are written.
    pub instances: &'a BTreeMap<String, String>,
}

/// This node's `status.discoveryErrors` entry per configuration: one message each, the first
/// of held back, properties, discovery, Instances. Planned last in a pass, from the state its
/// writes left (an Instance refused now shows now).
pub(crate) fn status_entries(state: &StatusState) -> BTreeMap<String, String> {
    let mut entries = state.instances.clone();
    for reasons in [state.discovery, state.properties, state.held_back] {
        entries.extend(reasons.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance_plan::{Departure, Grace, Step, Writer};
    use akri_api::v1::INSTANCE_SOURCE_DISCOVERY_CONFIGURATION;
    use std::time::Duration;

    const GRACE: Duration = Duration::from_secs(60);

    fn known(configuration: &str, name: &str, properties: &[(&str, &str)]) -> KnownDevice {
        KnownDevice {
            configuration: configuration.into(),
            instance: name.into(),
            device: DiscoveredDevice {
                id: name.into(),
                properties: (properties.iter())
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..DiscoveredDevice::default()
            },
        }
    }

    fn local(names: &[&str]) -> Vec<(Device, KnownDevice)> {
        (names.iter())
            .map(|name| {
                let device = Device {
                    name: name.to_string(),
                    ..Device::default()
                };
                (device, known("usb", name, &[]))
            })
            .collect()
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    /// One pool over successive passes: what each reports and holds, and what it plans.
    #[test]
    fn a_pool_keeps_held_devices_that_vanish_and_forgets_the_others() {
        struct Pass {
            what: &'static str,
            reported: &'static [&'static str],
            held: &'static [&'static str],
            answering: &'static [&'static str],
            after: Duration,
            /// (device, its taint's effect) as published.
            published: &'static [(&'static str, Option<&'static str>)],
            newly_vanished: &'static [&'static str],
            healthy: &'static [&'static str],
            unhealthy: &'static [&'static str],
            forget: &'static [&'static str],
        }
        let passes = [
            Pass {
                what: "two devices, their handler answering",
                reported: &["a", "b"],
                held: &[],
                answering: &["usb"],
                after: Duration::ZERO,
                published: &[("a", None), ("b", None)],
                newly_vanished: &[],
                healthy: &["a", "b"],
                unhealthy: &[],
                forget: &[],
            },
            Pass {
                what: "b vanishes while a claim holds it: kept, tainted NoSchedule, unhealthy",
                reported: &["a"],
                held: &["b"],
                answering: &["usb"],
                after: Duration::from_secs(1),
                published: &[("a", None), ("b", Some("NoSchedule"))],
                newly_vanished: &["b"],
                healthy: &["a"],
                unhealthy: &["b"],
                forget: &[],
            },
            Pass {
                what: "past the grace its taint is NoExecute; a's handler stopped answering",
                reported: &["a"],
                held: &["b"],
                answering: &[],
                after: GRACE,
                published: &[("a", None), ("b", Some("NoExecute"))],
                newly_vanished: &[],
                healthy: &[],
                unhealthy: &["b"],
                forget: &[],
            },
            Pass {
                what: "released: b leaves the pool and is forgotten",
                reported: &["a"],
                held: &[],
                answering: &["usb"],
                after: Duration::from_secs(1),
                published: &[("a", None)],
                newly_vanished: &[],
                healthy: &["a"],
                unhealthy: &[],
                forget: &["b"],
            },
            Pass {
                what: "a vanishes with nothing holding it: gone at once",
                reported: &[],
                held: &[],
                answering: &["usb"],
                after: Duration::from_secs(1),
                published: &[],
                newly_vanished: &[],
                healthy: &[],
                unhealthy: &[],
                forget: &["a"],
            },
        ];
        let mut vanished = VanishedDevices::new(akri_devices::NOT_DISCOVERED_TAINT, GRACE, true);
        let mut health = Health::default();
        let mut now = Timestamp::from_second(1_800_000_000).unwrap();
        for pass in passes {
            now += pass.after;
            let state = NodeState {
                pools: vec![PoolState {
                    driver: "usb.akri.sh".into(),
                    local: local(pass.reported),
                    held: set(pass.held),
                    answering: set(pass.answering),
                    vanished: &mut vanished,
                    health: &mut health,
                }],
                ..NodeState::default()
            };
            let mut plan = DevicePlan::of(state, now, Instant::now());
            let pool = plan.pools.pop().expect("one pool");
            let published: Vec<(String, Option<String>)> = (pool.slices.devices.iter())
                .map(|d| {
                    let taint = (d.taints.iter().flatten()).next();
                    (d.name.clone(), taint.map(|t| t.effect.clone()))
                })
                .collect();
            let expected: Vec<(String, Option<String>)> = (pass.published.iter())
                .map(|(n, e)| (n.to_string(), e.map(String::from)))
                .collect();
            assert_eq!(published, expected, "{}", pass.what);
            assert_eq!(
                pool.slices.newly_vanished,
                names(pass.newly_vanished),
                "{}",
                pass.what
            );
            let health = HealthPlan {
                healthy: names(pass.healthy),
                unhealthy: names(pass.unhealthy),
                forget: names(pass.forget),
            };
            assert_eq!(pool.health, health, "{}", pass.what);
        }
    }

    fn stored(name: &str, configuration: &str) -> Instance {
        let writer = writer(None);
        let mut instance = writer.instance(&known(configuration, name, &[]), 1, false);
        instance.metadata.resource_version = Some("1".into());
        instance
    }

    fn writer(live: Option<&BTreeSet<String>>) -> Writer<'_> {
        Writer {
            node: "node-a",
            source: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
            grace: Grace::uniform(GRACE),
            live,
            max_per_configuration: 2,
        }
    }

    /// The Instances of one path: what is seen and stored, and the steps and departures.
    #[test]
    fn instances_are_planned_from_what_is_seen_and_what_is_stored() {
        struct Case {
            what: &'static str,
            /// Devices of configuration `usb`.
            seen: &'static [&'static str],
            /// (name, configuration)
            stored: &'static [(&'static str, &'static str)],
            live: Option<&'static [&'static str]>,
            /// Since the device of a stored Instance went.
            gone_for: Duration,
            applied: &'static [&'static str],
            deleted: &'static [&'static str],
        }
        let cases = [
            Case {
                what: "a new device is applied",
                seen: &["a"],
                stored: &[],
                live: None,
                gone_for: Duration::ZERO,
                applied: &["a"],
                deleted: &[],
            },
            Case {
                what: "a stored Instance that says it all is not",
                seen: &["a"],
                stored: &[("a", "usb")],
                live: None,
                gone_for: Duration::ZERO,
                applied: &[],
                deleted: &[],
            },
            Case {
                what: "a gone device's Instance stays within the grace",
                seen: &[],
                stored: &[("a", "usb")],
                live: None,
                gone_for: Duration::from_secs(1),
                applied: &[],
                deleted: &[],
            },
            Case {
                what: "and is deleted after it",
                seen: &[],
                stored: &[("a", "usb")],
                live: None,
                gone_for: GRACE,
                applied: &[],
                deleted: &["a"],
            },
            Case {
                what: "a deleted configuration's Instance goes at once",
                seen: &["b"],
                stored: &[("a", "cams"), ("b", "usb")],
                live: Some(&["usb"]),
                gone_for: Duration::ZERO,
                applied: &[],
                deleted: &["a"],
            },
            Case {
                what: "beyond the limit (2), a new device is not written",
                seen: &["a", "b", "c"],
                stored: &[("a", "usb"), ("b", "usb")],
                live: None,
                gone_for: Duration::ZERO,
                applied: &[],
                deleted: &[],
            },
        ];
        let path = InstancePath::Legacy("edge".into());
        for case in cases {
            let live = case.live.map(set);
            let stored: BTreeMap<String, Instance> = (case.stored.iter())
                .map(|(n, c)| (n.to_string(), stored(n, c)))
                .collect();
            let start = Instant::now();
            let mut vanished = BTreeMap::new();
            let mut planned = None;
            // The pass that first found a device gone, then the one `gone_for` later.
            for at in [start, start + case.gone_for] {
                let state = NodeState {
                    instances: vec![InstancesState {
                        path: path.clone(),
                        writer: writer(live.as_ref()),
                        seen: (case.seen.iter())
                            .map(|n| (known("usb", n, &[]), 1, false))
                            .collect(),
                        stored: stored.clone(),
                        vanished: &mut vanished,
                    }],
                    ..NodeState::default()
                };
                let mut plan = DevicePlan::of(state, Timestamp::now(), at);
                assert!(plan.take_instances(&InstancePath::Dra).is_none());
                planned = plan.take_instances(&path);
            }
            let plan = planned.expect("the namespace's plan").plan;
            let applied: Vec<&str> = (plan.steps.iter())
                .filter_map(|s| match s {
                    Step::Apply { instance, .. } => instance.metadata.name.as_deref(),
                    _ => None,
                })
                .collect();
            assert_eq!(applied, case.applied, "{}", case.what);
            let deleted: Vec<Departure> = (case.deleted.iter())
                .map(|n| Departure::Delete(n.to_string()))
                .collect();
            assert_eq!(plan.departures, deleted, "{}", case.what);
            let limited = (plan.steps.iter()).any(|s| matches!(s, Step::Limited { .. }));
            assert_eq!(limited, case.what.contains("limit"), "{}", case.what);
        }
    }

    fn v0(namespace: &str, name: &str) -> Arc<Configuration> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "akri.sh/v0", "kind": "Configuration",
                "metadata": { "namespace": namespace, "name": name },
                "spec": {
                    "discoveryHandler": { "name": "debugEcho" },
                    "brokerProperties": { "RESOLUTION": "1080p", "SECRET": "x", "MODE": "config" },
                },
            }))
            .unwrap(),
        )
    }

    fn config(name: &str) -> ConfigDevices {
        ConfigDevices {
            configuration: name.into(),
            capacity: 2,
            unique_devices: true,
            shared: true,
            devices: Vec::new(),
        }
    }

    /// The device plugins serve the served Configurations' devices, each with the allowed
    /// `brokerProperties` and its own properties (which win).
    #[test]
    fn device_plugins_serve_the_served_configurations_with_the_allowed_properties() {
        let seen = vec![
            (known("cams", "cams-1", &[("MODE", "device")]), 2, true),
            (known("usb", "usb-1", &[]), 1, false),
        ];
        let state = NodeState {
            device_plugins: Some(DevicePluginState {
                // `usb` is discovered but not served (say, a DiscoveryConfiguration has its
                // name): no plugin.
                served: vec![v0("edge", "cams")],
                namespaces: BTreeMap::from([(
                    "edge".to_string(),
                    (vec![config("cams"), config("usb")], seen),
                )]),
                broker_property_names: set(&["RESOLUTION", "MODE"]),
            }),
            ..NodeState::default()
        };
        let plan = DevicePlan::of(state, Timestamp::now(), Instant::now());
        let served = plan.device_plugins.expect("device plugins planned");
        assert_eq!(served.len(), 1, "{served:?}");
        let cams = &served[0];
        assert_eq!(
            (cams.namespace.as_str(), cams.name.as_str()),
            ("edge", "cams")
        );
        let envs = &cams.instances["cams-1"].envs;
        let expected = BTreeMap::from([
            ("MODE".to_string(), "device".to_string()),
            ("RESOLUTION".to_string(), "1080p".to_string()),
        ]);
        assert_eq!(*envs, expected);
        assert!(
            DevicePlan::of(NodeState::default(), Timestamp::now(), Instant::now())
                .device_plugins
                .is_none()
        );
    }

    #[test]
    fn one_status_entry_per_configuration_held_back_first_instances_last() {
        let map = |entries: &[(&str, &str)]| -> BTreeMap<String, String> {
            (entries.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let held_back = map(&[("a", "held back")]);
        let properties = map(&[("a", "no secret"), ("b", "no secret")]);
        let discovery = map(&[("b", "stream failed"), ("c", "stream failed")]);
        let instances = map(&[("c", "refused"), ("d", "refused")]);
        let entries = status_entries(&StatusState {
            held_back: &held_back,
            properties: &properties,
            discovery: &discovery,
            instances: &instances,
        });
        let expected = map(&[
            ("a", "held back"),
            ("b", "no secret"),
            ("c", "stream failed"),
            ("d", "refused"),
        ]);
        assert_eq!(entries, expected);
    }
}
