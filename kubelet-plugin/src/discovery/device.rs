//! The devices a discovery handler reports, as plain Rust values, and the checks that keep a
//! misbehaving handler from feeding garbage to the rest of the plugin.
//!
//! Non-UTF-8 in a string field (an id, a property) never gets here: prost refuses to decode
//! such a message, so it arrives as a stream error (see [`crate::discovery::stream`]).

use akri_proto::discovery::v0 as proto;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The most devices one handler may report for one configuration, by default.
pub const DEFAULT_MAX_DEVICES: usize = 10_000;

/// A device as a discovery handler reported it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredDevice {
    /// Stable identifier, unique within its handler and configuration.
    pub id: String,
    /// Become the Instance's brokerProperties and the container's environment.
    pub properties: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    pub device_specs: Vec<DeviceSpec>,
}

/// A host path to mount into containers that use the device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// A device node to expose to containers that use the device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    /// cgroup permissions, e.g. `rw` or `rwm`.
    pub permissions: String,
}

/// Why a device list from a handler was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDevices {
    #[error("device #{index} has an empty id")]
    EmptyId { index: usize },
    #[error("device id {id:?} appears more than once")]
    DuplicateId { id: String },
    #[error("{count} devices, more than the limit of {max}")]
    TooMany { count: usize, max: usize },
}

/// Checks a handler's device list and converts it, sorted by id. Refuses the whole list if
/// any device is invalid: a partial list would make the others look vanished.
pub fn validate(
    devices: Vec<proto::Device>,
    max_devices: usize,
) -> Result<Vec<DiscoveredDevice>, InvalidDevices> {
    if devices.len() > max_devices {
        return Err(InvalidDevices::TooMany {
            count: devices.len(),
            max: max_devices,
        });
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(devices.len());
    for (index, device) in devices.into_iter().enumerate() {
        if device.id.is_empty() {
            return Err(InvalidDevices::EmptyId { index });
        }
        if !seen.insert(device.id.clone()) {
            return Err(InvalidDevices::DuplicateId { id: device.id });
        }
        out.push(DiscoveredDevice::from(device));
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

impl From<proto::Device> for DiscoveredDevice {
    fn from(device: proto::Device) -> Self {
        DiscoveredDevice {
            id: device.id,
            properties: device.properties.into_iter().collect(),
            mounts: device
                .mounts
                .into_iter()
                .map(|m| Mount {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            device_specs: device
                .device_specs
                .into_iter()
                .map(|d| DeviceSpec {
                    container_path: d.container_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
        }
    }
}

impl From<DiscoveredDevice> for proto::Device {
    fn from(device: DiscoveredDevice) -> Self {
        proto::Device {
            id: device.id,
            properties: device.properties.into_iter().collect(),
            mounts: device
                .mounts
                .into_iter()
                .map(|m| proto::Mount {
                    container_path: m.container_path,
                    host_path: m.host_path,
                    read_only: m.read_only,
                })
                .collect(),
            device_specs: device
                .device_specs
                .into_iter()
                .map(|d| proto::DeviceSpec {
                    container_path: d.container_path,
                    host_path: d.host_path,
                    permissions: d.permissions,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(id: &str) -> proto::Device {
        proto::Device {
            id: id.to_string(),
            properties: [("K".to_string(), "v".to_string())].into(),
            mounts: vec![proto::Mount {
                container_path: "/c".into(),
                host_path: "/h".into(),
                read_only: true,
            }],
            device_specs: vec![proto::DeviceSpec {
                container_path: "/dev/c".into(),
                host_path: "/dev/h".into(),
                permissions: "rw".into(),
            }],
        }
    }

    #[test]
    fn converts_and_sorts() {
        let devices = validate(vec![device("b"), device("a")], 10).unwrap();
        assert_eq!(devices[0].id, "a");
        assert_eq!(devices[1].id, "b");
        assert_eq!(devices[0].properties["K"], "v");
        assert!(devices[0].mounts[0].read_only);
        assert_eq!(devices[0].device_specs[0].permissions, "rw");
        assert_eq!(proto::Device::from(devices[0].clone()), device("a"));
    }

    #[test]
    fn refuses_garbage() {
        assert_eq!(
            validate(vec![device("a"), device("")], 10),
            Err(InvalidDevices::EmptyId { index: 1 })
        );
        assert_eq!(
            validate(vec![device("a"), device("a")], 10),
            Err(InvalidDevices::DuplicateId { id: "a".into() })
        );
        assert_eq!(
            validate(vec![device("a"), device("b")], 1),
            Err(InvalidDevices::TooMany { count: 2, max: 1 })
        );
        assert_eq!(validate(vec![], 0), Ok(vec![]));
    }
}
