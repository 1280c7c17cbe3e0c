//! `PropertyFilter`: a request for only those devices whose discovered properties match.

use super::DiscoveryReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Narrows a DiscoveryConfiguration's devices by their discovered properties. The
/// driver-controller compiles it to a CEL selector in a DeviceClass of the same name, so the
/// **scheduler** applies it: claims use `deviceClassName: <filter name>`.
#[allow(
    clippy::duplicated_attributes,
    reason = "two printcolumn(...) share `type_ = \"string\"`, which clippy takes for a duplicate"
)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "akri.sh",
    version = "v1",
    kind = "PropertyFilter",
    shortname = "pf",
    category = "akri",
    status = "PropertyFilterStatus",
    doc = "Narrows a DiscoveryConfiguration's devices by their discovered properties: the driver-controller compiles it to a CEL selector in a DeviceClass of the same name, which the scheduler applies (`deviceClassName: <filter name>` in a ResourceClaim).",
    printcolumn(
        name = "Discovery",
        type_ = "string",
        json_path = ".spec.discoveryReference.name"
    ),
    printcolumn(
        name = "Matching",
        type_ = "integer",
        json_path = ".status.matchingDevices"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    validation = Rule::new("size(self.metadata.name) <= 63").message("metadata.name must be at most 63 characters: its DeviceClass carries it as the value of the label akri.sh/property-filter, and label values are at most 63 characters"),
)]
#[serde(rename_all = "camelCase")]
pub struct PropertyFilterSpec {
    /// The DiscoveryConfiguration whose devices are filtered.
    #[x_kube(validation = Rule::new("self == oldSelf").message("discoveryReference is immutable: claims already allocated through this filter were checked against the old configuration"))]
    pub discovery_reference: DiscoveryReference,
    /// All filters must hold for a device to match.
    #[schemars(length(min = 1, max = 32))]
    pub filters: Vec<Filter>,
}

/// One rule on one discovered property.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Filter {
    /// Property name, as the discovery handler reports it (e.g. `ONVIF_DEVICE_IP_ADDRESS`).
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
    /// The value the property is compared with (exact, case-sensitive).
    pub value: String,
    /// `Include`: the property must equal `value`. `Exclude`: it must not (a device without
    /// the property is not excluded).
    #[serde(default)]
    pub mode: FilterMode,
}

/// How a [`Filter`] applies.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum FilterMode {
    #[default]
    Include,
    Exclude,
}

/// What the driver-controller observed of a PropertyFilter.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PropertyFilterStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The CEL expression the filters compiled to, as the scheduler evaluates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled_expression: Option<String>,
    /// Published devices that match now.
    #[serde(default)]
    pub matching_devices: i32,
    /// The DeviceClass made for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class_name: Option<String>,
    /// `Ready`, or `Ready=False` with reason `InvalidFilter` (a message naming the filter that
    /// cannot compile, or the limit its CEL exceeds), `DeviceClassConflict` (a DeviceClass of
    /// its name that Akri does not own), `NameConflict` or `DiscoveryConfigurationNotFound`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
