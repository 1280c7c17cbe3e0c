//! The kubelet-plugin end to end on real Kubernetes: two simulated nodes, each running the
//! agent with the embedded debugEcho handler next to its own kubelet peer; the real scheduler
//! places a pod on a node with the device and the kubelet's DRA manager prepares it.

use akri_kubelet_plugin::agent::AgentConfig;
use akri_testing::components::SimNode;
use akri_testing::monitoring::Alert;
use akri_testing::{ControlPlane, ControlPlaneOptions, KubeletPeer};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

const DRIVER: &str = "debugecho.akri.sh";

use akri_testing::eventually;

async fn start_node(cp: &ControlPlane, client: &kube::Client, namespace: &str) -> SimNode {
    start_node_with(cp, client, namespace, |_| {}).await
}

/// [`start_node`], once its kubelet has taken the debugEcho driver.
async fn ready_node(cp: &ControlPlane, client: &kube::Client, namespace: &str) -> SimNode {
    let node = start_node(cp, client, namespace).await;
    node.peer
        .wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    node
}

/// [`start_node`] with the agent's configuration adjusted by `adjust`.
async fn start_node_with(
    cp: &ControlPlane,
    client: &kube::Client,
    namespace: &str,
    adjust: impl FnOnce(&mut AgentConfig),
) -> SimNode {
    SimNode::start(cp, client, namespace, |config, _| adjust(config)).await
}

/// The devices of `node`'s pool of the debugEcho driver.
async fn pool_devices(client: &kube::Client, node: &str) -> Vec<String> {
    pool_devices_of(client, node, DRIVER).await
}

/// The devices of `node`'s pool of `driver`.
async fn pool_devices_of(client: &kube::Client, node: &str, driver: &str) -> Vec<String> {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    slices
        .items
        .into_iter()
        .filter(|s| s.spec.driver == driver)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| d.name)
        .collect()
}

/// The devices of `node`'s debugEcho pool with the effects of their `akri.sh/not-discovered`
/// taints.
async fn pool_taints(client: &kube::Client, node: &str) -> Vec<(String, Vec<String>)> {
    // Only this node's pool: the debugEcho driver is the only one here.
    akri_testing::device_taint_effects(
        &Api::all(client.clone()),
        &ListParams::default().fields(&format!("spec.nodeName={node}")),
        akri_devices::NOT_DISCOVERED_TAINT,
    )
    .await
    .unwrap()
}

/// A control plane of its own (every agent discovers every cluster-scoped configuration of its
/// handlers, so tests sharing a cluster would see each other's devices) with the CRDs, a
/// namespace for the Instances, and a configuration name.
async fn cluster() -> (ControlPlane, kube::Client, String, String) {
    let cp = ControlPlane::start(ControlPlaneOptions::full())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("akri").await.unwrap();
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    (cp, client, ns, ControlPlane::unique_name("echo"))
}

/// The DiscoveryConfiguration `config` of debugEcho device `foo0`, and (the driver-controller's
/// job, written here as it writes it) its DeviceClass.
async fn echo_configuration(client: &kube::Client, config: &str) {
    echo_configuration_of(client, config, "debugEcho").await
}

/// [`echo_configuration`] for a debugEcho registered as `handler`.
async fn echo_configuration_of(client: &kube::Client, config: &str, handler: &str) {
    let driver = akri_devices::driver_name(handler);
    let mut spec = json!({ "discoveryHandler": { "name": handler, "discoveryDetails": "descriptions: [foo0]" } });
    if handler != akri_debug_echo::NAME {
        // debugEcho under another name: its property is no known one of that kind, so the
        // configuration names it, as a user does for a handler of their own.
        spec["containerAccess"] = json!({ "environment": [akri_debug_echo::DESCRIPTION_PROPERTY] });
    }
    let discovery: akri_api::v1::DiscoveryConfiguration = serde_json::from_value(json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": config },
        "spec": spec,
    }))
    .unwrap();
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(&PostParams::default(), &discovery)
        .await
        .unwrap();
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": config },
            "spec": { "selectors": [{ "cel": { "expression": format!(
                "device.driver == '{driver}' && device.attributes['akri.sh'].configuration == '{config}'"
            ) } }] },
        })).unwrap())
        .await
        .unwrap();
}

/// The configuration `config` of [`echo_configuration`] and the pod of [`broker_pod`],
/// prepared by `node`'s kubelet.
async fn prepared_broker(node: &SimNode, client: &kube::Client, ns: &str, config: &str) {
    echo_configuration(client, config).await;
    broker_pod(client, ns, config).await;
    eventually("the pod prepared", async || {
        node.peer.prepare(ns, "broker").await.ok()
    })
    .await;
}

/// A ResourceClaimTemplate `echo` for one device of `config`, and pod `broker` whose container
/// `broker` holds a claim from it; the scheduler places it.
async fn broker_pod(client: &kube::Client, ns: &str, config: &str) {
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "echo" },
            "spec": { "spec": { "devices": { "requests": [{ "name": "echo", "exactly": { "deviceClassName": config } }] } } },
        })).unwrap())
        .await
        .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "broker" },
            "spec": {
                "resourceClaims": [{ "name": "echo", "resourceClaimTemplateName": "echo" }],
                "containers": [{ "name": "broker", "image": "none", "resources": { "claims": [{ "name": "echo" }] } }],
            },
        })).unwrap())
        .await
        .unwrap();
}

/// A claim whose device left the node between its allocation and its pod's start (its
/// configuration deleted) fails to prepare, naming the device; the chart's alert of failing
/// prepares is pending on what the node's /metrics then say, and silent before.
#[tokio::test]
async fn a_claim_whose_device_left_fails_to_prepare_and_the_alert_says_so() {
    let (cp, client, ns, config) = cluster().await;
    let node = ready_node(&cp, &client, &ns).await;
    let scrape = || [(node.name.as_str(), node.agent.metrics().encode())];
    let alert = Alert::named("AkriClaimPrepareFailing").silent(&scrape());
    echo_configuration(&client, &config).await;
    broker_pod(&client, &ns, &config).await;
    // Bound: the scheduler allocated the claim.
    eventually("the pod bound", async || {
        Api::<Pod>::namespaced(client.clone(), &ns)
            .get("broker")
            .await
            .ok()?
            .spec?
            .node_name
    })
    .await;
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .delete(&config, &Default::default())
        .await
        .unwrap();
    eventually("the device unpublished", async || {
        pool_devices(&client, &node.name)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let alert = alert.silent(&scrape());
    let error = node.peer.prepare(&ns, "broker").await.unwrap_err();
    assert!(
        error.to_string().contains("is not available on node"),
        "{error}"
    );
    (alert.pending(
        &scrape(),
        &[&[("pod", node.name.as_str()), ("driver", DRIVER)]],
    ))
    .check();
}

/// A container's CDI ids but those of device metadata files.
fn device_ids(ids: &[String]) -> Vec<&String> {
    ids.iter().filter(|id| !id.ends_with(".metadata")).collect()
}

fn device_health(health: &Value, device: &str) -> Option<String> {
    health["drivers"][DRIVER]
        .as_array()?
        .iter()
        .find(|d| d["device"] == device)
        .and_then(|d| d["health"].as_str().map(str::to_string))
}

#[tokio::test]
async fn debug_echo_devices_are_scheduled_prepared_and_tracked() {
    let (cp, client, ns, config) = cluster().await;
    let cp = &cp;

    let nodes = [
        start_node(cp, &client, &ns).await,
        start_node(cp, &client, &ns).await,
    ];
    for node in &nodes {
        node.peer
            .wait_for_driver(DRIVER, Duration::from_secs(30))
            .await
            .unwrap();
    }

    echo_configuration(&client, &config).await;

    // Each node publishes its own local device, and writes its Instance.
    let mut device_of = Vec::new();
    for node in &nodes {
        let devices = eventually("node pool published", async || {
            let devices = pool_devices(&client, &node.name).await;
            (!devices.is_empty()).then_some(devices)
        })
        .await;
        assert_eq!(
            devices.len(),
            1,
            "one debugEcho device per node: {devices:?}"
        );
        assert_eq!(
            devices[0],
            akri_devices::instance_name(&config, "foo0", false, &node.name)
        );
        device_of.push(devices[0].clone());
    }
    assert_ne!(
        device_of[0], device_of[1],
        "local devices are distinct per node"
    );
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    for (node, device) in nodes.iter().zip(&device_of) {
        let instance = eventually("Instance written", async || {
            instances.get_opt(device).await.unwrap()
        })
        .await;
        assert_eq!(instance.spec.configuration_name, config);
        assert_eq!(instance.spec.nodes, vec![node.name.clone()]);
        assert_eq!(
            instance.spec.broker_properties["DEBUG_ECHO_DESCRIPTION"],
            "foo0"
        );
    }

    // A pod asking for one device lands on a node that has it and is prepared there.
    broker_pod(&client, &ns, &config).await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let bound_to = eventually("pod bound", async || {
        pods.get("broker").await.ok()?.spec?.node_name
    })
    .await;
    let index = nodes
        .iter()
        .position(|n| n.name == bound_to)
        .expect("bound to one of our nodes");
    let node = &nodes[index];

    let containers = node
        .peer
        .prepare(&ns, "broker")
        .await
        .expect("the kubelet prepares the pod");
    let ids = &containers["broker"];
    assert_eq!(ids.len(), 2, "the device and its metadata file: {ids:?}");
    assert!(ids[0].starts_with("akri.sh/debugecho="), "{ids:?}");
    // Both in the claim's one CDI spec.
    assert!(
        ids[1].starts_with("akri.sh/debugecho=") && ids[1].ends_with("-echo.metadata"),
        "{ids:?}"
    );
    let specs = std::fs::read_dir(node.peer.cdi_dir()).unwrap().count();
    assert_eq!(specs, 1, "one CDI spec file for the claim");
    let edits = node
        .peer
        .cdi_inject(ids)
        .await
        .expect("the CDI library resolves the ids");
    let env: Vec<String> = serde_json::from_value(edits["env"].clone()).unwrap();
    assert!(
        env.contains(&"DEBUG_ECHO_DESCRIPTION=foo0".to_string()),
        "{env:?}"
    );
    // The reference CDI library turns the metadata id into a read-only bind mount of the file
    // at the standard path (the pod's claim `echo`, its request `echo`).
    let mounts = edits["mounts"].as_array().unwrap();
    let metadata = mounts
        .iter()
        .find(|m| {
            m["destination"]
                == "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/echo/echo/debugecho.akri.sh-metadata.json"
        })
        .unwrap_or_else(|| panic!("no metadata mount: {mounts:?}"));
    assert!(
        metadata["options"]
            .as_array()
            .unwrap()
            .contains(&json!("ro")),
        "{metadata}"
    );
    let file = std::fs::read_to_string(metadata["source"].as_str().unwrap()).unwrap();
    assert!(file.contains("DEBUG_ECHO_DESCRIPTION"), "{file}");

    // The claim's status shows the device, written by the library off the kubelet's path.
    let claim = eventually("the pod's claim", async || {
        (pods
            .get("broker")
            .await
            .ok()?
            .status?
            .resource_claim_statuses?)
            .into_iter()
            .find_map(|status| status.resource_claim_name)
    })
    .await;
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let shown = async || -> Option<Vec<(String, Value)>> {
        let devices = claims.get(&claim).await.ok()?.status?.devices;
        Some(
            (devices.unwrap_or_default().into_iter())
                .map(|d| (d.device, d.data.map(|data| data.0).unwrap_or_default()))
                .collect(),
        )
    };
    let entries = eventually("the device in the claim's status", async || {
        shown().await.filter(|entries| !entries.is_empty())
    })
    .await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].0, device_of[index]);
    assert_eq!(entries[0].1["properties"]["DEBUG_ECHO_DESCRIPTION"], "foo0");

    // Prepares and unprepares set off no pass of the agent's loop: the kubelet's calls cost no
    // discovery sync, health vouching or publishing. (At most one pass from the 30 s resync.)
    // After each call the test waits until the loop took its change of the prepared claims
    // (it takes one input at a time, so a pass it set off began before the next was taken).
    let wakes = |outcome: &str| {
        node.metric(&format!(
            "akri_kubelet_plugin_claim_wakes_total{{outcome=\"{outcome}\"}}"
        ))
    };
    let taken = || wakes("pass") + wakes("quiet");
    let (before, passing) = (node.passes(), wakes("pass"));
    for round in 0..10 {
        let was = taken();
        if round % 2 == 0 {
            node.peer.unprepare(&ns, "broker").await.unwrap();
        } else {
            node.peer.prepare(&ns, "broker").await.unwrap();
        }
        eventually("the agent's loop took the claims' change", async || {
            (taken() > was).then_some(())
        })
        .await;
    }
    let after = node.passes();
    assert!(
        after - before <= 1.0,
        "5 unprepares and prepares set off {} passes",
        after - before
    );
    assert_eq!(
        wakes("pass") - passing,
        0.0,
        "5 unprepares and prepares asked for passes"
    );

    // The device disappears while the pod holds it: it stays in the slice, tainted so that
    // nothing new gets it, and turns unhealthy; it comes back untainted.
    std::fs::write(&node.availability, "OFFLINE").unwrap();
    eventually("device tainted in the slice", async || {
        (pool_taints(&client, &node.name).await
            == [(device_of[index].clone(), vec!["NoSchedule".to_string()])])
        .then_some(())
    })
    .await;
    eventually("device unhealthy in the kubelet", async || {
        let health = node.peer.dra_health().await.ok()?;
        (device_health(&health, &device_of[index]).as_deref() == Some("Unhealthy")).then_some(())
    })
    .await;
    std::fs::write(&node.availability, "").unwrap();
    eventually("device back in the slice untainted", async || {
        (pool_taints(&client, &node.name).await == [(device_of[index].clone(), vec![])])
            .then_some(())
    })
    .await;
    eventually("device healthy again", async || {
        let health = node.peer.dra_health().await.ok()?;
        (device_health(&health, &device_of[index]).as_deref() == Some("Healthy")).then_some(())
    })
    .await;

    node.peer
        .unprepare(&ns, "broker")
        .await
        .expect("unprepare succeeds");
    assert!(
        node.peer.cdi_inject(ids).await.is_err(),
        "the CDI spec is gone after unprepare"
    );
    eventually("the claim's status without the device", async || {
        shown().await.filter(|entries| entries.is_empty())
    })
    .await;
}

/// Runs `create` while the DiscoveryConfiguration CRD has no rules on the object (as before
/// the CRD refused names that are not DNS labels), then puts the rules back. The API server
/// takes a new schema a moment after the CRD's update: `create` is tried until it says it
/// succeeded.
async fn without_name_rules(client: &kube::Client, create: impl AsyncFn() -> bool) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let name = "discoveryconfigurations.akri.sh";
    let original = crds.get(name).await.unwrap();
    let mut lifted = original.clone();
    for version in &mut lifted.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema.x_kubernetes_validations = None;
        }
    }
    crds.replace(name, &PostParams::default(), &lifted)
        .await
        .unwrap();
    eventually(
        "an object the rules refused, created without them",
        async || create().await.then_some(()),
    )
    .await;
    let mut restored = crds.get(name).await.unwrap();
    restored.spec = original.spec;
    crds.replace(name, &PostParams::default(), &restored)
        .await
        .unwrap();
}

#[tokio::test]
async fn discovery_errors_show_in_the_configurations_status() {
    // Its own control plane: every agent discovers every (cluster-scoped) configuration of
    // its handlers, so tests sharing a cluster would see each other's devices.
    let cp = &ControlPlane::start(ControlPlaneOptions::full())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("akri").await.unwrap();
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    let node = ready_node(cp, &client, &ns).await;
    let scrape = || [(node.name.as_str(), node.agent.metrics().encode())];
    let alert = Alert::named("AkriDiscoveryFailing").silent(&scrape());
    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    let config_of = |name: &str, handler: Value| -> akri_api::v1::DiscoveryConfiguration {
        serde_json::from_value(json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": name }, "spec": { "discoveryHandler": handler },
        }))
        .unwrap()
    };
    let create = async |name: &str, handler: Value| {
        configs
            .create(&PostParams::default(), &config_of(name, handler))
            .await
            .unwrap();
    };
    // An admission policy refuses the Instance of one device (as the API server refuses one
    // with a property too large for a request), once it is in force.
    let refused = ControlPlane::unique_name("refused");
    refuse_instances_described(&client, &ns, "refused0").await;
    create(
        &refused,
        json!({ "name": "debugEcho", "discoveryDetails": "descriptions: [refused0, fine0]" }),
    )
    .await;
    let good = ControlPlane::unique_name("good");
    let bad_details = ControlPlane::unique_name("bad-details");
    let bad_secret = ControlPlane::unique_name("bad-secret");
    // A name stored before the CRD refused dots (the CRD's rules are lifted for it): its
    // devices would be named `old.dotted-<digest>`, which no slice may hold.
    let dotted = format!("old.{}", ControlPlane::unique_name("dotted"));
    let dotted_config = config_of(
        &dotted,
        json!({ "name": "debugEcho", "discoveryDetails": "descriptions: [dot0]" }),
    );
    without_name_rules(&client, async || {
        (configs.create(&PostParams::default(), &dotted_config).await).is_ok()
    })
    .await;
    create(
        &good,
        json!({ "name": "debugEcho", "discoveryDetails": "descriptions: [ok0]" }),
    )
    .await;
    create(
        &bad_details,
        json!({ "name": "debugEcho", "discoveryDetails": "descriptions: {not: a list}" }),
    )
    .await;
    create(&bad_secret, json!({ "name": "debugEcho", "discoveryDetails": "descriptions: [s0]",
        "discoveryProperties": [{ "name": "password", "valueFrom": { "secretKeyRef": { "name": "missing", "namespace": ns, "key": "pw" } } }] })).await;

    let error_of = async |name: &str| -> Option<String> {
        let config = configs.get(name).await.ok()?;
        let errors = config.status?.discovery_errors;
        errors
            .iter()
            .find(|e| e.node == node.name)
            .map(|e| e.message.clone())
    };
    let message = eventually("bad details reported", async || {
        error_of(&bad_details).await
    })
    .await;
    assert!(message.contains("debugEcho discovery details"), "{message}");
    let message = eventually("missing secret reported", async || {
        error_of(&bad_secret).await
    })
    .await;
    assert!(
        message.contains("Secret") && message.contains("missing"),
        "{message}"
    );

    let message = eventually("the refused Instance reported", async || {
        error_of(&refused).await
    })
    .await;
    let refused_instance = akri_devices::instance_name(&refused, "refused0", false, &node.name);
    assert!(
        message.contains(&format!(
            "the API server refused Instance {refused_instance}"
        )) && message.contains("no refused0 here"),
        "{message}"
    );
    // Its other device is written and published all the same.
    let fine = akri_devices::instance_name(&refused, "fine0", false, &node.name);
    Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns)
        .get(&fine)
        .await
        .expect("the configuration's other Instance");

    // The good configuration on the same node and handler is unaffected.
    let good_device = akri_devices::instance_name(&good, "ok0", false, &node.name);
    eventually("good device published", async || {
        pool_devices(&client, &node.name)
            .await
            .contains(&good_device)
            .then_some(())
    })
    .await;
    assert_eq!(error_of(&good).await, None);
    // What the chart's alert of failing discovery is about, once the node counts it.
    eventually("the node's failing configurations counted", async || {
        let text = node.agent.metrics().encode();
        (akri_testing::metric(&text, "akri_kubelet_plugin_discovery_errors")? >= 3.0).then_some(())
    })
    .await;
    (alert.pending(&scrape(), &[&[("pod", node.name.as_str())]])).check();
    // Its status cannot take a write any more (the CRD's rules refuse the object), so the
    // node says it.
    let note = eventually("a Warning Event on the node names it", async || {
        akri_testing::node_event(&client, &node.name, "ConfigurationNotRun", &dotted)
            .await?
            .note
    })
    .await;
    assert!(note.contains("DNS label"), "{note}");
    assert!(
        !pool_devices(&client, &node.name)
            .await
            .iter()
            .any(|d| d.starts_with("old.")),
        "nothing of the refused configuration is published"
    );

    // Fixing the details clears this node's entry.
    let mut fixed = configs.get(&bad_details).await.unwrap();
    fixed.spec.discovery_handler.discovery_details = "descriptions: [fixed0]".into();
    configs
        .replace(&bad_details, &PostParams::default(), &fixed)
        .await
        .unwrap();
    eventually("error cleared", async || {
        error_of(&bad_details).await.is_none().then_some(())
    })
    .await;
}

/// A discovery property's Secret is read once and then kept by a watch: passes of the agent
/// read it no more. One that can no longer be read (the API server refuses, as it would in an
/// outage or after an RBAC mistake) is not a change: discovery goes on with the value it has,
/// the devices stay, and the configuration's status says why. Only when the Secret is
/// definitely gone does discovery stop. The agent runs as the chart's RBAC.
#[tokio::test]
async fn an_unreadable_secret_keeps_discovery_running_and_passes_do_not_read_it() {
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
    use kube::api::DeleteParams;
    let cp = &ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let admin = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("akri").await.unwrap();
    akri_testing::components::spawn_spec_mirror(&admin, &ns);
    let user = "system:serviceaccount:akri:kubelet-plugin";

    akri_testing::rbac::grant_kubelet_plugin(&admin, user, "akri-kubelet-plugin", &ns)
        .await
        .unwrap();
    // Secrets: only in the namespace that holds discovery credentials (here: the same one).
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "akri-property-reader" },
            "rules": [{ "apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["list", "watch"] }],
        })).unwrap())
        .await
        .unwrap();
    let secrets_binding: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": "akri-property-reader" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "akri-property-reader" },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))
    .unwrap();
    let bindings = Api::<RoleBinding>::namespaced(admin.clone(), &ns);
    bindings
        .create(&PostParams::default(), &secrets_binding)
        .await
        .unwrap();
    let secrets = Api::<Secret>::namespaced(admin.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "camera-creds" }, "stringData": { "pw": "hunter2" },
            }))
            .unwrap(),
        )
        .await
        .unwrap();

    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(cp.kubeconfig()).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    config.auth_info.impersonate = Some(user.into());
    // Through a proxy whose connections the test can cut, counting the agent's reads.
    let proxy = akri_testing::TcpProxy::start(cp.api_server_address())
        .await
        .unwrap();
    let reads = akri_testing::SlowLists::new();
    let plugin_client = reads.client(proxy.client_config(&config).unwrap()).unwrap();
    let node = ready_node(cp, &plugin_client, &ns).await;

    let name = ControlPlane::unique_name("creds");
    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(admin.clone());
    configs
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": name },
            "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [c0]",
                "discoveryProperties": [{ "name": "password", "valueFrom": { "secretKeyRef": {
                    "name": "camera-creds", "namespace": ns, "key": "pw" } } }] } },
        })).unwrap())
        .await
        .unwrap();
    let device = akri_devices::instance_name(&name, "c0", false, &node.name);
    eventually("the device is published", async || {
        pool_devices(&admin, &node.name)
            .await
            .contains(&device)
            .then_some(())
    })
    .await;

    // Where the node may get but not list (the chart's cluster-wide default), the value is
    // read all the same (every minute, not per pass).
    use k8s_openapi::api::core::v1::ConfigMap;
    let site_ns = cp.create_namespace("site").await.unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "akri-property-getter" },
                "rules": [{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"] }],
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), &site_ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "akri-property-getter" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "akri-property-getter" },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
        })).unwrap())
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), &site_ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "site" }, "data": { "floor": "2" },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let by_get = ControlPlane::unique_name("site");
    configs
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": by_get },
            "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [g0]",
                "discoveryProperties": [{ "name": "floor", "valueFrom": { "configMapKeyRef": {
                    "name": "site", "namespace": site_ns, "key": "floor" } } }] } },
        })).unwrap())
        .await
        .unwrap();
    let got = akri_devices::instance_name(&by_get, "g0", false, &node.name);
    eventually(
        "the device of a get-only property is published",
        async || {
            pool_devices(&admin, &node.name)
                .await
                .contains(&got)
                .then_some(())
        },
    )
    .await;

    let error_of = async || -> Option<String> {
        let status = configs.get(&name).await.ok()?.status?;
        status
            .discovery_errors
            .into_iter()
            .find(|e| e.node == node.name)
            .map(|e| e.message)
    };

    // Passes of the agent (each change of the configuration causes one) read no Secret.
    let read_at_start = reads.reads("/secrets");
    assert_eq!(read_at_start, 1, "one LIST of the one Secret");
    // Four changes, each waiting for its pass to begin: three whole passes (one task runs
    // them, so the fourth began after the third ended).
    for touch in 0..4 {
        let before = node.passes();
        let mut changed = configs.get(&name).await.unwrap();
        changed.metadata.labels = Some([("touched".to_string(), touch.to_string())].into());
        configs
            .replace(&name, &PostParams::default(), &changed)
            .await
            .unwrap();
        eventually("the change's pass", async || {
            (node.passes() > before).then_some(())
        })
        .await;
    }
    assert_eq!(
        reads.reads("/secrets"),
        read_at_start,
        "passes read the Secret again"
    );

    // The node may no longer read the Secret: once its watch has to start again (the
    // connections are cut), the status says so, and the device stays.
    bindings
        .delete("akri-property-reader", &DeleteParams::default())
        .await
        .unwrap();
    proxy.close_open_connections();
    let message = eventually("the refusal is reported", error_of).await;
    assert!(
        message.contains("forbidden") || message.contains("Forbidden"),
        "{message}"
    );
    for _ in 0..10 {
        assert!(
            pool_devices(&admin, &node.name).await.contains(&device),
            "the device stays published while the Secret cannot be read"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Readable again: the error clears (the watch retries by itself).
    bindings
        .create(&PostParams::default(), &secrets_binding)
        .await
        .unwrap();
    eventually("the error clears", async || {
        error_of().await.is_none().then_some(())
    })
    .await;

    // Definitely gone: discovery stops and says why, as soon as the watch tells.
    secrets
        .delete("camera-creds", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the device is withdrawn", async || {
        (!pool_devices(&admin, &node.name).await.contains(&device)).then_some(())
    })
    .await;
    let message = eventually("the missing Secret is reported", error_of).await;
    assert!(
        message.contains("camera-creds") && message.contains("does not exist"),
        "{message}"
    );
}

/// The health values the kubelet would put in the pod's status for its container `broker`.
async fn pod_health(peer: &KubeletPeer, ns: &str, pod: &str) -> Vec<String> {
    let health = peer.pod_health(ns, pod).await.unwrap();
    health["containers"]["broker"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|status| status["resources"].as_array().cloned().unwrap_or_default())
        .filter_map(|resource| resource["health"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_held_devices_health_stays_known_without_changes_and_turns_unhealthy_when_it_goes() {
    let (cp, client, ns, config) = cluster().await;
    let cp = &cp;
    let node = ready_node(cp, &client, &ns).await;
    prepared_broker(&node, &client, &ns, &config).await;
    eventually("the device healthy in the pod's status", async || {
        (pod_health(&node.peer, &ns, "broker").await == ["Healthy"]).then_some(())
    })
    .await;

    // Nothing changes for 2 minutes, four times the kubelet's 30 s health timeout: the
    // plugin's resends keep the device Healthy (without them it turns Unknown after 30 s).
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(120) {
        assert_eq!(
            pod_health(&node.peer, &ns, "broker").await,
            ["Healthy"],
            "after {:?} without a change",
            quiet.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    // The device goes: Unhealthy in the pod's status.
    std::fs::write(&node.availability, "OFFLINE").unwrap();
    let gone = std::time::Instant::now();
    eventually("the device unhealthy in the pod's status", async || {
        (pod_health(&node.peer, &ns, "broker").await == ["Unhealthy"]).then_some(())
    })
    .await;
    // A figure, not a pass mark (timed assertions flake); the handler polls every 100 ms.
    eprintln!(
        "offline to Unhealthy in the pod's status: {:?}",
        gone.elapsed()
    );
}

/// A pod `name` holding a claim from the template `echo` of [`broker_pod`].
async fn echo_pod(client: &kube::Client, ns: &str, name: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "resourceClaims": [{ "name": "echo", "resourceClaimTemplateName": "echo" }],
                "containers": [{ "name": "broker", "image": "none", "resources": { "claims": [{ "name": "echo" }] } }],
            },
        })).unwrap())
        .await
        .unwrap();
}

/// The condition `type_` of pod `name`, if it has one.
async fn pod_condition(
    pods: &Api<Pod>,
    name: &str,
    type_: &str,
) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    let pod = pods.get(name).await.ok()?;
    pod.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)
}

#[tokio::test]
async fn a_vanished_held_device_is_tainted_its_pod_evicted_and_replaced_and_it_returns_untainted() {
    let (cp, client, ns, config) = cluster().await;
    let cp = &cp;
    let grace = Duration::from_secs(15);
    let a = start_node_with(cp, &client, &ns, |c| c.vanished_grace = grace).await;
    a.peer
        .wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    echo_configuration(&client, &config).await;
    broker_pod(&client, &ns, &config).await;
    eventually("the pod prepared on the only node", async || {
        a.peer.prepare(&ns, "broker").await.ok()
    })
    .await;
    let device = pool_devices(&client, &a.name).await.remove(0);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);

    // The device vanishes while the pod holds it: NoSchedule at once, so the replacement
    // created now finds no device it may have.
    std::fs::write(&a.availability, "OFFLINE").unwrap();
    eventually("the device NoSchedule-tainted", async || {
        (pool_taints(&client, &a.name).await == [(device.clone(), vec!["NoSchedule".into()])])
            .then_some(())
    })
    .await;
    let tainted = std::time::Instant::now();
    echo_pod(&client, &ns, "replacement").await;
    eventually("the replacement unschedulable", async || {
        let scheduled = pod_condition(&pods, "replacement", "PodScheduled").await?;
        (scheduled.status == "False" && scheduled.reason.as_deref() == Some("Unschedulable"))
            .then_some(())
    })
    .await;

    // After the grace: NoExecute, and the device-taint eviction controller evicts the holder.
    eventually("the taint NoExecute", async || {
        (pool_taints(&client, &a.name).await == [(device.clone(), vec!["NoExecute".into()])])
            .then_some(())
    })
    .await;
    assert!(
        tainted.elapsed() >= grace - Duration::from_secs(2),
        "NoExecute after {:?}, before the grace of {grace:?}",
        tainted.elapsed()
    );
    let evicted = eventually("the holder evicted", async || {
        let condition = pod_condition(&pods, "broker", "DisruptionTarget").await?;
        (condition.status == "True").then_some(condition)
    })
    .await;
    assert_eq!(
        evicted.reason.as_deref(),
        Some("DeletionByDeviceTaintManager")
    );
    assert!(
        pods.get("broker")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "the evicted pod is being deleted"
    );

    // The kubelet's part of the deletion: unprepare, then the pod goes. Released, the device
    // leaves the slice.
    a.peer.unprepare(&ns, "broker").await.unwrap();
    pods.delete(
        "broker",
        &kube::api::DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap();
    eventually("the released device gone from the slice", async || {
        pool_taints(&client, &a.name).await.is_empty().then_some(())
    })
    .await;
    assert!(
        pods.get("replacement")
            .await
            .unwrap()
            .spec
            .and_then(|s| s.node_name)
            .is_none(),
        "the replacement stays unscheduled while no device exists"
    );

    // A node whose device exists: the replacement lands there.
    let b = start_node(cp, &client, &ns).await;
    eventually("the replacement on the other node", async || {
        let pod = pods.get("replacement").await.ok()?;
        (pod.spec?.node_name? == b.name).then_some(())
    })
    .await;

    // The device comes back: untainted, and a new pod gets it.
    std::fs::write(&a.availability, "").unwrap();
    eventually("the device back untainted", async || {
        (pool_taints(&client, &a.name).await == [(device.clone(), vec![])]).then_some(())
    })
    .await;
    echo_pod(&client, &ns, "third").await;
    eventually("a new pod on the returned device", async || {
        let pod = pods.get("third").await.ok()?;
        (pod.spec?.node_name? == a.name).then_some(())
    })
    .await;
}

/// Claims of today's request forms prepare, and each container gets the devices it names: a
/// request with `firstAvailable` subrequests (its result is named `echo/<subrequest>`, the
/// container names `echo`), and an `adminAccess` claim on a device another pod holds.
#[tokio::test]
async fn first_available_subrequests_and_admin_access_claims_prepare() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let (cp, client, ns, config) = cluster().await;
    let node = ready_node(&cp, &client, &ns).await;
    echo_configuration(&client, &config).await;
    // The first subrequest matches nothing, so the scheduler takes the second.
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "either" },
            "spec": { "spec": { "devices": { "requests": [{ "name": "echo", "firstAvailable": [
                { "name": "absent", "deviceClassName": config, "selectors": [{ "cel": { "expression": "device.attributes['akri.sh'].configuration == 'no-such-configuration'" } }] },
                { "name": "any", "deviceClassName": config },
            ] }] } } },
        })).unwrap())
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": { "name": "either" },
        "spec": {
            "resourceClaims": [{ "name": "c", "resourceClaimTemplateName": "either" }],
            "containers": [{ "name": "broker", "image": "none", "resources": { "claims": [{ "name": "c", "request": "echo" }] } }],
        },
    })).unwrap())
    .await
    .unwrap();
    let containers = eventually("the firstAvailable pod prepared", async || {
        node.peer.prepare(&ns, "either").await.ok()
    })
    .await;
    let claim_name = pods
        .get("either")
        .await
        .unwrap()
        .status
        .unwrap()
        .resource_claim_statuses
        .unwrap()[0]
        .resource_claim_name
        .clone()
        .unwrap();
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), &ns)
        .get(&claim_name)
        .await
        .unwrap();
    let results = claim
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap();
    assert_eq!(results[0].request, "echo/any");
    assert_eq!(
        device_ids(&containers["broker"]).len(),
        1,
        "the container naming request echo gets its subrequest's device: {containers:?}"
    );

    // The namespace may ask for admin access; the device is already held by "either".
    let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    namespaces
        .patch(
            &ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "metadata": { "labels": { "resource.kubernetes.io/admin-access": "true" } } })),
        )
        .await
        .unwrap();
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": "monitor" },
            "spec": { "spec": { "devices": { "requests": [{ "name": "watch", "exactly": { "deviceClassName": config, "adminAccess": true } }] } } },
        })).unwrap())
        .await
        .unwrap();
    pods.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": { "name": "monitor" },
        "spec": {
            "resourceClaims": [{ "name": "m", "resourceClaimTemplateName": "monitor" }],
            "containers": [{ "name": "broker", "image": "none", "resources": { "claims": [{ "name": "m" }] } }],
        },
    })).unwrap())
    .await
    .unwrap();
    let monitor = eventually("the admin-access pod prepared", async || {
        node.peer.prepare(&ns, "monitor").await.ok()
    })
    .await;
    assert_eq!(device_ids(&monitor["broker"]).len(), 1, "{monitor:?}");
    let edits = node.peer.cdi_inject(&monitor["broker"]).await.unwrap();
    let env: Vec<String> = serde_json::from_value(edits["env"].clone()).unwrap();
    assert!(
        env.contains(&"DEBUG_ECHO_DESCRIPTION=foo0".to_string()),
        "the monitor sees the held device: {env:?}"
    );
}

/// A plugin whose registry directory no kubelet watches (a wrong `kubeletPlugin.kubeletDir`)
/// is not ready and says which directory, instead of serving on quietly; one pointed at the
/// kubelet's is ready.
#[tokio::test]
async fn a_driver_no_kubelet_takes_makes_the_plugin_not_ready_naming_the_directory() {
    let (cp, client, ns, config) = cluster().await;
    let lost = start_node_with(&cp, &client, &ns, |c| {
        c.registry_dir = c.state_dir.with_file_name("not-the-kubelets-registry");
        c.kubelet_registration_timeout = Duration::from_secs(2);
    })
    .await;
    let wired = start_node_with(&cp, &client, &ns, |c| {
        c.kubelet_registration_timeout = Duration::from_secs(2);
    })
    .await;
    echo_configuration(&client, &config).await;
    let reason = eventually(
        "the unwatched plugin says why it is not ready",
        async || {
            lost.agent
                .readiness()
                .reason()
                .filter(|r| r.contains("no kubelet has taken"))
        },
    )
    .await;
    assert!(
        reason.contains(DRIVER) && reason.contains("not-the-kubelets-registry"),
        "{reason}"
    );
    wired
        .peer
        .wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    eventually("the wired plugin is ready", async || {
        wired.agent.readiness().is_ready().then_some(())
    })
    .await;
    // Past the timeout the wired one stays ready.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(wired.agent.readiness().reason(), None, "{}", wired.name);
}

/// A ValidatingAdmissionPolicy refusing Instances in `ns` whose device is described as
/// `description`, in force when this returns (a probe Instance is refused).
async fn refuse_instances_described(client: &kube::Client, ns: &str, description: &str) {
    let name = ControlPlane::unique_name("refuse-instances");
    let expression = format!(
        "object.spec.?brokerProperties[?'DEBUG_ECHO_DESCRIPTION'].orValue('') != '{description}'"
    );
    let denial = akri_testing::admission::Denial {
        name: &name,
        rule: json!({
            "apiGroups": ["akri.sh"], "apiVersions": ["v0"],
            "operations": ["CREATE", "UPDATE"], "resources": ["instances"],
        }),
        expression: &expression,
        message: &format!("no {description} here"),
        forbidden: false,
        namespace: Some(ns),
    };
    akri_testing::admission::deny_unless(client, denial)
        .await
        .unwrap();
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), ns);
    let probe: akri_api::v0::Instance = serde_json::from_value(json!({
        "metadata": { "name": "probe" },
        "spec": { "configurationName": "probe", "cdiName": "akri.sh/probe=probe", "capacity": 1,
                  "brokerProperties": { "DEBUG_ECHO_DESCRIPTION": description } },
    }))
    .unwrap();
    eventually("the Instance policy in force", async || {
        match instances
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &probe,
            )
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 422 || status.code == 403 => Some(()),
            _ => None,
        }
    })
    .await;
}

/// On the kubelet's own health manager (the peer runs it): the devices of a handler that
/// stops answering decay to Unknown in the pod's status (the agent stops vouching for them
/// and the library does not resend them), and are Healthy again once it answers.
#[tokio::test]
async fn a_wedged_handlers_devices_turn_unknown_and_healthy_again_when_it_answers() {
    let (cp, client, ns, config) = cluster().await;
    let mut sockets = None;
    let node = start_node_with(&cp, &client, &ns, |c| {
        let echo = c.debug_echo.as_ref().unwrap().socket.clone();
        sockets = Some((c.discovery_socket.clone(), echo));
    })
    .await;
    let (registration, echo) = sockets.unwrap();
    node.peer
        .wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    // debugEcho, behind the relay, registered as a handler of its own (a live handler's name
    // is not taken by another endpoint).
    let relay = akri_testing::UnixRelay::start(echo.with_file_name("relay.sock"), echo);
    let behind_relay = akri_kubelet_plugin::discovery::RegisteredHandler {
        name: "wedgedEcho".into(),
        endpoint: akri_kubelet_plugin::discovery::Endpoint::Uds(relay.socket.clone()),
        shared: false,
    };
    akri_kubelet_plugin::discovery::handler::register(&registration, &behind_relay)
        .await
        .unwrap();
    let wedged_driver = akri_devices::driver_name("wedgedEcho");
    echo_configuration_of(&client, &config, "wedgedEcho").await;
    broker_pod(&client, &ns, &config).await;
    eventually("the pod prepared", async || {
        node.peer.prepare(&ns, "broker").await.ok()
    })
    .await;
    eventually("the device healthy in the pod's status", async || {
        (pod_health(&node.peer, &ns, "broker").await == ["Healthy"]).then_some(())
    })
    .await;

    relay.pass(false);
    let wedged = std::time::Instant::now();
    // Noticed by keepalive within 20 s, out of the reports within 20 s more, Unknown in the
    // kubelet 30 s after the last report.
    akri_testing::eventually_within(
        "the device Unknown in the pod's status",
        Duration::from_secs(150),
        async || (pod_health(&node.peer, &ns, "broker").await == ["Unknown"]).then_some(()),
    )
    .await;
    eprintln!(
        "handler wedged to Unknown in the pod's status: {:?}",
        wedged.elapsed()
    );
    // Still published meanwhile: a wedged handler is not a vanished device.
    assert_eq!(
        pool_devices_of(&client, &node.name, &wedged_driver)
            .await
            .len(),
        1
    );

    relay.pass(true);
    let answering = std::time::Instant::now();
    akri_testing::eventually_within(
        "the device Healthy again",
        Duration::from_secs(90),
        async || (pod_health(&node.peer, &ns, "broker").await == ["Healthy"]).then_some(()),
    )
    .await;
    eprintln!("handler answering to Healthy: {:?}", answering.elapsed());
}

/// docs/operations.md "Taking a device out of service", as written but for the names: the
/// DeviceTaintRule (resource.k8s.io/v1, 1.37) evicts the pod holding the device, keeps its
/// replacement Pending, and once deleted lets the replacement have the device.
#[tokio::test]
async fn an_admins_device_taint_rule_drains_a_device_and_keeps_it_unallocatable() {
    const SECTION: &str = "Taking a device out of service";
    let (cp, client, ns, config) = cluster().await;
    let node = ready_node(&cp, &client, &ns).await;
    prepared_broker(&node, &client, &ns, &config).await;
    let device = pool_devices(&client, &node.name).await.remove(0);

    let doc = akri_testing::product::repo().join("docs/operations.md");
    let names = |text: &str| {
        text.replace("edge-1", &node.name)
            .replace("udev.akri.sh", DRIVER)
            .replace("device: cam-3f2a1c", &format!("device: {device}"))
    };
    let mut lines = akri_testing::docs::section_lines(&doc, SECTION)
        .unwrap()
        .into_iter();
    let mut next = |prefix: &str| {
        let line = lines.next().unwrap_or_default();
        assert!(line.starts_with(prefix), "{line:?}, want {prefix:?}...");
        names(&line)
    };
    let dir = tempfile::tempdir().unwrap();
    let kubectl = async |line: String| {
        let output = tokio::process::Command::new("sh")
            .args([
                "-c",
                &line.replacen(
                    "kubectl",
                    &cp.bins().require("kubectl").unwrap().display().to_string(),
                    1,
                ),
            ])
            .current_dir(dir.path())
            .env("KUBECONFIG", cp.kubeconfig())
            .output()
            .await
            .unwrap();
        assert!(
            output.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };

    // The device's name, as the section finds it.
    assert_eq!(
        kubectl(next("kubectl get resourceslices")).await.trim(),
        device
    );
    let [rule] = &akri_testing::docs::section_blocks(&doc, SECTION, &["yaml"]).unwrap()[..] else {
        panic!("one rule in the section");
    };
    std::fs::write(dir.path().join("cam-3f2a1c-maintenance.yaml"), names(rule)).unwrap();
    kubectl(next("kubectl apply -f cam-3f2a1c-maintenance.yaml")).await;

    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    eventually("the holder evicted", async || {
        let condition = pod_condition(&pods, "broker", "DisruptionTarget").await?;
        (condition.status == "True").then_some(())
    })
    .await;
    // A kubelet would now stop its container and let it go; the peer runs no container, so
    // the test finishes the deletion, which releases its claim.
    pods.delete(
        "broker",
        &kube::api::DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap();
    let status = next("kubectl get devicetaintrule");
    let message = eventually("the rule's condition", async || {
        Some(kubectl(status.clone()).await).filter(|m| !m.is_empty())
    })
    .await;
    eprintln!("the rule's condition: {message}");
    echo_pod(&client, &ns, "replacement").await;
    eventually("the replacement unschedulable", async || {
        let scheduled = pod_condition(&pods, "replacement", "PodScheduled").await?;
        (scheduled.status == "False" && scheduled.reason.as_deref() == Some("Unschedulable"))
            .then_some(())
    })
    .await;
    // Still published all along: only allocation and running pods see the taint.
    assert_eq!(
        pool_devices(&client, &node.name).await,
        std::slice::from_ref(&device)
    );

    kubectl(next("kubectl delete devicetaintrule")).await;
    assert!(lines.next().is_none(), "lines left in {SECTION:?}");
    eventually("the replacement scheduled", async || {
        let scheduled = pod_condition(&pods, "replacement", "PodScheduled").await?;
        (scheduled.status == "True").then_some(())
    })
    .await;
}

/// The slices of `node`'s pool (UID, generation) and the Instances of `ns` (name, resource
/// version): what a hand-over must leave as it is.
async fn published(
    client: &kube::Client,
    node: &str,
    ns: &str,
) -> (Vec<(String, i64)>, Vec<(String, String)>) {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    (
        (slices.items.into_iter())
            .map(|s| (s.metadata.uid.unwrap(), s.spec.pool.generation))
            .collect(),
        (instances.items.into_iter())
            .map(|i| {
                (
                    i.metadata.name.unwrap(),
                    i.metadata.resource_version.unwrap(),
                )
            })
            .collect(),
    )
}

/// A rolling update of the kubelet-plugin on one node, as the chart's `maxSurge: 1` makes it:
/// the new pod's agent stands by beside the old one (both registered with the kubelet, the
/// new one ready only then), the kubelet prepares and unprepares through either all along, and
/// when the old agent goes the new one leads without changing a slice or an Instance.
#[tokio::test]
async fn a_new_agent_stands_by_beside_the_old_and_takes_over_without_a_failed_prepare() {
    let (cp, client, ns, config) = cluster().await;
    // A resync every 3 s (the product's is 30 s): the check below waits for one.
    let mut node = start_node_with(&cp, &client, &ns, |c| {
        c.pod_uid = Some("pod-old".into());
        c.resync = Duration::from_secs(3);
    })
    .await;
    node.peer
        .wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    prepared_broker(&node, &client, &ns, &config).await;
    let at_rest = published(&client, &node.name, &ns).await;
    assert!(
        !at_rest.0.is_empty() && !at_rest.1.is_empty(),
        "{at_rest:?}"
    );

    // Prepare and unprepare the pod's claim, `rounds` times; the durations of the prepares.
    let cycle = async |rounds: usize| {
        let mut took = Vec::new();
        for _ in 0..rounds {
            node.peer
                .unprepare(&ns, "broker")
                .await
                .expect("unprepared");
            let start = std::time::Instant::now();
            node.peer.prepare(&ns, "broker").await.expect("prepared");
            took.push(start.elapsed());
        }
        took
    };
    let quantiles = akri_testing::quantiles;
    let alone = cycle(30).await;

    // The new pod comes up: it stands by, registered beside the old one.
    let mut new_config = node.config.clone();
    new_config.pod_uid = Some("pod-new".into());
    let new = akri_kubelet_plugin::agent::start(client.clone(), new_config)
        .await
        .expect("the new agent starts beside the old one");
    eventually("both pods' drivers registered", async || {
        (node.peer.driver_endpoints(DRIVER).await.ok()?.len() == 2).then_some(())
    })
    .await;
    eventually("the new agent ready", async || {
        new.readiness().is_ready().then_some(())
    })
    .await;
    let overlap = cycle(30).await;

    // The old agent goes (the DaemonSet deletes its pod once the new one is ready; SIGTERM).
    std::mem::replace(&mut node.agent, new).stop().await;
    let mut after = cycle(30).await;
    eventually("the old pod's driver deregistered", async || {
        (node.peer.driver_endpoints(DRIVER).await.ok()?.len() == 1).then_some(())
    })
    .await;
    after.extend(cycle(30).await);
    eprintln!("prepare, old agent alone: {}", quantiles(alone));
    eprintln!("prepare, both agents serving: {}", quantiles(overlap));
    eprintln!("prepare, the new agent taking over: {}", quantiles(after));

    // It leads: the registration socket is its own (the handler registers again with it) ...
    let handler = akri_kubelet_plugin::discovery::RegisteredHandler {
        name: "debugEcho".into(),
        endpoint: akri_kubelet_plugin::discovery::Endpoint::Uds(
            node.config.debug_echo.as_ref().unwrap().socket.clone(),
        ),
        shared: false,
    };
    akri_kubelet_plugin::discovery::handler::register(&node.config.discovery_socket, &handler)
        .await
        .expect("the new agent serves the handlers' registration socket");
    // ... and after a whole pass of its own (its resync, every 3 s here: a pass begun after
    // the next one ends) nothing it writes has changed.
    node.whole_pass().await;
    assert_eq!(
        published(&client, &node.name, &ns).await,
        at_rest,
        "the hand-over changed a slice or an Instance"
    );
    cycle(3).await;
}

/// A handler that reports more devices than the node keeps Instances of for one
/// configuration (a LAN peer answering probes with fresh uuids makes the ONVIF handler do so
/// every scan): the node writes its limit's worth and no more, counted on the API server, and
/// the configuration's status says why (issue 52; 20 new ids a scan had made 420 Instances
/// in 40 s).
#[tokio::test]
async fn instances_past_the_limit_of_a_configuration_are_not_written_and_the_status_says_so() {
    // Its own control plane: its devices are nobody else's.
    let (cp, client, ns, config) = cluster().await;
    let node = start_node_with(&cp, &client, &ns, |config| {
        config.max_instances_per_configuration = 3;
    })
    .await;
    let flood: akri_api::v1::DiscoveryConfiguration = serde_json::from_value(json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": config },
        "spec": { "discoveryHandler": { "name": "debugEcho",
            "discoveryDetails": "descriptions: [f0, f1, f2, f3, f4]" } },
    }))
    .unwrap();
    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    configs
        .create(&PostParams::default(), &flood)
        .await
        .unwrap();
    let said = eventually("the limit in the configuration's status", async || {
        akri_testing::discovery::discovery_error(&client, &config, &node.name).await
    })
    .await;
    assert!(
        said.contains("this node keeps 3 Instances of the configuration"),
        "{said}"
    );
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    let written = (instances.items.iter())
        .filter(|i| i.spec.configuration_name == config)
        .count();
    assert_eq!(written, 3, "{:?}", instances.items);
}

/// Status-only writes to a DiscoveryConfiguration (the driver-controller's counts, each
/// node's `discoveryErrors` entry: they grow with the fleet) reach no node; a change of its
/// spec does, and is acted on (issue 53: every status write cost every node a discovery sync,
/// health vouching and publishing). The node runs as the chart's kubelet-plugin, which may not
/// read DiscoveryConfigurations: it hears of them through their mirrors only. The oracle is the
/// API server's record of the mirror, up to the spec change's version, which comes after every
/// status write: a check, not a quiet window.
#[tokio::test]
async fn status_writes_to_a_configuration_reach_no_node_and_spec_changes_do() {
    let (cp, client, ns, config) = cluster().await;
    let node_client = akri_testing::rbac::kubelet_plugin_client(&cp, &ns)
        .await
        .unwrap();
    let refused = Api::<akri_api::v1::DiscoveryConfiguration>::all(node_client.clone())
        .list(&ListParams::default())
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 403),
        "the node may not read DiscoveryConfigurations: {refused:?}"
    );
    let node = SimNode::start(&cp, &node_client, &ns, |_, _| {}).await;
    echo_configuration(&client, &config).await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let described = async |description: &str| {
        (instances.list(&Default::default()).await.ok()?.items.iter())
            .any(|i| {
                i.spec
                    .broker_properties
                    .get("DEBUG_ECHO_DESCRIPTION")
                    .map(String::as_str)
                    == Some(description)
            })
            .then_some(())
    };
    eventually("the device's Instance", async || described("foo0").await).await;
    let mirrors = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let mirror = akri_api::v1::spec_mirror::config_map_name(&config);
    let version = (mirrors
        .get(&mirror)
        .await
        .unwrap()
        .metadata
        .resource_version)
        .unwrap();
    let changes = akri_testing::modifications_until(mirrors, &mirror, &version, |cm| {
        (cm.data.iter().flatten()).any(|(_, v)| v.contains("foo1"))
    });

    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    for i in 0..10 {
        let entry = json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": config },
            "status": { "discoveryErrors": [{ "node": format!("other-node-{i}"), "message": "an error" }] },
        });
        configs
            .patch_status(
                &config,
                &PatchParams::apply(&format!("akri-kubelet-plugin/other-node-{i}")),
                &Patch::Apply(&entry),
            )
            .await
            .unwrap();
    }
    configs
        .patch(
            &config,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "discoveryHandler": { "discoveryDetails": "descriptions: [foo1]" } } })),
        )
        .await
        .unwrap();
    let changes = tokio::time::timeout(Duration::from_secs(60), changes)
        .await
        .expect("the mirror shows the spec change within 60 s")
        .unwrap();
    assert_eq!(
        changes.len(),
        1,
        "one change of what the node reads, the spec's; none for the 10 status writes"
    );
    eventually("the spec's new device", async || described("foo1").await).await;
    drop(node);
}
