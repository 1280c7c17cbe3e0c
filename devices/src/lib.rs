//! How a device a discovery handler found becomes an Instance and a DRA device.
//!
//! One place for the naming and modelling rules, because two writers must agree on them: the
//! kubelet-plugin publishes node-local devices, the driver-controller publishes shared ones.

use blake2::Blake2bVar;
use blake2::digest::{Update, VariableOutput};
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The domain of every DRA driver of this project: `<handler>.akri.sh`.
pub const DRIVER_DOMAIN: &str = "akri.sh";
/// Device attribute: the DiscoveryConfiguration a device belongs to.
pub const ATTR_CONFIGURATION: &str = "akri.sh/configuration";
/// Device attribute: the Instance a device is (or, for slot devices, belongs to).
pub const ATTR_INSTANCE: &str = "akri.sh/instance";
/// Domain of the attributes carrying discovered properties (`property.akri.sh/<KEY>`), apart
/// from ours so that a property can never shadow them.
pub const PROPERTY_DOMAIN: &str = "property.akri.sh";
/// The consumable capacity of a shared device: how many claims may hold it at once.
pub const SLOTS_CAPACITY: &str = "akri.sh/slots";
/// The longest string attribute value resource.k8s.io/v1 accepts.
pub const MAX_ATTRIBUTE_VALUE: usize = 64;
/// The longest attribute identifier (the part after the domain).
pub const MAX_ATTRIBUTE_ID: usize = 32;

/// The DRA driver of a discovery handler: `<handler, lower-cased>.akri.sh` (Akri handler
/// names such as `debugEcho` are mixed case; driver names are DNS subdomains).
/// The server-side-apply field manager of a node's kubelet-plugin: it owns that node's entry
/// of an Instance's `nodes` and of a DiscoveryConfiguration's `status.discoveryErrors`. The
/// driver-controller applies nothing under it to take a deleted node's entries away.
pub fn node_field_manager(node: &str) -> String {
    format!("akri-kubelet-plugin/{node}")
}

pub fn driver_name(handler: &str) -> String {
    format!("{}.{DRIVER_DOMAIN}", handler.to_ascii_lowercase())
}

/// The Instance of a device, named as Akri names it: `<configuration>-<6 hex digits>`, a
/// Blake2b digest of the device id, with the node name added for local (unshared) devices so
/// that the same id on two nodes makes two Instances. Migrated clusters keep their names.
pub fn instance_name(configuration: &str, device_id: &str, shared: bool, node: &str) -> String {
    let mut hasher = Blake2bVar::new(3).expect("3 is a valid Blake2b output size");
    hasher.update(device_id.as_bytes());
    if !shared {
        hasher.update(node.as_bytes());
    }
    let mut digest = [0u8; 3];
    hasher
        .finalize_variable(&mut digest)
        .expect("buffer of the requested size");
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{configuration}-{hex}")
}

/// How a device with `capacity > 1` is offered to several claims at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// One device with `allowMultipleAllocations` and a [`SLOTS_CAPACITY`] of `capacity`; the
    /// scheduler counts the slots (DRAConsumableCapacity).
    ConsumableCapacity,
    /// `capacity` devices named `<instance>-<slot>`, each one claim at a time: for API servers
    /// without consumable capacity.
    SlotDevices,
}

impl Sharing {
    /// How the devices of a configuration are offered, given its `uniqueDevices` and whether
    /// the API server keeps consumable capacity (`dra_plugin::api_support::ApiSupport`).
    ///
    /// The scheduler never gives one device twice to the same request. So one device per
    /// Instance (consumable capacity) makes a request for K devices get K different Instances:
    /// exactly `uniqueDevices: true`, for claims and extended-resource requests alike (across
    /// the requests of one claim, a `distinctAttribute` constraint on [`ATTR_INSTANCE`] says
    /// the same). With `uniqueDevices: false` a request for K may take several slots of one
    /// Instance, which only separate slot devices can express; those are used even where
    /// consumable capacity exists. Without consumable capacity both are slot devices: capacity
    /// holds, but uniqueness within a request cannot be enforced (`distinctAttribute` comes
    /// with the same feature gate), and the driver-controller says so in the status.
    pub fn for_configuration(unique_devices: bool, consumable_capacity: bool) -> Sharing {
        if unique_devices && consumable_capacity {
            Sharing::ConsumableCapacity
        } else {
            Sharing::SlotDevices
        }
    }
}

/// An Instance as DRA sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceDevice<'a> {
    pub instance: &'a str,
    pub configuration: &'a str,
    pub capacity: i32,
    pub properties: &'a BTreeMap<String, String>,
}

/// The DRA devices of an Instance. Discovered properties become `property.akri.sh/<KEY>`
/// string attributes where DRA can hold them (the key a C identifier of at most 32
/// characters, the value at most 64); the others still reach containers through CDI.
pub fn devices(instance: &InstanceDevice<'_>, sharing: Sharing) -> Vec<Device> {
    let mut attributes = BTreeMap::from([
        (
            ATTR_CONFIGURATION.to_string(),
            string_attribute(instance.configuration),
        ),
        (
            ATTR_INSTANCE.to_string(),
            string_attribute(instance.instance),
        ),
    ]);
    for (key, value) in instance.properties {
        if property_fits(key, value) {
            attributes.insert(format!("{PROPERTY_DOMAIN}/{key}"), string_attribute(value));
        }
    }
    if instance.capacity <= 1 {
        return vec![Device {
            name: instance.instance.to_string(),
            attributes: Some(attributes),
            ..Device::default()
        }];
    }
    match sharing {
        Sharing::ConsumableCapacity => vec![Device {
            name: instance.instance.to_string(),
            attributes: Some(attributes),
            allow_multiple_allocations: Some(true),
            capacity: Some(BTreeMap::from([(
                SLOTS_CAPACITY.to_string(),
                DeviceCapacity {
                    value: Quantity(instance.capacity.to_string()),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(Quantity("1".into())),
                        valid_range: Some(CapacityRequestPolicyRange {
                            min: Quantity("1".into()),
                            max: None,
                            step: Some(Quantity("1".into())),
                        }),
                        valid_values: None,
                    }),
                },
            )])),
            ..Device::default()
        }],
        Sharing::SlotDevices => (0..instance.capacity)
            .map(|slot| Device {
                name: slot_device_name(instance.instance, slot),
                attributes: Some(attributes.clone()),
                ..Device::default()
            })
            .collect(),
    }
}

/// The name of slot `slot` of an Instance in the [`Sharing::SlotDevices`] model.
pub fn slot_device_name(instance: &str, slot: i32) -> String {
    format!("{instance}-{slot}")
}

/// Whether a discovered property can be a DRA attribute.
pub fn property_fits(key: &str, value: &str) -> bool {
    let mut chars = key.chars();
    let c_identifier = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    c_identifier && key.len() <= MAX_ATTRIBUTE_ID && value.len() <= MAX_ATTRIBUTE_VALUE
}

fn string_attribute(value: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(value.to_string()),
        ..DeviceAttribute::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names_follow_akri() {
        let local_a = instance_name("usb-cam", "/dev/video0", false, "node-a");
        let local_b = instance_name("usb-cam", "/dev/video0", false, "node-b");
        let shared_a = instance_name("ip-cam", "10.0.0.7", true, "node-a");
        let shared_b = instance_name("ip-cam", "10.0.0.7", true, "node-b");
        assert_ne!(local_a, local_b, "local devices are per node");
        assert_eq!(shared_a, shared_b, "shared devices are one Instance");
        assert!(local_a.starts_with("usb-cam-") && local_a.len() == "usb-cam-".len() + 6);
        assert_eq!(
            local_a,
            instance_name("usb-cam", "/dev/video0", false, "node-a"),
            "stable"
        );
    }

    #[test]
    fn driver_names_are_lower_case() {
        assert_eq!(driver_name("debugEcho"), "debugecho.akri.sh");
    }

    #[test]
    fn properties_that_fit_become_attributes() {
        let properties = BTreeMap::from([
            ("DEBUG_ECHO_DESCRIPTION".to_string(), "foo0".to_string()),
            ("URL".to_string(), "x".repeat(65)),
            ("not-an-identifier".to_string(), "v".to_string()),
            (
                "A_VERY_LONG_PROPERTY_NAME_OVER_32_CHARS".to_string(),
                "v".to_string(),
            ),
        ]);
        let device = &devices(
            &InstanceDevice {
                instance: "cam-abcdef",
                configuration: "cam",
                capacity: 1,
                properties: &properties,
            },
            Sharing::ConsumableCapacity,
        )[0];
        let attributes = device.attributes.as_ref().unwrap();
        assert_eq!(
            attributes["property.akri.sh/DEBUG_ECHO_DESCRIPTION"]
                .string
                .as_deref(),
            Some("foo0")
        );
        assert_eq!(
            attributes[ATTR_INSTANCE].string.as_deref(),
            Some("cam-abcdef")
        );
        assert_eq!(attributes.len(), 3, "{attributes:?}");
        assert!(
            device.allow_multiple_allocations.is_none(),
            "capacity 1 is not shared"
        );
    }

    #[test]
    fn capacity_is_consumable_or_slot_devices() {
        let properties = BTreeMap::new();
        let instance = InstanceDevice {
            instance: "cam-abcdef",
            configuration: "cam",
            capacity: 3,
            properties: &properties,
        };
        let shared = devices(&instance, Sharing::ConsumableCapacity);
        assert_eq!(shared.len(), 1);
        assert_eq!(shared[0].allow_multiple_allocations, Some(true));
        assert_eq!(
            shared[0].capacity.as_ref().unwrap()[SLOTS_CAPACITY].value.0,
            "3"
        );
        let slots = devices(&instance, Sharing::SlotDevices);
        let names: Vec<&str> = slots.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["cam-abcdef-0", "cam-abcdef-1", "cam-abcdef-2"]);
        assert!(slots.iter().all(|d| {
            d.attributes.as_ref().unwrap()[ATTR_INSTANCE]
                .string
                .as_deref()
                == Some("cam-abcdef")
        }));
    }
}
