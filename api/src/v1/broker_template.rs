//! `BrokerTemplate`: what to run next to the devices of a DiscoveryConfiguration.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Workloads the broker-controller creates for a DiscoveryConfiguration's devices: one copy of
/// `instanceBrokerResources` per Instance (bound to that device through a ResourceClaim) and
/// one copy of `globalBrokerResources` per DiscoveryConfiguration.
#[allow(
    clippy::duplicated_attributes,
    reason = "two printcolumn(...) share `type_ = \"string\"`, which clippy takes for a duplicate"
)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "akri.sh",
    version = "v1",
    kind = "BrokerTemplate",
    namespaced,
    shortname = "bt",
    category = "akri",
    status = "BrokerTemplateStatus",
    doc = "Workloads the broker-controller creates for a DiscoveryConfiguration's devices: `instanceBrokerResources` once per Instance, each bound to its device through a ResourceClaim, and `globalBrokerResources` once per configuration.",
    printcolumn(
        name = "Discovery",
        type_ = "string",
        json_path = ".spec.discoveryReference.name"
    ),
    printcolumn(name = "Brokers", type_ = "integer", json_path = ".status.brokers"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("size(self.instanceBrokerResources) + size(self.globalBrokerResources) > 0").message("a BrokerTemplate needs at least one object in instanceBrokerResources or globalBrokerResources"))]
pub struct BrokerTemplateSpec {
    /// The DiscoveryConfiguration whose devices the brokers serve.
    pub discovery_reference: DiscoveryReference,
    /// Objects created once per Instance (e.g. a Deployment or Job and a Service).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub instance_broker_resources: Vec<BrokerResource>,
    /// Objects created once per DiscoveryConfiguration (e.g. a Service over all brokers).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub global_broker_resources: Vec<BrokerResource>,
}

/// A reference to a cluster-scoped DiscoveryConfiguration (or, from a PropertyFilter, the
/// configuration whose devices it narrows).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryReference {
    /// The DiscoveryConfiguration's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Any Kubernetes object, kept as written. Its `apiVersion` and `kind` are checked here; the
/// rest is checked by the API server when the broker-controller creates it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(transparent)]
pub struct BrokerResource(pub serde_json::Map<String, serde_json::Value>);

impl schemars::JsonSchema for BrokerResource {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "BrokerResource".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "object",
            "description": "A Kubernetes object to create for each device (or once), as it would be applied.",
            "required": ["apiVersion", "kind"],
            "properties": {
                "apiVersion": { "type": "string", "minLength": 1, "description": "The object's API version, e.g. `apps/v1`." },
                "kind": { "type": "string", "minLength": 1, "description": "The object's kind, e.g. `Deployment`: one the broker-controller may create." },
                "metadata": {
                    "type": "object",
                    "description": "The object's metadata; the broker-controller names it after its Instance and owns it.",
                    "properties": {
                        "name": { "type": "string", "description": "A name prefix: the broker-controller adds the Instance's name." },
                        "namespace": { "type": "string", "description": "Left out: objects are created in the BrokerTemplate's namespace." },
                    },
                    "x-kubernetes-preserve-unknown-fields": true,
                },
            },
            "x-kubernetes-preserve-unknown-fields": true,
            "x-kubernetes-validations": [{
                "rule": "!has(self.metadata) || !has(self.metadata.namespace)",
                "message": "broker resources are created in the BrokerTemplate's namespace: leave metadata.namespace out",
            }],
        })
    }
}

/// What the broker-controller observed of a BrokerTemplate.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BrokerTemplateStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Instances that currently have their brokers.
    #[serde(default)]
    pub brokers: i32,
    /// Objects the broker-controller manages for the template (ResourceClaimTemplates
    /// included), as wanted now.
    #[serde(default)]
    pub objects: i32,
    /// The kinds (`<kind>.<apiVersion>`, e.g. `Deployment.apps/v1`) holding objects of the
    /// template, so that objects of a kind removed from it are still found and deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub managed_kinds: Vec<String>,
    /// The template's Jobs that finished, as `<name> <digest>`: not run again (after their
    /// `ttlSecondsAfterFinished`, say) until the template renders them differently.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub finished_jobs: Vec<String>,
    /// `Ready`, or `Ready=False` with the objects the API server refused and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The name, in a broker pod spec's `resourceClaims`, of the claim that binds it to its
/// Instance (the broker-controller adds it; `akri-migrate` writes it).
pub const POD_CLAIM_NAME: &str = "akri-device";

/// The text that the broker-controller's substitution of `$(AKRI_...)` variables turns back
/// into `text`: every `$(AKRI_` escaped as `$$(AKRI_`, for text written before these
/// variables existed (a migrated v0 broker spec), which must reach the kubelet as written.
pub fn escape_variables(text: &str) -> String {
    text.replace("$(AKRI_", "$$(AKRI_")
}
