//! `DiscoveryConfiguration`: what a discovery handler should look for, and how the devices it
//! finds may be shared.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Devices found by one discovery handler with one set of details.
///
/// Becomes a DeviceClass of the same name (with extended resource `akri.sh/<name>`), so pods
/// ask for its devices with `deviceClassName: <name>` in a ResourceClaim, or with
/// `resources.limits: {akri.sh/<name>: N}` (an extended resource is asked for with a limit).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "akri.sh",
    version = "v1",
    kind = "DiscoveryConfiguration",
    shortname = "akridc",
    category = "akri",
    status = "DiscoveryConfigurationStatus",
    doc = "Devices found by one discovery handler with one set of details: a DeviceClass of the same name selects them (`deviceClassName: <name>` in a ResourceClaim, or the extended resource `akri.sh/<name>`), and each device found gets an Instance.",
    printcolumn(name = "Handler", type_ = "string", json_path = ".spec.discoveryHandler.name"),
    printcolumn(name = "Capacity", type_ = "integer", json_path = ".spec.capacity", priority = 1),
    printcolumn(name = "Unique", type_ = "boolean", json_path = ".spec.uniqueDevices", priority = 1),
    printcolumn(name = "Instances", type_ = "integer", json_path = ".status.instances"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.nodes"),
    printcolumn(name = "Devices", type_ = "integer", json_path = ".status.devicesPublished"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Degraded", type_ = "string", json_path = ".status.conditions[?(@.type==\"Degraded\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("size(self.metadata.name) <= 52").message("metadata.name must be at most 52 characters: Instances are named <name>-<6 hex digits> and their slot devices <instance>-<slot>, which must fit in 63"),
    validation = Rule::new("self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("metadata.name must be a DNS label (lower-case letters, digits and '-', no '.'): its devices are named <name>-<6 hex digits>, and DRA device names are DNS labels"),
)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryConfigurationSpec {
    /// Which handler discovers the devices, and what it is told.
    #[x_kube(validation = Rule::new("self.name == oldSelf.name").message("discoveryHandler.name is immutable: changing it would strand every device and claim of this configuration; create a new DiscoveryConfiguration instead"))]
    pub discovery_handler: DiscoveryHandlerSpec,

    /// How many claims may use one device at the same time (its slots).
    #[serde(default = "default_capacity")]
    #[schemars(range(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self >= oldSelf").message("capacity can only grow: lowering it could take slots from claims that already hold them; create a new DiscoveryConfiguration instead"))]
    pub capacity: i32,

    /// A request for N devices gets N different devices (`true`, devices as data sources such
    /// as cameras), or may get several slots of one device (`false`, devices as compute).
    #[serde(default = "default_unique_devices")]
    pub unique_devices: bool,

    /// What the devices may bring into the containers that use them: each an allowlist. A
    /// device whose handler reports more is refused on its node, with the reason in
    /// `status.discoveryErrors`; the configuration's other devices are published. Absent: the
    /// handler kind's default, `udev`: character devices under `/dev/` (not the host's memory
    /// devices, no block devices), read-write; every other handler: none. Either way the
    /// handler kind's known properties come as environment variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_access: Option<ContainerAccess>,

    /// How the configuration's shared devices (those several nodes discover, such as network
    /// cameras and OPC UA servers) reach pods. Node-local devices always go through their
    /// node's kubelet-plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_devices: Option<SharedDevices>,
}

/// How shared devices reach pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.nodeSelector) || self.nodeOperations == 'Skip'").message("sharedDevices.nodeSelector needs nodeOperations: Skip: the nodes it selects may run no kubelet-plugin to prepare the devices"))]
pub struct SharedDevices {
    /// `Required` (the default): the kubelet asks the node's kubelet-plugin to prepare each
    /// claim, which gives the containers the devices' properties as environment variables and
    /// device metadata, and shows the devices in the claim's status.
    ///
    /// `Skip`: the devices' ResourceSlices say `skipNodeOperations: ["*"]`, so the kubelet
    /// calls no plugin for a claim of only these devices. Its pod needs no kubelet-plugin on
    /// its node and never waits for one to unprepare, but its containers get nothing from
    /// Akri (no environment variables, no metadata file, no binding check): the workload
    /// finds its device from its claim. Needs DRAOptionalNodeOperations (alpha in Kubernetes
    /// 1.37) on the API server, the scheduler and the kubelets; where the API server does
    /// not keep the field, the devices are prepared as with `Required` and the
    /// configuration's `Ready` condition says so.
    #[serde(default)]
    pub node_operations: NodeOperations,
    /// With `nodeOperations: Skip`: the labels a node must have to use the devices, instead of
    /// having discovered them. Such nodes need not run the kubelet-plugin; a device is still
    /// published only while some node discovers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<std::collections::BTreeMap<String, String>>,
}

/// Whether the kubelet calls the node's kubelet-plugin for a claim.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum NodeOperations {
    #[default]
    Required,
    Skip,
}

/// What a configuration's devices may bring into containers besides their handler kind's
/// known properties: device nodes, mounts and further environment names, each an allowlist.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAccess {
    /// Device nodes whose host path, resolved on the node (symlinks followed, never out of
    /// `/dev/`), starts with one of these (`/dev/video` allows `/dev/video0`): character
    /// devices, with cgroup permissions `r` and `m` (mknod of that device only), and `w` if
    /// `writable`. Block devices and the host's memory devices only where `blockDevices` and
    /// `memoryDevices` say so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub device_nodes: Vec<HostPathPrefix>,
    /// Mounts whose host path, in canonical form (no `//`, `.` or `..`), starts with one of
    /// these, read-only unless `writable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub mounts: Vec<HostPathPrefix>,
    /// Environment variable names the devices may bring besides their handler kind's known
    /// properties (a handler of your own names its properties here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 128), pattern(r"^[A-Za-z_][A-Za-z0-9_]*$"))
    )]
    pub environment: Vec<String>,
    /// Whether `deviceNodes` may be block devices (disks, partitions: the host's data).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_devices: bool,
    /// Whether `deviceNodes` may be the host's memory devices (`/dev/mem`, `/dev/kmem`,
    /// `/dev/port`, `/dev/kmsg`, ...: character major 1 other than `null`, `zero`, `full`,
    /// `random` and `urandom`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_devices: bool,
}

/// A host path prefix, compared as text with the canonical form of each path a device
/// reports (`/dev/ttyUSB` allows `/dev/ttyUSB0`; `/dev//mem` and `/dev/char/1:1` are
/// `/dev/mem` by then).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostPathPrefix {
    /// An absolute host path prefix: what a device reports is allowed when it starts with it.
    #[schemars(length(min = 2, max = 4096))]
    #[x_kube(
        validation = Rule::new("self.startsWith('/')").message("a host path prefix must be absolute"),
        validation = Rule::new("!self.split('/').exists(c, c == '..')").message("a host path prefix must not contain '..'"),
    )]
    pub path: String,
    /// Whether containers may write (device nodes: `rw`; mounts: not read-only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable: bool,
}

fn default_capacity() -> i32 {
    1
}

fn default_unique_devices() -> bool {
    true
}

/// The discovery handler and its input.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryHandlerSpec {
    /// Name the handler registers with (e.g. `udev`, `onvif`, `opcua`, `debugEcho`). The DRA
    /// driver of its devices is `<name, lower-cased>.akri.sh`.
    #[schemars(length(min = 1, max = 54))]
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$')").message("discoveryHandler.name must be letters, digits and '-', starting and ending with a letter or digit: it becomes part of the DRA driver name <name>.akri.sh"),
        validation = Rule::new("self.matches('^[A-Za-z]')").message("discoveryHandler.name must start with a letter: lower-cased, it is the CDI class of its devices (akri.sh/<class>=<device>), which must start with a letter"),
    )]
    pub name: String,

    /// Handler-specific details, passed to the handler verbatim (usually YAML).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub discovery_details: String,

    /// Extra values for the handler, literal or read from Secrets and ConfigMaps by the agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.all(p, self.exists_one(q, q.name == p.name))").message("discoveryProperties names must be unique"))]
    pub discovery_properties: Vec<DiscoveryProperty>,
}

/// One named value for the discovery handler.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.value) != has(self.valueFrom)").message("a discovery property needs exactly one of value and valueFrom"))]
pub struct DiscoveryProperty {
    /// The name the handler knows the value by.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$')").message("a discovery property name may only contain letters, digits, '-', '_' and '.'"))]
    pub name: String,
    /// The value itself (one of `value` and `valueFrom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Where the node reads the value (one of `value` and `valueFrom`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<DiscoveryPropertySource>,
}

/// Where a discovery property's value comes from. The configuration is cluster-scoped, so each
/// reference names its namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretKeyRef) != has(self.configMapKeyRef)").message("valueFrom needs exactly one of secretKeyRef and configMapKeyRef"))]
pub struct DiscoveryPropertySource {
    /// A key of a Secret (the chart lets nodes read only the Secrets `propertySecrets` names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyReference>,
    /// A key of a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyReference>,
}

/// A key of a Secret or ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeyReference {
    /// The Secret's or ConfigMap's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Its namespace (one of the chart's `propertyNamespaces`).
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The key whose value is the property's.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// When true, a missing object or key is no error: the property is left out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// What the controllers observed of a DiscoveryConfiguration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryConfigurationStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Instances currently discovered.
    #[serde(default)]
    pub instances: i32,
    /// Nodes that see at least one of its devices.
    #[serde(default)]
    pub nodes: i32,
    /// Devices published in ResourceSlices (slot devices counted one by one).
    #[serde(default)]
    pub devices_published: i32,
    /// The DeviceClass made for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class_name: Option<String>,
    /// Nodes whose discovery of this configuration currently fails, one entry per node,
    /// written by that node's kubelet-plugin (and removed when discovery works again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub discovery_errors: Vec<NodeDiscoveryError>,
    /// `Ready`, `Degraded` (with the handler's or the cluster's error in the message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Why discovery of a configuration fails on one node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeDiscoveryError {
    /// The node whose discovery fails.
    pub node: String,
    /// What went wrong, e.g. the handler's error or a property that could not be resolved.
    pub message: String,
}

/// A v0 discovery property as v1 says it: the same name and value, or the same Secret or
/// ConfigMap key (v0 defaults a reference's namespace to `default`, which it carries here).
/// The one conversion, for the legacy path (which resolves v0 properties with the v1 code)
/// and for migration.
impl From<&crate::v0::DiscoveryProperty> for DiscoveryProperty {
    fn from(v0: &crate::v0::DiscoveryProperty) -> Self {
        use crate::v0::DiscoveryPropertySource as Source;
        let reference = |selector: &crate::v0::KeySelector| KeyReference {
            name: selector.name.clone(),
            namespace: selector.namespace.clone(),
            key: selector.key.clone(),
            optional: selector.optional.unwrap_or(false),
        };
        DiscoveryProperty {
            name: v0.name.clone(),
            value: v0.value.clone(),
            value_from: v0.value_from.as_ref().map(|source| match source {
                Source::Secret(selector) => DiscoveryPropertySource {
                    secret_key_ref: Some(reference(selector)),
                    config_map_key_ref: None,
                },
                Source::ConfigMap(selector) => DiscoveryPropertySource {
                    secret_key_ref: None,
                    config_map_key_ref: Some(reference(selector)),
                },
            }),
        }
    }
}
