//! The devices this node currently sees, per driver and configuration: what the slices
//! publish, what prepare looks devices up in, and what Instances are written from.

use crate::discovery::DiscoveredDevice;
use akri_devices::{InstanceDevice, Sharing};
use k8s_openapi::api::resource::v1::Device;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// The devices of one DiscoveryConfiguration on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Shared, cheap to clone.
#[derive(Clone, Default)]
pub struct NodeDevices {
    node: Arc<str>,
    consumable_capacity: bool,
    drivers: Arc<RwLock<BTreeMap<String, BTreeMap<String, Named>>>>,
}

/// A configuration's devices with their Instance names (by device id), which stick to their
/// devices across reports ([`akri_devices::instance_names`]).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    devices: ConfigDevices,
    names: BTreeMap<String, String>,
}

impl NodeDevices {
    /// `consumable_capacity`: whether the API server keeps consumable capacity.
    pub fn new(node: &str, consumable_capacity: bool) -> Self {
        NodeDevices {
            node: node.into(),
            consumable_capacity,
            drivers: Arc::default(),
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
        let mut drivers = self.drivers.write().expect("lock");
        let configs = drivers.entry(driver.to_string()).or_default();
        let previous = configs.get(&devices.configuration);
        if previous.is_some_and(|p| p.devices == devices) {
            return false;
        }
        let empty = BTreeMap::new();
        let ids: Vec<&str> = devices.devices.iter().map(|d| d.id.as_str()).collect();
        let names = akri_devices::instance_names(
            &devices.configuration,
            &ids,
            devices.shared,
            &self.node,
            previous.map_or(&empty, |p| &p.names),
        );
        let names = ids.iter().map(|id| id.to_string()).zip(names).collect();
        configs.insert(devices.configuration.clone(), Named { devices, names });
        true
    }

    /// Forgets a configuration (deleted, or its handler went away).
    pub fn remove(&self, driver: &str, configuration: &str) -> bool {
        let mut drivers = self.drivers.write().expect("lock");
        drivers
            .get_mut(driver)
            .is_some_and(|configs| configs.remove(configuration).is_some())
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
        let drivers = self.drivers.read().expect("lock");
        let Some(configs) = drivers.get(driver) else {
            return Vec::new();
        };
        configs
            .values()
            .flat_map(|named| {
                named.devices.devices.iter().map(|device| KnownDevice {
                    instance: named.names[&device.id].clone(),
                    configuration: named.devices.configuration.clone(),
                    device: device.clone(),
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
        self.known(driver).into_iter().find(|known| {
            dra_device == known.instance
                || dra_device
                    .strip_prefix(known.instance.as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|slot| slot.parse::<u32>().is_ok())
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
}
