//! The CRDs derived from the v0 types: names, printer columns, and the schema details that the
//! compatibility contract (`akri_api::v0` module docs) promises.

use akri_api::v0::{Configuration, Instance};
use kube::CustomResourceExt;
use serde_json::{Value, json};

fn crd_json<K: CustomResourceExt>() -> Value {
    serde_json::to_value(K::crd()).expect("the CRD serializes")
}

fn spec_schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
}

/// Every `(path, schema)` in `schema`, depth first.
fn walk<'a>(path: String, schema: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    out.push((path.clone(), schema));
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            walk(format!("{path}.{name}"), property, out);
        }
    }
    if let Some(items) = schema.get("items") {
        walk(format!("{path}[]"), items, out);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        walk(format!("{path}{{}}"), values, out);
    }
}

fn rules(schema: &Value) -> Vec<&str> {
    schema["x-kubernetes-validations"]
        .as_array()
        .map(|rules| rules.iter().filter_map(|r| r["rule"].as_str()).collect())
        .unwrap_or_default()
}

#[test]
fn configuration_names_and_columns_are_akris() {
    let crd = crd_json::<Configuration>();
    assert_eq!(crd["metadata"]["name"], "configurations.akri.sh");
    assert_eq!(crd["spec"]["group"], "akri.sh");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    let names = &crd["spec"]["names"];
    assert_eq!(names["kind"], "Configuration");
    assert_eq!(names["plural"], "configurations");
    assert_eq!(names["singular"], "configuration");
    assert_eq!(names["shortNames"], json!(["akric"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v0");
    assert_eq!(version["served"], true);
    assert_eq!(version["storage"], true);
    let columns: Vec<_> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        columns,
        [
            ("Capacity", ".spec.capacity"),
            ("Age", ".metadata.creationTimestamp")
        ]
    );
}

#[test]
fn instance_names_and_columns_are_akris() {
    let crd = crd_json::<Instance>();
    assert_eq!(crd["metadata"]["name"], "instances.akri.sh");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["akrii"]));
    assert_eq!(crd["spec"]["names"]["categories"], json!(["akri"]));
    let version = &crd["spec"]["versions"][0];
    let columns: Vec<_> = version["additionalPrinterColumns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["type"].as_str().unwrap(),
                c["jsonPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        columns,
        [
            ("Config", "string", ".spec.configurationName"),
            ("Shared", "boolean", ".spec.shared"),
            ("Nodes", "string", ".spec.nodes"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
}

#[test]
fn configuration_schema_has_akris_fields_defaults_and_requirements() {
    let crd = crd_json::<Configuration>();
    let spec = spec_schema(&crd);
    assert_eq!(spec["required"], json!(["discoveryHandler"]));
    let properties = spec["properties"].as_object().unwrap();
    assert_eq!(properties["uniqueDevices"]["type"], "boolean");
    assert!(
        properties["uniqueDevices"].get("default").is_none(),
        "absent stays absent"
    );
    let mut names: Vec<_> = properties.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "brokerProperties",
            "brokerSpec",
            "capacity",
            "configurationServiceSpec",
            "discoveryHandler",
            "instanceServiceSpec",
            // Not in Akri v0.13's schema: the seeds' Configuration-level sharing policy,
            // optional so that Akri's YAML still round-trips.
            "uniqueDevices",
        ]
    );

    assert_eq!(spec["properties"]["capacity"]["default"], 1);
    // JSONSchemaProps.minimum is a float.
    assert_eq!(
        spec["properties"]["capacity"]["minimum"].as_f64(),
        Some(1.0)
    );
    assert_eq!(spec["properties"]["capacity"]["type"], "integer");
    assert_eq!(spec["properties"]["brokerProperties"]["default"], json!({}));
    assert_eq!(
        spec["properties"]["brokerProperties"]["additionalProperties"]["type"],
        "string"
    );

    let handler = &spec["properties"]["discoveryHandler"];
    assert_eq!(handler["required"], json!(["name"]));
    assert_eq!(handler["properties"]["name"]["minLength"], 1);
    assert_eq!(handler["properties"]["discoveryDetails"]["default"], "");

    let property = &handler["properties"]["discoveryProperties"]["items"];
    assert_eq!(property["required"], json!(["name"]));
    assert_eq!(
        property["properties"]["name"]["pattern"],
        "^[_A-Za-z][_A-Za-z0-9]*$"
    );
    assert_eq!(rules(property), ["has(self.value) != has(self.valueFrom)"]);

    let value_from = &property["properties"]["valueFrom"];
    assert_eq!(
        rules(value_from),
        ["has(self.secretKeyRef) != has(self.configMapKeyRef)"]
    );
    for reference in ["secretKeyRef", "configMapKeyRef"] {
        let selector = &value_from["properties"][reference];
        assert_eq!(selector["required"], json!(["key", "name"]), "{reference}");
        assert_eq!(selector["properties"]["namespace"]["default"], "default");
        assert_eq!(selector["properties"]["optional"]["type"], "boolean");
    }

    let broker = &spec["properties"]["brokerSpec"];
    assert_eq!(
        rules(broker),
        ["has(self.brokerPodSpec) != has(self.brokerJobSpec)"]
    );
}

#[test]
fn embedded_kubernetes_specs_are_preserved_objects() {
    let crd = crd_json::<Configuration>();
    let spec = spec_schema(&crd);
    for embedded in [
        &spec["properties"]["brokerSpec"]["properties"]["brokerPodSpec"],
        &spec["properties"]["brokerSpec"]["properties"]["brokerJobSpec"],
        &spec["properties"]["instanceServiceSpec"],
        &spec["properties"]["configurationServiceSpec"],
    ] {
        assert_eq!(embedded["type"], "object");
        assert_eq!(embedded["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(embedded.get("properties"), None, "{embedded}");
    }
    // Small enough to read: the Pod, Job and Service schemas are not inlined.
    let size = serde_json::to_string(&crd).unwrap().len();
    assert!(size < 16 * 1024, "the Configuration CRD is {size} bytes");
}

#[test]
fn instance_schema_has_akris_fields_and_merge_semantics() {
    let crd = crd_json::<Instance>();
    let spec = spec_schema(&crd);
    let mut required: Vec<_> = spec["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["capacity", "cdiName", "configurationName"]);
    let p = &spec["properties"];
    assert_eq!(p["brokerProperties"]["default"], json!({}));
    assert_eq!(p["shared"]["default"], false);
    assert_eq!(p["nodes"]["default"], json!([]));
    assert_eq!(p["nodes"]["x-kubernetes-list-type"], "set");
    assert_eq!(p["deviceUsage"]["default"], json!({}));
    assert_eq!(p["deviceUsage"]["x-kubernetes-map-type"], "granular");
    assert_eq!(p["deviceUsage"]["additionalProperties"]["type"], "string");
    assert_eq!(p["capacity"]["type"], "integer");
}

#[test]
fn no_field_is_nullable_and_every_schema_is_structural() {
    for crd in [crd_json::<Configuration>(), crd_json::<Instance>()] {
        let mut schemas = Vec::new();
        walk("spec".into(), spec_schema(&crd), &mut schemas);
        for (path, schema) in schemas {
            assert_eq!(schema.get("nullable"), None, "{path} is nullable");
            for keyword in ["$ref", "anyOf", "oneOf", "allOf", "not"] {
                assert_eq!(schema.get(keyword), None, "{path} has {keyword}");
            }
            let preserved = schema.get("x-kubernetes-preserve-unknown-fields").is_some();
            assert!(
                schema.get("type").is_some() || preserved,
                "{path} has no type: {schema}"
            );
        }
    }
}

#[test]
fn top_level_spec_fields_have_descriptions() {
    let crd = crd_json::<Configuration>();
    let spec = spec_schema(&crd);
    for path in [
        &spec["properties"]["discoveryHandler"],
        &spec["properties"]["capacity"],
        &spec["properties"]["brokerSpec"],
        &spec["properties"]["instanceServiceSpec"],
        &spec["properties"]["configurationServiceSpec"],
        &spec["properties"]["brokerProperties"],
    ] {
        assert!(path["description"].is_string(), "{path}");
    }
}
