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

pub mod binding;
pub mod handlers;
mod nodes;
pub use nodes::node_lost;

/// The domain of every DRA driver of this project: `<handler>.akri.sh`.
pub const DRIVER_DOMAIN: &str = "akri.sh";
/// Device attribute: the DiscoveryConfiguration a device belongs to.
pub const ATTR_CONFIGURATION: &str = "akri.sh/configuration";
/// Device attribute: the Instance a device is (or, for slot devices, belongs to).
pub const ATTR_INSTANCE: &str = "akri.sh/instance";
/// The binding condition of a shared device (KEP-5007): the scheduler binds a pod to the node
/// it chose only once that node's kubelet-plugin has found the device answers from there.
pub const BINDING_CONDITION: &str = "akri.sh/Reachable";
/// The binding failure condition: the device does not answer from the chosen node, and the
/// scheduler tries again (elsewhere).
pub const BINDING_FAILURE_CONDITION: &str = "akri.sh/Unreachable";

/// Makes a shared device wait, at binding, for the chosen node to reach it: its allocation is
/// bound to that node (`bindsToNode`), and the pod is bound only once the node's
/// kubelet-plugin has set [`BINDING_CONDITION`] (or is moved on by
/// [`BINDING_FAILURE_CONDITION`]).
pub fn with_binding_check(device: &mut Device) {
    device.binds_to_node = Some(true);
    device.binding_conditions = Some(vec![BINDING_CONDITION.to_string()]);
    device.binding_failure_conditions = Some(vec![BINDING_FAILURE_CONDITION.to_string()]);
}

/// Domain of the attributes carrying discovered properties (`property.akri.sh/<KEY>`), apart
/// from ours so that a property can never shadow them.
pub const PROPERTY_DOMAIN: &str = "property.akri.sh";
/// Device taint on a device that no node's discovery handler reports any more while a claim
/// still holds it: `NoSchedule` at once, `NoExecute` after the grace ([`dra_plugin`'s
/// `vanished`](https://docs.rs/dra-plugin)).
pub const NOT_DISCOVERED_TAINT: &str = "akri.sh/not-discovered";

/// The reason and note of the Warning Event that says device `device` of `driver` vanished
/// (`how`: e.g. "is no longer reported by its discovery handler") while a claim holds it, and
/// what follows: with device taints it stays tainted until released; without them its holders
/// keep running on a device that is gone.
pub fn vanished_while_held(
    driver: &str,
    device: &str,
    how: &str,
    device_taints: bool,
) -> (&'static str, String) {
    if device_taints {
        (
            "DeviceVanishedWhileHeld",
            format!(
                "Device {device} of {driver} {how} while a claim holds it: it stays published with the {NOT_DISCOVERED_TAINT} taint (NoSchedule, NoExecute after the grace, which evicts its pods) until no claim holds it."
            ),
        )
    } else {
        (
            "DeviceVanishedHoldersNotEvicted",
            format!(
                "Device {device} of {driver} {how} while a claim holds it. This API server does not keep device taints (feature gate DRADeviceTaints), so the device left its slice and the pods that hold it are not evicted."
            ),
        )
    }
}
/// The consumable capacity of a shared device: how many claims may hold it at once.
pub const SLOTS_CAPACITY: &str = "akri.sh/slots";
/// The longest string attribute value resource.k8s.io/v1 accepts.
pub const MAX_ATTRIBUTE_VALUE: usize = 64;
/// The longest attribute identifier (the part after the domain).
pub const MAX_ATTRIBUTE_ID: usize = 32;
/// DRA's limit on attributes and capacities together, per device
/// (`ResourceSliceMaxAttributesAndCapacitiesPerDevice`): a device over it fails its whole slice.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// How many discovered properties can become attributes: the limit less the two Akri
/// attributes and the slots capacity (reserved in every sharing model, so a device publishes
/// the same properties whichever model its configuration uses).
pub const MAX_PROPERTY_ATTRIBUTES: usize = MAX_ATTRIBUTES_AND_CAPACITIES - 3;

/// The CEL expression selecting the device of one Instance (its [`ATTR_INSTANCE`] attribute):
/// how a claim asks for exactly that device, as the broker-controller's claims and migrated
/// Instance-level requests do.
pub fn instance_selector(instance: &str) -> String {
    let attribute = ATTR_INSTANCE
        .strip_prefix(&format!("{DRIVER_DOMAIN}/"))
        .expect("the attribute is in our domain");
    // A JSON string literal is a valid CEL string literal.
    let literal = serde_json::to_string(instance).expect("a string serializes");
    format!("device.attributes[\"{DRIVER_DOMAIN}\"].{attribute} == {literal}")
}

/// The DRA driver of a discovery handler: `<handler, lower-cased>.akri.sh` (Akri handler
/// names such as `debugEcho` are mixed case; driver names are DNS subdomains).
pub fn driver_name(handler: &str) -> String {
    format!("{}.{DRIVER_DOMAIN}", handler.to_ascii_lowercase())
}

/// 16 hex digits of a Blake2b digest of a node name: what stands for it where the whole name
/// (up to 253 characters) would not fit.
fn node_digest(node: &str) -> String {
    let mut hasher = Blake2bVar::new(8).expect("8 is a valid Blake2b output size");
    hasher.update(node.as_bytes());
    let mut digest = [0u8; 8];
    hasher
        .finalize_variable(&mut digest)
        .expect("the buffer has the output size");
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The server-side-apply field manager of a node's kubelet-plugin (slices, Instances, its
/// `discoveryErrors` entry): `akri-kubelet-plugin/<node>`, one per node, so that each node
/// owns its own entry of an Instance's `nodes` and of `status.discoveryErrors`. The
/// driver-controller applies nothing under it to take a deleted node's entries away. The API server refuses managers over 128 bytes and node names
/// may have 253, so a long node name is cut and a digest of the whole name keeps it unique.
pub fn node_field_manager(node: &str) -> String {
    const PREFIX: &str = "akri-kubelet-plugin/";
    const MAX: usize = 128;
    let full = format!("{PREFIX}{node}");
    if full.len() <= MAX {
        return full;
    }
    let digest = node_digest(node);
    // Node names are ASCII (DNS subdomains), so any byte is a character boundary.
    let keep = MAX - PREFIX.len() - 1 - digest.len();
    format!("{PREFIX}{}-{digest}", &node[..keep])
}

/// The longest discovery-handler name, as the DiscoveryConfiguration CRD allows it (its driver
/// name `<name>.akri.sh` must stay within DRA's 63 characters).
pub const MAX_HANDLER_NAME: usize = 54;

/// Whether a discovery handler's name can be used: it becomes a DRA driver name, a CDI class,
/// file and directory names on the node, so it must be a DNS label once lower-cased (letters,
/// digits and `-`, starting with a letter, ending with a letter or digit) of at most
/// [`MAX_HANDLER_NAME`] characters. Case is kept (`debugEcho`), but two names that differ only
/// in case are one driver.
pub fn validate_handler_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > MAX_HANDLER_NAME {
        return Err(format!(
            "the name is {} characters long; at most {MAX_HANDLER_NAME} fit a DRA driver name",
            name.len()
        ));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return Err("the name must start with a letter".into());
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("the name must end with a letter or digit".into());
    }
    if let Some(c) = name
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && *c != '-')
    {
        return Err(format!(
            "the name contains {c:?}; only letters, digits and '-' are allowed"
        ));
    }
    Ok(())
}

/// The longest DiscoveryConfiguration name, as its CRD allows it: Instances are named
/// `<name>-<6 hex digits>` and slot devices `<instance>-<slot>`, which must fit a DNS label.
pub const MAX_CONFIGURATION_NAME: usize = 52;

/// Whether a DiscoveryConfiguration's devices can be named after it: a DNS label (lower-case
/// letters, digits and `-`, starting and ending with a letter or digit) of at most
/// [`MAX_CONFIGURATION_NAME`] characters. The CRD refuses other names; this catches objects
/// stored before it did, whose devices would make the node's whole pool fail.
pub fn validate_configuration_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_CONFIGURATION_NAME {
        return Err(format!(
            "the name must be 1 to {MAX_CONFIGURATION_NAME} characters long (it has {})",
            name.len()
        ));
    }
    let label = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !label {
        return Err(
            "the name must be a DNS label (lower-case letters, digits and '-', no '.'): its devices are named after it"
                .into(),
        );
    }
    Ok(())
}

/// The Instance of a device, named as Akri names it: `<configuration>-<6 hex digits>`, a
/// Blake2b digest of the device id, with the node name added for local (unshared) devices so
/// that the same id on two nodes makes two Instances. Migrated clusters keep their names.
///
/// Six hex digits collide (about 3% among 1,000 devices of a configuration); use
/// [`instance_names`] for a configuration's devices, which resolves collisions.
pub fn instance_name(configuration: &str, device_id: &str, shared: bool, node: &str) -> String {
    salted_instance_name(configuration, device_id, shared, node, 0)
}

/// Akri's name for salt 0; for salt k > 0 the digest also covers `"\0" k`, which gives a
/// colliding device another name of the same length (configuration names are limited so that
/// `<configuration>-<6 hex>-<slot>` fits a DNS label: a longer name would not).
fn salted_instance_name(
    configuration: &str,
    device_id: &str,
    shared: bool,
    node: &str,
    salt: u32,
) -> String {
    let mut hasher = Blake2bVar::new(3).expect("3 is a valid Blake2b output size");
    hasher.update(device_id.as_bytes());
    if !shared {
        hasher.update(node.as_bytes());
    }
    if salt > 0 {
        hasher.update(&[0]);
        hasher.update(salt.to_string().as_bytes());
    }
    let mut digest = [0u8; 3];
    hasher
        .finalize_variable(&mut digest)
        .expect("buffer of the requested size");
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{configuration}-{hex}")
}

/// The Instance names of a configuration's devices (in the order of `device_ids`).
///
/// A device keeps the name it had (`previous`, by device id) as long as it is there, so a
/// name never passes to another device while a claim may hold it. Every other device gets
/// Akri's [`instance_name`] unless another device has it; of several new devices that share
/// one, the smallest id gets it. The others take the first salted name of the same length
/// that no device has and no device's Akri name is. With no `previous` the result depends only
/// on the set of ids; no two devices ever share a name (which would hand a pod the wrong
/// device).
pub fn instance_names(
    configuration: &str,
    device_ids: &[&str],
    shared: bool,
    node: &str,
    previous: &BTreeMap<String, String>,
) -> Vec<String> {
    let none = std::collections::BTreeSet::new();
    instance_names_avoiding(configuration, device_ids, shared, node, previous, &none)
}

/// [`instance_names`], giving no device a name in `avoid`: names another node's unshared
/// device has (Akri's names of unshared devices include the node, and still collide across
/// nodes: 6 hex digits).
pub fn instance_names_avoiding(
    configuration: &str,
    device_ids: &[&str],
    shared: bool,
    node: &str,
    previous: &BTreeMap<String, String>,
    avoid: &std::collections::BTreeSet<String>,
) -> Vec<String> {
    let mut ids: Vec<&str> = device_ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let akri: BTreeMap<&str, String> = ids
        .iter()
        .map(|id| (*id, instance_name(configuration, id, shared, node)))
        .collect();
    let mut taken = avoid.clone();
    let mut names: BTreeMap<&str, String> = BTreeMap::new();
    for id in &ids {
        if let Some(name) = previous.get(*id)
            && taken.insert(name.clone())
        {
            names.insert(id, name.clone());
        }
    }
    for id in &ids {
        if !names.contains_key(id) && taken.insert(akri[id].clone()) {
            names.insert(id, akri[id].clone());
        }
    }
    let reserved: std::collections::BTreeSet<&String> = akri.values().collect();
    for id in &ids {
        if names.contains_key(id) {
            continue;
        }
        let name = (1..)
            .map(|salt| salted_instance_name(configuration, id, shared, node, salt))
            .find(|name| !taken.contains(name) && !reserved.contains(name))
            .expect("a free name among 16 million");
        taken.insert(name.clone());
        names.insert(id, name);
    }
    device_ids.iter().map(|id| names[id].clone()).collect()
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
/// string attributes where DRA can hold them ([`property_attributes`]); the others still
/// reach containers through CDI.
pub fn devices(instance: &InstanceDevice<'_>, sharing: Sharing) -> Vec<Device> {
    let attributes = attributes(instance);
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

/// The attributes of an Instance's DRA devices: its configuration and name, and its
/// discovered properties as `property.akri.sh/<KEY>` where DRA can hold them
/// ([`property_attributes`]).
pub fn attributes(instance: &InstanceDevice<'_>) -> BTreeMap<String, DeviceAttribute> {
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
    let (published, _) = property_attributes(instance.properties);
    for (key, value) in published {
        attributes.insert(format!("{PROPERTY_DOMAIN}/{key}"), string_attribute(value));
    }
    attributes
}

/// Splits discovered properties into those published as attributes and the keys left out:
/// a key that is no C identifier of at most [`MAX_ATTRIBUTE_ID`] characters, a value over
/// [`MAX_ATTRIBUTE_VALUE`], or a property beyond the first [`MAX_PROPERTY_ATTRIBUTES`] that
/// fit (in key order, so the choice is stable). Left-out properties still reach containers
/// through CDI; the kubelet-plugin names them in the Instance ([`UNPUBLISHED_PROPERTIES`]).
pub fn property_attributes(
    properties: &BTreeMap<String, String>,
) -> (Vec<(&str, &str)>, Vec<String>) {
    let mut published = Vec::new();
    let mut left_out = Vec::new();
    for (key, value) in properties {
        if property_fits(key, value) && published.len() < MAX_PROPERTY_ATTRIBUTES {
            published.push((key.as_str(), value.as_str()));
        } else {
            left_out.push(key.clone());
        }
    }
    (published, left_out)
}

/// Annotation of an Instance listing (comma-separated) the properties that are not DRA
/// attributes of its device, so that a selector on them is known not to match.
pub const UNPUBLISHED_PROPERTIES: &str = "akri.sh/unpublished-properties";

/// The name of slot `slot` of an Instance: its DRA device in the [`Sharing::SlotDevices`]
/// model, and Akri's slot id (the key of `Instance.deviceUsage`, the device id of the
/// Instance-level device plugin). [`parse_slot_device_name`] reads it back.
pub fn slot_device_name(instance: &str, slot: i32) -> String {
    format!("{instance}-{slot}")
}

/// The Instance and slot number of a [`slot_device_name`]; `None` for anything else.
pub fn parse_slot_device_name(name: &str) -> Option<(&str, i32)> {
    let (instance, slot) = name.rsplit_once('-')?;
    let digits = !slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit());
    let canonical = slot == "0" || !slot.starts_with('0');
    if instance.is_empty() || !digits || !canonical {
        return None;
    }
    Some((instance, slot.parse().ok()?))
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

    #[test]
    fn slot_names_parse_back() {
        for (instance, slot) in [("akri-onvif-8120fe", 0), ("a", 17), ("x-1", 3)] {
            let name = slot_device_name(instance, slot);
            assert_eq!(parse_slot_device_name(&name), Some((instance, slot)));
        }
        for bad in [
            "",
            "-1",
            "abc",
            "abc-",
            "abc-x",
            "abc-01",
            "abc-99999999999",
        ] {
            assert_eq!(parse_slot_device_name(bad), None, "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn colliding_instance_names_are_resolved_deterministically() {
        // A real pair: both are `echo-55c92e` on node-a.
        let (a, b) = ("cam2839", "cam3489");
        assert_eq!(
            instance_name("echo", a, false, "node-a"),
            instance_name("echo", b, false, "node-a")
        );
        let none = BTreeMap::new();
        let names = instance_names("echo", &[b, "cam1", a], false, "node-a", &none);
        assert_eq!(
            names[2],
            instance_name("echo", a, false, "node-a"),
            "the smaller id keeps Akri's name"
        );
        assert_ne!(names[0], names[2]);
        assert_eq!(names[0].len(), names[2].len());
        assert_eq!(
            names[1],
            instance_name("echo", "cam1", false, "node-a"),
            "no collision, Akri's name"
        );
        assert_eq!(
            instance_names("echo", &[a, "cam1", b], false, "node-a", &none),
            [names[2].clone(), names[1].clone(), names[0].clone()],
            "the order of discovery does not matter"
        );
        // On another node they do not collide, and keep Akri's names.
        let elsewhere = instance_names("echo", &[a, b], false, "node-b", &none);
        assert_eq!(elsewhere[1], instance_name("echo", b, false, "node-b"));
        // The same id twice is one device, one name.
        let twice = instance_names("echo", &[a, a], false, "node-a", &none);
        assert_eq!(twice[0], twice[1]);
        // A device keeps its name: b came first and has Akri's name, a arrives later.
        let akri = instance_name("echo", b, false, "node-a");
        let previous = BTreeMap::from([(b.to_string(), akri.clone())]);
        let later = instance_names("echo", &[a, b], false, "node-a", &previous);
        assert_eq!(later[1], akri, "the device that had the name keeps it");
        assert_ne!(later[0], akri);
        // ... and when b goes, a keeps its salted name: a name never passes to another device.
        let previous = BTreeMap::from([(a.to_string(), later[0].clone())]);
        assert_eq!(
            instance_names("echo", &[a], false, "node-a", &previous),
            [later[0].clone()]
        );
    }

    #[test]
    fn at_most_the_attributes_dra_allows() {
        let properties: BTreeMap<String, String> = (0..40)
            .map(|i| (format!("KEY_{i:02}"), format!("value {i}")))
            .chain([("bad-key".to_string(), "x".to_string())])
            .collect();
        let (published, left_out) = property_attributes(&properties);
        assert_eq!(published.len(), MAX_PROPERTY_ATTRIBUTES);
        assert_eq!(published[0], ("KEY_00", "value 0"));
        assert_eq!(left_out.len(), 41 - MAX_PROPERTY_ATTRIBUTES);
        assert!(left_out.contains(&"bad-key".to_string()));
        assert!(left_out.contains(&"KEY_39".to_string()));
        for sharing in [Sharing::ConsumableCapacity, Sharing::SlotDevices] {
            let device = InstanceDevice {
                instance: "cams-abcdef",
                configuration: "cams",
                capacity: 3,
                properties: &properties,
            };
            for d in devices(&device, sharing) {
                let count = d.attributes.map_or(0, |a| a.len()) + d.capacity.map_or(0, |c| c.len());
                assert!(count <= MAX_ATTRIBUTES_AND_CAPACITIES, "{count}");
            }
        }
    }

    #[test]
    fn field_managers_fit_the_api_servers_limit() {
        assert_eq!(node_field_manager("node-a"), "akri-kubelet-plugin/node-a");
        let long_a = format!("{}.a", "n".repeat(250));
        let long_b = format!("{}.b", "n".repeat(250));
        let (a, b) = (node_field_manager(&long_a), node_field_manager(&long_b));
        assert_eq!(a.len(), 128);
        assert_ne!(
            a, b,
            "names that share their first 100 characters stay apart"
        );
        assert_eq!(a, node_field_manager(&long_a), "stable");
        let exactly = "x".repeat(128 - "akri-kubelet-plugin/".len());
        assert_eq!(node_field_manager(&exactly).len(), 128);
        assert!(node_field_manager(&exactly).ends_with(&exactly));
    }

    #[test]
    fn handler_names_must_make_driver_names() {
        for good in [
            "debugEcho",
            "udev",
            "opcua",
            "onvif",
            "my-handler2",
            &"a".repeat(MAX_HANDLER_NAME),
        ] {
            assert_eq!(validate_handler_name(good), Ok(()), "{good}");
            assert!(driver_name(good).len() <= 63);
        }
        for (bad, why) in [
            ("", "empty"),
            ("2cams", "start with a letter"),
            ("cams-", "end with a letter or digit"),
            ("../../etc", "start with a letter"),
            ("a/b", "'/'"),
            ("a.b", "'.'"),
            ("a_b", "'_'"),
            (&"a".repeat(MAX_HANDLER_NAME + 1), "at most 54"),
        ] {
            let error = validate_handler_name(bad).unwrap_err();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
    }

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
    fn configuration_names_must_make_device_names() {
        assert!(validate_configuration_name("onvif-cams").is_ok());
        assert!(validate_configuration_name(&"a".repeat(MAX_CONFIGURATION_NAME)).is_ok());
        for bad in ["", "cams.example", "Cams", "-cams", "cams-", "a_b"] {
            assert!(validate_configuration_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_configuration_name(&"a".repeat(MAX_CONFIGURATION_NAME + 1)).is_err());
        // Every slot device of the longest name fits a DNS label (capacity is at most 128).
        let instance = instance_name(&"a".repeat(MAX_CONFIGURATION_NAME), "x", true, "n");
        assert_eq!(format!("{instance}-127").len(), 63);
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
