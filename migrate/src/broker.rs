//! What Akri's controller deploys for a v0 Configuration, as a BrokerTemplate of the shapes
//! in `examples/brokers/` (the user guide's "Akri's broker strategies"):
//!
//! - `brokerPodSpec`: a Pod `$(AKRI_NODE)-$(AKRI_INSTANCE)-pod` per Instance per node that
//!   reaches it, with Akri's labels;
//! - `brokerJobSpec`: a Job `$(AKRI_INSTANCE)-job` per Instance, its spec kept as written;
//! - `instanceServiceSpec`: a Service `$(AKRI_INSTANCE)-svc` per Instance;
//! - `configurationServiceSpec`: a Service `$(AKRI_CONFIGURATION)-svc`.
//!
//! Akri's `{{PLACEHOLDER}}` resource (which Akri's controller replaced with the Instance's
//! resource) is removed: the broker-controller binds every broker container to its
//! Instance's claim. Text is copied verbatim; only `$(AKRI_` is escaped, so that the kubelet
//! still sees what it saw under Akri.

use akri_api::v1::{POD_CLAIM_NAME, escape_variables};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The resource key Akri's controller replaces with `akri.sh/<instance>`.
pub const PLACEHOLDER: &str = "{{PLACEHOLDER}}";

/// Akri's label naming the broker's Configuration (here: its DiscoveryConfiguration).
const CONFIGURATION_LABEL: &str = "akri.sh/configuration";
const INSTANCE_LABEL: &str = "akri.sh/instance";
const TARGET_NODE_LABEL: &str = "akri.sh/target-node";
const CONTROLLER_LABEL: &str = "controller";
const CONTROLLER: &str = "akri.sh";

/// The objects of a BrokerTemplate: per Instance and once.
#[derive(Debug, Default, PartialEq)]
pub struct Brokers {
    pub instance: Vec<Value>,
    pub global: Vec<Value>,
}

/// What a v0 spec (`spec` of a Configuration, as read) deploys. `brokerProperties` become
/// environment variables of the broker containers that had the placeholder (those that Akri
/// gave the device, and with it these properties).
pub fn brokers(spec: &Value, broker_properties: &BTreeMap<String, String>) -> Brokers {
    let mut brokers = Brokers::default();
    let broker_spec = &spec["brokerSpec"];
    if let Some(pod_spec) = broker_spec.get("brokerPodSpec") {
        let name = "$(AKRI_NODE)-$(AKRI_INSTANCE)-pod";
        let mut labels = broker_labels();
        labels.insert(TARGET_NODE_LABEL.into(), json!("$(AKRI_NODE)"));
        labels.insert("app".into(), json!(name));
        brokers.instance.push(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name, "labels": labels },
            "spec": broker_pod_spec(pod_spec, broker_properties),
        }));
    }
    if let Some(job_spec) = broker_spec.get("brokerJobSpec") {
        let mut job_spec = escape_all(job_spec);
        if let Some(template) = job_spec.get_mut("template").and_then(Value::as_object_mut) {
            let metadata = template.entry("metadata").or_insert_with(|| json!({}));
            if let Some(metadata) = metadata.as_object_mut() {
                let labels = metadata.entry("labels").or_insert_with(|| json!({}));
                if let Some(labels) = labels.as_object_mut() {
                    labels.extend(broker_labels());
                }
            }
            if let Some(pod_spec) = template.get_mut("spec") {
                remove_placeholder(pod_spec, broker_properties);
            }
        }
        brokers.instance.push(json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": { "name": "$(AKRI_INSTANCE)-job", "labels": broker_labels() },
            "spec": job_spec,
        }));
    }
    if let Some(service) = spec.get("instanceServiceSpec") {
        brokers.instance.push(service_of(
            service,
            "$(AKRI_INSTANCE)-svc",
            INSTANCE_LABEL,
            "$(AKRI_INSTANCE)",
        ));
    }
    if let Some(service) = spec.get("configurationServiceSpec") {
        brokers.global.push(service_of(
            service,
            "$(AKRI_CONFIGURATION)-svc",
            CONFIGURATION_LABEL,
            "$(AKRI_CONFIGURATION)",
        ));
    }
    brokers
}

/// The labels Akri's controller puts on a broker (and selects in its Services).
fn broker_labels() -> Map<String, Value> {
    [
        (CONTROLLER_LABEL, "akri.sh"),
        (CONFIGURATION_LABEL, "$(AKRI_CONFIGURATION)"),
        (INSTANCE_LABEL, "$(AKRI_INSTANCE)"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), json!(v)))
    .collect()
}

fn broker_pod_spec(pod_spec: &Value, broker_properties: &BTreeMap<String, String>) -> Value {
    let mut pod_spec = escape_all(pod_spec);
    remove_placeholder(&mut pod_spec, broker_properties);
    pod_spec
}

/// Akri's Service: the spec as written, its selector extended with Akri's broker labels, and
/// Akri's labels (`app` is the Service's name).
fn service_of(spec: &Value, name: &str, label: &str, value: &str) -> Value {
    let mut spec = escape_all(spec);
    if let Some(spec) = spec.as_object_mut() {
        let selector = spec.entry("selector").or_insert_with(|| json!({}));
        if let Some(selector) = selector.as_object_mut() {
            selector.insert(CONTROLLER_LABEL.into(), json!(CONTROLLER));
            selector.insert(label.into(), json!(value));
        }
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "labels": { "app": name, CONTROLLER_LABEL: CONTROLLER, label: value },
        },
        "spec": spec,
    })
}

/// Takes `{{PLACEHOLDER}}` out of every container's limits and requests (dropping what is
/// left empty) and gives the containers that had it the broker properties as environment
/// (and init containers that had it the Instance's claim).
fn remove_placeholder(pod_spec: &mut Value, broker_properties: &BTreeMap<String, String>) {
    for list in ["initContainers", "containers"] {
        let Some(containers) = pod_spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
            let mut had = false;
            if let Some(resources) = container
                .get_mut("resources")
                .and_then(Value::as_object_mut)
            {
                for field in ["limits", "requests"] {
                    if let Some(map) = resources.get_mut(field).and_then(Value::as_object_mut) {
                        had |= map.remove(PLACEHOLDER).is_some();
                        if map.is_empty() {
                            resources.remove(field);
                        }
                    }
                }
                if resources.is_empty() {
                    container.remove("resources");
                }
            }
            if had && list == "initContainers" {
                // The broker-controller names the claim in every container; an init container
                // that Akri gave the device names it itself.
                let resources = container.entry("resources").or_insert_with(|| json!({}));
                if let Some(resources) = resources.as_object_mut() {
                    resources.insert("claims".into(), json!([{ "name": POD_CLAIM_NAME }]));
                }
            }
            if had && !broker_properties.is_empty() {
                add_env(container, broker_properties);
            }
        }
    }
}

/// Adds `NAME=value` for each property the container does not set itself.
pub fn add_env(container: &mut Map<String, Value>, properties: &BTreeMap<String, String>) {
    let env = container.entry("env").or_insert_with(|| json!([]));
    let Some(env) = env.as_array_mut() else {
        return;
    };
    for (name, value) in properties {
        if !env.iter().any(|e| e["name"] == name.as_str()) {
            env.push(json!({ "name": name, "value": escape_variables(value) }));
        }
    }
}

/// `value` with `$(AKRI_` escaped in every string.
fn escape_all(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(escape_variables(s)),
        Value::Array(items) => Value::Array(items.iter().map(escape_all).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), escape_all(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_goes_and_its_containers_get_the_broker_properties() {
        let spec = json!({
            "brokerSpec": { "brokerPodSpec": { "containers": [
                { "name": "a", "resources": { "limits": { PLACEHOLDER: "1" }, "requests": { PLACEHOLDER: "1", "cpu": "10m" } } },
                { "name": "b", "env": [{ "name": "X", "value": "mine" }] },
            ]}},
        });
        let properties = [("X".to_string(), "v0".to_string())].into();
        let brokers = brokers(&spec, &properties);
        let containers = &brokers.instance[0]["spec"]["containers"];
        assert_eq!(
            containers[0]["resources"],
            json!({ "requests": { "cpu": "10m" } })
        );
        assert_eq!(
            containers[0]["env"],
            json!([{ "name": "X", "value": "v0" }])
        );
        assert_eq!(
            containers[1]["env"],
            json!([{ "name": "X", "value": "mine" }])
        );
    }

    #[test]
    fn akri_values_in_v0_text_are_escaped() {
        let spec = json!({ "brokerSpec": { "brokerJobSpec": { "template": { "spec": {
            "containers": [{ "name": "a", "command": ["echo", "$(AKRI_X) $(HOME)"] }],
        }}}}});
        let job = &brokers(&spec, &BTreeMap::new()).instance[0];
        assert_eq!(
            job["spec"]["template"]["spec"]["containers"][0]["command"][1],
            "$$(AKRI_X) $(HOME)"
        );
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"]["akri.sh/instance"],
            "$(AKRI_INSTANCE)"
        );
    }

    #[test]
    fn services_select_akris_labels_besides_their_own() {
        let spec = json!({
            "instanceServiceSpec": { "selector": { "tier": "x" }, "ports": [{ "port": 80 }] },
            "configurationServiceSpec": { "ports": [{ "port": 80 }] },
        });
        let brokers = brokers(&spec, &BTreeMap::new());
        assert_eq!(
            brokers.instance[0]["spec"]["selector"],
            json!({ "tier": "x", "controller": "akri.sh", "akri.sh/instance": "$(AKRI_INSTANCE)" })
        );
        assert_eq!(
            brokers.global[0]["metadata"]["name"],
            "$(AKRI_CONFIGURATION)-svc"
        );
    }
}
