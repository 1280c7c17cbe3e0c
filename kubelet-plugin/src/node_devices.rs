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
    drivers: Arc<RwLock<BTreeMap<String, BTreeMap<String, ConfigDevices>>>>,
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
        if configs.get(&devices.configuration) == Some(&devices) {
            return false;
        }
        configs.insert(devices.configuration.clone(), devices);
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
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every device of a driver with its Instance name.
    pub fn known(&self, driver: &str) -> Vec<KnownDevice> {
        self.configurations(driver)
            .into_iter()
            .flat_map(|config| {
                let ids: Vec<&str> = config.devices.iter().map(|d| d.id.as_str()).collect();
                let names = akri_devices::instance_names(
                    &config.configuration,
                    &ids,
                    config.shared,
                    &self.node,
                );
                names
                    .into_iter()
                    .zip(config.devices.clone())
                    .map(|(instance, device)| KnownDevice {
                        instance,
                        configuration: config.configuration.clone(),
                        device,
                    })
                    .collect::<Vec<_>>()
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
