//! What a BrokerTemplate's objects become for one Instance (or once per configuration):
//! `$(AKRI_*)` values substituted, names and labels set, the device's claim wired into every
//! pod spec. Pure functions: the controller applies what comes out.
//!
//! Values are written as Kubernetes writes variable references in container commands,
//! `$(NAME)`, all of ours prefixed `AKRI_` so that the kubelet's own `$(VAR)` expansion of
//! the broker's environment is left alone. `$$(AKRI_X)` is a literal `$(AKRI_X)`.
//!
//! | value | meaning |
//! |---|---|
//! | `$(AKRI_INSTANCE)` | the Instance's name (per-Instance objects) |
//! | `$(AKRI_CONFIGURATION)` | the DiscoveryConfiguration's name |
//! | `$(AKRI_NODE)` | a node that reaches the device; an object whose name has it is made once per such node, at most `capacity` of them |
//! | `$(AKRI_CLAIM_TEMPLATE)` | the ResourceClaimTemplate that binds a pod to the Instance (per-Instance objects) |
//! | `$(AKRI_DEVICE_CLASS)` | the configuration's DeviceClass |
//! | `$(AKRI_TEMPLATE)` | the BrokerTemplate's name |
//! | `$(AKRI_PROPERTY_<KEY>)` | the Instance's broker property `<KEY>` |

use akri_api::workload::pod_spec_path;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Label on every object made for a BrokerTemplate: the template's UID (names may be longer
/// than a label value), which is how the controller finds what it made.
pub const TEMPLATE_UID_LABEL: &str = "akri.sh/broker-template-uid";
/// Annotation naming the Instance an object was made for.
pub const INSTANCE_ANNOTATION: &str = "akri.sh/instance";
/// Annotation with a digest of what was applied: an object whose digest is unchanged is not
/// applied again, so a completed Job or a scaled Deployment is left as it is.
pub const DIGEST_ANNOTATION: &str = "akri.sh/broker-digest";
pub use akri_api::v1::{POD_CLAIM_NAME, escape_variables};

/// Why an object of a template cannot be rendered; shown in the template's status.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RenderError {
    #[error("unknown value $({0}); see the BrokerTemplate documentation for the AKRI_ values")]
    UnknownValue(String),
    #[error("$({0}) has no value here: {1}")]
    Unavailable(String, &'static str),
    #[error("unterminated $(… in {0:?}")]
    Unterminated(String),
    #[error(
        "metadata.name {0:?} of a per-Instance object must contain $(AKRI_INSTANCE), or every Instance would write the same object"
    )]
    NameWithoutInstance(String),
    #[error(
        "$(AKRI_NODE) is used, but not in metadata.name: put it in the name to make one object per node"
    )]
    NodeOutsideName,
}

/// What the `$(AKRI_*)` values are for one rendering.
#[derive(Clone, Debug, Default)]
pub struct Values<'a> {
    pub template: &'a str,
    pub configuration: &'a str,
    pub device_class: Option<&'a str>,
    pub instance: Option<&'a str>,
    pub claim_template: Option<&'a str>,
    pub node: Option<&'a str>,
    pub properties: Option<&'a BTreeMap<String, String>>,
}

impl Values<'_> {
    fn get(&self, name: &str) -> Result<String, RenderError> {
        let missing = |why| RenderError::Unavailable(name.to_string(), why);
        let value = match name {
            "AKRI_TEMPLATE" => Some(self.template),
            "AKRI_CONFIGURATION" => Some(self.configuration),
            "AKRI_INSTANCE" => self
                .instance
                .ok_or_else(|| missing("only per-Instance objects have an Instance"))
                .map(Some)?,
            "AKRI_CLAIM_TEMPLATE" => self
                .claim_template
                .ok_or_else(|| missing("only per-Instance objects have a claim template"))
                .map(Some)?,
            "AKRI_NODE" => self
                .node
                .ok_or_else(|| missing("only per-Instance objects are made per node"))
                .map(Some)?,
            "AKRI_DEVICE_CLASS" => self
                .device_class
                .ok_or_else(|| missing("the configuration has no DeviceClass yet"))
                .map(Some)?,
            _ => None,
        };
        if let Some(value) = value {
            return Ok(value.to_string());
        }
        if let Some(key) = name.strip_prefix("AKRI_PROPERTY_") {
            let properties = self
                .properties
                .ok_or_else(|| missing("only per-Instance objects have properties"))?;
            return properties
                .get(key)
                .cloned()
                .ok_or_else(|| missing("the Instance has no such broker property"));
        }
        Err(RenderError::UnknownValue(name.to_string()))
    }
}

/// Substitutes every `$(AKRI_*)` of `text`; other `$(…)` are left for the kubelet.
pub fn substitute(text: &str, values: &Values) -> Result<String, RenderError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("$(AKRI_") {
        // `$$(AKRI_X)` is the escape for a literal `$(AKRI_X)`.
        if rest[..at].ends_with('$') {
            out.push_str(&rest[..at - 1]);
            out.push_str("$(AKRI_");
            rest = &rest[at + "$(AKRI_".len()..];
            continue;
        }
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after
            .find(')')
            .ok_or_else(|| RenderError::Unterminated(text.to_string()))?;
        out.push_str(&values.get(&after[..end])?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Substitutes in every string of `value` (object keys are left as written).
fn substitute_all(value: &Value, values: &Values) -> Result<Value, RenderError> {
    Ok(match value {
        Value::String(s) => Value::String(substitute(s, values)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| substitute_all(v, values))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), substitute_all(v, values)?)))
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

/// Whether `$(AKRI_NODE)` appears anywhere in `value` (escaped occurrences aside).
fn mentions_node(value: &Value) -> bool {
    match value {
        Value::String(s) => s
            .match_indices("$(AKRI_NODE)")
            .any(|(at, _)| !s[..at].ends_with('$')),
        Value::Array(items) => items.iter().any(mentions_node),
        Value::Object(map) => map.values().any(mentions_node),
        _ => false,
    }
}

/// The name an object of the template is given before substitution: its own, or
/// `$(AKRI_INSTANCE)-<kind>` per Instance and `$(AKRI_CONFIGURATION)-<kind>` once.
pub fn name_pattern(resource: &Map<String, Value>, per_instance: bool) -> String {
    if let Some(name) = resource
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
    {
        return name.to_string();
    }
    let kind = resource
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    if per_instance {
        format!("$(AKRI_INSTANCE)-{kind}")
    } else {
        format!("$(AKRI_CONFIGURATION)-{kind}")
    }
}

/// Whether a per-Instance object of the template is made once per node (its name has
/// `$(AKRI_NODE)`). An error when `$(AKRI_NODE)` is used elsewhere only, or when the name
/// lacks `$(AKRI_INSTANCE)`.
pub fn per_node(resource: &Map<String, Value>) -> Result<bool, RenderError> {
    let name = name_pattern(resource, true);
    if !name.contains("$(AKRI_INSTANCE)") {
        return Err(RenderError::NameWithoutInstance(name));
    }
    let in_name = name.contains("$(AKRI_NODE)");
    if !in_name && mentions_node(&Value::Object(resource.clone())) {
        return Err(RenderError::NodeOutsideName);
    }
    Ok(in_name)
}

/// One object of a template, rendered.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// The Instance it was made for (`None`: once per configuration).
    pub instance: Option<String>,
    /// The object as it is applied (name, namespace, labels, owner, digest included).
    pub object: Value,
}

impl Rendered {
    /// `<kind> <name>`, as status messages name an object.
    pub fn describe(&self) -> String {
        format!("{} {}", self.kind, self.name)
    }

    /// The digest it was rendered with.
    pub fn digest(&self) -> &str {
        self.object["metadata"]["annotations"][DIGEST_ANNOTATION]
            .as_str()
            .unwrap_or_default()
    }
}

/// The owner every object gets: the BrokerTemplate, so that deleting it deletes them all
/// (the garbage collector); `controller: true` marks who manages them.
#[derive(Clone, Debug)]
pub struct Owner<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    pub namespace: &'a str,
}

/// Renders `resource` with `values` for `owner`: substitution, name, namespace, the owner
/// reference, the template-UID label, the Instance annotation, the pod claim, the digest.
pub fn render(
    resource: &Map<String, Value>,
    per_instance: bool,
    values: &Values,
    owner: &Owner,
) -> Result<Rendered, RenderError> {
    let mut object = substitute_all(&Value::Object(resource.clone()), values)?;
    let name = substitute(&name_pattern(resource, per_instance), values)?;
    let kind = resource["kind"].as_str().unwrap_or_default();
    if let (true, Some(claim_template)) = (per_instance, values.claim_template) {
        if let Some(pod_spec) = pod_spec_mut(kind, &mut object) {
            bind_to_claim(pod_spec, claim_template);
        }
        if let (Some(pod_spec), Some(node)) = (pod_spec_mut(kind, &mut object), values.node) {
            pin_to_node(pod_spec, node);
        }
    }
    Ok(finish(object, name, values.instance, owner))
}

/// Makes `object` one of `owner`'s: its name and namespace, the template-UID label, the
/// Instance annotation, the owner reference, and the digest of all that.
fn finish(mut object: Value, name: String, instance: Option<&str>, owner: &Owner) -> Rendered {
    let root = object
        .as_object_mut()
        .expect("a rendered object is an object");
    let metadata = root.entry("metadata").or_insert_with(|| json!({}));
    if !metadata.is_object() {
        *metadata = json!({});
    }
    let metadata = metadata.as_object_mut().expect("made an object");
    metadata.insert("name".into(), json!(name));
    metadata.insert("namespace".into(), json!(owner.namespace));
    let labels = metadata.entry("labels").or_insert_with(|| json!({}));
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(TEMPLATE_UID_LABEL.into(), json!(owner.uid));
    }
    let annotations = metadata.entry("annotations").or_insert_with(|| json!({}));
    if let (Some(annotations), Some(instance)) = (annotations.as_object_mut(), instance) {
        annotations.insert(INSTANCE_ANNOTATION.into(), json!(instance));
    }
    metadata.insert(
        "ownerReferences".into(),
        json!([{
            "apiVersion": "akri.sh/v1",
            "kind": "BrokerTemplate",
            "name": owner.name,
            "uid": owner.uid,
            "controller": true,
            "blockOwnerDeletion": false,
        }]),
    );
    let digest = digest(&object);
    if let Some(annotations) = object["metadata"]["annotations"].as_object_mut() {
        annotations.insert(DIGEST_ANNOTATION.into(), json!(digest));
    }
    let field = |key: &str| object[key].as_str().unwrap_or_default().to_string();
    Rendered {
        api_version: field("apiVersion"),
        kind: field("kind"),
        name,
        instance: instance.map(str::to_string),
        object,
    }
}

/// A short digest of an object as rendered (before the digest annotation is added).
fn digest(object: &Value) -> String {
    use std::hash::{Hash, Hasher};
    // serde_json keeps keys sorted (no `preserve_order`), so equal objects serialize equally.
    // The hasher's keys are fixed: digests must agree across restarts.
    let mut hasher = std::hash::DefaultHasher::new();
    object.to_string().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Whether objects of `kind` run pods (and so get the Instance's claim).
pub fn runs_pods(kind: &str) -> bool {
    pod_spec_path(kind).is_some()
}

fn pod_spec_mut<'v>(kind: &str, object: &'v mut Value) -> Option<&'v mut Map<String, Value>> {
    let mut at = object;
    for key in pod_spec_path(kind)? {
        at = at.get_mut(*key)?;
    }
    at.as_object_mut()
}

/// Adds the Instance's claim to the pod and to each of its containers (init containers are
/// left out: a device is rarely needed before the broker starts, and a restartable sidecar
/// that needs it can name the claim itself).
fn bind_to_claim(pod_spec: &mut Map<String, Value>, claim_template: &str) {
    let claims = pod_spec
        .entry("resourceClaims")
        .or_insert_with(|| json!([]));
    if let Some(claims) = claims.as_array_mut() {
        claims.retain(|c| c["name"] != POD_CLAIM_NAME);
        claims.push(json!({ "name": POD_CLAIM_NAME, "resourceClaimTemplateName": claim_template }));
    }
    if let Some(containers) = pod_spec.get_mut("containers").and_then(Value::as_array_mut) {
        for container in containers.iter_mut().filter_map(Value::as_object_mut) {
            let resources = container.entry("resources").or_insert_with(|| json!({}));
            let Some(resources) = resources.as_object_mut() else {
                continue;
            };
            let claims = resources.entry("claims").or_insert_with(|| json!([]));
            if let Some(claims) = claims.as_array_mut()
                && !claims.iter().any(|c| c["name"] == POD_CLAIM_NAME)
            {
                claims.push(json!({ "name": POD_CLAIM_NAME }));
            }
        }
    }
}

/// Requires the pod to run on `node` (a per-node broker), as a DaemonSet's pods are pinned:
/// by the node's name, which a label might not carry.
fn pin_to_node(pod_spec: &mut Map<String, Value>, node: &str) {
    let term = json!({
        "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [node] }],
    });
    let affinity = pod_spec.entry("affinity").or_insert_with(|| json!({}));
    let Some(affinity) = affinity.as_object_mut() else {
        return;
    };
    let node_affinity = affinity.entry("nodeAffinity").or_insert_with(|| json!({}));
    let Some(node_affinity) = node_affinity.as_object_mut() else {
        return;
    };
    let required = node_affinity
        .entry("requiredDuringSchedulingIgnoredDuringExecution")
        .or_insert_with(|| json!({ "nodeSelectorTerms": [] }));
    let Some(terms) = required
        .get_mut("nodeSelectorTerms")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    if terms.is_empty() {
        terms.push(term);
    } else {
        // Terms are ORed: the node's field requirement is added to each (ANDed within it).
        for t in terms.iter_mut().filter_map(Value::as_object_mut) {
            let fields = t.entry("matchFields").or_insert_with(|| json!([]));
            if let Some(fields) = fields.as_array_mut() {
                fields.push(term["matchFields"][0].clone());
            }
        }
    }
}

/// The ResourceClaimTemplate binding a pod to exactly one Instance: one device of the
/// configuration's class whose `akri.sh/instance` attribute names it.
pub fn claim_template(name: &str, instance: &str, device_class: &str, owner: &Owner) -> Rendered {
    let expression = akri_devices::instance_selector(instance);
    let object = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "spec": { "spec": { "devices": { "requests": [{
            "name": "device",
            "exactly": {
                "deviceClassName": device_class,
                "selectors": [{ "cel": { "expression": expression } }],
            },
        }]}}},
    });
    finish(object, name.to_string(), Some(instance), owner)
}

/// The name of the ResourceClaimTemplate of `instance` for `template`:
/// `<instance>-<template>`, cut with a digest of the whole when longer than a name may be.
pub fn claim_template_name(instance: &str, template: &str) -> String {
    const MAX: usize = 253;
    let full = format!("{instance}-{template}");
    if full.len() <= MAX {
        return full;
    }
    let digest = digest(&json!(full));
    // Both names are ASCII (DNS subdomains), so any byte is a character boundary.
    let keep = MAX - 1 - digest.len();
    format!("{}-{digest}", full[..keep].trim_end_matches(['-', '.']))
}

#[cfg(test)]
mod tests {

    #[test]
    fn escaped_text_comes_back_as_written() {
        let values = Values {
            template: "t",
            configuration: "c",
            ..Default::default()
        };
        for text in [
            "$(AKRI_X)",
            "$$(AKRI_X) and $(HOME)",
            "plain",
            "$(AKRI_CONFIGURATION)$",
        ] {
            assert_eq!(substitute(&escape_variables(text), &values).unwrap(), text);
        }
    }

    use super::*;

    fn props() -> BTreeMap<String, String> {
        BTreeMap::from([("RESOLUTION".to_string(), "1080p".to_string())])
    }

    fn values<'a>(properties: &'a BTreeMap<String, String>) -> Values<'a> {
        Values {
            template: "cams",
            configuration: "onvif",
            device_class: Some("onvif"),
            instance: Some("onvif-a1b2c3"),
            claim_template: Some("onvif-a1b2c3-cams"),
            node: None,
            properties: Some(properties),
        }
    }

    const OWNER: Owner = Owner {
        name: "cams",
        uid: "1234",
        namespace: "apps",
    };

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn values_are_substituted_and_the_kubelets_are_left_alone() {
        let p = props();
        let v = values(&p);
        assert_eq!(
            substitute(
                "$(AKRI_INSTANCE) at $(AKRI_PROPERTY_RESOLUTION) for $(HOME)",
                &v
            )
            .unwrap(),
            "onvif-a1b2c3 at 1080p for $(HOME)"
        );
        assert_eq!(
            substitute("$$(AKRI_INSTANCE)", &v).unwrap(),
            "$(AKRI_INSTANCE)"
        );
        assert_eq!(
            substitute("$(AKRI_INSTANCEX)", &v),
            Err(RenderError::UnknownValue("AKRI_INSTANCEX".into()))
        );
        assert!(matches!(
            substitute("$(AKRI_PROPERTY_FPS)", &v),
            Err(RenderError::Unavailable(..))
        ));
        assert!(matches!(
            substitute("$(AKRI_NODE", &v),
            Err(RenderError::Unterminated(_))
        ));
        let global = Values {
            instance: None,
            ..v.clone()
        };
        assert!(matches!(
            substitute("$(AKRI_INSTANCE)", &global),
            Err(RenderError::Unavailable(..))
        ));
    }

    #[test]
    fn a_pod_gets_its_instance_claim_owner_and_labels() {
        let p = props();
        let pod = object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "spec": { "containers": [
                { "name": "a", "image": "x", "env": [{ "name": "R", "value": "$(AKRI_PROPERTY_RESOLUTION)" }] },
                { "name": "b", "image": "y", "resources": { "claims": [{ "name": "akri-device" }] } },
            ]},
        }));
        let r = render(&pod, true, &values(&p), &OWNER).unwrap();
        assert_eq!(r.name, "onvif-a1b2c3-pod");
        let o = &r.object;
        assert_eq!(o["metadata"]["namespace"], "apps");
        assert_eq!(o["metadata"]["labels"][TEMPLATE_UID_LABEL], "1234");
        assert_eq!(
            o["metadata"]["annotations"][INSTANCE_ANNOTATION],
            "onvif-a1b2c3"
        );
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "1234");
        assert_eq!(o["spec"]["containers"][0]["env"][0]["value"], "1080p");
        assert_eq!(
            o["spec"]["resourceClaims"],
            json!([{ "name": "akri-device", "resourceClaimTemplateName": "onvif-a1b2c3-cams" }])
        );
        for c in 0..2 {
            assert_eq!(
                o["spec"]["containers"][c]["resources"]["claims"],
                json!([{ "name": "akri-device" }])
            );
        }
        assert!(o["spec"].get("affinity").is_none());
        // The same input renders the same digest; a changed one another.
        assert_eq!(
            render(&pod, true, &values(&p), &OWNER).unwrap().digest(),
            r.digest()
        );
        let mut changed = pod.clone();
        changed["spec"]["containers"][0]["image"] = json!("z");
        assert_ne!(
            render(&changed, true, &values(&p), &OWNER)
                .unwrap()
                .digest(),
            r.digest()
        );
    }

    #[test]
    fn workloads_get_the_claim_in_their_pod_template_and_services_none() {
        let p = props();
        let job = object(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "spec": { "template": { "spec": { "containers": [{ "name": "a", "image": "x" }] } } },
        }));
        let r = render(&job, true, &values(&p), &OWNER).unwrap();
        assert_eq!(
            r.object["spec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateName"],
            "onvif-a1b2c3-cams"
        );
        let service = object(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": { "name": "$(AKRI_INSTANCE)-svc" },
            "spec": { "selector": { "app": "$(AKRI_INSTANCE)" } },
        }));
        let r = render(&service, true, &values(&p), &OWNER).unwrap();
        assert_eq!(r.name, "onvif-a1b2c3-svc");
        assert_eq!(
            r.object["spec"],
            json!({ "selector": { "app": "onvif-a1b2c3" } })
        );
    }

    #[test]
    fn per_node_objects_are_named_per_node_and_pinned_to_it() {
        let p = props();
        let pod = object(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "$(AKRI_INSTANCE)-$(AKRI_NODE)" },
            "spec": { "containers": [{ "name": "a", "image": "x" }] },
        }));
        assert_eq!(per_node(&pod), Ok(true));
        let v = Values {
            node: Some("node-a"),
            ..values(&p)
        };
        let r = render(&pod, true, &v, &OWNER).unwrap();
        assert_eq!(r.name, "onvif-a1b2c3-node-a");
        assert_eq!(
            r.object["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"],
            json!(["node-a"])
        );
        // $(AKRI_NODE) outside the name, and a name without the Instance, are errors.
        let elsewhere = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "data": { "node": "$(AKRI_NODE)" },
        }));
        assert_eq!(per_node(&elsewhere), Err(RenderError::NodeOutsideName));
        let shared_name = object(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "fixed" },
        }));
        assert!(matches!(
            per_node(&shared_name),
            Err(RenderError::NameWithoutInstance(_))
        ));
    }

    #[test]
    fn the_claim_template_selects_exactly_its_instance() {
        let r = claim_template("onvif-a1b2c3-cams", "onvif-a1b2c3", "onvif", &OWNER);
        let request = &r.object["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        assert_eq!(request["deviceClassName"], "onvif");
        assert_eq!(
            request["selectors"][0]["cel"]["expression"],
            "device.attributes[\"akri.sh\"].instance == \"onvif-a1b2c3\""
        );
        let long = claim_template_name(&"i".repeat(200), &"t".repeat(200));
        assert!(long.len() <= 253, "{}", long.len());
        assert_ne!(
            long,
            claim_template_name(&"i".repeat(200), &"t".repeat(199))
        );
    }
}
