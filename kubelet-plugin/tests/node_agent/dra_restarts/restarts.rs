//! Restarts, reboots, checkpoints, the per-node lock and the state directory.

use super::support::{
    DRIVER, Publication, echo_config, eventually, from_json, node_on, node_with_peer, pool_size,
    publication, publication_of, spawn_plugin, spawn_plugin_with,
};
use akri_testing::ControlPlane;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

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
    let plugin = spawn_plugin_with(cp, &peer, &node, &ns, dir.path(), &extra);
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

    let plugin = restart_changes_nothing(
        cp,
        &peer,
        (&node, &ns),
        dir.path(),
        &extra,
        Stop::Kill,
        plugin,
        &before,
    )
    .await;
    // A graceful stop, as a DaemonSet rolling update does it (maxSurge 0): the old process
    // removes its sockets, so the kubelet unregisters the driver and would wipe the node's
    // slices if no plugin registered again within its wiping delay (30 s).
    let mut plugin = restart_changes_nothing(
        cp,
        &peer,
        (&node, &ns),
        dir.path(),
        &extra,
        Stop::Term,
        plugin,
        &before,
    )
    .await;
    plugin.kill().await.unwrap();
}

/// `cam2839` and `cam3489` collide in Akri's naming on node-a: the one seen first keeps Akri's
/// name, the other gets another. A restarted plugin hears of both at once; each must keep the
/// name it had (the smaller id used to take Akri's name, so a claim allocated to that name
/// would have been prepared with the other camera).
#[tokio::test]
async fn colliding_devices_keep_their_names_across_a_restart() {
    // Its own API server: the configuration must be named `echo` and the node `node-a`.
    let cp = &ControlPlane::start(akri_testing::ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("collide").await.unwrap();
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    let node = "node-a";
    cp.create_node(node).await.unwrap();
    let peer = akri_testing::KubeletPeer::start(cp, node).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = spawn_plugin(cp, &peer, node, &ns, dir.path());
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();

    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    let echo = |descriptions: &str| -> akri_api::v1::DiscoveryConfiguration {
        from_json(json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": "echo" },
            "spec": { "discoveryHandler": { "name": "debugEcho",
                "discoveryDetails": format!("descriptions: [{descriptions}]") } },
        }))
    };
    configs
        .create(&PostParams::default(), &echo("cam3489"))
        .await
        .unwrap();
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    // Instance name -> the device behind it.
    let named = async || -> BTreeMap<String, String> {
        instances
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|i| {
                let description = i.spec.broker_properties["DEBUG_ECHO_DESCRIPTION"].clone();
                (i.metadata.name.unwrap(), description)
            })
            .collect()
    };
    let akri_name = eventually("cam3489 gets Akri's name", async || {
        named().await.into_iter().next().map(|(name, _)| name)
    })
    .await;
    assert_eq!(
        akri_name,
        akri_devices::instance_name("echo", "cam2839", false, node),
        "the pair collides"
    );
    let patch = json!({ "spec": { "discoveryHandler": { "discoveryDetails": "descriptions: [cam3489, cam2839]" } } });
    configs
        .patch("echo", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let before = eventually("both devices published", async || {
        let now = publication(&client, node, &ns).await;
        let devices: usize = now.0.iter().map(|s| s.3).sum();
        (devices == 2 && now.1.len() == 2).then_some(now)
    })
    .await;
    let names = named().await;
    assert_eq!(names[&akri_name], "cam3489");

    let mut plugin = restart_changes_nothing(
        cp,
        &peer,
        (node, &ns),
        dir.path(),
        &[],
        Stop::Kill,
        plugin,
        &before,
    )
    .await;
    assert_eq!(named().await, names, "each name still means its device");
    plugin.kill().await.unwrap();
}

/// How a test stops the plugin.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGKILL: nothing is cleaned up (a crash, an OOM kill).
    Kill,
    /// SIGTERM, waiting for the process to exit (a pod deleted or rolled).
    Term,
}

/// Stops `plugin` and starts it again; from then until two seconds after the new process has
/// passed its start-up gate, checks every 50 ms that the node's slices and Instances are still
/// `before`. Returns the new process.
#[allow(clippy::too_many_arguments)]
async fn restart_changes_nothing(
    cp: &ControlPlane,
    peer: &akri_testing::KubeletPeer,
    (node, ns): (&str, &str),
    dir: &Path,
    extra: &[&str],
    stop: Stop,
    mut plugin: tokio::process::Child,
    before: &Publication,
) -> tokio::process::Child {
    let client = cp.client().await.unwrap();
    match stop {
        Stop::Kill => plugin.kill().await.unwrap(),
        Stop::Term => {
            let status = akri_testing::terminate(&mut plugin, Duration::from_secs(20))
                .await
                .expect("the plugin exits within 20 s of SIGTERM");
            assert!(status.success(), "a SIGTERM is a clean stop: {status}");
        }
    }
    let log = dir.join("plugin.log");
    let log_offset = std::fs::metadata(&log).unwrap().len() as usize;
    let plugin = spawn_plugin_with(cp, peer, node, ns, dir, extra);
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
        let now = publication(&client, node, ns).await;
        assert_eq!(
            &now,
            before,
            "{:?} after the restart: slices or Instances (name, UID, generation, devices) changed",
            started.elapsed()
        );
        if published_at.is_none() && published() {
            published_at = Some(std::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    plugin
}

/// A node reads DiscoveryConfigurations from the driver-controller's mirrors. A node agent
/// upgraded before the driver-controller (whose older version wrote no mirror) must not take
/// "not mirrored yet" for "no configuration": it keeps what it published, past its start-up
/// wait, until the mirrors and their marker are there, and then finds nothing to change.
#[tokio::test]
async fn a_node_started_before_the_configurations_are_mirrored_keeps_what_it_published() {
    let cp = &ControlPlane::start(akri_testing::ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("mirror").await.unwrap();
    let mirror = akri_testing::components::spawn_spec_mirror(&client, &ns);
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let peer = akri_testing::KubeletPeer::start(cp, &node).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let extra = ["--startup-wait-seconds", "2"];
    let mut plugin = spawn_plugin_with(cp, &peer, &node, &ns, dir.path(), &extra);
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    echo_config(&client, "echo", "m0, m1").await;
    let before = eventually("two devices and two Instances published", async || {
        let now = publication(&client, &node, &ns).await;
        let devices: usize = now.0.iter().map(|s| s.3).sum();
        (devices == 2 && now.1.len() == 2).then_some(now)
    })
    .await;

    // The node agent stops; the mirrors go, as on a cluster whose driver-controller is older.
    plugin.kill().await.unwrap();
    mirror.abort();
    let _ = mirror.await;
    let config_maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns);
    let labelled = ListParams::default().labels(akri_api::v1::spec_mirror::SPEC_MIRROR_LABEL);
    config_maps
        .delete_collection(&Default::default(), &labelled)
        .await
        .unwrap();

    // The new agent: past its start-up wait, it says it waits for the mirrors, and has
    // changed nothing.
    let log = dir.path().join("plugin.log");
    let offset = std::fs::metadata(&log).unwrap().len() as usize;
    let logged = |what: &str| std::fs::read_to_string(&log).unwrap()[offset..].contains(what);
    let plugin = spawn_plugin_with(cp, &peer, &node, &ns, dir.path(), &extra);
    let started = std::time::Instant::now();
    while !logged("not mirrored by the driver-controller yet") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the agent never said it waits for the mirrors"
        );
        assert_eq!(
            publication(&client, &node, &ns).await,
            before,
            "nothing mirrored yet: slices or Instances changed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(publication(&client, &node, &ns).await, before);

    // The driver-controller mirrors them: the agent publishes (past its start-up wait, what its
    // handler last reported, carried over), and nothing changes.
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    while !logged("; publishing") {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the agent never published once the configurations were mirrored"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(publication(&client, &node, &ns).await, before);
    drop(plugin);
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
    let event = eventually("a Warning Event on the node", async || {
        akri_testing::node_event(&client, &node, "CheckpointSetAside", "").await
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
    // No quiet window: the second touches nothing until it holds the lock. Its log below says
    // that it served only after taking over, and the sockets are the first's up to its end.
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

    assert_eq!(inode(&socket), dra_socket, "the first's socket, to its end");
    assert!(
        second.try_wait().unwrap().is_none(),
        "the second still waits"
    );
    first.kill().await.unwrap();
    eventually("the second takes over and serves", async || {
        let taken = std::fs::read_to_string(&log)
            .unwrap()
            .contains("taking over");
        (taken && serving() == 2).then_some(())
    })
    .await;
    // The later event that says what the second did while it waited: it served only after
    // it took over.
    let text = std::fs::read_to_string(&log).unwrap();
    let (waiting, taken) = text.split_once("taking over").unwrap();
    assert_eq!(
        (
            waiting.matches("serving DRA plugin").count(),
            taken.matches("serving DRA plugin").count()
        ),
        (1, 1),
        "the first served before the takeover, the second only after it"
    );
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    second.kill().await.unwrap();
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

/// A handler slower than the start-up wait (an OPC UA server behind connect timeouts, a camera
/// that answers late): the restarted plugin keeps its devices as the process before it last
/// heard them, past the wait and through the handler's first report, instead of withdrawing
/// them when the wait is over and publishing them anew when the handler answers.
#[tokio::test]
async fn a_handler_slower_than_the_startup_wait_keeps_its_devices_through_a_restart() {
    use akri_kubelet_plugin::discovery::{Endpoint, RegisteredHandler, handler};
    // Its own API server: the node's publication must be this configuration's alone.
    let cp = &ControlPlane::start(akri_testing::ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    let (node, ns, peer, dir) = node_on(cp, "slow").await;
    let extra = ["--startup-wait-seconds", "2"];
    let plugin = spawn_plugin_with(cp, &peer, &node, &ns, dir.path(), &extra);
    peer.wait_for_driver(DRIVER, Duration::from_secs(30))
        .await
        .unwrap();
    // slowEcho: the plugin's own debugEcho, behind a relay the test can stall.
    let relay =
        akri_testing::UnixRelay::start(dir.path().join("relay.sock"), dir.path().join("echo.sock"));
    let slow = RegisteredHandler {
        name: "slowEcho".into(),
        endpoint: Endpoint::Uds(relay.socket.clone()),
        shared: false,
    };
    handler::register(&dir.path().join("handlers/registration.sock"), &slow)
        .await
        .unwrap();
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": "slow" },
                // debugEcho's property under another handler name: named, as for any
                // handler of one's own.
                "spec": { "discoveryHandler": { "name": "slowEcho",
                    "discoveryDetails": "descriptions: [slow0, slow1]" },
                    "containerAccess": { "environment": ["DEBUG_ECHO_DESCRIPTION"] } },
            })),
        )
        .await
        .unwrap();
    let published = async || publication_of(&client, &node, &ns, "slowecho.akri.sh").await;
    let before = eventually("two devices and two Instances published", async || {
        let now = published().await;
        let devices: usize = now.0.iter().map(|s| s.3).sum();
        (devices == 2 && now.1.len() == 2).then_some(now)
    })
    .await;

    // Restarted while the handler answers nothing.
    relay.pass(false);
    let mut plugin = plugin;
    plugin.kill().await.unwrap();
    let log = dir.path().join("plugin.log");
    let offset = std::fs::metadata(&log).unwrap().len() as usize;
    let mut plugin = spawn_plugin_with(cp, &peer, &node, &ns, dir.path(), &extra);
    let logged = |what: &str| std::fs::read_to_string(&log).unwrap()[offset..].contains(what);
    let started = std::time::Instant::now();
    // Five times the start-up wait, then the handler answers, then two seconds more.
    let mut answered_at = None;
    while answered_at.is_none_or(|at: std::time::Instant| at.elapsed() < Duration::from_secs(2)) {
        let now = published().await;
        assert_eq!(
            now,
            before,
            "{:?} after the restart: slices or Instances (name, UID, generation, devices) changed",
            started.elapsed()
        );
        if answered_at.is_none() && started.elapsed() > Duration::from_secs(10) {
            assert!(
                logged("start-up wait over before discovery answered"),
                "the start-up wait (2 s) was over long ago"
            );
            relay.pass(true);
            answered_at = Some(std::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    plugin.kill().await.unwrap();
}
