//! The kubelet-plugin binary under failure: SIGKILL between prepare and unprepare, a kubelet
//! restart, and claims that are wrong in every way the kubelet can send them.

use akri_kubelet_plugin::discovery::DiscoveredDevice;
use akri_kubelet_plugin::driver::AkriDriver;
use akri_kubelet_plugin::node_devices::{ConfigDevices, NodeDevices};
use akri_testing::{ControlPlane, KubeletPeer};
use dra_plugin::cdi::CdiRoot;
use dra_plugin::service::{ClaimRef, DraService};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const DRIVER: &str = "debugecho.akri.sh";

async fn eventually<T, F: AsyncFn() -> Option<T>>(what: &str, check: F) -> T {
    akri_testing::eventually(what, Duration::from_secs(60), check).await
}

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

/// The plugin binary for `node`, with the embedded debugEcho, its state in `dir`.
fn spawn_plugin(
    cp: &ControlPlane,
    peer: &KubeletPeer,
    node: &str,
    namespace: &str,
    dir: &Path,
) -> tokio::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("plugin.log"))
        .unwrap();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-kubelet-plugin"))
        .env("KUBECONFIG", cp.kubeconfig())
        .env("RUST_LOG", "info")
        .args([
            "--node-name",
            node,
            "--instance-namespace",
            namespace,
            "--instance-grace-seconds",
            "0",
        ])
        .arg("--registry-dir")
        .arg(peer.registry_dir())
        .arg("--plugins-dir")
        .arg(peer.plugins_dir())
        .arg("--cdi-dir")
        .arg(peer.cdi_dir())
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--discovery-socket")
        .arg(dir.join("registration.sock"))
        .arg("--debug-echo-socket")
        .arg(dir.join("echo.sock"))
        .arg("--debug-echo-availability-file")
        .arg(dir.join("availability.txt"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("the plugin binary starts")
}

async fn pool_size(client: &kube::Client, node: &str) -> usize {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .map(|s| s.spec.devices.unwrap_or_default().len())
        .sum()
}

#[tokio::test]
async fn survives_sigkill_and_kubelet_restart() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("akri").await.unwrap();
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let peer = KubeletPeer::start(cp, &node).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut plugin = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();

    let config = ControlPlane::unique_name("echo");
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(&PostParams::default(), &from_json(json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": config },
            "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [bar0, bar1]" } },
        })))
        .await
        .unwrap();
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &from_json(json!({
            "metadata": { "name": config },
            "spec": { "selectors": [{ "cel": { "expression": format!(
                "device.driver == '{DRIVER}' && device.attributes['akri.sh'].configuration == '{config}'") } }] },
        })))
        .await
        .unwrap();
    eventually("two devices published", async || {
        (pool_size(&client, &node).await == 2).then_some(())
    })
    .await;

    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &from_json(json!({
            "metadata": { "name": "echo" },
            "spec": { "spec": { "devices": { "requests": [{ "name": "echo", "exactly": { "deviceClassName": config } }] } } },
        })))
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &from_json(json!({
        "metadata": { "name": "broker" },
        "spec": {
            "resourceClaims": [{ "name": "echo", "resourceClaimTemplateName": "echo" }],
            "containers": [{ "name": "broker", "image": "none", "resources": { "claims": [{ "name": "echo" }] } }],
        },
    })))
    .await
    .unwrap();
    eventually("pod bound", async || {
        pods.get("broker").await.ok()?.spec?.node_name
    })
    .await;
    let ids = peer.prepare(&ns, "broker").await.expect("prepared");
    let ids = ids["broker"].clone();
    assert!(peer.cdi_inject(&ids).await.is_ok());

    // SIGKILL between prepare and unprepare.
    plugin.kill().await.unwrap();
    let mut plugin = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        peer.prepare(&ns, "broker").await.unwrap()["broker"],
        ids,
        "same CDI ids after the restart"
    );
    // The kubelet answers that prepare from its own cache and retries a failed unprepare
    // until the plugin is back; so does this test.
    eventually("unprepared by the restarted plugin", async || {
        peer.unprepare(&ns, "broker").await.ok()
    })
    .await;
    assert!(
        peer.cdi_inject(&ids).await.is_err(),
        "the CDI spec of the claim is gone"
    );

    // The kubelet restarts (its DRA manager deletes the node's slices): the plugin registers
    // again and republishes, without being restarted itself.
    peer.restart().await.unwrap();
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .expect("registered again");
    eventually("pool republished", async || {
        (pool_size(&client, &node).await == 2).then_some(())
    })
    .await;
    assert!(
        plugin.try_wait().unwrap().is_none(),
        "the plugin kept running"
    );
    plugin.kill().await.unwrap();
}

#[tokio::test]
async fn malformed_claims_fail_alone() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("claims").await.unwrap();
    let node = "node-here";
    let dir = tempfile::tempdir().unwrap();
    let devices = NodeDevices::new(node, true);
    devices.set(
        DRIVER,
        ConfigDevices {
            configuration: "echo".into(),
            capacity: 1,
            unique_devices: true,
            shared: false,
            devices: vec![DiscoveredDevice {
                id: "foo0".into(),
                properties: [("DEBUG_ECHO_DESCRIPTION".to_string(), "foo0".to_string())].into(),
                ..DiscoveredDevice::default()
            }],
        },
    );
    let device = akri_devices::instance_name("echo", "foo0", false, node);
    let service = DraService::new(
        AkriDriver {
            driver: DRIVER.into(),
            cdi_class: "debugecho".into(),
            client: client.clone(),
            cdi: CdiRoot::new(dir.path().join("cdi"), "akri.sh").unwrap(),
            devices,
        },
        &dir.path().join("checkpoint.json"),
    )
    .unwrap();

    // Claims allocated by hand (an admin may write claim status), each wrong in one way.
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let mut refs = Vec::new();
    for (name, driver, device, on_node) in [
        ("good", DRIVER, device.as_str(), node),
        ("other-driver", "other.akri.sh", "x", node),
        ("other-node", DRIVER, device.as_str(), "node-elsewhere"),
        ("gone-device", DRIVER, "echo-000000", node),
    ] {
        let claim: ResourceClaim = from_json(json!({
            "metadata": { "name": name },
            "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "any" } }] } },
        }));
        let created = claims.create(&PostParams::default(), &claim).await.unwrap();
        let status = json!({ "status": { "allocation": {
            "devices": { "results": [{ "request": "r", "driver": driver, "pool": on_node, "device": device }] },
            "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [on_node] }] }] },
        } } });
        claims
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        refs.push(ClaimRef {
            namespace: ns.clone(),
            name: name.into(),
            uid: created.metadata.uid.unwrap(),
        });
    }
    refs.push(ClaimRef {
        namespace: ns.clone(),
        name: "deleted".into(),
        uid: "no-such-uid".into(),
    });

    let results = service.prepare_claims(refs.clone()).await;
    let by_name = |name: &str| results[&refs.iter().find(|r| r.name == name).unwrap().uid].clone();
    let good = by_name("good").expect("the good claim is prepared despite the others");
    assert_eq!(good[0].device_name, device);
    let expect_error = |name: &str, words: &str| {
        let error = by_name(name).expect_err(name);
        assert!(
            error.contains(words),
            "{name}: {error:?} should contain {words:?}"
        );
    };
    expect_error("other-driver", "has no device of driver");
    expect_error("other-node", "allocated for other nodes");
    expect_error("gone-device", "not available on node");
    expect_error("deleted", "no longer exists");
}
