//! The devices this node currently sees, per driver and configuration: what the slices
//! publish, what prepare looks devices up in, and what Instances are written from.

use crate::discovery::DiscoveredDevice;
use akri_devices::{InstanceDevice, Sharing};
use k8s_openapi::api::resource::v1::Device;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The devices of one DiscoveryConfiguration on this node.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigDevices {
    pub configuration: String,
    pub capacity: i32,
    /// The configuration's `uniqueDevices`: decides, with the API server's support for
    /// consumable capacity, how capacity > 1 is modelled.
    pub unique_devices: bool,
    /// The handler's devices are seen by several nodes (published by the driver-controller).
    pub shared: bool,
    pub devices: Vec<DiscoveredDevice>,
}

/// One discovered device with the names it has in Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownDevice {
    pub configuration: String,
    pub instance: String,
    pub device: DiscoveredDevice,
}

/// A device this node sees: its Instance's capacity and whether it is shared.
pub type Seen = (KnownDevice, i32, bool);

/// Shared, cheap to clone.
#[derive(Clone, Default)]
pub struct NodeDevices {
    node: Arc<str>,
    consumable_capacity: bool,
    drivers: Arc<RwLock<BTreeMap<String, BTreeMap<String, Named>>>>,
    names: Option<Arc<StickyNames>>,
    /// Where what the handlers last reported is kept ([`NodeDevices::carrying_reports`]).
    reports: Option<Arc<Path>>,
    /// (driver, configuration) whose devices come from that file, not yet from their handler.
    carried: Arc<RwLock<BTreeSet<(String, String)>>>,
}

/// What the handlers last reported, by driver and configuration.
type Reports = BTreeMap<String, BTreeMap<String, ConfigDevices>>;

/// Per driver and configuration, the devices whose Instance name is not Akri's (the second
/// of two devices whose Akri names collide: [`akri_devices::instance_names`]).
type Renamed = BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>;

/// The renamed devices, kept in a file so that a restarted agent gives every device the name
/// it had: after a restart both colliding devices are reported at once, and without the file
/// the other one would take Akri's name, handing claims allocated to it the wrong device.
/// Only renamed devices are kept (rare, a few bytes each); the others get Akri's name anyway.
struct StickyNames {
    path: PathBuf,
    renamed: RwLock<Renamed>,
}

impl StickyNames {
    /// Reads `path`; a missing file is an empty one, an unreadable one is logged and ignored
    /// (names are then as after a first start).
    fn load(path: &Path) -> StickyNames {
        let renamed = read_or_default(path, "ignoring unreadable Instance names");
        StickyNames {
            path: path.to_path_buf(),
            renamed: RwLock::new(renamed),
        }
    }

    fn get(&self, driver: &str, configuration: &str) -> BTreeMap<String, String> {
        let renamed = self.renamed.read().expect("lock");
        renamed
            .get(driver)
            .and_then(|configs| configs.get(configuration))
            .cloned()
            .unwrap_or_default()
    }

    /// Records a configuration's renamed devices; writes the file when they changed.
    fn put(&self, driver: &str, configuration: &str, now: BTreeMap<String, String>) {
        let mut renamed = self.renamed.write().expect("lock");
        let configs = renamed.entry(driver.to_string()).or_default();
        let before = configs.get(configuration).cloned().unwrap_or_default();
        if before == now {
            return;
        }
        if now.is_empty() {
            configs.remove(configuration);
        } else {
            configs.insert(configuration.to_string(), now);
        }
        let written = serde_json::to_vec_pretty(&*renamed)
            .map_err(std::io::Error::other)
            .and_then(|json| node_io::files::write_atomically(&self.path, &json, 0o600));
        if let Err(error) = written {
            tracing::warn!(path = %self.path.display(), %error, "cannot keep Instance names; a restart may rename colliding devices");
        }
    }
}

/// The JSON in `path`: a missing file is an empty one; an unreadable one is logged (`what`)
/// and taken as empty, as after a first start.
fn read_or_default<T: serde::de::DeserializeOwned + Default>(path: &Path, what: &str) -> T {
    let read = match std::fs::read(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return T::default(),
        read => read
            .map_err(|e| e.to_string())
            .and_then(|bytes| serde_json::from_slice::<T>(&bytes).map_err(|e| e.to_string())),
    };
    read.unwrap_or_else(|error| {
        tracing::warn!(path = %path.display(), %error, "{what}");
        T::default()
    })
}

/// A configuration's devices with their Instance names (by device id), which stick to their
/// devices across reports ([`akri_devices::instance_names`]).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    devices: ConfigDevices,
    names: BTreeMap<String, String>,
    /// Names other nodes' devices have ([`NodeDevices::avoid`]).
    avoid: BTreeSet<String>,
}

impl NodeDevices {
    /// `consumable_capacity`: whether the API server keeps consumable capacity.
    pub fn new(node: &str, consumable_capacity: bool) -> Self {
        NodeDevices {
            node: node.into(),
            consumable_capacity,
            drivers: Arc::default(),
            names: None,
            reports: None,
            carried: Arc::default(),
        }
    }

    /// Keeps what each configuration's handler last reported in `reports_file`, and starts
    /// from what the file holds. The node's slices and Instances describe those reports, so a
    /// restarted agent publishes (and prepares) a configuration's devices as they were until
    /// its handler reports again ([`NodeDevices::carried`]), however long that takes, instead
    /// of withdrawing them when the start-up wait is over. A missing file is a first start; an
    /// unreadable one is logged and ignored.
    pub fn carrying_reports(mut self, reports_file: &Path) -> Self {
        let reports: Reports = read_or_default(
            reports_file,
            "ignoring the unreadable last reports; devices come from the handlers alone",
        );
        for (driver, configs) in reports {
            for (configuration, devices) in configs {
                self.set(&driver, devices);
                let mut carried = self.carried.write().expect("lock");
                carried.insert((driver.clone(), configuration));
            }
        }
        self.reports = Some(reports_file.into());
        self
    }

    /// The (driver, configuration) pairs whose devices are as an earlier process last heard
    /// them: their handler has not reported since this one started.
    pub fn carried(&self) -> Vec<(String, String)> {
        self.carried.read().expect("lock").iter().cloned().collect()
    }

    /// Writes what the handlers last reported to the reports file, if there is one.
    fn save(&self, drivers: &BTreeMap<String, BTreeMap<String, Named>>) {
        let Some(path) = &self.reports else {
            return;
        };
        let reports: Reports = drivers
            .iter()
            .map(|(driver, configs)| {
                let configs = configs
                    .iter()
                    .map(|(name, named)| (name.clone(), named.devices.clone()))
                    .collect();
                (driver.clone(), configs)
            })
            .collect();
        let written = serde_json::to_vec(&reports)
            .map_err(std::io::Error::other)
            .and_then(|json| node_io::files::write_atomically(path, &json, 0o600));
        if let Err(error) = written {
            tracing::warn!(path = %path.display(), %error, "cannot keep the last reports; a restart may withdraw a slow handler's devices for a while");
        }
    }

    /// Like [`NodeDevices::new`], keeping the names of renamed devices in `names_file` so that
    /// they survive a restart.
    pub fn with_names_file(node: &str, consumable_capacity: bool, names_file: &Path) -> Self {
        NodeDevices {
            names: Some(Arc::new(StickyNames::load(names_file))),
            ..NodeDevices::new(node, consumable_capacity)
        }
    }

    /// The node these devices are on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// How the devices of a configuration with capacity > 1 are modelled.
    pub fn sharing(&self, config: &ConfigDevices) -> Sharing {
        Sharing::for_configuration(config.unique_devices, self.consumable_capacity)
    }

    /// Replaces what a configuration's handler reports; returns whether anything changed.
    pub fn set(&self, driver: &str, devices: ConfigDevices) -> bool {
        let key = (driver.to_string(), devices.configuration.clone());
        self.carried.write().expect("lock").remove(&key);
        let mut drivers = self.drivers.write().expect("lock");
        let configs = drivers.entry(driver.to_string()).or_default();
        let previous = configs.get(&devices.configuration);
        if previous.is_some_and(|p| p.devices == devices) {
            return false;
        }
        // The names the devices had: in this process, or before it restarted.
        let (previous, avoid) = match (previous, &self.names) {
            (Some(previous), _) => (previous.names.clone(), previous.avoid.clone()),
            (None, Some(sticky)) => (sticky.get(driver, &devices.configuration), BTreeSet::new()),
            (None, None) => Default::default(),
        };
        let names = self.name(driver, &devices, &previous, &avoid);
        configs.insert(
            devices.configuration.clone(),
            Named {
                devices,
                names,
                avoid,
            },
        );
        self.save(&drivers);
        true
    }

    /// Gives up `name` for `configuration`'s devices of `driver`: another node's unshared
    /// device has it (the Instance of that name is that node's). The device that had it is
    /// named otherwise, and keeps that name across restarts. Returns whether a name changed.
    pub fn avoid(&self, driver: &str, configuration: &str, name: &str) -> bool {
        let mut drivers = self.drivers.write().expect("lock");
        let Some(named) = drivers
            .get_mut(driver)
            .and_then(|configs| configs.get_mut(configuration))
        else {
            return false;
        };
        if !named.avoid.insert(name.to_string()) {
            return false;
        }
        let names = self.name(driver, &named.devices, &named.names, &named.avoid);
        let changed = names != named.names;
        named.names = names;
        changed
    }

    /// The Instance names of a configuration's devices (by id), remembering the renamed ones.
    fn name(
        &self,
        driver: &str,
        devices: &ConfigDevices,
        previous: &BTreeMap<String, String>,
        avoid: &BTreeSet<String>,
    ) -> BTreeMap<String, String> {
        let ids: Vec<&str> = devices.devices.iter().map(|d| d.id.as_str()).collect();
        let names = akri_devices::instance_names_avoiding(
            &devices.configuration,
            &ids,
            devices.shared,
            &self.node,
            previous,
            avoid,
        );
        let names: BTreeMap<String, String> =
            ids.iter().map(|id| id.to_string()).zip(names).collect();
        if let Some(sticky) = &self.names {
            let renamed = names
                .iter()
                .filter(|(id, name)| {
                    **name
                        != akri_devices::instance_name(
                            &devices.configuration,
                            id,
                            devices.shared,
                            &self.node,
                        )
                })
                .map(|(id, name)| (id.clone(), name.clone()))
                .collect();
            sticky.put(driver, &devices.configuration, renamed);
        }
        names
    }

    /// Forgets a configuration (deleted, or its handler went away).
    pub fn remove(&self, driver: &str, configuration: &str) -> bool {
        let key = (driver.to_string(), configuration.to_string());
        self.carried.write().expect("lock").remove(&key);
        let mut drivers = self.drivers.write().expect("lock");
        let removed = drivers
            .get_mut(driver)
            .is_some_and(|configs| configs.remove(configuration).is_some());
        if removed {
            self.save(&drivers);
        }
        removed
    }

    /// The configurations of a driver.
    pub fn configurations(&self, driver: &str) -> Vec<ConfigDevices> {
        let drivers = self.drivers.read().expect("lock");
        drivers
            .get(driver)
            .map(|c| c.values().map(|named| named.devices.clone()).collect())
            .unwrap_or_default()
    }

    /// Every device of a driver with its Instance name.
    pub fn known(&self, driver: &str) -> Vec<KnownDevice> {
        self.seen(driver)
            .into_iter()
            .map(|(known, _, _)| known)
            .collect()
    }

    /// Every device of a driver with its Instance name, and its configuration's capacity and
    /// sharing: what its Instance is written from ([`Seen`]).
    pub fn seen(&self, driver: &str) -> Vec<Seen> {
        let drivers = self.drivers.read().expect("lock");
        let Some(configs) = drivers.get(driver) else {
            return Vec::new();
        };
        (configs.values())
            .flat_map(|named| {
                let config = &named.devices;
                config.devices.iter().map(|device| {
                    let known = KnownDevice {
                        instance: named.names[&device.id].clone(),
                        configuration: config.configuration.clone(),
                        device: device.clone(),
                    };
                    (known, config.capacity, config.shared)
                })
            })
            .collect()
    }

    /// The DRA devices of a driver's node-local devices, for this node's pool. Shared devices
    /// are left to the driver-controller, which publishes them once for all nodes.
    pub fn local_dra_devices(&self, driver: &str) -> Vec<(Device, KnownDevice)> {
        let configs = self.configurations(driver);
        let mut out = Vec::new();
        for known in self.known(driver) {
            let Some(config) = configs
                .iter()
                .find(|c| c.configuration == known.configuration)
            else {
                continue;
            };
            if config.shared {
                continue;
            }
            let instance = InstanceDevice {
                instance: &known.instance,
                configuration: &known.configuration,
                capacity: config.capacity,
                properties: &known.device.properties,
            };
            for device in akri_devices::devices(&instance, self.sharing(config)) {
                out.push((device, known.clone()));
            }
        }
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out
    }

    /// The discovered device behind a DRA device name of a driver (an Instance name, or a slot
    /// device `<instance>-<slot>`), if this node sees it now.
    pub fn lookup(&self, driver: &str, dra_device: &str) -> Option<KnownDevice> {
        // On every prepare: searched in place by name (not a map lookup per device), only
        // the device found is cloned.
        let drivers = self.drivers.read().expect("lock");
        drivers.get(driver)?.values().find_map(|named| {
            let (id, instance) = named.names.iter().find(|(_, instance)| {
                dra_device == instance.as_str()
                    || dra_device
                        .strip_prefix(instance.as_str())
                        .and_then(|rest| rest.strip_prefix('-'))
                        .is_some_and(|slot| slot.parse::<u32>().is_ok())
            })?;
            let device = named.devices.devices.iter().find(|d| d.id == *id)?;
            Some(KnownDevice {
                instance: instance.clone(),
                configuration: named.devices.configuration.clone(),
                device: device.clone(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo(ids: &[&str]) -> ConfigDevices {
        ConfigDevices {
            configuration: "echo".into(),
            capacity: 1,
            unique_devices: true,
            shared: false,
            devices: ids
                .iter()
                .map(|id| DiscoveredDevice {
                    id: id.to_string(),
                    ..DiscoveredDevice::default()
                })
                .collect(),
        }
    }

    fn names(devices: &NodeDevices) -> BTreeMap<String, String> {
        devices
            .known("d")
            .into_iter()
            .map(|k| (k.device.id, k.instance))
            .collect()
    }

    /// `cam2839` and `cam3489` share Akri's name on node-a. The one seen first keeps it; the
    /// other keeps its own name after the first one goes, so a claim allocated to a name
    /// never gets another device.
    #[test]
    fn instance_names_stick_to_their_devices() {
        let devices = NodeDevices::new("node-a", true);
        devices.set("d", echo(&["cam3489"]));
        let akri = names(&devices)["cam3489"].clone();
        devices.set("d", echo(&["cam2839", "cam3489"]));
        let both = names(&devices);
        assert_eq!(both["cam3489"], akri);
        assert_ne!(both["cam2839"], akri);
        devices.set("d", echo(&["cam2839"]));
        assert_eq!(names(&devices)["cam2839"], both["cam2839"]);
        assert!(
            devices.lookup("d", &akri).is_none(),
            "the old name finds no device"
        );
    }

    /// A name another node's device has is given up for another, which a restart keeps.
    #[test]
    fn a_name_given_up_to_another_node_stays_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("instance-names.json");
        let devices = NodeDevices::with_names_file("node-a", true, &file);
        devices.set("d", echo(&["cam0", "cam1"]));
        let before = names(&devices);
        assert!(devices.avoid("d", "echo", &before["cam0"]));
        let after = names(&devices);
        assert_ne!(after["cam0"], before["cam0"]);
        assert_eq!(
            after["cam1"], before["cam1"],
            "the other device keeps its name"
        );
        assert!(
            !devices.avoid("d", "echo", &before["cam0"]),
            "once is enough"
        );
        // A new report keeps the new name, and so does a restart.
        devices.set("d", echo(&["cam0", "cam1", "cam2"]));
        assert_eq!(names(&devices)["cam0"], after["cam0"]);
        let restarted = NodeDevices::with_names_file("node-a", true, &file);
        restarted.set("d", echo(&["cam0", "cam1"]));
        assert_eq!(names(&restarted)["cam0"], after["cam0"]);
    }

    /// A restarted agent starts from what the handlers last reported, names included, until
    /// each handler reports again; what a configuration lost is lost after a restart too.
    #[test]
    fn a_restart_carries_the_last_reports_until_the_handlers_report_again() {
        let dir = tempfile::tempdir().unwrap();
        let (names_file, reports) = (
            dir.path().join("names.json"),
            dir.path().join("reports.json"),
        );
        let open =
            || NodeDevices::with_names_file("node-a", true, &names_file).carrying_reports(&reports);
        let first = open();
        first.set("d", echo(&["cam3489"]));
        first.set("d", echo(&["cam2839", "cam3489"]));
        let mut other = echo(&["x"]);
        other.configuration = "other".into();
        first.set("d", other.clone());
        let before = names(&first);

        let restarted = open();
        assert_eq!(names(&restarted), before, "the devices, each with its name");
        assert!(
            restarted.lookup("d", &before["cam2839"]).is_some(),
            "preparable"
        );
        assert_eq!(
            restarted.carried(),
            [
                ("d".to_string(), "echo".to_string()),
                ("d".to_string(), "other".to_string())
            ]
        );
        // A report, even the same one, makes a configuration's devices its handler's again.
        assert!(!restarted.set("d", other));
        assert_eq!(restarted.carried(), [("d".to_string(), "echo".to_string())]);
        assert!(restarted.remove("d", "echo"));
        assert!(restarted.carried().is_empty());

        let again = open();
        assert_eq!(again.configurations("d").len(), 1, "only `other` was left");
        assert!(again.lookup("d", &before["cam2839"]).is_none());
        // An unreadable file is a first start.
        std::fs::write(&reports, b"[").unwrap();
        assert!(open().configurations("d").is_empty());
    }

    /// A restarted agent is told of both colliding devices at once: the names file gives each
    /// the name it had (without it, `cam2839`, the smaller id, would take Akri's name).
    #[test]
    fn instance_names_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("instance-names.json");
        let first = NodeDevices::with_names_file("node-a", true, &file);
        first.set("d", echo(&["cam3489"]));
        first.set("d", echo(&["cam2839", "cam3489"]));
        let before = names(&first);

        let restarted = NodeDevices::with_names_file("node-a", true, &file);
        restarted.set("d", echo(&["cam2839", "cam3489"]));
        assert_eq!(names(&restarted), before);
        let without_file = NodeDevices::new("node-a", true);
        without_file.set("d", echo(&["cam2839", "cam3489"]));
        assert_ne!(names(&without_file), before, "the case the file is for");

        // Only renamed devices are kept.
        let kept: Renamed = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(
            kept["d"]["echo"],
            BTreeMap::from([("cam2839".to_string(), before["cam2839"].clone())])
        );
        // An unreadable file is a first start, not a failure.
        std::fs::write(&file, b"{").unwrap();
        let fresh = NodeDevices::with_names_file("node-a", true, &file);
        fresh.set("d", echo(&["cam3489"]));
        assert_eq!(names(&fresh)["cam3489"], before["cam3489"]);
    }
}
