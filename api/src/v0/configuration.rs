//! `Configuration` (`akri.sh/v0`, short name `akric`): what to discover, how many consumers may
//! share each discovered device, and what to deploy for it.
//!
//! The JSON is Akri v0.13's, field for field; see the [compatibility contract](super).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::JobSpec;
use k8s_openapi::api::core::v1::{PodSpec, ServiceSpec};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::schema::{not_nullable, positive_count, preserved_object};

/// The desired state of an Akri Configuration.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "akri.sh",
    version = "v0",
    kind = "Configuration",
    plural = "configurations",
    singular = "configuration",
    shortname = "akric",
    namespaced,
    derive = "PartialEq",
    doc = "An Akri Configuration: the discovery handler to run, the number of slots of each device it finds, and the brokers and services to deploy for those devices.",
    printcolumn(
        name = "Capacity",
        type_ = "integer",
        description = "The capacity of each Instance discovered",
        json_path = ".spec.capacity"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationSpec {
    /// The discovery handler that finds the devices, and what it needs to know to find them.
    pub discovery_handler: DiscoveryHandlerInfo,

    /// How many consumers may use each discovered device at once: the number of usage slots of
    /// every Instance. Defaults to 1.
    #[serde(default = "default_capacity")]
    #[schemars(schema_with = "positive_count")]
    pub capacity: usize,

    /// The workload to deploy for the discovered devices: a Pod on every node that can reach a
    /// device, or a Job per device.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_yaml::with::singleton_map"
    )]
    #[schemars(schema_with = "not_nullable::<BrokerSpec>")]
    pub broker_spec: Option<BrokerSpec>,

    /// A Service to create for each discovered device (each Instance), selecting its brokers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub instance_service_spec: Option<ServiceSpec>,

    /// A Service to create once for the Configuration, selecting the brokers of all its devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_object")]
    pub configuration_service_spec: Option<ServiceSpec>,

    /// Properties given to the brokers as environment variables and copied into every Instance.
    #[serde(default)]
    pub broker_properties: BTreeMap<String, String>,

    /// Whether a request for N devices of the Configuration-level resource must get N
    /// different devices (default) or may get several slots of one device. Not in Akri
    /// v0.13's schema (its seed design has it): optional here, so Akri's YAML round-trips.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "not_nullable::<bool>")]
    pub unique_devices: Option<bool>,
}

impl ConfigurationSpec {
    /// `uniqueDevices`, defaulted.
    pub fn unique_devices(&self) -> bool {
        self.unique_devices.unwrap_or(true)
    }
}

/// The `capacity` of a Configuration that does not set one.
pub const DEFAULT_CAPACITY: usize = 1;

fn default_capacity() -> usize {
    DEFAULT_CAPACITY
}

/// The discovery handler of a Configuration, and the details it needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryHandlerInfo {
    /// The name the discovery handler registered with (for example `debugEcho`, `udev`, `onvif`,
    /// `opcua`).
    #[schemars(length(min = 1))]
    pub name: String,

    /// Handler-specific details, as a string that the handler parses (Akri's handlers use YAML).
    #[serde(default)]
    pub discovery_details: String,

    /// Named values passed to the discovery handler, given inline or read from a Secret or a
    /// ConfigMap (for example credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "not_nullable::<Vec<DiscoveryProperty>>")]
    pub discovery_properties: Option<Vec<DiscoveryProperty>>,
}

/// A named value passed to a discovery handler: exactly one of `value` and `valueFrom`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.value) != has(self.valueFrom)",
    "message": "a discovery property needs exactly one of value and valueFrom",
}]))]
pub struct DiscoveryProperty {
    /// The property name: a letter or `_`, then letters, digits or `_`.
    #[schemars(pattern(r"^[_A-Za-z][_A-Za-z0-9]*$"))]
    pub name: String,

    /// The value, given inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "not_nullable::<String>")]
    pub value: Option<String>,

    /// Where to read the value from.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_yaml::with::singleton_map"
    )]
    #[schemars(schema_with = "not_nullable::<DiscoveryPropertySource>")]
    pub value_from: Option<DiscoveryPropertySource>,
}

/// Where a discovery property's value comes from (`valueFrom`): one key of a Secret or of a
/// ConfigMap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DiscoveryPropertySource {
    /// `configMapKeyRef`: a key of a ConfigMap.
    #[serde(rename = "configMapKeyRef")]
    ConfigMap(KeySelector),
    /// `secretKeyRef`: a key of a Secret.
    #[serde(rename = "secretKeyRef")]
    Secret(KeySelector),
}

impl JsonSchema for DiscoveryPropertySource {
    fn schema_name() -> Cow<'static, str> {
        "DiscoveryPropertySource".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let selector = generator.subschema_for::<KeySelector>();
        json_schema!({
            "description": "Where to read the value from: exactly one of secretKeyRef and configMapKeyRef.",
            "type": "object",
            "properties": {
                "secretKeyRef": selector,
                "configMapKeyRef": selector,
            },
            "x-kubernetes-validations": [{
                "rule": "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                "message": "valueFrom needs exactly one of secretKeyRef and configMapKeyRef",
            }],
        })
    }
}

/// One key of a Secret or a ConfigMap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct KeySelector {
    /// The key to read.
    pub key: String,

    /// The name of the Secret or ConfigMap.
    pub name: String,

    /// The namespace of the Secret or ConfigMap. Defaults to `default` (Akri's default), not to
    /// the namespace of the Configuration.
    #[serde(default = "default_namespace")]
    pub namespace: String,

    /// Whether the Secret or ConfigMap, or its key, may be missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "not_nullable::<bool>")]
    pub optional: Option<bool>,
}

/// The `namespace` of a [`KeySelector`] that does not set one.
pub const DEFAULT_KEY_SELECTOR_NAMESPACE: &str = "default";

fn default_namespace() -> String {
    DEFAULT_KEY_SELECTOR_NAMESPACE.to_owned()
}

/// The workload a Configuration deploys for its devices (`brokerSpec`): exactly one of
/// `brokerPodSpec` and `brokerJobSpec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum BrokerSpec {
    /// `brokerPodSpec`: a Pod on every node that can reach a device.
    #[serde(rename = "brokerPodSpec")]
    Pod(Box<PodSpec>),
    /// `brokerJobSpec`: a Job for every device.
    #[serde(rename = "brokerJobSpec")]
    Job(Box<JobSpec>),
}

impl JsonSchema for BrokerSpec {
    fn schema_name() -> Cow<'static, str> {
        "BrokerSpec".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut pod = preserved_object(generator);
        pod.insert(
            "description".into(),
            "The Pod to run on every node that can reach a device.".into(),
        );
        let mut job = preserved_object(generator);
        job.insert(
            "description".into(),
            "The Job to run for every device.".into(),
        );
        json_schema!({
            "description": "The workload to deploy for the discovered devices: exactly one of brokerPodSpec and brokerJobSpec.",
            "type": "object",
            "properties": {
                "brokerPodSpec": pod,
                "brokerJobSpec": job,
            },
            "x-kubernetes-validations": [{
                "rule": "has(self.brokerPodSpec) != has(self.brokerJobSpec)",
                "message": "brokerSpec needs exactly one of brokerPodSpec and brokerJobSpec",
            }],
        })
    }
}
