//! Binding conditions (KEP-5007) as a user installs them: the chart with its default
//! `bindingConditions: auto` on two real 1.37 nodes, the OPC UA handler's DaemonSet in the nodes'
//! host network (`discoveryHandlers.opcua.hostNetwork`), and a real OPC UA server that both
//! nodes' handlers find through a discovery server. Node B's pods cannot reach the server (this
//! machine refuses their connections to its port, as a server on a network routed to the node
//! but not to its pods), node A's can. The kubelet-plugins check from their pods, in the pod
//! network a broker gets: a pod that may go to either node is bound on A, and one that may only
//! go to B is not bound, the scheduler saying B's reason. Runs kube-proxy: one at a time with
//! the other suites that install the chart on real nodes (`hack/test.sh`).
//!
//! Node A is an edge node as many are: tainted `NoSchedule` for the workloads meant for it.
//! The chart's defaults run the kubelet-plugin and the handler there untold, and the broker
//! that tolerates the taint is prepared and runs there.

use akri_testing::product::{Helm, Images, kubectl};
use akri_testing::{ControlPlane, ControlPlaneOptions, RealNode, from_json};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

const NODES: [&str; 2] = ["reach-a", "reach-b"];
const WAIT: Duration = Duration::from_secs(120);
/// Node A's taint: a node kept for the workloads that tolerate it.
const EDGE_TAINT: &str = "edge.example.com/dedicated";

#[tokio::test]
async fn a_shared_device_binds_on_the_node_whose_pods_reach_it() {
    let cp = ControlPlane::start(ControlPlaneOptions::with_services())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    let images = Images::pushed().await.unwrap();
    let mut nodes = Vec::new();
    for name in NODES {
        nodes.push(RealNode::start(&cp, name).await.expect("real node"));
    }
    let (reaching, refused) = (&nodes[0], &nodes[1]);
    Api::<Node>::all(client.clone())
        .patch(
            reaching.node_name(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "taints": [
                { "key": EDGE_TAINT, "value": "plcs", "effect": "NoSchedule" },
            ] } })),
        )
        .await
        .unwrap();

    // A discovery server and a server registered with it, on the address pods reach this
    // machine at; node B's pods are refused the server's port.
    let host = cp.api_server_address().ip().to_string();
    let (lds, boiler) = (
        akri_testing::free_port().unwrap(),
        akri_testing::free_port().unwrap(),
    );
    let peer = |name: &str, port: u16, extra: &[String]| {
        let mut args = vec![
            "--port".to_string(),
            port.to_string(),
            "--name".into(),
            name.into(),
            "--host".into(),
            host.clone(),
        ];
        args.extend(extra.iter().cloned());
        akri_testing::peers::Peer::start(name, "opcua_server.py", &args).unwrap()
    };
    let lds_url = format!("opc.tcp://{host}:{lds}/");
    let _lds = peer("LDS", lds, &["--type".into(), "discovery".into()]);
    let _boiler = peer("Boiler", boiler, &["--register-to".into(), lds_url.clone()]);
    let _refusal = refused.refuse_pods_to(boiler).unwrap();

    kubectl(&cp, &["apply", "-f", "examples/akri-namespace.yaml"]).unwrap();
    let kubeconfig = cp.kubeconfig().display().to_string();
    let [registry, tag] = images.values();
    Helm::new()
        .unwrap()
        .ok(&[
            "install",
            "akri",
            "charts/akri",
            "--namespace",
            "akri",
            "--kubeconfig",
            &kubeconfig,
            "--set",
            &registry,
            "--set",
            &tag,
            "--set",
            "discoveryHandlers.opcua.enabled=true",
            "--set",
            "discoveryHandlers.opcua.hostNetwork=true",
            "--set",
            "discoveryHandlers.opcua.rescanSeconds=2",
            "--set",
            "brokerController.enabled=false",
            "--wait",
            "--timeout",
            "3m",
        ])
        .await
        .unwrap_or_else(|e| panic!("{e}"));

    let config = "plcs";
    let details = format!("opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: ['{lds_url}']\n");
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": config },
                "spec": { "discoveryHandler": { "name": "opcua", "discoveryDetails": details } },
            })),
        )
        .await
        .unwrap();
    // Both handlers report the server: its Instance names both nodes.
    let instances = Api::<akri_api::v1::Instance>::namespaced(client.clone(), "akri");
    let instance =
        akri_testing::eventually_within("the server listed on both nodes", WAIT, async || {
            let list = instances.list(&ListParams::default()).await.ok()?.items;
            list.into_iter().find(|i| {
                i.spec.configuration_name == config && i.spec.shared && i.spec.nodes.len() == 2
            })
        })
        .await;
    assert!(
        (instance.spec.broker_properties.get("OPCUA_DISCOVERY_URL"))
            .is_some_and(|url| url.ends_with(&format!(":{boiler}/"))),
        "{instance:?}"
    );

    let users = cp.create_namespace("plc-users").await.unwrap();
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &users)
        .create(
            &PostParams::default(),
            &from_json(json!({
                "metadata": { "name": "plc" },
                "spec": { "spec": { "devices": { "requests": [
                    { "name": "plc", "exactly": { "deviceClassName": config } },
                ] } } },
            })),
        )
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &users);
    let busybox = reaching.busybox_image().unwrap();
    let pod = |name: &str, node: Option<&str>| -> Pod {
        let affinity = node.map(|node| {
            json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchFields": [
                    { "key": "metadata.name", "operator": "In", "values": [node] },
                ] }],
            } } })
        });
        from_json(json!({
            "metadata": { "name": name },
            "spec": {
                "affinity": affinity,
                "tolerations": [{ "key": EDGE_TAINT, "operator": "Exists", "effect": "NoSchedule" }],
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{ "name": "plc", "resourceClaimTemplateName": "plc" }],
                "containers": [{
                    "name": "broker", "image": busybox, "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": { "claims": [{ "name": "plc" }] },
                }],
            },
        }))
    };

    // Only node B: refused there, never bound, the scheduler saying why.
    pods.create(
        &PostParams::default(),
        &pod("pinned", Some(refused.node_name())),
    )
    .await
    .unwrap();
    let events = Api::<Event>::namespaced(client.clone(), &users);
    let reason = akri_testing::eventually_within(
        "the scheduler says the binding failed on node B",
        WAIT,
        async || {
            let events = events.list(&ListParams::default()).await.ok()?.items;
            events.into_iter().find_map(|e| {
                let about = e.regarding.as_ref()?.name.as_deref() == Some("pinned");
                let note = e.note.unwrap_or_default();
                (about && note.contains("ConnectFailed")).then_some(note)
            })
        },
    )
    .await;
    assert!(
        reason.contains(&format!("node {}", refused.node_name())),
        "{reason}"
    );
    let bound = |name: &str| {
        let pods = pods.clone();
        let name = name.to_string();
        async move { pods.get(&name).await.ok()?.spec?.node_name }
    };
    assert_eq!(bound("pinned").await, None, "not bound on node B");
    pods.delete("pinned", &Default::default()).await.unwrap();

    // Either node: each try on B fails and deallocates, the scheduler picks again (backing off
    // up to 10 s between tries); bound on A, whose word the claim shows.
    pods.create(&PostParams::default(), &pod("free", None))
        .await
        .unwrap();
    let node = akri_testing::eventually_within(
        "the free pod bound",
        Duration::from_secs(240),
        async || bound("free").await,
    )
    .await;
    assert_eq!(node, reaching.node_name(), "bound where the server answers");
    akri_testing::eventually_within(
        "the free pod running on the tainted node",
        WAIT,
        async || {
            let phase = pods.get("free").await.ok()?.status?.phase?;
            (phase == "Running").then_some(())
        },
    )
    .await;
    let claim = akri_testing::eventually_within("the free pod's claim", WAIT, async || {
        let pod = pods.get("free").await.ok()?;
        pod.status?
            .resource_claim_statuses?
            .into_iter()
            .next()?
            .resource_claim_name
    })
    .await;
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), &users)
        .get(&claim)
        .await
        .unwrap();
    let conditions: Vec<_> = (claim.status.and_then(|s| s.devices))
        .unwrap_or_default()
        .into_iter()
        .flat_map(|d| d.conditions.unwrap_or_default())
        .filter(|c| c.type_ == akri_devices::BINDING_CONDITION)
        .collect();
    assert_eq!(conditions.len(), 1, "{conditions:?}");
    assert_eq!(
        (conditions[0].status.as_str(), conditions[0].reason.as_str()),
        ("True", "Connected")
    );
    assert!(
        conditions[0]
            .message
            .contains(&format!("node {} connected", reaching.node_name())),
        "{:?}",
        conditions[0]
    );
}
