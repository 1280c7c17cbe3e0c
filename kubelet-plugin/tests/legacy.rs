//! The legacy path end to end: Akri v0 Configurations served as device plugins by the node
//! agent, with the kubelet's own device manager (kubelet peer) as the peer, on 2 simulated
//! nodes that both reach 2 cameras (debugEcho, shared) of capacity 2: seed 000's
//! walkthroughs, Akri #843, restarts, reclamation and deletion.

use akri_api::v0::{Configuration, Instance};
use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_kubelet_plugin::discovery::debug_echo::DebugEchoConfig;
use akri_kubelet_plugin::legacy::LegacyOptions;
use akri_testing::{ControlPlane, ControlPlaneOptions, KubeletPeer};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

async fn eventually<T, F: AsyncFn() -> Option<T>>(what: &str, check: F) -> T {
    akri_testing::eventually(what, Duration::from_secs(30), check).await
}

struct SimNode {
    name: String,
    peer: KubeletPeer,
    _agent: agent::Agent,
    _dir: tempfile::TempDir,
}

struct Cluster {
    cp: ControlPlane,
    client: kube::Client,
    ns: String,
    nodes: Vec<SimNode>,
}

/// A control plane of its own (every agent serves every v0 Configuration it sees) with
/// `nodes` simulated nodes; slots with no container are freed after `reclaim_grace`.
async fn cluster(nodes: usize, reclaim_grace: Duration) -> Cluster {
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("legacy").await.unwrap();
    let mut started = Vec::new();
    for _ in 0..nodes {
        started.push(start_node(&cp, &client, reclaim_grace).await);
    }
    Cluster {
        cp,
        client,
        ns,
        nodes: started,
    }
}

async fn start_node(cp: &ControlPlane, client: &kube::Client, reclaim_grace: Duration) -> SimNode {
    let name = ControlPlane::unique_name("node");
    cp.create_node(&name).await.unwrap();
    let peer = KubeletPeer::start(cp, &name).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut echo = DebugEchoConfig::new(dir.path().join("debug-echo.sock"));
    echo.availability_file = dir.path().join("availability.txt");
    echo.poll_interval = Duration::from_millis(100);
    echo.shared = true;
    let config = AgentConfig {
        node_name: name.clone(),
        instance_namespace: "unused-by-the-legacy-path".to_string(),
        registry_dir: peer.registry_dir(),
        plugins_dir: peer.plugins_dir(),
        cdi_dir: peer.cdi_dir(),
        state_dir: dir.path().join("state"),
        discovery_socket: dir.path().join("handlers/agent-registration.sock"),
        debug_echo: Some(echo),
        consumable_capacity: Some(false),
        instance_grace: Duration::ZERO,
        startup_wait: Duration::from_secs(5),
        property_namespaces: None,
        legacy: Some(LegacyOptions {
            device_plugin_dir: peer.device_plugin_dir(),
            pod_resources_socket: Some(peer.pod_resources_socket()),
            reclaim_grace,
            reclaim_interval: Duration::from_millis(200),
        }),
    };
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

impl Cluster {
    /// Creates the v0 Configuration `name` over cameras `cam0`, `cam1` with capacity 2;
    /// returns its two Instance names (sorted) once both exist with every slot.
    async fn cameras(&self, name: &str, unique: bool) -> [String; 2] {
        self.configuration(name, &["cam0", "cam1"], 2, unique).await
    }

    /// Creates a v0 Configuration of debugEcho devices; returns the Instance names (sorted)
    /// once each exists with every node and slot.
    async fn configuration<const N: usize>(
        &self,
        name: &str,
        descriptions: &[&str; N],
        capacity: usize,
        unique: bool,
    ) -> [String; N] {
        let config: Configuration = serde_json::from_value(json!({
            "apiVersion": "akri.sh/v0", "kind": "Configuration",
            "metadata": { "name": name },
            "spec": {
                "discoveryHandler": {
                    "name": "debugEcho",
                    "discoveryDetails": format!("descriptions: [{}]", descriptions.join(", ")),
                },
                "capacity": capacity,
                "uniqueDevices": unique,
                "brokerProperties": { "RESOLUTION": "1080p" },
            },
        }))
        .unwrap();
        Api::<Configuration>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
        let nodes = self.nodes.len();
        eventually("every Instance with every node and slot", async || {
            let list = self.instances().list(&Default::default()).await.ok()?;
            let mut ready: Vec<String> = list
                .items
                .iter()
                .filter(|i| i.spec.configuration_name == name)
                .filter(|i| i.spec.nodes.len() == nodes && i.spec.device_usage.len() == capacity)
                .filter_map(|i| i.metadata.name.clone())
                .collect();
            ready.sort();
            ready.try_into().ok()
        })
        .await
    }

    fn instances(&self) -> Api<Instance> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// `deviceUsage` of an Instance, values sorted, with `C:<vdev>:<node>` shown as
    /// `C:<node>` when `hide_vdev` (unique virtual device ids are the plugin's choice).
    async fn usage(&self, instance: &str, hide_vdev: bool) -> Vec<String> {
        let instance = self.instances().get(instance).await.unwrap();
        let mut values: Vec<String> = instance
            .spec
            .device_usage
            .values()
            .map(
                |v| match v.strip_prefix("C:").and_then(|r| r.split_once(':')) {
                    Some((_, node)) if hide_vdev => format!("C:{node}"),
                    _ => v.clone(),
                },
            )
            .collect();
        values.sort();
        values
    }

    async fn slot_free(&self, instance: &str, i: u32) -> bool {
        let usage = self
            .instances()
            .get(instance)
            .await
            .unwrap()
            .spec
            .device_usage;
        usage[&slot(instance, i)].is_empty()
    }

    async fn pod(&self, name: &str, containers: &[(&str, &str, u32)]) {
        let containers: Vec<Value> = containers
            .iter()
            .map(|(container, resource, n)| {
                json!({
                    "name": container, "image": "broker",
                    "resources": { "limits": { *resource: n.to_string() } },
                })
            })
            .collect();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": name },
            "spec": { "containers": containers },
        }))
        .unwrap();
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }
}

/// What a node's kubelet holds of `resource`: (capacity, healthy ids).
async fn kubelet_view(peer: &KubeletPeer, resource: &str) -> (i64, Vec<String>) {
    let capacity = peer.device_capacity().await.unwrap()["capacity"][resource]
        .as_i64()
        .unwrap_or(0);
    let healthy = peer
        .allocatable_devices()
        .await
        .unwrap()
        .remove(resource)
        .unwrap_or_default();
    (capacity, healthy)
}

/// Waits until `node`'s kubelet shows `capacity` devices of `resource`, `healthy` of them
/// healthy (ids checked when given as names).
async fn expect_view(node: &SimNode, resource: &str, capacity: i64, healthy: Healthy<'_>) {
    let what = format!(
        "{resource} on {}: {capacity} devices, {healthy:?}",
        node.name
    );
    eventually(&what, async || {
        let (c, h) = kubelet_view(&node.peer, resource).await;
        let ok = c == capacity
            && match &healthy {
                Healthy::Count(n) => h.len() == *n,
                Healthy::Ids(ids) => h == *ids,
            };
        ok.then_some(())
    })
    .await;
}

/// Waits until the kubelet knows `resource` with `count` healthy devices. Tests admit pods
/// directly through the kubelet (no scheduler), and the kubelet admits a pod asking for a
/// resource no plugin registered yet without giving it anything.
async fn registered(node: &SimNode, resource: &str, count: usize) {
    eventually(
        &format!("{resource} registered on {}", node.name),
        async || {
            let (_, healthy) = kubelet_view(&node.peer, resource).await;
            (healthy.len() == count).then_some(())
        },
    )
    .await;
}

#[derive(Debug)]
enum Healthy<'a> {
    Count(usize),
    Ids(Vec<&'a str>),
}

fn slot(instance: &str, i: u32) -> String {
    format!("{instance}-{i}")
}

#[tokio::test]
async fn seed_000_configuration_and_instance_level_claims_share_slots() {
    let c = cluster(2, Duration::from_secs(600)).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let config = ControlPlane::unique_name("onvif");
    let [cam1, cam2] = c.cameras(&config, true).await;
    let cl = format!("akri.sh/{config}");
    let (il1, il2) = (format!("akri.sh/{cam1}"), format!("akri.sh/{cam2}"));
    let (s10, s11, s20, s21) = (
        slot(&cam1, 0),
        slot(&cam1, 1),
        slot(&cam2, 0),
        slot(&cam2, 1),
    );

    // Initial state: every slot free. The CL plugin offers one virtual device per camera
    // with a free slot (seed 003), the IL plugins every slot, on both nodes.
    for node in [a, b] {
        expect_view(node, &cl, 2, Healthy::Count(2)).await;
        expect_view(node, &il1, 2, Healthy::Ids(vec![&s10, &s11])).await;
        expect_view(node, &il2, 2, Healthy::Ids(vec![&s20, &s21])).await;
    }

    // A pod on node-a asks for 2 cameras through the CL resource: one slot of each camera.
    c.pod("cl-pair", &[("broker", &cl, 2)]).await;
    let options = a.peer.allocate(&c.ns, "cl-pair", "broker").await.unwrap();
    assert_eq!(options["envs"]["RESOLUTION"], "1080p", "{options}");
    // Each camera's properties, suffixed with its id (as Akri does), so both are there.
    let mut descriptions: Vec<&str> = [&cam1, &cam2]
        .iter()
        .map(|cam| {
            let suffix = cam.rsplit('-').next().unwrap().to_uppercase();
            options["envs"][format!("DEBUG_ECHO_DESCRIPTION_{suffix}")]
                .as_str()
                .unwrap_or_default()
        })
        .collect();
    descriptions.sort();
    assert_eq!(descriptions, ["cam0", "cam1"], "{options}");
    for cam in [&cam1, &cam2] {
        assert_eq!(c.usage(cam, true).await, ["", &format!("C:{}", a.name)]);
    }
    // node-a: the IL plugins see the slots reserved by the CL plugin as unhealthy; the CL
    // plugin offers its 2 held ids plus one per camera with a free slot (seed 003's rule;
    // seed 000's table, written before it, shows only the 2 held ones).
    let free1 = if c.slot_free(&cam1, 0).await {
        &s10
    } else {
        &s11
    };
    let free2 = if c.slot_free(&cam2, 0).await {
        &s20
    } else {
        &s21
    };
    expect_view(a, &cl, 4, Healthy::Count(4)).await;
    expect_view(a, &il1, 2, Healthy::Ids(vec![free1])).await;
    expect_view(a, &il2, 2, Healthy::Ids(vec![free2])).await;
    // node-b: one free slot per camera.
    expect_view(b, &cl, 2, Healthy::Count(2)).await;
    expect_view(b, &il1, 2, Healthy::Ids(vec![free1])).await;
    expect_view(b, &il2, 2, Healthy::Ids(vec![free2])).await;

    // A pod on node-b asks for the second camera through its IL resource: its free slot.
    c.pod("il-one", &[("broker", &il2, 1)]).await;
    let options = b.peer.allocate(&c.ns, "il-one", "broker").await.unwrap();
    assert!(
        options["envs"]["DEBUG_ECHO_DESCRIPTION"].is_string(),
        "{options}"
    );
    assert_eq!(
        c.usage(&cam2, true).await,
        [format!("C:{}", a.name), b.name.clone()]
    );
    // node-b: the CL plugin has a free slot on the first camera only; the IL plugin of the
    // second camera holds its own slot (healthy) and sees node-a's as unhealthy.
    expect_view(b, &cl, 1, Healthy::Count(1)).await;
    expect_view(b, &il2, 2, Healthy::Ids(vec![free2])).await;
    // node-a: both slots of the second camera are taken for it now.
    expect_view(a, &il2, 2, Healthy::Count(0)).await;
    expect_view(a, &cl, 3, Healthy::Count(3)).await;
    // The second camera has no slot left: a third pod on node-b asking for 2 cameras fails
    // admission, and the kubelet's view stays what the Instances say.
    c.pod("cl-too-many", &[("broker", &cl, 2)]).await;
    assert!(
        b.peer
            .allocate(&c.ns, "cl-too-many", "broker")
            .await
            .is_err()
    );
    expect_view(b, &cl, 1, Healthy::Count(1)).await;
}

#[tokio::test]
async fn seed_000_instance_level_claims_leave_configuration_level_slots() {
    let c = cluster(2, Duration::from_secs(600)).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let config = ControlPlane::unique_name("onvif");
    let [cam1, cam2] = c.cameras(&config, true).await;
    let cl = format!("akri.sh/{config}");

    // One pod per camera on node-a, each through the camera's IL resource.
    for (pod, cam) in [("il-1", &cam1), ("il-2", &cam2)] {
        registered(a, &format!("akri.sh/{cam}"), 2).await;
        c.pod(pod, &[("broker", &format!("akri.sh/{cam}"), 1)])
            .await;
        a.peer.allocate(&c.ns, pod, "broker").await.unwrap();
        assert_eq!(c.usage(cam, false).await, ["", a.name.as_str()]);
    }
    for cam in [&cam1, &cam2] {
        let il = format!("akri.sh/{cam}");
        let taken = c.instances().get(cam).await.unwrap().spec.device_usage;
        let free: Vec<&str> = taken
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k.as_str())
            .collect();
        // node-a: its own slot and the free one are healthy; node-b: only the free one.
        expect_view(a, &il, 2, Healthy::Count(2)).await;
        expect_view(b, &il, 2, Healthy::Ids(free)).await;
    }
    // Both nodes' CL plugins: one free slot per camera.
    expect_view(a, &cl, 2, Healthy::Count(2)).await;
    expect_view(b, &cl, 2, Healthy::Count(2)).await;
}

#[tokio::test]
async fn seed_000_without_unique_devices_one_camera_can_serve_a_request_twice() {
    let c = cluster(2, Duration::from_secs(600)).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let config = ControlPlane::unique_name("gpu");
    let [cam1, cam2] = c.cameras(&config, false).await;
    let cl = format!("akri.sh/{config}");
    let all = [
        slot(&cam1, 0),
        slot(&cam1, 1),
        slot(&cam2, 0),
        slot(&cam2, 1),
    ];
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    for node in [a, b] {
        expect_view(node, &cl, 4, Healthy::Ids(all.clone())).await;
    }
    // 2 CL devices on node-a: both slots of the first camera (the seed's example).
    c.pod("cl-pair", &[("broker", &cl, 2)]).await;
    a.peer.allocate(&c.ns, "cl-pair", "broker").await.unwrap();
    assert_eq!(
        c.usage(&cam1, false).await,
        [
            format!("C:{}:{}", slot(&cam1, 0), a.name),
            format!("C:{}:{}", slot(&cam1, 1), a.name)
        ]
    );
    assert_eq!(c.usage(&cam2, false).await, ["", ""]);
    expect_view(a, &cl, 4, Healthy::Ids(all.clone())).await;
    expect_view(a, &format!("akri.sh/{cam1}"), 2, Healthy::Count(0)).await;
    expect_view(b, &cl, 4, Healthy::Ids(all[2..].to_vec())).await;
    expect_view(b, &format!("akri.sh/{cam1}"), 2, Healthy::Count(0)).await;
    expect_view(b, &format!("akri.sh/{cam2}"), 2, Healthy::Count(2)).await;
}

#[tokio::test]
async fn two_containers_of_one_pod_each_get_a_configuration_level_device() {
    // Akri #843: the second container's request failed.
    let c = cluster(1, Duration::from_secs(600)).await;
    let a = &c.nodes[0];
    let config = ControlPlane::unique_name("cams");
    let [cam1, cam2] = c.cameras(&config, true).await;
    let cl = format!("akri.sh/{config}");
    registered(a, &cl, 2).await;
    c.pod("two", &[("first", &cl, 1), ("second", &cl, 1)]).await;
    let first = a.peer.allocate(&c.ns, "two", "first").await.unwrap();
    let second = a.peer.allocate(&c.ns, "two", "second").await.unwrap();
    for options in [&first, &second] {
        assert!(
            options["envs"]["DEBUG_ECHO_DESCRIPTION"].is_string(),
            "{options}"
        );
    }
    let mut held = 0;
    for cam in [&cam1, &cam2] {
        held += c
            .usage(cam, true)
            .await
            .iter()
            .filter(|v| !v.is_empty())
            .count();
    }
    assert_eq!(held, 2, "one slot per container");
}

#[tokio::test]
async fn slots_return_after_the_pod_and_plugins_survive_restarts_and_deletion() {
    let c = cluster(1, Duration::from_secs(1)).await;
    let a = &c.nodes[0];
    let config = ControlPlane::unique_name("cams");
    let [cam1, _] = c.cameras(&config, true).await;
    let il = format!("akri.sh/{cam1}");

    // A pod holds a slot; once pod-resources no longer lists it, the slot is freed after the
    // grace period and the kubelet sees it healthy again.
    registered(a, &il, 2).await;
    c.pod("holder", &[("broker", &il, 1)]).await;
    a.peer.allocate(&c.ns, "holder", "broker").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.usage(&cam1, false).await,
        ["", a.name.as_str()],
        "a running container's slot is kept past the grace period"
    );
    a.peer.release(&c.ns, "holder").await.unwrap();
    eventually("the slot freed", async || {
        (c.usage(&cam1, false).await == ["", ""]).then_some(())
    })
    .await;
    expect_view(a, &il, 2, Healthy::Count(2)).await;

    // A kubelet restart: the plugins register again and allocation goes on.
    a.peer.restart().await.unwrap();
    expect_view(a, &il, 2, Healthy::Count(2)).await;
    c.pod("after-restart", &[("broker", &il, 1)]).await;
    a.peer
        .allocate(&c.ns, "after-restart", "broker")
        .await
        .unwrap();

    // The Configuration deleted: none of its resources keeps devices on the node (the
    // kubelet drops the names themselves after its fixed 5-minute endpoint grace).
    Api::<Configuration>::namespaced(c.client.clone(), &c.ns)
        .delete(&config, &DeleteParams::default())
        .await
        .unwrap();
    eventually("no akri.sh capacity left", async || {
        let body = a.peer.device_capacity().await.ok()?;
        let left: BTreeMap<String, i64> = body["capacity"]
            .as_object()?
            .iter()
            .filter(|(k, v)| k.starts_with("akri.sh/") && v.as_i64() != Some(0))
            .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(-1)))
            .collect();
        left.is_empty().then_some(())
    })
    .await;
    let _ = &c.cp;
}

#[tokio::test]
async fn two_nodes_racing_for_a_shared_device_never_hold_more_than_its_slots() {
    // One camera of capacity 3 seen by both nodes; each node asks for it 100 times (200
    // allocations), holding up to 2 pods at once, releasing the oldest as it goes. Slots of
    // released pods are freed at once (grace 0), so the nodes race for them.
    let c = std::sync::Arc::new(cluster(2, Duration::ZERO).await);
    let config = ControlPlane::unique_name("cam");
    let [cam] = c.configuration(&config, &["cam0"], 3, true).await;
    let il = format!("akri.sh/{cam}");
    for node in &c.nodes {
        registered(node, &il, 3).await;
    }
    let live = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    // Slot -> the live pod the plugin gave it to (from Akri's slot annotation).
    let holders = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<String, String>::new()));
    let most = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut racers = Vec::new();
    for n in 0..2 {
        let (c, il, cam, live, most) = (
            c.clone(),
            il.clone(),
            cam.clone(),
            live.clone(),
            most.clone(),
        );
        let holders = holders.clone();
        racers.push(tokio::spawn(async move {
            let node = &c.nodes[n];
            let (mut admitted, mut refused) = (0, 0);
            // Each node holds up to 2 pods: together they want 4 of the 3 slots.
            let mut held = std::collections::VecDeque::new();
            for i in 0..100 {
                let pod = format!("race-{n}-{i}");
                c.pod(&pod, &[("broker", &il, 1)]).await;
                match node.peer.allocate(&c.ns, &pod, "broker").await {
                    Ok(options) => {
                        let slot = options["annotations"]
                            .as_object()
                            .and_then(|a| a.keys().find_map(|k| k.strip_prefix("akri.agent.slot-")))
                            .expect("a slot annotation")
                            .to_string();
                        let twice = holders.lock().unwrap().insert(slot.clone(), pod.clone());
                        assert_eq!(twice, None, "slot {slot} given to {pod} while a live pod holds it");
                        admitted += 1;
                        let now = live.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                        held.push_back((pod, slot));
                    }
                    Err(_) => {
                        refused += 1;
                        // Within 1 s the kubelet's healthy slots are what the Instance says.
                        let start = std::time::Instant::now();
                        loop {
                            let usage = c.instances().get(&cam).await.unwrap().spec.device_usage;
                            let expected: Vec<String> = usage
                                .iter()
                                .filter(|(_, v)| v.is_empty() || **v == node.name)
                                .map(|(k, _)| k.clone())
                                .collect();
                            let (_, healthy) = kubelet_view(&node.peer, &il).await;
                            if healthy == expected {
                                break;
                            }
                            assert!(
                                start.elapsed() < Duration::from_secs(1),
                                "{}: a refused allocation was not followed by a correct advertisement within 1 s: kubelet {healthy:?}, Instance {usage:?}",
                                node.name
                            );
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                if held.len() >= 2 || (held.len() == 1 && i % 3 == 0) {
                    let (old, slot) = held.pop_front().unwrap();
                    holders.lock().unwrap().remove(&slot);
                    live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    node.peer.release(&c.ns, &old).await.unwrap();
                }
            }
            for (old, slot) in held {
                holders.lock().unwrap().remove(&slot);
                live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                node.peer.release(&c.ns, &old).await.unwrap();
            }
            (admitted, refused)
        }));
    }
    let mut admitted = 0;
    for racer in racers {
        let (a, r) = racer.await.unwrap();
        admitted += a;
        eprintln!("racer: {a} admitted, {r} refused");
    }
    assert!(
        most.load(std::sync::atomic::Ordering::SeqCst) <= 3,
        "more pods held the capacity-3 camera at once than it has slots"
    );
    assert!(admitted >= 3, "the race admitted only {admitted} pods");
}
