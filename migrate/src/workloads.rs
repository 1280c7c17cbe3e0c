//! Workloads that request Akri's device-plugin resources: `akri.sh/<configuration>` (any N
//! devices of a Configuration) and `akri.sh/<instance>` (a slot of one device). Each request
//! is listed with the DRA claim that replaces it; `--rewrite-workloads` makes the change: the
//! request becomes a ResourceClaimTemplate (added next to the workload) that the pod and the
//! container name, and the Configuration's `brokerProperties`, which Akri's agent put in the
//! container's environment, are set there.

use crate::broker;
use crate::convert::Migrated;
use crate::input::Document;
use crate::report::{Kind, Report};
use serde_json::{Map, Value, json};

const RESOURCE_PREFIX: &str = "akri.sh/";

/// What a requested `akri.sh/<name>` is in the migrated configurations.
#[derive(Debug)]
enum Target<'a> {
    /// Any `count` devices of the configuration.
    Configuration(&'a Migrated),
    /// One device: the v1 Instance of that name.
    Instance(&'a Migrated, String),
}

impl Target<'_> {
    fn migrated(&self) -> &Migrated {
        match self {
            Target::Configuration(m) | Target::Instance(m, _) => m,
        }
    }
}

/// One container's request for an Akri resource.
#[derive(Debug)]
struct Request<'a> {
    /// `containers[0]` or `initContainers[1]`, under the pod spec.
    container_path: String,
    resource: String,
    count: i64,
    target: Target<'a>,
}

/// Finds the requests of one workload, reports each with its replacement, and when
/// `rewrite`, returns the workload rewritten followed by its ResourceClaimTemplates (`None`:
/// nothing to rewrite).
pub fn migrate(
    document: &Document,
    default_namespace: &str,
    migrated: &[Migrated],
    rewrite: bool,
    report: &mut Report,
) -> Option<Vec<Value>> {
    let kind = document.kind().to_string();
    let path = akri_api::workload::pod_spec_path(&kind)?;
    let namespace = document.namespace(default_namespace).to_string();
    let name = document.name().to_string();
    let object = format!("{kind} {namespace}/{name}");
    let origin = &document.origin;
    let mut pod_spec = &document.value;
    for key in path {
        pod_spec = &pod_spec[*key];
    }
    let spec_path = path.join(".");
    let mut requests = Vec::new();
    for list in ["initContainers", "containers"] {
        let containers = pod_spec[list].as_array().cloned().unwrap_or_default();
        for (i, container) in containers.iter().enumerate() {
            let container_path = format!("{list}[{i}]");
            let container_name = container["name"].as_str().unwrap_or_default().to_string();
            let resources = &container["resources"];
            let mut names: Vec<&String> = ["limits", "requests"]
                .iter()
                .filter_map(|f| resources[*f].as_object())
                .flat_map(|m| m.keys())
                .filter(|k| k.starts_with(RESOURCE_PREFIX))
                .collect();
            names.sort();
            names.dedup();
            for resource in names {
                let field = format!("{spec_path}.{container_path}.resources");
                let quantity = resources["limits"]
                    .get(resource)
                    .or_else(|| resources["requests"].get(resource))
                    .expect("found among them");
                let Some(count) = count(quantity) else {
                    report.add(
                        origin,
                        &object,
                        field,
                        Kind::Error,
                        format!("{resource}: {quantity} is not a whole number of devices"),
                    );
                    continue;
                };
                let short = &resource[RESOURCE_PREFIX.len()..];
                let Some(target) = resolve(short, &namespace, migrated) else {
                    report.add(
                        origin,
                        &object,
                        field,
                        Kind::Workload,
                        format!("container {container_name} requests {resource}, which names no Configuration given here nor one of its Instances: give its Configuration to migrate this request"),
                    );
                    continue;
                };
                report.add(
                    origin,
                    &object,
                    field,
                    Kind::Workload,
                    describe(&container_name, resource, count, &target),
                );
                let properties = &target.migrated().broker_properties;
                if !rewrite && !properties.is_empty() {
                    report.add(
                        origin,
                        &object,
                        format!("{spec_path}.{container_path}.env"),
                        Kind::Lossy,
                        format!(
                            "container {container_name} got {} from Akri's agent, which the DRA driver does not set: rewrite it with --rewrite-workloads, or set them yourself",
                            properties.keys().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    );
                }
                requests.push(Request {
                    container_path: container_path.clone(),
                    resource: resource.clone(),
                    count,
                    target,
                });
            }
        }
    }
    if !rewrite || requests.is_empty() {
        return None;
    }
    Some(rewritten(&document.value, path, &name, &requests))
}

/// A whole, positive number of devices (`2`, `"2"`).
fn count(quantity: &Value) -> Option<i64> {
    let n = match quantity {
        Value::Number(n) => n.as_i64()?,
        Value::String(s) => s.parse().ok()?,
        _ => return None,
    };
    (n > 0).then_some(n)
}

/// `akri.sh/<short>`: a Configuration's name (preferring one in the workload's namespace, as
/// Akri's resource names were global) or `<configuration>-<6 hex digits>`, an Instance.
fn resolve<'a>(short: &str, namespace: &str, migrated: &'a [Migrated]) -> Option<Target<'a>> {
    let named = |name: &str| {
        let mut found = migrated.iter().filter(|m| m.key.1 == name);
        let first = found.next()?;
        Some(
            std::iter::once(first)
                .chain(found)
                .find(|m| m.key.0 == namespace)
                .unwrap_or(first),
        )
    };
    if let Some(m) = named(short) {
        return Some(Target::Configuration(m));
    }
    let (configuration, digest) = short.rsplit_once('-')?;
    let hex = digest.len() == 6
        && digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let m = named(configuration).filter(|_| hex)?;
    Some(Target::Instance(m, format!("{}-{digest}", m.name())))
}

fn describe(container: &str, resource: &str, count: i64, target: &Target) -> String {
    let new = target.migrated().name();
    match target {
        Target::Configuration(_) => {
            let renamed = if resource != format!("{RESOURCE_PREFIX}{new}") {
                format!(
                    " (the Configuration's DiscoveryConfiguration is {new}: the resource becomes {RESOURCE_PREFIX}{new})"
                )
            } else {
                String::new()
            };
            format!(
                "container {container} requests {resource}: {count}; with DRA, a claim for {count} device(s) of deviceClassName: {new}, or {RESOURCE_PREFIX}{new}: {count} as it is on Kubernetes 1.36 (DRAExtendedResource){renamed}"
            )
        }
        Target::Instance(_, instance) => format!(
            "container {container} requests {resource}: {count}, a slot of one device; with DRA, a claim for deviceClassName: {new} selecting {}",
            akri_devices::instance_selector(instance)
        ),
    }
}

/// The workload with each request replaced by a claim, and the claims' templates.
fn rewritten(workload: &Value, path: &[&str], name: &str, requests: &[Request]) -> Vec<Value> {
    let mut workload = workload.clone();
    let namespace = workload["metadata"]["namespace"].clone();
    let mut pod_spec = &mut workload;
    for key in path {
        pod_spec = &mut pod_spec[*key];
    }
    let mut templates = Vec::new();
    let mut claims = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let claim = format!("akri-{i}");
        let template = format!("{name}-{claim}");
        let container = container_mut(pod_spec, &request.container_path);
        if let Some(resources) = container
            .get_mut("resources")
            .and_then(Value::as_object_mut)
        {
            for field in ["limits", "requests"] {
                if let Some(map) = resources.get_mut(field).and_then(Value::as_object_mut) {
                    map.remove(&request.resource);
                    if map.is_empty() {
                        resources.remove(field);
                    }
                }
            }
        }
        let resources = container.entry("resources").or_insert_with(|| json!({}));
        let list = resources
            .as_object_mut()
            .expect("resources is an object")
            .entry("claims")
            .or_insert_with(|| json!([]));
        list.as_array_mut()
            .expect("claims is a list")
            .push(json!({ "name": claim }));
        broker::add_env(container, &request.target.migrated().broker_properties);
        if container["env"].as_array().is_some_and(Vec::is_empty) {
            container.remove("env");
        }
        claims.push(json!({ "name": claim, "resourceClaimTemplateName": template }));
        let mut exactly = json!({
            "deviceClassName": request.target.migrated().name(),
            "allocationMode": "ExactCount",
            "count": request.count,
        });
        if let Target::Instance(_, instance) = &request.target {
            exactly["selectors"] =
                json!([{ "cel": { "expression": akri_devices::instance_selector(instance) } }]);
        }
        let mut metadata = json!({ "name": template });
        if !namespace.is_null() {
            metadata["namespace"] = namespace.clone();
        }
        templates.push(json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": metadata,
            "spec": { "spec": { "devices": { "requests": [{ "name": "devices", "exactly": exactly }] } } },
        }));
    }
    let pod_claims = pod_spec
        .as_object_mut()
        .expect("a pod spec is an object")
        .entry("resourceClaims")
        .or_insert_with(|| json!([]));
    if let Some(list) = pod_claims.as_array_mut() {
        list.extend(claims);
    }
    std::iter::once(workload).chain(templates).collect()
}

fn container_mut<'v>(pod_spec: &'v mut Value, path: &str) -> &'v mut Map<String, Value> {
    let (list, index) = path
        .trim_end_matches(']')
        .split_once('[')
        .expect("list[index]");
    let index: usize = index.parse().expect("an index");
    pod_spec[list][index]
        .as_object_mut()
        .expect("a container is an object")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn migrated(name: &str, new: &str, properties: &[(&str, &str)]) -> Migrated {
        let properties: BTreeMap<String, String> = properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Migrated {
            key: ("ns".into(), name.into()),
            origin: Default::default(),
            discovery: akri_api::v1::DiscoveryConfiguration::new(
                new,
                serde_json::from_value(json!({ "discoveryHandler": { "name": "udev" } })).unwrap(),
            ),
            brokers: None,
            broker_properties: properties,
        }
    }

    fn deployment(limits: Value) -> Document {
        Document {
            origin: Default::default(),
            value: json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": { "name": "reader", "namespace": "ns" },
                "spec": { "template": { "spec": { "containers": [
                    { "name": "c", "resources": { "limits": limits } },
                ]}}},
            }),
        }
    }

    #[test]
    fn configuration_and_instance_requests_become_claims() {
        let all = [migrated("cams", "cams", &[("ROOM", "a")])];
        let doc = deployment(json!({ "akri.sh/cams": "2", "akri.sh/cams-0a1b2c": 1, "cpu": "1" }));
        let mut report = Report::default();
        let out = migrate(&doc, "default", &all, true, &mut report).unwrap();
        assert_eq!(report.count(Kind::Workload), 2, "{report:?}");
        assert_eq!(report.count(Kind::Lossy), 0);
        let pod = &out[0]["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["resources"],
            json!({ "limits": { "cpu": "1" }, "claims": [{ "name": "akri-0" }, { "name": "akri-1" }] })
        );
        assert_eq!(
            pod["containers"][0]["env"],
            json!([{ "name": "ROOM", "value": "a" }])
        );
        assert_eq!(
            pod["resourceClaims"][0],
            json!({ "name": "akri-0", "resourceClaimTemplateName": "reader-akri-0" })
        );
        let exactly =
            |i: usize| out[i]["spec"]["spec"]["devices"]["requests"][0]["exactly"].clone();
        assert_eq!(exactly(1)["count"], 2);
        assert_eq!(exactly(1)["deviceClassName"], "cams");
        assert_eq!(
            exactly(2)["selectors"][0]["cel"]["expression"],
            "device.attributes[\"akri.sh\"].instance == \"cams-0a1b2c\""
        );
        assert_eq!(out[1]["metadata"]["namespace"], "ns");
    }

    #[test]
    fn listing_without_rewriting_reports_the_lost_environment() {
        let all = [migrated("cams", "cams-lab", &[("ROOM", "a")])];
        let mut report = Report::default();
        assert!(
            migrate(
                &deployment(json!({ "akri.sh/cams": 1 })),
                "default",
                &all,
                false,
                &mut report
            )
            .is_none()
        );
        assert_eq!(report.count(Kind::Lossy), 1);
        assert!(
            report.findings[0]
                .reason
                .contains("the resource becomes akri.sh/cams-lab"),
            "{report:?}"
        );
    }

    #[test]
    fn unknown_resources_are_listed_and_left_alone() {
        let mut report = Report::default();
        assert!(
            migrate(
                &deployment(json!({ "akri.sh/other": 1 })),
                "default",
                &[],
                true,
                &mut report
            )
            .is_none()
        );
        assert!(
            report.findings[0].reason.contains("names no Configuration"),
            "{report:?}"
        );
    }
}
