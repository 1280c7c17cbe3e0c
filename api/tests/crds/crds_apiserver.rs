//! Every CRD on a real kube-apiserver: it is accepted and established, a valid object of each
//! kind is stored, and invalid objects are rejected with a message a person understands.

use akri_testing::ControlPlane;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

/// The control plane of this test binary, with the CRDs installed.
async fn cluster() -> &'static ControlPlane {
    let cp = ControlPlane::shared_api_server()
        .await
        .expect("control plane starts");
    cp.install_crds(&akri_api::crds::all())
        .await
        .expect("every CRD is accepted and established");
    cp
}

/// A dynamic API for `kind` of akri.sh/`version`, in `namespace` when given.
async fn api(
    kind: &str,
    version: &str,
    plural: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let client = cluster().await.client().await.unwrap();
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("akri.sh", version, kind), plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
    }
}

fn object(kind: &str, version: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("akri.sh/{version}"),
        "kind": kind,
        "metadata": { "name": name },
        "spec": spec,
    }))
    .unwrap()
}

/// Creating `spec` fails with HTTP 422 and a message containing `expected`.
async fn assert_rejected(
    api: &Api<DynamicObject>,
    kind: &str,
    version: &str,
    spec: Value,
    expected: &str,
) {
    let name = ControlPlane::unique_name("invalid");
    match api
        .create(
            &PostParams::default(),
            &object(kind, version, &name, spec.clone()),
        )
        .await
    {
        Ok(_) => panic!("{kind} {spec} was accepted; expected rejection with {expected:?}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains(expected),
                "{kind} {spec}: message {:?} should contain {expected:?}",
                status.message
            );
        }
        Err(other) => panic!("unexpected error {other}"),
    }
}

/// Creating an object named `name` fails with HTTP 422 and a message containing `expected`.
async fn assert_name_rejected(
    api: &Api<DynamicObject>,
    kind: (&str, &str),
    name: &str,
    spec: Value,
    expected: &str,
) {
    match api
        .create(&PostParams::default(), &object(kind.0, kind.1, name, spec))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains(expected),
                "{} {name}: message {:?} should contain {expected:?}",
                kind.0,
                status.message
            );
        }
        other => panic!("{} named {name} must be rejected, got {other:?}", kind.0),
    }
}

/// Replacing the spec of an existing object with `spec` fails with a message containing
/// `expected`.
async fn assert_update_rejected(api: &Api<DynamicObject>, name: &str, spec: Value, expected: &str) {
    let mut current = api.get(name).await.unwrap();
    current.data["spec"] = spec;
    match api.replace(name, &PostParams::default(), &current).await {
        Ok(_) => panic!("update of {name} was accepted; expected {expected:?}"),
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains(expected),
                "message {:?} should contain {expected:?}",
                status.message
            );
        }
        Err(other) => panic!("unexpected error {other}"),
    }
}

#[tokio::test]
async fn configuration_v0() {
    let cp = cluster().await;
    let ns = cp.create_namespace("crd-config").await.unwrap();
    let api = api("Configuration", "v0", "configurations", Some(&ns)).await;
    let valid = json!({
        "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [foo0]" },
        "capacity": 2,
    });
    let created = api
        .create(
            &PostParams::default(),
            &object("Configuration", "v0", "echo", valid),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["brokerProperties"],
        json!({}),
        "Akri's default is applied"
    );

    let kind = ("Configuration", "v0");
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "udev" }, "capacity": 0 }),
        "greater than or equal to 1",
    )
    .await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "discoveryDetails": "" } }),
        "spec.discoveryHandler.name: Required value",
    )
    .await;
    assert_rejected(&api, kind.0, kind.1, json!({ "discoveryHandler": { "name": "onvif", "discoveryProperties": [
        { "name": "user", "value": "a", "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } }
    ]}}), "a discovery property needs exactly one of value and valueFrom").await;
    assert_rejected(&api, kind.0, kind.1, json!({ "discoveryHandler": { "name": "udev" },
        "brokerSpec": { "brokerPodSpec": { "containers": [] }, "brokerJobSpec": { "template": {} } } }),
        "brokerSpec needs exactly one of brokerPodSpec and brokerJobSpec").await;
}

#[tokio::test]
async fn configuration_v0_fixtures_round_trip_through_the_api_server() {
    let cp = cluster().await;
    let ns = cp.create_namespace("crd-fixtures").await.unwrap();
    let api = api("Configuration", "v0", "configurations", Some(&ns)).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("configuration-") && !name.starts_with("helm-") {
            continue;
        }
        let fixture: Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let object_name = ControlPlane::unique_name("fixture");
        let stored = api
            .create(
                &PostParams::default(),
                &object("Configuration", "v0", &object_name, fixture["spec"].clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("{name} rejected: {e}"));
        // What the server stored reads into our types and writes back unchanged.
        let typed: akri_api::v0::ConfigurationSpec =
            serde_json::from_value(stored.data["spec"].clone()).unwrap();
        assert_eq!(
            serde_json::to_value(&typed).unwrap(),
            stored.data["spec"],
            "{name}"
        );
        if name != "configuration-defaults.yaml" {
            assert_eq!(
                stored.data["spec"], fixture["spec"],
                "{name}: the server changed the spec"
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} fixtures found in {dir:?}");
}

#[tokio::test]
async fn instance_v0() {
    let cp = cluster().await;
    let ns = cp.create_namespace("crd-instance").await.unwrap();
    let api = api("Instance", "v0", "instances", Some(&ns)).await;
    let valid = json!({
        "configurationName": "cam", "cdiName": "akri.sh/cam=abc", "capacity": 2, "shared": true,
        "nodes": ["a", "b"], "deviceUsage": { "cam-abc-0": "", "cam-abc-1": "C:0:a" },
    });
    api.create(
        &PostParams::default(),
        &object("Instance", "v0", "cam-abc", valid),
    )
    .await
    .unwrap();

    let kind = ("Instance", "v0");
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "cdiName": "x", "capacity": 1 }),
        "spec.configurationName: Required value",
    )
    .await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "configurationName": "c", "cdiName": "x", "capacity": -1 }),
        "greater than or equal to 0",
    )
    .await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "configurationName": "c", "cdiName": "x", "capacity": 1, "nodes": ["a", "a"] }),
        "Duplicate value",
    )
    .await;
    assert_rejected(&api, kind.0, kind.1, json!({ "configurationName": "c", "cdiName": "x", "capacity": 1, "deviceUsage": { "s": 3 } }), "must be of type string").await;
}

#[tokio::test]
async fn discovery_configuration_v1() {
    let api = api(
        "DiscoveryConfiguration",
        "v1",
        "discoveryconfigurations",
        None,
    )
    .await;
    let name = ControlPlane::unique_name("cams");
    let valid = json!({
        "discoveryHandler": {
            "name": "onvif",
            "discoveryDetails": "ipAddresses: {action: Exclude, items: []}",
            "discoveryProperties": [
                { "name": "username", "value": "admin" },
                { "name": "password", "valueFrom": { "secretKeyRef": { "name": "onvif", "namespace": "akri", "key": "password" } } },
            ],
        },
        "capacity": 2,
    });
    let created = api
        .create(
            &PostParams::default(),
            &object("DiscoveryConfiguration", "v1", &name, valid.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["uniqueDevices"],
        json!(true),
        "uniqueDevices defaults to true"
    );

    let kind = ("DiscoveryConfiguration", "v1");
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "udev" }, "capacity": 0 }),
        "greater than or equal to 1",
    )
    .await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "bad_name!" } }),
        "discoveryHandler.name must be letters, digits and '-'",
    )
    .await;
    assert_rejected(&api, kind.0, kind.1, json!({ "discoveryHandler": { "name": "onvif", "discoveryProperties": [
        { "name": "p", "value": "a", "valueFrom": { "configMapKeyRef": { "name": "c", "namespace": "n", "key": "k" } } }
    ]}}), "a discovery property needs exactly one of value and valueFrom").await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "onvif", "discoveryProperties": [
            { "name": "p", "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } }
        ]}}),
        "namespace: Required value",
    )
    .await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "onvif", "discoveryProperties": [
            { "name": "p", "value": "a" }, { "name": "p", "value": "b" }
        ]}}),
        "discoveryProperties names must be unique",
    )
    .await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "9cams" } }),
        "discoveryHandler.name must start with a letter",
    )
    .await;
    let long_name = "x".repeat(60);
    assert_name_rejected(
        &api,
        kind,
        &long_name,
        json!({ "discoveryHandler": { "name": "udev" } }),
        "metadata.name must be at most 52 characters",
    )
    .await;
    // A DNS subdomain the API server accepts for a cluster-scoped object, but not a label:
    // its devices are named <name>-<hex>, and DRA device names are DNS labels.
    assert_name_rejected(
        &api,
        kind,
        "cams.example",
        json!({ "discoveryHandler": { "name": "udev" } }),
        "metadata.name must be a DNS label",
    )
    .await;

    // What devices may bring into containers: absolute prefixes, never `..`.
    for (path, expected) in [
        ("dev/ttyUSB", "a host path prefix must be absolute"),
        ("/dev/../etc", "a host path prefix must not contain '..'"),
    ] {
        assert_rejected(
            &api,
            kind.0,
            kind.1,
            json!({ "discoveryHandler": { "name": "serial" },
                    "containerAccess": { "mounts": [{ "path": path }] } }),
            expected,
        )
        .await;
    }
    // Environment names a configuration allows: names a shell takes, nothing else.
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "serial" },
                "containerAccess": { "environment": ["BAUD", "BASH_FUNC_ls%%"] } }),
        "should match '^[A-Za-z_][A-Za-z0-9_]*$'",
    )
    .await;
    let access = json!({ "discoveryHandler": { "name": "serial" }, "containerAccess": {
        "deviceNodes": [{ "path": "/dev/ttyUSB", "writable": true }],
        "mounts": [{ "path": "/var/lib/serial-firmware/" }],
        "environment": ["SERIAL_BAUD"], "blockDevices": false,
    } });
    api.create(
        &PostParams::default(),
        &object(kind.0, kind.1, &ControlPlane::unique_name("serial"), access),
    )
    .await
    .expect("containerAccess with absolute prefixes");

    // Shared devices offered on nodes without the kubelet-plugin must skip its operations.
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "onvif" },
                "sharedDevices": { "nodeSelector": { "network": "cameras" } } }),
        "sharedDevices.nodeSelector needs nodeOperations: Skip",
    )
    .await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryHandler": { "name": "onvif" },
                "sharedDevices": { "nodeOperations": "Sometimes" } }),
        "Unsupported value: \"Sometimes\"",
    )
    .await;
    let skipping = json!({ "discoveryHandler": { "name": "onvif" }, "sharedDevices": {
        "nodeOperations": "Skip", "nodeSelector": { "network": "cameras" },
    } });
    api.create(
        &PostParams::default(),
        &object(kind.0, kind.1, &ControlPlane::unique_name("skip"), skipping),
    )
    .await
    .expect("nodeOperations: Skip with a node selector");

    // Changes that would strand allocations.
    let mut renamed = valid.clone();
    renamed["discoveryHandler"]["name"] = json!("udev");
    assert_update_rejected(&api, &name, renamed, "discoveryHandler.name is immutable").await;
    let mut smaller = valid.clone();
    smaller["capacity"] = json!(1);
    assert_update_rejected(&api, &name, smaller, "capacity can only grow").await;
    let mut larger = valid;
    larger["capacity"] = json!(4);
    let mut current = api.get(&name).await.unwrap();
    current.data["spec"] = larger;
    api.replace(&name, &PostParams::default(), &current)
        .await
        .expect("capacity may grow");
}

#[tokio::test]
async fn broker_template_v1() {
    let cp = cluster().await;
    let ns = cp.create_namespace("crd-broker").await.unwrap();
    let api = api("BrokerTemplate", "v1", "brokertemplates", Some(&ns)).await;
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "broker" },
        "spec": { "template": { "spec": { "containers": [{ "name": "b", "image": "broker:1" }] } } },
    });
    let valid = json!({ "discoveryReference": { "name": "cams" }, "instanceBrokerResources": [deployment] });
    let created = api
        .create(
            &PostParams::default(),
            &object("BrokerTemplate", "v1", "brokers", valid),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["instanceBrokerResources"][0]["spec"]["template"]["spec"]["containers"]
            [0]["image"],
        json!("broker:1"),
        "arbitrary object content is kept"
    );

    let kind = ("BrokerTemplate", "v1");
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryReference": { "name": "cams" } }),
        "needs at least one object in instanceBrokerResources or globalBrokerResources",
    )
    .await;
    assert_rejected(&api, kind.0, kind.1, json!({ "discoveryReference": { "name": "cams" }, "globalBrokerResources": [{ "apiVersion": "v1" }] }), "kind: Required value").await;
    assert_rejected(&api, kind.0, kind.1, json!({ "discoveryReference": { "name": "cams" }, "globalBrokerResources": [
        { "apiVersion": "v1", "kind": "Service", "metadata": { "name": "s", "namespace": "other" } }
    ]}), "leave metadata.namespace out").await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "instanceBrokerResources": [{ "apiVersion": "v1", "kind": "Service" }] }),
        "spec.discoveryReference: Required value",
    )
    .await;
}

#[tokio::test]
async fn property_filter_v1() {
    let api = api("PropertyFilter", "v1", "propertyfilters", None).await;
    let name = ControlPlane::unique_name("front-door");
    let valid = json!({
        "discoveryReference": { "name": "cams" },
        "filters": [{ "key": "ONVIF_DEVICE_IP_ADDRESS", "value": "10.0.0.7" }, { "key": "MODEL", "value": "x", "mode": "Exclude" }],
    });
    let created = api
        .create(
            &PostParams::default(),
            &object("PropertyFilter", "v1", &name, valid.clone()),
        )
        .await
        .unwrap();
    assert_eq!(
        created.data["spec"]["filters"][0]["mode"],
        json!("Include"),
        "mode defaults to Include"
    );

    let kind = ("PropertyFilter", "v1");
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "discoveryReference": { "name": "cams" }, "filters": [] }),
        "should have at least 1 items",
    )
    .await;
    assert_rejected(&api, kind.0, kind.1, json!({ "discoveryReference": { "name": "cams" }, "filters": [{ "key": "a", "value": "b", "mode": "Maybe" }] }), "supported values: \"Include\", \"Exclude\"").await;
    assert_rejected(
        &api,
        kind.0,
        kind.1,
        json!({ "filters": [{ "key": "a", "value": "b" }] }),
        "spec.discoveryReference: Required value",
    )
    .await;
    assert_rejected(&api, kind.0, kind.1, json!({ "discoveryReference": { "name": "cams" }, "filters": [{ "key": "", "value": "b" }] }), "should be at least 1 chars long").await;
    // Its DeviceClass carries the filter's name as a label value: at most 63 characters.
    assert_name_rejected(
        &api,
        kind,
        &"f".repeat(64),
        json!({ "discoveryReference": { "name": "cams" }, "filters": [{ "key": "a", "value": "b" }] }),
        "metadata.name must be at most 63 characters",
    )
    .await;

    let mut moved = valid;
    moved["discoveryReference"]["name"] = json!("other");
    assert_update_rejected(&api, &name, moved, "discoveryReference is immutable").await;
}

/// Every manifest in `examples/` (the debugEcho walkthrough, the namespace, Akri's broker
/// strategies, the USB camera, ONVIF and OPC UA configurations with their BrokerTemplates and
/// Secret) is accepted by a real API server with our CRDs (a server-side dry run: schema, CEL,
/// admission), so none of them can rot.
#[tokio::test]
async fn every_example_is_accepted_by_the_api_server() {
    let cp = cluster().await;
    let kubectl = cp.bins().require("kubectl").unwrap();
    let kubectl_run = |args: &[&str]| {
        let output = std::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig())
            .args(args)
            .output()
            .expect("kubectl runs");
        (
            output.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    };
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    // The namespace the others use, for real; the pods' ServiceAccounts, which the
    // controller-manager (not running here) would make.
    let (ok, out) = kubectl_run(&[
        "apply",
        "-f",
        &examples.join("akri-namespace.yaml").display().to_string(),
    ]);
    assert!(ok, "{out}");
    for namespace in ["default", "akri"] {
        let (ok, out) = kubectl_run(&["create", "serviceaccount", "default", "-n", namespace]);
        assert!(ok || out.contains("AlreadyExists"), "{out}");
    }
    let mut files = Vec::new();
    let mut dirs = vec![examples.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 13, "the examples are found: {files:?}");
    let mut refused = Vec::new();
    for file in &files {
        let (ok, out) = kubectl_run(&[
            "apply",
            "--dry-run=server",
            "-f",
            &file.display().to_string(),
        ]);
        if !ok {
            refused.push(format!("{}: {out}", file.display()));
        }
    }
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n"));
}

/// Short names that clusters we are installed on serve and a real kube-apiserver does not:
/// OpenShift's own kinds (`oc api-resources` on OpenShift 4), where a clash is most likely to
/// meet an edge user. kubectl resolves a clashing short name to one of the two, silently.
const OPENSHIFT_SHORT_NAMES: &[(&str, &str)] = &[
    ("dc", "deploymentconfigs.apps.openshift.io"),
    ("bc", "buildconfigs.build.openshift.io"),
    ("is", "imagestreams.image.openshift.io"),
    ("istag", "imagestreamtags.image.openshift.io"),
    ("isimage", "imagestreamimages.image.openshift.io"),
    ("scc", "securitycontextconstraints.security.openshift.io"),
    ("clusterquota", "clusterresourcequotas.quota.openshift.io"),
];

/// No short name of our v1 kinds means anything else: not a kind the real API server serves
/// (every group it lists, with our CRDs installed), not an OpenShift kind. Akri's v0 kinds keep
/// Akri's names (`akric`, `akrii`): they are the same resources.
#[tokio::test]
async fn no_short_name_of_ours_names_another_kind() {
    let client = cluster().await.client().await.unwrap();
    let mut served: Vec<(String, String)> = Vec::new(); // (short name, resource.group)
    let mut lists = vec![client.list_core_api_resources("v1").await.unwrap()];
    for group in client.list_api_groups().await.unwrap().groups {
        for version in &group.versions {
            lists.push(
                client
                    .list_api_group_resources(&version.group_version)
                    .await
                    .unwrap(),
            );
        }
    }
    for list in &lists {
        let group = list.group_version.split('/').rev().nth(1).unwrap_or("");
        for resource in &list.resources {
            for short in resource.short_names.iter().flatten() {
                served.push((short.clone(), format!("{}.{group}", resource.name)));
            }
        }
    }
    assert!(
        served.iter().any(|(s, _)| s == "po"),
        "the API server's discovery lists short names: {served:?}"
    );
    served.extend(
        OPENSHIFT_SHORT_NAMES
            .iter()
            .map(|(s, r)| (s.to_string(), r.to_string())),
    );

    let mut clashes = Vec::new();
    for crd in akri_api::crds::all() {
        let ours = crd.metadata.name.clone().unwrap_or_default();
        if crd.spec.versions.iter().all(|v| v.name == "v0") {
            continue;
        }
        for short in crd.spec.names.short_names.iter().flatten() {
            for (name, resource) in &served {
                if name == short && *resource != ours {
                    clashes.push(format!("{short}: {ours} and {resource}"));
                }
            }
        }
    }
    assert!(
        clashes.is_empty(),
        "short names that name two kinds: {clashes:?}"
    );
}
