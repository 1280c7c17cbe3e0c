//! The legacy path where DRA is absent, as a user installs it: a Kubernetes control plane that
//! serves no `resource.k8s.io` (1.33, where DRA is beta and off; `hack/test.sh` runs this
//! module with `AKRI_K8S_VERSION=1.33.13`), two real nodes (containerd + the kubelet), our
//! kubelet-plugin image and `helm install` of the chart with `legacyDevicePlugin.enabled`.
//! Seed 000's walkthroughs then run through the kubelet's own device manager into real
//! containers: configuration- and instance-level requests sharing `deviceUsage` slots, with
//! `uniqueDevices` on and off, two nodes racing for one slot, and slots coming back after
//! their pod and their node go. The debugEcho handler embedded in the kubelet-plugin stands
//! in for cameras that both nodes reach (shared). The OPC UA handler runs as the chart's
//! DaemonSet, to show how the chart contains a handler pod.

use akri_api::v0::{Configuration, Instance};
use akri_testing::product::{Images, fixtures_after, repo, shell};
use akri_testing::{ControlPlane, ControlPlaneOptions, RealNode, from_json};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::OnceCell;

/// The release namespace (the chart's examples/akri-namespace.yaml).
const NAMESPACE: &str = "akri";
/// The users' namespace, as the documented install lists it.
const USERS: &str = "cameras";
const NODES: [&str; 2] = ["legacy-a", "legacy-b"];
/// Slots with no container behind them are freed after this (the chart's
/// `legacyDevicePlugin.slotReclaimGraceSeconds`).
const RECLAIM_GRACE_SECONDS: u64 = 5;
const WAIT: Duration = Duration::from_secs(120);

/// One control plane, two real nodes and the installed chart, shared by this module's tests
/// (each with configurations of its own).
struct Shared {
    cp: ControlPlane,
    nodes: Vec<RealNode>,
    /// The users' namespace: Configurations, their Instances and the pods.
    ns: String,
}

/// The shared cluster and a client of the calling test's own runtime (a client outlives
/// neither the runtime it was made in nor, so, the test that made it).
struct Cluster {
    shared: &'static Shared,
    client: kube::Client,
}

impl std::ops::Deref for Cluster {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        self.shared
    }
}

async fn cluster() -> Cluster {
    static SHARED: OnceCell<Shared> = OnceCell::const_new();
    let shared = SHARED
        .get_or_init(|| async {
            let cp = ControlPlane::start(ControlPlaneOptions::with_services())
                .await
                .expect("control plane");
            let client = cp.client().await.unwrap();
            Images::pushed().await.unwrap();
            let mut nodes = Vec::new();
            for name in NODES {
                nodes.push(RealNode::start(&cp, name).await.expect("real node"));
            }
            // The commands docs/operations.md gives for clusters without DRA, as written (the
            // chart from the registry, whose images the nodes pull from it); once they run,
            // what the tests need, as their own upgrade: a short reclaim grace, the embedded
            // debugEcho handler's devices shared between the nodes, and a handler as its own
            // DaemonSet, for its containment (no configuration uses it).
            // The namespace the documented install lists (legacyDevicePlugin.namespaces): a
            // user's, there before the install (the chart grants the driver-controller its
            // Instances there).
            let ns = cp.create_namespace_named(USERS).await.unwrap();
            let [kubectl_line, helm_line] = documented_commands();
            let kubectl_bin = cp.bins().require("kubectl").unwrap();
            let fixtures = [
                format!("legacyDevicePlugin.slotReclaimGraceSeconds={RECLAIM_GRACE_SECONDS}"),
                "kubeletPlugin.debugEcho.enabled=true".to_string(),
                "kubeletPlugin.debugEcho.shared=true".to_string(),
                "discoveryHandlers.opcua.enabled=true".to_string(),
            ];
            let install = format!(
                "{kubectl_line}\n{helm_line}\n{}",
                fixtures_after(&helm_line, &fixtures)
            );
            let started = std::time::Instant::now();
            let installed = shell(cp.kubeconfig(), &[&kubectl_bin], &install).await;
            if let Err(error) = installed {
                panic!("{error}\n{}", plugin_logs(&client).await);
            }
            eprintln!(
                "helm install on Kubernetes {} (DRA served: {}) with two real nodes in {:?}",
                cp.bins().version(),
                cp.serves_dra(),
                started.elapsed()
            );
            Shared { cp, nodes, ns }
        })
        .await;
    Cluster {
        shared,
        client: shared.cp.client().await.unwrap(),
    }
}

/// The `kubectl` and `helm install` lines of docs/operations.md's "Clusters without DRA".
fn documented_commands() -> [String; 2] {
    let lines = akri_testing::docs::section_lines(
        &repo().join("docs/operations.md"),
        "Clusters without DRA",
    )
    .unwrap();
    let line = |prefix: &str| {
        (lines.iter())
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in the section"))
            .clone()
    };
    let helm = line("helm install ");
    assert!(
        helm.contains("--set legacyDevicePlugin.enabled=true")
            && helm.contains(&format!("--set legacyDevicePlugin.namespaces={{{USERS}}}")),
        "{helm}"
    );
    [line("kubectl apply "), helm]
}

/// Every kubelet-plugin pod's log, for a failure message.
async fn plugin_logs(client: &kube::Client) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let mut out = String::new();
    let Ok(list) = pods.list(&plugins()).await else {
        return out;
    };
    for pod in list.items {
        let name = pod.metadata.name.unwrap_or_default();
        let logs = pods
            .logs(&name, &LogParams::default())
            .await
            .unwrap_or_default();
        out += &format!("--- {name}\n{logs}\n");
    }
    out
}

fn plugins() -> ListParams {
    ListParams::default().labels("app.kubernetes.io/component=kubelet-plugin")
}

impl Cluster {
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn instances(&self) -> Api<Instance> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates a v0 Configuration of shared debugEcho devices (`descriptions`) with
    /// `capacity` slots each; returns their Instance names (sorted) once every one is seen by
    /// both nodes with every slot.
    async fn configuration<const N: usize>(
        &self,
        name: &str,
        descriptions: [&str; N],
        capacity: usize,
        unique: bool,
    ) -> [String; N] {
        let config: Configuration = from_json(akri_testing::discovery::v0_debug_echo(
            name,
            &descriptions,
            capacity,
            unique,
        ));
        Api::<Configuration>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
        akri_testing::eventually_within("every Instance on both nodes", WAIT, async || {
            let list = self.instances().list(&ListParams::default()).await.ok()?;
            let mut ready: Vec<String> = list
                .items
                .iter()
                .filter(|i| i.spec.configuration_name == name)
                .filter(|i| NODES.iter().all(|n| i.spec.nodes.iter().any(|m| m == n)))
                .filter(|i| i.spec.device_usage.len() == capacity)
                .filter_map(|i| i.metadata.name.clone())
                .collect();
            ready.sort();
            ready.try_into().ok()
        })
        .await
    }

    /// `deviceUsage` values of an Instance, sorted, with `C:<vdev>:<node>` shown as
    /// `C:<node>` (the virtual device id is the plugin's choice).
    async fn usage(&self, instance: &str) -> Vec<String> {
        let usage = self
            .instances()
            .get(instance)
            .await
            .unwrap()
            .spec
            .device_usage;
        let mut values: Vec<String> = usage
            .into_values()
            .map(|v| match v.strip_prefix("C:") {
                Some(rest) => format!("C:{}", rest.rsplit(':').next().unwrap_or_default()),
                None => v,
            })
            .collect();
        values.sort();
        values
    }

    async fn usage_becomes(&self, instance: &str, expected: &[&str]) {
        akri_testing::eventually_within(
            &format!("{instance}'s deviceUsage {expected:?}"),
            WAIT,
            async || (self.usage(instance).await == expected).then_some(()),
        )
        .await;
    }

    /// What the kubelet of `node` offers of `resource` (its allocatable count, the healthy
    /// devices) once it equals `count`.
    async fn allocatable_becomes(&self, node: &str, resource: &str, count: i64) {
        let nodes = Api::<Node>::all(self.client.clone());
        akri_testing::eventually_within(
            &format!("{node}'s allocatable {resource} = {count}"),
            WAIT,
            async || {
                let node = nodes.get(node).await.ok()?;
                let allocatable = node.status?.allocatable?;
                let now: i64 = allocatable.get(resource)?.0.parse().ok()?;
                (now == count).then_some(())
            },
        )
        .await;
    }

    /// Waits until `node`'s kubelet holds `count` healthy devices of `resource`, in its device
    /// manager's own record: the checkpoint it writes on every `ListAndWatch` update, with the
    /// healthy ids of each resource. That is what it admits a pod against; the node status
    /// in the API may be up to 10 s older.
    async fn kubelet_healthy(&self, node: &str, resource: &str, count: usize) {
        let real = (self.nodes.iter())
            .find(|n| n.node_name() == node)
            .expect("one of the real nodes");
        let checkpoint = real.device_plugin_dir().join("kubelet_internal_checkpoint");
        akri_testing::eventually_within(
            &format!("{node}'s kubelet has {count} healthy {resource}"),
            WAIT,
            async || {
                let text = std::fs::read_to_string(&checkpoint).ok()?;
                let record: serde_json::Value = serde_json::from_str(&text).ok()?;
                let healthy = record["Data"]["RegisteredDevices"][resource]
                    .as_array()
                    .map_or(0, Vec::len);
                (healthy == count).then_some(())
            },
        )
        .await;
    }

    /// A pod on `node` whose one container asks for `resources` (limits) and prints its
    /// environment's device variables.
    async fn pod(&self, name: &str, node: &str, resources: &[(&str, u32)]) {
        let limits: BTreeMap<&str, String> =
            resources.iter().map(|(r, n)| (*r, n.to_string())).collect();
        let pod: Pod = from_json(json!({
            "metadata": { "name": name },
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "broker",
                    "image": self.nodes[0].busybox_image().unwrap(),
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "env | grep -E '^(DEBUG_ECHO|RESOLUTION)' | sort; echo END-OF-OUTPUT; exec sleep 3600"],
                    "resources": { "limits": limits },
                }],
            },
        }));
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    /// The container's output once it printed it (the pod is running).
    async fn output(&self, pod: &str) -> String {
        let pods = self.pods();
        akri_testing::eventually_within(&format!("pod {pod}'s output"), WAIT, async || {
            let logs = pods.logs(pod, &LogParams::default()).await.ok()?;
            logs.contains("END-OF-OUTPUT").then_some(logs)
        })
        .await
    }

    /// The kubelet refused the pod at admission for want of devices: it failed and never ran
    /// (`OutOf<resource>` when too few are healthy, `UnexpectedAdmissionError` when the
    /// plugin's Allocate refused).
    async fn refused(&self, pod: &str) {
        let pods = self.pods();
        let status =
            akri_testing::eventually_within(&format!("pod {pod} refused"), WAIT, async || {
                let status = pods.get(pod).await.ok()?.status?;
                (status.phase.as_deref() == Some("Failed")).then_some(status)
            })
            .await;
        let reason = status.reason.unwrap_or_default();
        assert!(
            reason.starts_with("OutOfakri.sh/") || reason == "UnexpectedAdmissionError",
            "pod {pod} failed for another reason: {reason}: {:?}",
            status.message
        );
        assert!(
            status
                .container_statuses
                .unwrap_or_default()
                .iter()
                .all(|s| s
                    .state
                    .as_ref()
                    .is_none_or(|s| s.running.is_none() && s.terminated.is_none())),
            "pod {pod} ran"
        );
    }

    /// The pod's phase once the kubelet decided: `Running` or `Failed`.
    async fn decided(&self, pod: &str) -> String {
        let pods = self.pods();
        akri_testing::eventually_within(
            &format!("pod {pod} running or refused"),
            WAIT,
            async || {
                let phase = pods.get(pod).await.ok()?.status?.phase?;
                matches!(phase.as_str(), "Running" | "Failed").then_some(phase)
            },
        )
        .await
    }

    async fn delete_pod(&self, pod: &str) {
        let pods = self.pods();
        pods.delete(pod, &DeleteParams::default()).await.unwrap();
        akri_testing::eventually_within(&format!("pod {pod} gone"), WAIT, async || {
            pods.get_opt(pod).await.ok()?.is_none().then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn the_chart_runs_the_legacy_device_plugins_alone_and_says_dra_is_off() {
    let c = &cluster().await;
    let pods = Api::<Pod>::namespaced(c.client.clone(), NAMESPACE);
    let plugins = pods.list(&plugins()).await.unwrap().items;
    assert_eq!(
        plugins.len(),
        NODES.len(),
        "one kubelet-plugin pod per node"
    );
    let deployments = Api::<Deployment>::namespaced(c.client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap();
    let names: Vec<_> = deployments
        .items
        .iter()
        .filter_map(|d| d.metadata.name.clone())
        .collect();
    if c.cp.serves_dra() {
        assert!(
            names.iter().any(|n| n.ends_with("driver-controller")),
            "{names:?}"
        );
        return;
    }
    // Without DRA, the driver-controller only to free deleted and lost nodes' slots (a node
    // frees only its own), running on 1.33.
    assert_eq!(
        names,
        ["akri-driver-controller"],
        "no other controller without DRA"
    );
    let deployments = Api::<Deployment>::namespaced(c.client.clone(), NAMESPACE);
    akri_testing::eventually_within("the driver-controller available", WAIT, async || {
        let status = deployments.get(&names[0]).await.ok()?.status?;
        (status.available_replicas? >= 1).then_some(())
    })
    .await;
    for pod in plugins {
        let name = pod.metadata.name.unwrap();
        let logs = pods.logs(&name, &LogParams::default()).await.unwrap();
        let said = logs
            .lines()
            .filter(|l| l.contains("DRA is off: the API server serves no resource.k8s.io/v1"))
            .count();
        assert_eq!(said, 1, "{name} says once that DRA is off:\n{logs}");
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .expect("the pod's address");
        let (status, body) = akri_testing::http_get(format!("{ip}:8080"), "/readyz")
            .await
            .unwrap();
        assert_eq!(
            (status, body.as_str()),
            (
                200,
                "ok; DRA is off: the API server serves no resource.k8s.io/v1; legacy device plugins only"
            ),
            "{name}'s /readyz"
        );
    }
}

/// The chart's handler pods: the OPC UA handler's process runs as the chart's non-root user
/// and sees, of the node's `/var/lib/akri`, only its own directory, which the kubelet-plugin
/// made for the handler's group (mode 0770) and registered it from. So no other handler reaches its
/// socket, and it reaches no other handler's.
#[tokio::test]
async fn the_charts_handler_pods_run_unprivileged_each_in_a_directory_of_its_own() {
    let c = &cluster().await;
    for node in &c.nodes {
        let on_node = |script: &str| node.host_shell(script).unwrap();
        assert_eq!(
            on_node("stat -c '%u:%g %a' /var/lib/akri/opcua").trim(),
            "0:65532 770"
        );
        let registered = on_node("cat /var/lib/akri-kubelet-plugin/discovery-handlers.json");
        assert!(
            registered.contains("/var/lib/akri/opcua/opcua.sock"),
            "{}: the handler registered from its own directory: {registered}",
            node.node_name()
        );
        // The handler's process, found by the node's directory behind its /var/lib/akri
        // (mountinfo names a source by its path in its filesystem: compared by the end).
        let akri = Path::new(node.dir().file_name().unwrap()).join("host/var-lib/akri");
        let (pid, mounts) = handler_processes("akri-opcua-discovery-handler")
            .into_iter()
            .find(|(_, mounts)| {
                mounts
                    .iter()
                    .any(|(_, root)| root.ends_with(akri.join("opcua")))
            })
            .unwrap_or_else(|| panic!("no OPC UA handler process of {}", node.node_name()));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert_eq!(
            uid.split_whitespace().skip(1).collect::<Vec<_>>(),
            ["65532"; 4],
            "{uid}"
        );
        let seen: Vec<_> = (mounts.iter())
            .filter(|(_, root)| (root.ancestors()).any(|a| a.ends_with(&akri)))
            .map(|(point, root)| (point.clone(), root.ends_with(akri.join("opcua"))))
            .collect();
        assert_eq!(
            seen,
            [("/var/lib/akri".into(), true)],
            "{}: of the node's /var/lib/akri, only its own directory, at Akri's path",
            node.node_name()
        );
    }
}

/// The processes running `binary`, each with its mounts (mount point, source path).
fn handler_processes(binary: &str) -> Vec<(u32, Vec<(PathBuf, PathBuf)>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if !program.ends_with(binary.as_bytes()) {
            continue;
        }
        let Ok(mountinfo) = std::fs::read_to_string(entry.path().join("mountinfo")) else {
            continue;
        };
        // mountinfo: id parent major:minor root mount-point ...
        let mounts = (mountinfo.lines())
            .filter_map(|line| {
                let fields: Vec<_> = line.split(' ').collect();
                Some((fields.get(4)?.into(), fields.get(3)?.into()))
            })
            .collect();
        found.push((pid, mounts));
    }
    found
}

/// Seed 000's first walkthrough, in real containers: a configuration-level request takes one
/// slot of each camera, an instance-level request on the other node takes the second camera's
/// last slot, and a further request for two cameras is refused by the kubelet. Then the first
/// pod goes: its slots come back after the reclaim grace, and the refused request fits.
#[tokio::test]
async fn seed_000_configuration_and_instance_level_requests_share_slots_in_real_containers() {
    let c = &cluster().await;
    let [a, b] = NODES;
    let config = ControlPlane::unique_name("onvif");
    let [cam1, cam2] = c.configuration(&config, ["cam0", "cam1"], 2, true).await;
    let cl = format!("akri.sh/{config}");
    let il2 = format!("akri.sh/{cam2}");
    for node in NODES {
        c.allocatable_becomes(node, &cl, 2).await;
        c.allocatable_becomes(node, &il2, 2).await;
    }

    c.pod("cl-pair", a, &[(&cl, 2)]).await;
    let output = c.output("cl-pair").await;
    assert!(output.contains("RESOLUTION=1080p"), "{output}");
    // Each camera's properties, suffixed with its id (as Akri does), so both are there.
    let mut descriptions: Vec<&str> = output
        .lines()
        .filter(|l| l.starts_with("DEBUG_ECHO_DESCRIPTION_"))
        .filter_map(|l| l.split_once('=').map(|(_, v)| v))
        .collect();
    descriptions.sort();
    assert_eq!(descriptions, ["cam0", "cam1"], "{output}");
    let held_by_a = format!("C:{a}");
    for cam in [&cam1, &cam2] {
        c.usage_becomes(cam, &["", &held_by_a]).await;
    }

    c.pod("il-one", b, &[(&il2, 1)]).await;
    let output = c.output("il-one").await;
    assert!(output.contains("DEBUG_ECHO_DESCRIPTION="), "{output}");
    c.usage_becomes(&cam2, &[&held_by_a, b]).await;
    // node-b: one camera with a free slot is left for the configuration-level resource.
    c.allocatable_becomes(b, &cl, 1).await;

    c.pod("cl-too-many", b, &[(&cl, 2)]).await;
    c.refused("cl-too-many").await;
    c.usage_becomes(&cam1, &["", &held_by_a]).await;

    // The pair goes: after the reclaim grace its slots are free, and two cameras fit on b.
    c.delete_pod("cl-pair").await;
    c.usage_becomes(&cam1, &["", ""]).await;
    c.usage_becomes(&cam2, &["", b]).await;
    c.pod("cl-after", b, &[(&cl, 2)]).await;
    c.output("cl-after").await;
    let held_by_b = format!("C:{b}");
    c.usage_becomes(&cam1, &["", &held_by_b]).await;
    c.usage_becomes(&cam2, &[&held_by_b, b]).await;
}

/// Seed 000 with `uniqueDevices: false`: every slot is a device of the configuration-level
/// resource, so one request may get two slots of one camera.
#[tokio::test]
async fn seed_000_without_unique_devices_every_slot_is_offered_and_one_request_takes_two() {
    let c = &cluster().await;
    let [a, b] = NODES;
    let config = ControlPlane::unique_name("gpu");
    let [gpu1, gpu2] = c.configuration(&config, ["gpu0", "gpu1"], 2, false).await;
    let cl = format!("akri.sh/{config}");
    for node in NODES {
        c.allocatable_becomes(node, &cl, 4).await;
    }
    c.pod("four", a, &[(&cl, 4)]).await;
    let output = c.output("four").await;
    assert!(output.contains("RESOLUTION=1080p"), "{output}");
    let held = format!("C:{a}");
    for gpu in [&gpu1, &gpu2] {
        c.usage_becomes(gpu, &[&held, &held]).await;
    }
    c.allocatable_becomes(b, &cl, 0).await;
    c.pod("none-left", b, &[(&cl, 1)]).await;
    c.refused("none-left").await;
}

/// One slot, both nodes asking at once, three rounds: the kubelets admit exactly one pod each
/// round, and the slot is given again only after its holder is gone.
#[tokio::test]
async fn two_nodes_racing_for_a_shared_slot_never_both_get_it() {
    let c = &cluster().await;
    let config = ControlPlane::unique_name("race");
    let [solo] = c.configuration(&config, ["solo"], 1, true).await;
    let il = format!("akri.sh/{solo}");
    for node in NODES {
        c.allocatable_becomes(node, &il, 1).await;
    }
    for round in 0..3 {
        let pods: Vec<String> = NODES.iter().map(|n| format!("race-{round}-{n}")).collect();
        let wanted = [(il.as_str(), 1)];
        tokio::join!(
            c.pod(&pods[0], NODES[0], &wanted),
            c.pod(&pods[1], NODES[1], &wanted),
        );
        let phases = [c.decided(&pods[0]).await, c.decided(&pods[1]).await];
        let running: Vec<usize> = (0..2).filter(|&i| phases[i] == "Running").collect();
        assert_eq!(running.len(), 1, "round {round}: {phases:?}");
        let winner = running[0];
        let holder = NODES[winner];
        c.usage_becomes(&solo, &[holder]).await;
        // The other kubelet sees the slot taken (Unhealthy): so the healthy slot waited for
        // below is its view after the slot was freed, not one from before this round.
        c.kubelet_healthy(NODES[1 - winner], &il, 0).await;
        c.pods()
            .delete(&pods[1 - winner], &DeleteParams::default())
            .await
            .unwrap();
        c.delete_pod(&pods[winner]).await;
        c.usage_becomes(&solo, &[""]).await;
        for node in NODES {
            c.allocatable_becomes(node, &il, 1).await;
        }
        // The node status may be up to 10 s old: the next round starts once both kubelets'
        // device managers hold the slot healthy again.
        for node in NODES {
            c.kubelet_healthy(node, &il, 1).await;
        }
    }
}

/// A node holding a slot goes for good (its kubelet stops, its Node object is deleted): the
/// driver-controller (the chart's, `--dra=off` on 1.33) frees its slots; no node may.
#[tokio::test]
async fn the_slots_of_a_node_that_went_are_freed_by_the_driver_controller() {
    let c = &cluster().await;
    let name = "legacy-gone";
    let node = RealNode::start(&c.cp, name).await.expect("real node");
    let pods = Api::<Pod>::namespaced(c.client.clone(), NAMESPACE);
    akri_testing::eventually_within(
        "a kubelet-plugin pod ready on the new node",
        WAIT,
        async || {
            let list = pods.list(&plugins()).await.ok()?;
            list.items.into_iter().find(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name)
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
            })
        },
    )
    .await;
    let config = ControlPlane::unique_name("gone");
    let [cam] = c.configuration(&config, ["cam0"], 2, true).await;
    let il = format!("akri.sh/{cam}");
    c.allocatable_becomes(name, &il, 2).await;
    c.pod("on-gone", name, &[(&il, 1)]).await;
    c.output("on-gone").await;
    c.usage_becomes(&cam, &["", name]).await;

    drop(node);
    Api::<Node>::all(c.client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    c.usage_becomes(&cam, &["", ""]).await;
    for node in NODES {
        c.allocatable_becomes(node, &il, 2).await;
    }
}
