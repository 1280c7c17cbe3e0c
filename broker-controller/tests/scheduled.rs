//! Brokers end to end on real Kubernetes: two simulated nodes (kubelet peer + the node agent
//! with debugEcho), the driver-controller, the broker-controller, the real scheduler. Each
//! broker pod's claim is allocated to its own Instance, the pod lands on a node that reaches
//! the device, and the kubelet prepares it with that device's properties.

use akri_api::v1::{BrokerTemplate, DiscoveryConfiguration, Instance};
use akri_broker_controller::controller::{self, ControllerConfig};
use akri_broker_controller::metrics::Metrics;
use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_testing::{ControlPlane, ControlPlaneOptions, KubeletPeer};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const DRIVER: &str = "debugecho.akri.sh";

async fn eventually<T, F: AsyncFn() -> Option<T>>(what: &str, check: F) -> T {
    akri_testing::eventually(what, Duration::from_secs(90), check).await
}

use akri_testing::from_json;

struct SimNode {
    name: String,
    peer: KubeletPeer,
    _agent: agent::Agent,
    _dir: tempfile::TempDir,
}

async fn start_node(cp: &ControlPlane, client: &kube::Client, namespace: &str) -> SimNode {
    let name = ControlPlane::unique_name("node");
    cp.create_node(&name).await.unwrap();
    let peer = KubeletPeer::start(cp, &name).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::embedded(&name, namespace, dir.path()).kubelet_dirs(
        peer.registry_dir(),
        peer.plugins_dir(),
        peer.cdi_dir(),
    );
    config.debug_echo_mut().shared = true;
    let agent = agent::start(client.clone(), config)
        .await
        .expect("agent starts");
    SimNode {
        name,
        peer,
        _agent: agent,
        _dir: dir,
    }
}

#[tokio::test]
async fn each_broker_is_scheduled_with_its_own_device() {
    let cp = ControlPlane::start(ControlPlaneOptions::full())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let akri = cp.create_namespace("akri").await.unwrap();
    let apps = cp.create_namespace("apps").await.unwrap();
    let nodes = [
        start_node(&cp, &client, &akri).await,
        start_node(&cp, &client, &akri).await,
    ];
    let mut driver = akri_driver_controller::controller::ControllerConfig::new(&akri);
    driver.debounce = Duration::from_millis(100);
    let mut brokers = ControllerConfig::new(&akri);
    brokers.debounce = Duration::from_millis(100);
    let tasks = [
        tokio::spawn({
            let client = client.clone();
            async move {
                akri_driver_controller::controller::run(client, driver, Default::default())
                    .await
                    .expect("driver-controller runs")
            }
        }),
        tokio::spawn(controller::run(client.clone(), brokers, Metrics::default())),
    ];

    // Two cameras both nodes reach, each shareable by 2 claims.
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": "cams" },
                "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [cam0, cam1]" }, "capacity": 2 },
            })),
        )
        .await
        .unwrap();
    let instances = Api::<Instance>::namespaced(client.clone(), &akri);
    let reachable: BTreeMap<String, Vec<String>> =
        eventually("both Instances on both nodes", async || {
            let list = instances.list(&Default::default()).await.ok()?;
            let found: BTreeMap<String, Vec<String>> = list
                .items
                .iter()
                .filter(|i| i.spec.nodes.len() == 2)
                .map(|i| (i.name_any(), i.spec.nodes.clone()))
                .collect();
            (found.len() == 2).then_some(found)
        })
        .await;

    Api::<BrokerTemplate>::namespaced(client.clone(), &apps)
        .patch(
            "cams",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({
                "apiVersion": "akri.sh/v1", "kind": "BrokerTemplate",
                "metadata": { "name": "cams" },
                "spec": {
                    "discoveryReference": { "name": "cams" },
                    "instanceBrokerResources": [
                        { "apiVersion": "v1", "kind": "Pod",
                          "metadata": { "labels": { "instance": "$(AKRI_INSTANCE)" } },
                          "spec": { "containers": [{ "name": "broker", "image": "broker" }] } },
                        { "apiVersion": "v1", "kind": "Service", "metadata": { "name": "$(AKRI_INSTANCE)-svc" },
                          "spec": { "selector": { "instance": "$(AKRI_INSTANCE)" }, "ports": [{ "port": 80 }] } },
                    ],
                    "globalBrokerResources": [
                        { "apiVersion": "v1", "kind": "Service", "metadata": { "name": "cams-all" },
                          "spec": { "selector": { "app": "cams" }, "ports": [{ "port": 80 }] } },
                    ],
                },
            })),
        )
        .await
        .unwrap();

    let pods = Api::<Pod>::namespaced(client.clone(), &apps);
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &apps);
    let services = Api::<Service>::namespaced(client.clone(), &apps);
    services.get_opt("cams-all").await.unwrap();
    for (instance, reach) in &reachable {
        let pod_name = format!("{instance}-pod");
        // Bound by the scheduler to a node that reaches the device.
        let node = eventually(&format!("{pod_name} bound"), async || {
            pods.get_opt(&pod_name).await.ok()??.spec?.node_name
        })
        .await;
        assert!(
            reach.contains(&node),
            "{pod_name} on {node}, device reachable from {reach:?}"
        );
        // Its claim allocated to its own Instance.
        let claim_name = eventually("the pod's claim", async || {
            let status = pods.get(&pod_name).await.ok()?.status?;
            status
                .resource_claim_statuses?
                .into_iter()
                .find_map(|s| s.resource_claim_name)
        })
        .await;
        let claim = claims.get(&claim_name).await.unwrap();
        let results = claim
            .status
            .unwrap()
            .allocation
            .unwrap()
            .devices
            .unwrap()
            .results
            .unwrap_or_default();
        assert_eq!(results.len(), 1);
        let slices = Api::<ResourceSlice>::all(client.clone())
            .list(&Default::default())
            .await
            .unwrap();
        let device = slices
            .items
            .iter()
            .filter(|s| s.spec.driver == DRIVER && s.spec.pool.name == results[0].pool)
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .find(|d| d.name == results[0].device)
            .expect("the allocated device is published");
        let attribute = device.attributes.unwrap()[akri_devices::ATTR_INSTANCE]
            .string
            .clone();
        assert_eq!(
            attribute.as_deref(),
            Some(instance.as_str()),
            "{pod_name} got another device"
        );
        services.get(&format!("{instance}-svc")).await.unwrap();

        // The kubelet prepares it: the CDI env carries that camera's description.
        let sim = nodes.iter().find(|n| n.name == node).unwrap();
        let containers = sim.peer.prepare(&apps, &pod_name).await.expect("prepared");
        let edits = sim
            .peer
            .cdi_inject(&containers["broker"])
            .await
            .expect("CDI resolves");
        let env: Vec<String> = serde_json::from_value(edits["env"].clone()).unwrap();
        let description = instances
            .get(instance)
            .await
            .unwrap()
            .spec
            .broker_properties["DEBUG_ECHO_DESCRIPTION"]
            .clone();
        assert!(
            env.contains(&format!("DEBUG_ECHO_DESCRIPTION={description}")),
            "{pod_name}: {env:?}"
        );
    }
    for task in tasks {
        task.abort();
    }
}
