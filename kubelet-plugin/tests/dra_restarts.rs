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
    spawn_plugin_with(cp, peer, node, namespace, dir, &[])
}

fn spawn_plugin_with(
    cp: &ControlPlane,
    peer: &KubeletPeer,
    node: &str,
    namespace: &str,
    dir: &Path,
    extra: &[&str],
) -> tokio::process::Child {
    spawn_plugin_through(cp.kubeconfig(), peer, node, namespace, dir, extra)
}

/// The plugin binary reaching the API server as `kubeconfig` says.
fn spawn_plugin_through(
    kubeconfig: &Path,
    peer: &KubeletPeer,
    node: &str,
    namespace: &str,
    dir: &Path,
    extra: &[&str],
) -> tokio::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("plugin.log"))
        .unwrap();
    tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-kubelet-plugin"))
        .env("KUBECONFIG", kubeconfig)
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
        .arg(dir.join("handlers/registration.sock"))
        .arg("--debug-echo-socket")
        .arg(dir.join("echo.sock"))
        .arg("--debug-echo-availability-file")
        .arg(dir.join("availability.txt"))
        .args(extra)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("the plugin binary starts")
}

/// How many devices of `config` the node's pool has (other tests' configurations share the
/// cluster, and every plugin discovers them all).
async fn pool_size(client: &kube::Client, node: &str, config: &str) -> usize {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter(|d| d.name.starts_with(&format!("{config}-")))
        .count()
}

#[tokio::test]
async fn survives_sigkill_and_kubelet_restart() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let (node, ns, peer, dir) = node_on(cp, "akri").await;
    let mut plugin = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();

    let config = echo_config(&client, "echo", "bar0, bar1").await;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &from_json(json!({
            "metadata": { "name": config },
            "spec": { "selectors": [{ "cel": { "expression": format!(
                "device.driver == '{DRIVER}' && device.attributes['akri.sh'].configuration == '{config}'") } }] },
        })))
        .await
        .unwrap();
    eventually("two devices published", async || {
        (pool_size(&client, &node, &config).await == 2).then_some(())
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
            // Other tests' plugins share this cluster and publish this configuration too.
            "nodeSelector": { "kubernetes.io/hostname": node },
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

    // SIGKILL between prepare and unprepare; then a "reboot": the CDI directory (a tmpfs on
    // real nodes) is emptied and the kubelet restarts, forgetting that the claim was prepared
    // (its checkpoint keeps the claim, not that it is prepared), so the plugin's own checkpoint
    // is what answers the next prepare.
    plugin.kill().await.unwrap();
    let checkpoint: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join(format!("state/{DRIVER}-checkpoint.json"))).unwrap(),
    )
    .unwrap();
    let recorded = checkpoint["claims"].as_object().unwrap();
    assert_eq!(recorded.len(), 1, "{checkpoint}");
    let (_, record) = recorded.iter().next().unwrap();
    assert_eq!(record["namespace"], ns.as_str());
    assert_eq!(record["devices"][0]["cdi_device_ids"], json!(ids));
    for spec in std::fs::read_dir(peer.cdi_dir()).unwrap() {
        std::fs::remove_file(spec.unwrap().path()).unwrap();
    }
    let mut plugin = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    peer.restart().await.unwrap();
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    // The kubelet adds the ids of a claim prepared again after its restart to those it
    // restored from its checkpoint, so a container lists each twice; the set is what counts.
    let mut again = peer.prepare(&ns, "broker").await.unwrap()["broker"].clone();
    again.sort();
    again.dedup();
    assert_eq!(again, ids, "same CDI ids after the restart");
    assert!(
        peer.cdi_inject(&ids).await.is_ok(),
        "the CDI spec the reboot wiped is back"
    );
    // The kubelet retries a failed unprepare until the plugin answers; so does this test.
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
        (pool_size(&client, &node, &config).await == 2).then_some(())
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

/// Creates a debugEcho DiscoveryConfiguration named `<prefix>-<unique>` whose devices are
/// `descriptions` (comma separated); its name.
async fn echo_config(client: &kube::Client, prefix: &str, descriptions: &str) -> String {
    let name = ControlPlane::unique_name(prefix);
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name },
                "spec": { "discoveryHandler": { "name": "debugEcho",
                    "discoveryDetails": format!("descriptions: [{descriptions}]") } },
            })),
        )
        .await
        .unwrap();
    name
}

/// What a node's publication looks like from the API server: slice (name, UID, generation,
/// device count) and Instance (name, UID).
async fn publication(
    client: &kube::Client,
    node: &str,
    namespace: &str,
) -> (Vec<(String, String, i64, usize)>, Vec<(String, String)>) {
    let mut slices: Vec<_> = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .map(|s| {
            (
                s.metadata.name.unwrap(),
                s.metadata.uid.unwrap(),
                s.spec.pool.generation,
                s.spec.devices.unwrap_or_default().len(),
            )
        })
        .collect();
    slices.sort();
    let mut instances: Vec<_> =
        Api::<akri_api::v0::Instance>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|i| (i.metadata.name.unwrap(), i.metadata.uid.unwrap()))
            .collect();
    instances.sort();
    (slices, instances)
}

/// A restarted plugin must not withdraw what the previous process published: it writes
/// nothing until discovery has answered, and then finds nothing to change.
#[tokio::test]
async fn restart_leaves_slices_and_instances_untouched() {
    // Its own API server: the agent discovers every configuration of its handlers, and another
    // test's configuration coming or going would change this node's pool.
    let cp = &ControlPlane::start(akri_testing::ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    let (node, ns, peer, dir) = node_on(cp, "restart").await;
    // `AKRI_TEST_STARTUP_WAIT` lets the old behaviour (no wait) be shown on demand.
    let wait = std::env::var("AKRI_TEST_STARTUP_WAIT").unwrap_or_else(|_| "30".into());
    let extra = ["--startup-wait-seconds", wait.as_str()];
    let mut plugin = spawn_plugin_with(cp, &peer, &node, &ns, dir.path(), &extra);
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    echo_config(&client, "echo", "baz0, baz1").await;
    let before = eventually("two devices and two Instances published", async || {
        let now = publication(&client, &node, &ns).await;
        let devices: usize = now.0.iter().map(|s| s.3).sum();
        (devices == 2 && now.1.len() == 2).then_some(now)
    })
    .await;

    plugin.kill().await.unwrap();
    let mut plugin = spawn_plugin_with(cp, &peer, &node, &ns, dir.path(), &extra);
    // Watch every 50 ms from the restart until two seconds after the new process published.
    let log = dir.path().join("plugin.log");
    let log_offset = std::fs::metadata(&log).unwrap().len() as usize;
    let published = || {
        std::fs::read_to_string(&log).unwrap()[log_offset..]
            .contains("discovery answered for every configuration")
    };
    let started = std::time::Instant::now();
    let mut published_at = None;
    while published_at.is_none_or(|at: std::time::Instant| at.elapsed() < Duration::from_secs(2)) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the restarted plugin never finished its start-up wait"
        );
        let now = publication(&client, &node, &ns).await;
        assert_eq!(
            now,
            before,
            "{:?} after the restart: slices or Instances (name, UID, generation, devices) changed",
            started.elapsed()
        );
        if published_at.is_none() && published() {
            published_at = Some(std::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    plugin.kill().await.unwrap();
}

/// A test node with the kubelet peer, a namespace and a state directory.
async fn node_with_peer(prefix: &str) -> (String, String, KubeletPeer, tempfile::TempDir) {
    node_on(ControlPlane::shared().await.expect("control plane"), prefix).await
}

/// A namespace, a Node with its kubelet peer, and a state directory, on `cp`.
async fn node_on(
    cp: &ControlPlane,
    prefix: &str,
) -> (String, String, KubeletPeer, tempfile::TempDir) {
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace(prefix).await.unwrap();
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let peer = KubeletPeer::start(cp, &node).await.unwrap();
    (node, ns, peer, tempfile::tempdir().unwrap())
}

/// A corrupt checkpoint is set aside (kept for inspection), the plugin serves anyway, and the
/// node carries a Warning Event saying what happened and where the file went.
#[tokio::test]
async fn a_corrupt_checkpoint_is_set_aside_loudly() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let (node, ns, peer, dir) = node_with_peer("corrupt").await;
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let checkpoint = state.join(format!("{DRIVER}-checkpoint.json"));
    std::fs::write(
        &checkpoint,
        b"{\"version\": 1, \"checksum\": 7, \"claims\": {}",
    )
    .unwrap();

    let mut plugin = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .expect("the driver is served despite the corrupt checkpoint");
    let moved: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("-checkpoint.json.corrupt-"))
        .collect();
    assert_eq!(moved.len(), 1, "the corrupt file is kept aside");
    assert_eq!(
        std::fs::read(&moved[0]).unwrap(),
        b"{\"version\": 1, \"checksum\": 7, \"claims\": {}"
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(client.clone());
    let event = eventually("a Warning Event on the node", async || {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str())
                    && e.reason.as_deref() == Some("CheckpointSetAside")
            })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains(&moved[0].display().to_string()),
        "the Event names where the file went: {note}"
    );
    assert!(
        plugin.try_wait().unwrap().is_none(),
        "the plugin keeps running"
    );

    // Who may read and connect to what the plugin keeps on the node.
    let mode = |path: &Path| {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions())
            & 0o777
    };
    assert_eq!(mode(&state), 0o700, "state directory");
    assert_eq!(
        mode(&peer.plugins_dir().join(DRIVER).join("dra.sock")),
        0o600
    );
    let registration = peer.registry_dir().join(format!("{DRIVER}-reg.sock"));
    assert_eq!(mode(&registration), 0o600);
    assert_eq!(mode(&dir.path().join("handlers/registration.sock")), 0o660);
    plugin.kill().await.unwrap();
}

/// A second plugin process on the same node waits for the first instead of taking its
/// sockets and overwriting its checkpoint; it takes over when the first exits.
#[tokio::test]
async fn a_second_plugin_waits_for_the_first() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let (node, ns, peer, dir) = node_with_peer("second").await;
    let mut first = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    let socket = peer.plugins_dir().join(DRIVER).join("dra.sock");
    let inode =
        |path: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
    let (dra_socket, discovery_socket) = (
        inode(&socket),
        inode(&dir.path().join("handlers/registration.sock")),
    );

    let mut second = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    let log = dir.path().join("plugin.log");
    eventually("the second plugin says it waits", async || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("another kubelet-plugin runs on this node")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        inode(&socket),
        dra_socket,
        "the first plugin's DRA socket is untouched"
    );
    assert_eq!(
        inode(&dir.path().join("handlers/registration.sock")),
        discovery_socket,
        "the first plugin's discovery socket is untouched"
    );
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second waits, it does not exit"
    );

    let serving = || {
        std::fs::read_to_string(&log)
            .unwrap()
            .matches("serving DRA plugin")
            .count()
    };
    assert_eq!(serving(), 1, "only the first plugin serves");

    first.kill().await.unwrap();
    eventually("the second takes over and serves", async || {
        let taken = std::fs::read_to_string(&log)
            .unwrap()
            .contains("taking over");
        (taken && serving() == 2).then_some(())
    })
    .await;
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    second.kill().await.unwrap();
}

/// A driver for `node` that sees debugEcho devices `ids` of configuration `echo`, its CDI
/// specs under `dir`.
fn driver_seeing(
    client: &kube::Client,
    node: &str,
    ids: &[&str],
    capacity: i32,
    dir: &Path,
) -> DraService<AkriDriver> {
    let devices = NodeDevices::new(node, true);
    devices.set(
        DRIVER,
        ConfigDevices {
            configuration: "echo".into(),
            capacity,
            unique_devices: true,
            shared: false,
            devices: ids
                .iter()
                .map(|id| DiscoveredDevice {
                    id: id.to_string(),
                    properties: [("DEBUG_ECHO_DESCRIPTION".to_string(), id.to_string())].into(),
                    ..DiscoveredDevice::default()
                })
                .collect(),
        },
    );
    DraService::new(
        AkriDriver {
            driver: DRIVER.into(),
            cdi_class: "debugecho".into(),
            client: client.clone(),
            cdi: CdiRoot::new(dir.join("cdi"), "akri.sh").unwrap(),
            devices,
        },
        &dir.join("checkpoint.json"),
    )
    .unwrap()
}

/// A claim allocated by hand (as the scheduler would) to `results` (request, device, share id)
/// on `node`.
async fn allocated_claim(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    results: &[(&str, &str, Option<&str>)],
) -> ClaimRef {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), ns);
    let requests: Vec<_> = results
        .iter()
        .map(|(request, _, _)| json!({ "name": request, "exactly": { "deviceClassName": "any" } }))
        .collect();
    let created = claims
        .create(
            &PostParams::default(),
            &from_json(json!({ "metadata": { "name": name }, "spec": { "devices": { "requests": requests } } })),
        )
        .await
        .unwrap();
    let results: Vec<_> = results
        .iter()
        .map(|(request, device, share)| {
            json!({ "request": request, "driver": DRIVER, "pool": node, "device": device, "shareID": share })
        })
        .collect();
    let status = json!({ "status": { "allocation": {
        "devices": { "results": results },
        "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [node] }] }] },
    } } });
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    ClaimRef {
        namespace: ns.into(),
        name: name.into(),
        uid: created.metadata.uid.unwrap(),
    }
}

/// The environment a CDI id gives a container, read from the spec files in `cdi_dir`.
fn cdi_env(cdi_dir: &Path, id: &str) -> Vec<String> {
    let (_, device) = id.split_once('=').unwrap();
    for file in std::fs::read_dir(cdi_dir).unwrap() {
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file.unwrap().path()).unwrap()).unwrap();
        for d in spec["devices"].as_array().unwrap() {
            if d["name"] == device {
                return serde_json::from_value(d["containerEdits"]["env"].clone()).unwrap();
            }
        }
    }
    panic!("no CDI device {id}");
}

/// Two debugEcho devices whose Akri names collide on node-a get two names, and a claim for
/// each gets its own device (the collision used to hand both claims one of them).
#[tokio::test]
async fn colliding_instance_names_never_mix_devices() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("collide").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = ("cam2839", "cam3489");
    assert_eq!(
        akri_devices::instance_name("echo", a, false, "node-a"),
        akri_devices::instance_name("echo", b, false, "node-a"),
        "the pair collides in Akri's naming"
    );
    let service = driver_seeing(&client, "node-a", &[a, b], 1, dir.path());
    let published: Vec<String> = service
        .driver()
        .devices
        .local_dra_devices(DRIVER)
        .into_iter()
        .map(|(d, _)| d.name)
        .collect();
    assert_eq!(published.len(), 2);
    assert_ne!(
        published[0], published[1],
        "two devices, two names: {published:?}"
    );

    let mut seen = Vec::new();
    for (i, device) in published.iter().enumerate() {
        let claim = allocated_claim(
            &client,
            &ns,
            &format!("c{i}"),
            "node-a",
            &[("r", device, None)],
        )
        .await;
        let prepared = service.prepare_claims(vec![claim.clone()]).await;
        let ids = &prepared[&claim.uid].as_ref().unwrap()[0].cdi_device_ids;
        let env = cdi_env(&dir.path().join("cdi"), &ids[0]);
        let description = env
            .iter()
            .find_map(|e| e.strip_prefix("DEBUG_ECHO_DESCRIPTION="))
            .unwrap()
            .to_string();
        seen.push(description);
    }
    seen.sort();
    assert_eq!(seen, [a, b], "each claim got its own device");
}

/// With consumable capacity, two requests of one claim may get the same device (two shares);
/// the claim must prepare, both requests with the device's one CDI id.
#[tokio::test]
async fn two_requests_on_one_shared_device_prepare() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("shares").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = driver_seeing(&client, "node-s", &["cam"], 2, dir.path());
    let device = akri_devices::instance_name("echo", "cam", false, "node-s");
    let claim = allocated_claim(
        &client,
        &ns,
        "two-shares",
        "node-s",
        &[
            (
                "first",
                &device,
                Some("0b6c1c5e-8d0e-4b53-9a3f-1f2e3d4c5b6a"),
            ),
            (
                "second",
                &device,
                Some("7d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"),
            ),
        ],
    )
    .await;
    let prepared = service.prepare_claims(vec![claim.clone()]).await;
    let devices = prepared[&claim.uid].clone().expect("the claim prepares");
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].cdi_device_ids, devices[1].cdi_device_ids);
    // One place builds the CDI name: `<claim uid>-<device>`, the UID once.
    assert_eq!(
        devices[0].cdi_device_ids,
        [format!("akri.sh/debugecho={}-{device}", claim.uid)]
    );
    let requests: Vec<_> = devices
        .iter()
        .map(|d| d.request_names[0].as_str())
        .collect();
    assert_eq!(requests, ["first", "second"]);
    let shares: Vec<_> = devices.iter().map(|d| d.share_id.as_deref()).collect();
    assert_eq!(
        shares,
        [
            Some("0b6c1c5e-8d0e-4b53-9a3f-1f2e3d4c5b6a"),
            Some("7d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")
        ]
    );
    assert_eq!(
        cdi_env(&dir.path().join("cdi"), &devices[0].cdi_device_ids[0]).len(),
        1
    );
}

/// Checkpoints must not be where discovery-handler pods can read them: a state directory
/// inside the registration socket's directory is refused at start, with what to do.
#[tokio::test]
async fn a_state_dir_visible_to_handlers_is_refused() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let dir = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-kubelet-plugin"))
        .env("KUBECONFIG", cp.kubeconfig())
        .args(["--node-name", "node-x"])
        .arg("--state-dir")
        .arg(dir.path().join("akri/state"))
        .arg("--discovery-socket")
        .arg(dir.path().join("akri/agent-registration.sock"))
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("which discovery-handler pods mount"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("akri/state").exists(),
        "nothing was written there"
    );
}

/// A proxy in front of the API server, and a kubeconfig in `dir` that reaches it through the
/// proxy (as `user`, if given).
async fn through_proxy(
    cp: &ControlPlane,
    dir: &Path,
    user: Option<&str>,
) -> (akri_testing::TcpProxy, std::path::PathBuf) {
    let proxy = akri_testing::TcpProxy::start(cp.api_server_address())
        .await
        .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    cp.write_kubeconfig(&kubeconfig, Some(proxy.address()), user)
        .unwrap();
    (proxy, kubeconfig)
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    ticks as f64 / 100.0
}

/// A minute without the API server, and a minute of 403s: neither costs a device, and
/// neither makes the plugin spin (its CPU and log lines per second are printed).
#[tokio::test]
async fn an_api_server_outage_or_403s_cost_nothing_and_do_not_spin() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let (down_node, ns, down_peer, down_dir) = node_with_peer("outage").await;
    let (denied_node, _, denied_peer, denied_dir) = node_with_peer("denied").await;

    // One plugin reaches the API server through a proxy that will go down; the other runs as
    // a user whose permissions will be taken away.
    let (proxy, down_kubeconfig) = through_proxy(cp, down_dir.path(), None).await;
    let user = format!("system:serviceaccount:akri:{denied_node}");
    let binding = ControlPlane::unique_name("akri-kubelet-plugin");
    akri_testing::rbac::grant_kubelet_plugin(&admin, &user, &binding)
        .await
        .unwrap();
    // Open watches are not authorised again: its connections are closed when its rights go,
    // so that every request after that meets the 403.
    let (denied_proxy, denied_kubeconfig) = through_proxy(cp, denied_dir.path(), Some(&user)).await;
    let mut down_plugin = spawn_plugin_through(
        &down_kubeconfig,
        &down_peer,
        &down_node,
        &ns,
        down_dir.path(),
        &[],
    );
    let mut denied_plugin = spawn_plugin_through(
        &denied_kubeconfig,
        &denied_peer,
        &denied_node,
        &ns,
        denied_dir.path(),
        &[],
    );

    let config = echo_config(&admin, "outage", "o0").await;
    // Only this configuration's devices: other tests' configurations come and go meanwhile.
    let down_device = akri_devices::instance_name(&config, "o0", false, &down_node);
    let denied_device = akri_devices::instance_name(&config, "o0", false, &denied_node);
    let published = async |node: &str, device: &str| {
        pool_size(&admin, node, &config).await == 1
            && publication(&admin, node, &ns)
                .await
                .1
                .iter()
                .any(|i| i.0 == device)
    };
    eventually("both nodes publish", async || {
        (published(&down_node, &down_device).await && published(&denied_node, &denied_device).await)
            .then_some(())
    })
    .await;

    let log_lines = |dir: &Path| {
        std::fs::read_to_string(dir.join("plugin.log"))
            .unwrap()
            .lines()
            .count()
    };
    let (down_pid, denied_pid) = (down_plugin.id().unwrap(), denied_plugin.id().unwrap());
    let start = (
        cpu_seconds(down_pid),
        cpu_seconds(denied_pid),
        log_lines(down_dir.path()),
        log_lines(denied_dir.path()),
    );
    proxy.go_down();
    kube::Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(admin.clone())
        .delete(&binding, &Default::default())
        .await
        .unwrap();
    denied_proxy.close_open_connections();
    let outage = Duration::from_secs(60);
    tokio::time::sleep(outage).await;
    let seconds = outage.as_secs_f64();
    let down_cpu = (cpu_seconds(down_pid) - start.0) / seconds;
    let denied_cpu = (cpu_seconds(denied_pid) - start.1) / seconds;
    let down_logs = (log_lines(down_dir.path()) - start.2) as f64 / seconds;
    let denied_logs = (log_lines(denied_dir.path()) - start.3) as f64 / seconds;
    eprintln!(
        "during a 60 s outage: CPU {:.2}% of a core, {down_logs:.2} log lines/s; during 60 s of 403s: CPU {:.2}%, {denied_logs:.2} log lines/s",
        down_cpu * 100.0,
        denied_cpu * 100.0
    );
    assert!(
        down_cpu < 0.05 && denied_cpu < 0.05,
        "no hot loop: {down_cpu} {denied_cpu}"
    );
    assert!(
        down_logs < 1.0 && denied_logs < 1.0,
        "no log flood: {down_logs} {denied_logs}"
    );
    assert!(
        down_plugin.try_wait().unwrap().is_none() && denied_plugin.try_wait().unwrap().is_none()
    );

    // Nothing was lost, and both come back by themselves.
    assert!(
        published(&down_node, &down_device).await,
        "the outage cost no device"
    );
    assert!(
        published(&denied_node, &denied_device).await,
        "the 403s cost no device"
    );
    proxy.resume();
    akri_testing::rbac::grant_kubelet_plugin(&admin, &user, &format!("{binding}-again"))
        .await
        .unwrap();
    // A change after the outage reaches both nodes' pools.
    std::fs::write(down_dir.path().join("availability.txt"), "OFFLINE").unwrap();
    std::fs::write(denied_dir.path().join("availability.txt"), "OFFLINE").unwrap();
    eventually("both nodes publish again after the outage", async || {
        let down: usize = publication(&admin, &down_node, &ns)
            .await
            .0
            .iter()
            .map(|s| s.3)
            .sum();
        let denied: usize = publication(&admin, &denied_node, &ns)
            .await
            .0
            .iter()
            .map(|s| s.3)
            .sum();
        (down == 0 && denied == 0).then_some(())
    })
    .await;
    down_plugin.kill().await.unwrap();
    denied_plugin.kill().await.unwrap();
}

/// A connection that dies silently (the API server's end gone without a word) must not hold
/// the node's publications: every call has a deadline, and the next one uses a new connection.
#[tokio::test]
async fn a_silently_dead_connection_does_not_stall_the_node() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.client().await.unwrap();
    let (node, ns, peer, dir) = node_with_peer("blackhole").await;
    let (proxy, kubeconfig) = through_proxy(cp, dir.path(), None).await;
    let mut plugin = spawn_plugin_through(&kubeconfig, &peer, &node, &ns, dir.path(), &[]);
    let config = echo_config(&admin, "blackhole", "h0").await;
    let device = akri_devices::instance_name(&config, "h0", false, &node);
    let published = async || -> Vec<String> {
        Api::<ResourceSlice>::all(admin.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .map(|d| d.name)
            .collect()
    };
    eventually("published", async || {
        published().await.contains(&device).then_some(())
    })
    .await;

    proxy.black_hole_open_connections();
    std::fs::write(dir.path().join("availability.txt"), "OFFLINE").unwrap();
    // The first attempt waits out its deadline (20 s) on a dead connection; the resync (30 s)
    // retries on a new one. Without deadlines it waits for the client's read timeout (295 s).
    akri_testing::eventually(
        "the change published despite the dead connections",
        Duration::from_secs(90),
        async || (!published().await.contains(&device)).then_some(()),
    )
    .await;
    plugin.kill().await.unwrap();
}

/// State an earlier version kept next to the registration socket (where handler pods can read
/// it) moves into the state directory on upgrade, and is used from there.
#[tokio::test]
async fn state_left_next_to_the_socket_moves_into_the_state_dir() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let (node, ns, peer, dir) = node_with_peer("upgrade").await;
    let old = dir.path().join("handlers");
    std::fs::create_dir_all(&old).unwrap();
    // A valid, empty checkpoint of the old layout (CRC-32 of `{}`).
    let checkpoint = format!("{DRIVER}-checkpoint.json");
    let content = "{\"version\":1,\"checksum\":2745614147,\"claims\":{}}\n";
    std::fs::write(old.join(&checkpoint), content).unwrap();
    let mut plugin = spawn_plugin(cp, &peer, &node, &ns, dir.path());
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        !old.join(&checkpoint).exists(),
        "gone from the handlers' directory"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("state").join(&checkpoint)).unwrap(),
        content,
        "moved as it was (not set aside as corrupt)"
    );
    plugin.kill().await.unwrap();
}
