//! One v0 Configuration to a DiscoveryConfiguration and, when it deploys brokers, a
//! BrokerTemplate in its namespace. Every field is carried over, reported as carried in
//! another form, or reported as lost: nothing is dropped silently.

use crate::broker;
use crate::input::Document;
use crate::names::Key;
use crate::report::{Kind, Origin, Report};
use akri_api::v0;
use akri_api::v1::{
    BrokerResource, BrokerTemplate, BrokerTemplateSpec, DiscoveryConfiguration,
    DiscoveryConfigurationSpec, DiscoveryHandlerSpec, DiscoveryProperty, DiscoveryReference,
};
use serde_json::Value;
use std::collections::BTreeMap;

/// Annotation on every migrated object: `<namespace>/<name>` of its v0 Configuration. A
/// DiscoveryConfiguration with another value (or none) is not overwritten by `--apply`; the
/// node agent holds it back while that v0 Configuration is served.
pub const MIGRATED_FROM: &str = akri_api::v1::MIGRATED_FROM_ANNOTATION;
/// Annotations not carried over: kubectl's record of the v0 object, which would be wrong on
/// the v1 one.
const SKIPPED_ANNOTATIONS: &[&str] = &["kubectl.kubernetes.io/last-applied-configuration"];

/// The largest `capacity` a DiscoveryConfiguration allows.
const MAX_CAPACITY: usize = 128;
/// The most discovery properties a DiscoveryConfiguration allows.
const MAX_DISCOVERY_PROPERTIES: usize = 64;

/// A v0 Configuration and what it became.
#[derive(Clone, Debug)]
pub struct Migrated {
    pub key: Key,
    pub origin: Origin,
    pub discovery: DiscoveryConfiguration,
    pub brokers: Option<BrokerTemplate>,
    /// Its `brokerProperties`, which workloads using its devices got from Akri's agent.
    pub broker_properties: BTreeMap<String, String>,
}

impl Migrated {
    /// The name of the DiscoveryConfiguration (and of its DeviceClass).
    pub fn name(&self) -> &str {
        self.discovery.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The Configuration in `document`, or an error naming the field that does not parse.
pub fn parse(document: &Document, report: &mut Report) -> Option<v0::Configuration> {
    match serde_path_to_error::deserialize::<_, v0::Configuration>(document.value.clone()) {
        Ok(config)
            if config
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| !n.is_empty()) =>
        {
            Some(config)
        }
        Ok(_) => {
            report.add(
                &document.origin,
                "",
                "metadata.name",
                Kind::Error,
                "a Configuration needs a name",
            );
            None
        }
        Err(e) => {
            let field = e.path().to_string();
            let field = if field == "." { String::new() } else { field };
            report.add(
                &document.origin,
                document.name(),
                field,
                Kind::Error,
                e.into_inner().to_string(),
            );
            None
        }
    }
}

/// The v1 objects of `config` (read as `document`), its DiscoveryConfiguration named `name`;
/// `None` (with errors in `report`) when it cannot be migrated.
pub fn convert(
    document: &Document,
    config: &v0::Configuration,
    key: &Key,
    name: &str,
    report: &mut Report,
) -> Option<Migrated> {
    let origin = &document.origin;
    let object = format!("{}/{}", key.0, key.1);
    let errors = report.count(Kind::Error);
    let mut add =
        |field: &str, kind: Kind, reason: String| report.add(origin, &object, field, kind, reason);
    unknown_fields(&document.value, &mut add);
    let spec = &config.spec;
    let raw_spec = &document.value["spec"];

    if let Err(e) = akri_devices::validate_handler_name(&spec.discovery_handler.name) {
        add(
            "spec.discoveryHandler.name",
            Kind::Error,
            format!(
                "{:?} cannot be a v1 discovery handler name (it names the DRA driver): {e}",
                spec.discovery_handler.name
            ),
        );
    }
    if spec.capacity > MAX_CAPACITY {
        add(
            "spec.capacity",
            Kind::Error,
            format!(
                "{} slots per device: a DiscoveryConfiguration allows at most {MAX_CAPACITY}",
                spec.capacity
            ),
        );
    }
    let properties = spec
        .discovery_handler
        .discovery_properties
        .clone()
        .unwrap_or_default();
    if properties.len() > MAX_DISCOVERY_PROPERTIES {
        add(
            "spec.discoveryHandler.discoveryProperties",
            Kind::Error,
            format!(
                "{} properties: a DiscoveryConfiguration allows at most {MAX_DISCOVERY_PROPERTIES}",
                properties.len()
            ),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, property) in properties.iter().enumerate() {
        let field = format!("spec.discoveryHandler.discoveryProperties[{i}]");
        if !seen.insert(&property.name) {
            add(
                &format!("{field}.name"),
                Kind::Error,
                format!(
                    "{} is given twice: v1 property names are unique",
                    property.name
                ),
            );
        }
        if let Some(
            v0::DiscoveryPropertySource::Secret(s) | v0::DiscoveryPropertySource::ConfigMap(s),
        ) = &property.value_from
            && (s.name.is_empty() || s.key.is_empty() || s.namespace.is_empty())
        {
            add(
                &format!("{field}.valueFrom"),
                Kind::Error,
                "a Secret or ConfigMap reference needs a name, a key and a namespace".into(),
            );
        }
    }
    let has_brokers = spec.broker_spec.is_some();
    if !spec.broker_properties.is_empty() {
        let names = spec
            .broker_properties
            .keys()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if has_brokers {
            add(
                "spec.brokerProperties",
                Kind::Note,
                format!(
                    "{names}: set as environment variables of the broker containers that had {}; Instances no longer list them, and other workloads that use these devices get them only when rewritten (--rewrite-workloads)",
                    broker::PLACEHOLDER
                ),
            );
        } else {
            add(
                "spec.brokerProperties",
                Kind::Lossy,
                format!(
                    "{names}: a DiscoveryConfiguration has no broker properties (Instances no longer list them; workloads that use these devices get them only when rewritten with --rewrite-workloads)"
                ),
            );
        }
    }
    if !has_brokers {
        for field in ["instanceServiceSpec", "configurationServiceSpec"] {
            if raw_spec.get(field).is_some() {
                add(
                    &format!("spec.{field}"),
                    Kind::Note,
                    "not carried: Akri creates it only for running brokers, and this Configuration has no brokerSpec".into(),
                );
            }
        }
    }
    if report.count(Kind::Error) > errors {
        return None;
    }

    let (labels, annotations) = carried_metadata(config, &object);
    let discovery = DiscoveryConfiguration {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: labels.clone(),
            annotations: annotations.clone(),
            ..Default::default()
        },
        spec: DiscoveryConfigurationSpec {
            discovery_handler: DiscoveryHandlerSpec {
                name: spec.discovery_handler.name.clone(),
                discovery_details: spec.discovery_handler.discovery_details.clone(),
                discovery_properties: properties.iter().map(DiscoveryProperty::from).collect(),
            },
            capacity: i32::try_from(spec.capacity).expect("checked against the maximum"),
            unique_devices: spec.unique_devices(),
            // The handler's default, which is what its devices brought under Akri too (but
            // for what the default refuses: host mounts and other nodes from network handlers).
            container_access: None,
            shared_devices: None,
        },
        status: None,
    };
    let brokers = if has_brokers {
        broker::brokers(raw_spec, &spec.broker_properties)
    } else {
        broker::Brokers::default()
    };
    let resources = |objects: Vec<Value>| -> Vec<BrokerResource> {
        objects
            .into_iter()
            .filter_map(|o| match o {
                Value::Object(map) => Some(BrokerResource(map)),
                _ => None,
            })
            .collect()
    };
    let brokers =
        (!brokers.instance.is_empty() || !brokers.global.is_empty()).then(|| BrokerTemplate {
            metadata: kube::api::ObjectMeta {
                name: Some(key.1.clone()),
                namespace: Some(key.0.clone()),
                labels,
                annotations,
                ..Default::default()
            },
            spec: BrokerTemplateSpec {
                discovery_reference: DiscoveryReference {
                    name: name.to_string(),
                },
                instance_broker_resources: resources(brokers.instance),
                global_broker_resources: resources(brokers.global),
            },
            status: None,
        });
    Some(Migrated {
        key: key.clone(),
        origin: origin.clone(),
        discovery,
        brokers,
        broker_properties: spec.broker_properties.clone(),
    })
}

type Labels = Option<BTreeMap<String, String>>;

/// The labels and annotations the v1 objects carry: the Configuration's (kubectl's record
/// aside) and [`MIGRATED_FROM`].
fn carried_metadata(config: &v0::Configuration, object: &str) -> (Labels, Labels) {
    let labels = config.metadata.labels.clone().filter(|l| !l.is_empty());
    let mut annotations = config.metadata.annotations.clone().unwrap_or_default();
    annotations.retain(|k, _| !SKIPPED_ANNOTATIONS.contains(&k.as_str()));
    annotations.insert(MIGRATED_FROM.into(), object.to_string());
    (labels, Some(annotations))
}

/// Fields of an Akri v0 Configuration, by path (`*` for each list item); below the broker and
/// service specs everything is carried verbatim.
const KNOWN: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "spec",
    "spec.discoveryHandler",
    "spec.discoveryHandler.name",
    "spec.discoveryHandler.discoveryDetails",
    "spec.discoveryHandler.discoveryProperties",
    "spec.discoveryHandler.discoveryProperties.*",
    "spec.discoveryHandler.discoveryProperties.*.name",
    "spec.discoveryHandler.discoveryProperties.*.value",
    "spec.discoveryHandler.discoveryProperties.*.valueFrom",
    "spec.discoveryHandler.discoveryProperties.*.valueFrom.secretKeyRef",
    "spec.discoveryHandler.discoveryProperties.*.valueFrom.configMapKeyRef",
    "spec.capacity",
    "spec.uniqueDevices",
    "spec.brokerProperties",
    "spec.brokerSpec",
    "spec.brokerSpec.brokerPodSpec",
    "spec.brokerSpec.brokerJobSpec",
    "spec.instanceServiceSpec",
    "spec.configurationServiceSpec",
];

/// Paths whose contents are carried as written (or, for `metadata`, looked at by key).
const VERBATIM: &[&str] = &[
    "spec.brokerSpec.brokerPodSpec",
    "spec.brokerSpec.brokerJobSpec",
    "spec.instanceServiceSpec",
    "spec.configurationServiceSpec",
    "spec.brokerProperties",
    "spec.discoveryHandler.discoveryProperties.*.valueFrom.secretKeyRef",
    "spec.discoveryHandler.discoveryProperties.*.valueFrom.configMapKeyRef",
];

/// Metadata the API server writes (or that names the object): not the user's to carry.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// Reports every field of `value` that is not part of a v0 Configuration (Akri's API server
/// would have pruned it, so it never did anything) and every metadata field that cannot be
/// carried.
fn unknown_fields(value: &Value, add: &mut impl FnMut(&str, Kind, String)) {
    if let Some(metadata) = value["metadata"].as_object() {
        for key in metadata
            .keys()
            .filter(|k| !SERVER_METADATA.contains(&k.as_str()))
        {
            add(
                &format!("metadata.{key}"),
                Kind::Lossy,
                format!(
                    "{key} is not carried: the v1 objects are new objects (a cluster-scoped DiscoveryConfiguration cannot have a namespaced owner)"
                ),
            );
        }
    }
    if !value["status"].is_null() {
        add(
            "status",
            Kind::Note,
            "status is not carried: the v1 controllers write their own".into(),
        );
    }
    walk(value, "", "", add);
}

fn walk(value: &Value, pattern: &str, path: &str, add: &mut impl FnMut(&str, Kind, String)) {
    if VERBATIM.contains(&pattern) || pattern == "metadata" {
        return;
    }
    let join = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            format!("{a}.{b}")
        }
    };
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let child_pattern = join(pattern, key);
                let child_path = join(path, key);
                if pattern.is_empty() && key == "status" {
                    continue;
                }
                if !KNOWN.contains(&child_pattern.as_str()) {
                    add(
                        &child_path,
                        Kind::Lossy,
                        "not a field of an Akri v0 Configuration (Akri's API server drops it): not carried".into(),
                    );
                    continue;
                }
                walk(child, &child_pattern, &child_path, add);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, &join(pattern, "*"), &format!("{path}[{i}]"), add);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn migrate(value: Value) -> (Option<Migrated>, Report) {
        let document = Document {
            origin: Origin::default(),
            value,
        };
        let mut report = Report::default();
        let config = parse(&document, &mut report).expect("parses");
        let key = ("ns".to_string(), document.name().to_string());
        let migrated = convert(&document, &config, &key, "new", &mut report);
        (migrated, report)
    }

    fn config(spec: Value) -> Value {
        json!({ "apiVersion": "akri.sh/v0", "kind": "Configuration", "metadata": { "name": "cams" }, "spec": spec })
    }

    #[test]
    fn unknown_fields_are_lossy_and_named() {
        let (migrated, report) = migrate(json!({
            "apiVersion": "akri.sh/v0", "kind": "Configuration",
            "metadata": { "name": "cams", "finalizers": ["x"], "uid": "1" },
            "spec": {
                "discoveryHandler": { "name": "udev", "discoveryDetails": "", "filter": "x",
                    "discoveryProperties": [{ "name": "a", "value": "b", "extra": 1 }] },
                "brokerSpec": { "brokerPodSpec": { "containers": [], "anything": 1 } },
                "colour": "red",
            },
        }));
        assert!(migrated.is_some());
        let lossy: Vec<&str> = report
            .findings
            .iter()
            .filter(|f| f.kind == Kind::Lossy)
            .map(|f| f.field.as_str())
            .collect();
        assert_eq!(
            lossy,
            [
                "metadata.finalizers",
                "spec.colour",
                "spec.discoveryHandler.discoveryProperties[0].extra",
                "spec.discoveryHandler.filter"
            ]
        );
    }

    #[test]
    fn defaults_become_explicit() {
        let (migrated, report) = migrate(config(
            json!({ "discoveryHandler": { "name": "debugEcho", "discoveryProperties": [
            { "name": "p", "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } },
        ] } }),
        ));
        assert!(report.findings.is_empty(), "{report:?}");
        let migrated = migrated.unwrap();
        let spec = serde_json::to_value(&migrated.discovery.spec).unwrap();
        assert_eq!(spec["capacity"], 1);
        assert_eq!(spec["uniqueDevices"], true);
        assert_eq!(
            spec["discoveryHandler"]["discoveryProperties"][0]["valueFrom"]["secretKeyRef"],
            json!({ "name": "s", "namespace": "default", "key": "k" })
        );
        assert!(migrated.brokers.is_none());
        assert_eq!(
            migrated.discovery.metadata.annotations.unwrap()[MIGRATED_FROM],
            "ns/cams"
        );
    }

    #[test]
    fn values_v1_cannot_hold_are_errors() {
        let (migrated, report) = migrate(config(
            json!({ "capacity": 500, "discoveryHandler": { "name": "my_handler" } }),
        ));
        assert!(migrated.is_none());
        let fields: Vec<&str> = report.findings.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(fields, ["spec.discoveryHandler.name", "spec.capacity"]);
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let document = Document {
            origin: Origin::default(),
            value: config(json!({ "discoveryHandler": { "name": "udev" }, "capacity": "two" })),
        };
        let mut report = Report::default();
        assert!(parse(&document, &mut report).is_none());
        assert_eq!(report.findings[0].field, "spec.capacity");
    }

    #[test]
    fn broker_properties_without_brokers_are_lossy() {
        let (_, report) = migrate(config(
            json!({ "discoveryHandler": { "name": "udev" }, "brokerProperties": { "A": "1" } }),
        ));
        assert_eq!(report.count(Kind::Lossy), 1);
        let (_, report) = migrate(config(json!({
            "discoveryHandler": { "name": "udev" }, "brokerProperties": { "A": "1" },
            "brokerSpec": { "brokerPodSpec": { "containers": [] } },
        })));
        assert_eq!(report.count(Kind::Lossy), 0);
        assert_eq!(report.count(Kind::Note), 1);
    }
}
