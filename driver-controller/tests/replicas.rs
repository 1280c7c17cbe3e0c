//! Two replicas of the driver-controller against a real control plane: one acts, the other
//! waits and takes over when the first dies; objects are garbage-collected with their
//! configuration; status and the HTTP endpoints say what is going on.

mod support;

use akri_api::v1::{CONDITION_DEGRADED, CONDITION_READY, DiscoveryConfiguration};
use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::http::{self, Readiness};
use akri_driver_controller::leader::LeaseConfig;
use akri_driver_controller::metrics::Metrics;
use akri_testing::ControlPlane;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::{eventually, from_json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Replica {
    task: tokio::task::JoinHandle<()>,
    metrics: Metrics,
    address: SocketAddr,
    _server: tokio::task::JoinHandle<()>,
}

async fn replica(client: &kube::Client, namespace: &str, identity: &str) -> Replica {
    let metrics = Metrics::default();
    let readiness = Readiness::default();
    let (address, server) = http::serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
        readiness.clone(),
    )
    .await
    .unwrap();
    let mut lease = LeaseConfig::new(namespace, "akri-driver-controller", identity);
    lease.lease_duration = Duration::from_secs(3);
    lease.retry_period = Duration::from_millis(500);
    let mut config = ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    let task = tokio::spawn({
        let (client, metrics) = (client.clone(), metrics.clone());
        async move {
            let _ =
                akri_driver_controller::run_as_leader(client, config, lease, metrics, readiness)
                    .await;
        }
    });
    Replica {
        task,
        metrics,
        address,
        _server: server,
    }
}

/// GET `path`: status code and body.
async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response[9..12].parse().unwrap();
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (code, body)
}

fn is_leader(replica: &Replica) -> bool {
    replica
        .metrics
        .encode()
        .lines()
        .any(|l| l == "akri_driver_controller_leader 1")
}

async fn configuration(client: &kube::Client, prefix: &str) -> String {
    let name = ControlPlane::unique_name(prefix);
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name },
                "spec": { "discoveryHandler": { "name": "onvif" }, "capacity": 2 },
            })),
        )
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn a_standby_replica_takes_over_when_the_leader_dies() {
    let (_cp, client, namespace) = support::control_plane().await;
    let classes = Api::<DeviceClass>::all(client.clone());
    let configs = Api::<DiscoveryConfiguration>::all(client.clone());

    let first = replica(&client, &namespace, "first").await;
    eventually("the first replica leads", async || {
        is_leader(&first).then_some(())
    })
    .await;
    let second = replica(&client, &namespace, "second").await;
    assert_eq!(get(second.address, "/healthz").await.0, 200);
    eventually("the standby is ready", async || {
        (get(second.address, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    // The leader acts: a DeviceClass per configuration, owned by it, with its extended resource.
    let kept = configuration(&client, "kept").await;
    let class = eventually("the leader's DeviceClass", async || {
        classes.get_opt(&kept).await.ok()?
    })
    .await;
    let owner = &class.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("DiscoveryConfiguration", kept.as_str())
    );
    let selector = &class.spec.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression;
    assert!(selector.contains("\"onvif.akri.sh\"") && selector.contains(&format!("\"{kept}\"")));
    let status = eventually("status written", async || {
        let status = configs.get(&kept).await.ok()?.status?;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_READY)
            .then_some(status)
    })
    .await;
    assert_eq!(status.device_class_name.as_deref(), Some(kept.as_str()));
    assert_eq!((status.instances, status.devices_published), (0, 0));
    assert!(!is_leader(&second), "one active replica");
    let (code, body) = get(first.address, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        body.contains(
            "akri_driver_controller_api_writes_total{resource=\"deviceclass\",verb=\"apply\"} 1"
        ),
        "{body}"
    );

    // A node reporting a discovery error (as the kubelet-plugin writes it) degrades it.
    let node_entry = json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration", "metadata": { "name": kept },
        "status": { "discoveryErrors": [{ "node": "edge-1", "message": "handler onvif: connection refused" }] },
    });
    configs
        .patch_status(
            &kept,
            &PatchParams::apply("akri-kubelet-plugin/edge-1"),
            &Patch::Apply(&node_entry),
        )
        .await
        .unwrap();
    let degraded = eventually("Degraded", async || {
        let status = configs.get(&kept).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_DEGRADED && c.status == "True")
    })
    .await;
    assert!(
        degraded
            .message
            .contains("edge-1: handler onvif: connection refused"),
        "{degraded:?}"
    );
    let status = configs.get(&kept).await.unwrap().status.unwrap();
    assert_eq!(
        status.discovery_errors.len(),
        1,
        "the node's entry is kept: {status:?}"
    );

    // The leader dies without a word; the standby takes over once the Lease expires.
    first.task.abort();
    let died = Instant::now();
    let later = configuration(&client, "later").await;
    eventually("the standby's DeviceClass", async || {
        classes.get_opt(&later).await.ok()?
    })
    .await;
    let takeover = died.elapsed();
    assert!(
        takeover < Duration::from_secs(15),
        "took over in {takeover:?}"
    );
    assert!(is_leader(&second));
    let lease = Api::<Lease>::namespaced(client.clone(), &namespace)
        .get("akri-driver-controller")
        .await
        .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("second"));
    assert_eq!(spec.lease_transitions, Some(1));

    // Deleting a configuration takes its DeviceClass with it (garbage collector).
    configs
        .delete(&kept, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the DeviceClass garbage-collected", async || {
        classes.get_opt(&kept).await.ok()?.is_none().then_some(())
    })
    .await;
    second.task.abort();
}
