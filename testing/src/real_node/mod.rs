//! A real node: containerd (with CDI) and the kubelet, built from source by
//! `hack/node-bins.sh` and `hack/k8s-bins.sh`, joined to a test [`ControlPlane`], so that pods
//! really start: the kubelet asks our plugins to prepare, containerd applies the CDI edits and
//! the device plugin's Allocate answer, runc runs the container.
//!
//! Everything lives under one temporary directory ([`teardown::root_prefix`]): containerd's
//! root and state, the kubelet's root (its `plugins_registry/` and `plugins/`, where DRA
//! plugins register), the device-plugin directory, the CDI spec directory containerd reads,
//! the pods' logs. containerd and the kubelet share a mount namespace of the node's own
//! ([`namespace`]: the kubelet's device-plugin path is fixed, and each node needs its own).
//! Pods run in the cgroup of the same name, on the node's bridge ([`network`]). The images
//! come from archives (`pause` for sandboxes, `busybox` for tests); nothing is ever pulled.
//!
//! What this machine needs of the kubelet, and why, is in [`kubelet`]'s configuration: the
//! cgroupfs driver, `failCgroupV1: false`, no eviction or image GC. The kubelet also sets the
//! kernel tunables every kubelet sets (`vm.overcommit_memory=1`, `kernel.panic=10`,
//! `kernel.panic_on_oops=1`): with `protectKernelDefaults` it would refuse to start instead.
//!
//! Dropping a [`RealNode`] kills the kubelet, every process of its pods, the shims and
//! containerd, unmounts what they mounted and removes its cgroups, bridge and directory; a
//! node of a test process that was killed is swept by the next [`RealNode::start`].

mod containerd;
mod kubelet;
mod namespace;
mod network;
mod teardown;

use crate::bins::NodeBins;
use crate::process::Component;
use crate::{ControlPlane, Error, free_port};
use containerd::Containerd;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kubelet::{Kubelet, KubeletSettings};
use namespace::MountNamespace;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub use network::Refusal;
pub(crate) use network::{NodeNetwork, create_bridge};
pub(crate) use teardown::{delete_link, sweep_dead_runs};

/// The link and address of process `pid`'s API server when pods must reach it
/// ([`crate::services`]): an address of the nodes' range that no node of the process takes.
pub(crate) fn api_server_link(pid: u32) -> (String, NodeNetwork) {
    (
        teardown::bridge_name(pid, network::API_SERVER_SLOT),
        NodeNetwork::of(pid, network::API_SERVER_SLOT),
    )
}

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running containerd + kubelet, registered as Node `name`.
pub struct RealNode {
    name: String,
    bins: NodeBins,
    kubelet_binary: PathBuf,
    containerd: Containerd,
    kubelet: Kubelet,
    namespace: MountNamespace,
    client: kube::Client,
    // Option: taken (stopped) in order by `Drop` and by the restarts.
    kubelet_process: Option<Component>,
    containerd_process: Option<Component>,
    cgroup_root: String,
    bridge: String,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.name)
            .field("dir", &self.dir.path())
            .finish()
    }
}

impl RealNode {
    /// Starts containerd and a kubelet for Node `name` against `control_plane`, imports the
    /// images, and waits until the Node is Ready; then lifts the `not-ready` taint that the
    /// node-lifecycle controller (off in the test control plane) would lift.
    pub async fn start(control_plane: &ControlPlane, name: &str) -> Result<RealNode, Error> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let started = Instant::now();
        let bins = NodeBins::from_env()?;
        let kubelet_binary = control_plane.bins().require("kubelet")?;
        teardown::sweep_dead_runs();

        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        if n >= network::API_SERVER_SLOT {
            return Err(Error::Other(format!(
                "at most {} real nodes per test process (their addresses)",
                network::API_SERVER_SLOT
            )));
        }
        let pid = std::process::id();
        let dir = tempfile::Builder::new()
            .prefix(&teardown::root_prefix(pid, n))
            .tempdir()
            .map_err(Error::io("create the node directory"))?;
        let cgroup_root = dir
            .path()
            .file_name()
            .expect("a temporary directory has a name")
            .to_string_lossy()
            .into_owned();
        let bridge = teardown::bridge_name(pid, n);
        let network = NodeNetwork::of(pid, n);
        let address = network.address;

        let cdi_dir = dir.path().join("cdi");
        let containerd =
            Containerd::configure(&bins, dir.path(), &cdi_dir, &bridge, &network.subnet())?;
        let kubeconfig = dir.path().join("kubelet.kubeconfig");
        control_plane.write_node_kubeconfig(&kubeconfig, name)?;
        let kubelet = Kubelet::configure(&KubeletSettings {
            node: name,
            dir: dir.path(),
            kubeconfig: &kubeconfig,
            containerd_socket: &containerd.socket,
            cgroup_root: &cgroup_root,
            feature_gates: control_plane.feature_gates(),
            address,
            port: free_port()?,
            healthz_port: free_port()?,
        })?;
        let client = control_plane.client().await?;
        // Made last before the node exists, whose Drop removes them.
        teardown::create_cgroup_root(&cgroup_root)
            .map_err(Error::io(format!("create cgroup {cgroup_root}")))?;
        network::create_bridge(&bridge, &network)?;
        network::confine_pods()?;
        let namespace = MountNamespace::create(dir.path(), &kubelet.root_dir)?;
        let mut node = RealNode {
            name: name.to_string(),
            bins,
            kubelet_binary,
            containerd,
            kubelet,
            namespace,
            client,
            kubelet_process: None,
            containerd_process: None,
            cgroup_root,
            bridge,
            dir,
        };
        node.containerd_process = Some(node.containerd.start(&node.bins, &node.namespace).await?);
        for image in ["pause", "busybox"] {
            let archive = node.bins.image_archive(image)?;
            node.containerd.import(&node.bins, &archive).await?;
        }
        node.start_kubelet().await?;
        node.wait_ready().await?;
        tracing::info!(node = name, dir = %node.dir.path().display(), started_in = ?started.elapsed(), "real node ready");
        Ok(node)
    }

    /// Whether this machine can run a real node of the control-plane binaries `bins` (before
    /// the control plane starts: it may need services): `Err` says what is missing (the
    /// binaries, root, a tool). For callers with a fallback, as the
    /// demo's simulated nodes; tests call [`start`](Self::start) and fail.
    pub fn available(bins: &crate::BinDir) -> Result<(), String> {
        NodeBins::from_env().map_err(|e| e.to_string())?;
        bins.require("kubelet").map_err(|e| e.to_string())?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let root = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|uids| uids.split_whitespace().nth(1))
            == Some("0");
        if !root {
            return Err("a real node needs root (cgroups, mounts, a bridge)".into());
        }
        for tool in [
            "ip", "mount", "umount", "unshare", "nsenter", "setpriv", "nft", "tar",
        ] {
            let found = std::env::var_os("PATH")
                .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()));
            if !found {
                return Err(format!("a real node needs `{tool}` on PATH"));
            }
        }
        Ok(())
    }

    /// Makes image `image` (`busybox`, `pause`) also known as `name`, e.g. the tag a user's
    /// manifest names: nothing is ever pulled, so a manifest's image must be there already.
    pub async fn tag_image(&self, image: &str, name: &str) -> Result<(), Error> {
        let source = self.bins.image_name(image)?;
        self.ctr(&["images", "tag", "--force", &source, name])
            .await
            .map(drop)
    }

    /// Runs `script` with `sh -c` as the node's host sees it (its mount namespace: its own
    /// `/var/lib/kubelet`, `/var/run/cdi`, ...), as an operator's shell on that node would;
    /// its stdout, or an error with its stderr.
    pub fn host_shell(&self, script: &str) -> Result<String, Error> {
        let (program, args) = self
            .namespace
            .command(Path::new("sh"), &["-c".to_string(), script.to_string()]);
        let output = std::process::Command::new(program)
            .args(&args)
            .output()
            .map_err(Error::io("run nsenter"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(Error::Other(format!(
                "on {}: sh -c {script:?}: {}",
                self.name,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// Refuses (a TCP reset) what the node's pods send to `port` on this machine, until the
    /// returned value is dropped: a device on a network the node is not on, while every other
    /// node's pods reach it.
    pub fn refuse_pods_to(&self, port: u16) -> Result<network::Refusal, Error> {
        network::Refusal::create(&self.bridge, port)
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// The kubelet's plugin registration directory (`<root-dir>/plugins_registry`).
    pub fn registry_dir(&self) -> PathBuf {
        self.kubelet.root_dir.join("plugins_registry")
    }

    /// The kubelet's `plugins/` directory, parent of each DRA driver's socket directory.
    pub fn plugins_dir(&self) -> PathBuf {
        self.kubelet.root_dir.join("plugins")
    }

    /// The kubelet's device-plugin directory (`kubelet.sock` and the plugins' sockets): the
    /// node's own, which the kubelet sees at `/var/lib/kubelet/device-plugins`
    /// ([`namespace`]).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    /// The kubelet's pod-resources socket (`<root-dir>/pod-resources/kubelet.sock`).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet.root_dir.join("pod-resources/kubelet.sock")
    }

    /// The directory containerd reads CDI specs from: where a DRA plugin writes them.
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// The node's directory (logs of containerd and the kubelet, their state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The image every test container can use: busybox (`sh`, `env`, `cat`, `ls`, ...),
    /// present on the node; use it with `imagePullPolicy: Never`.
    pub fn busybox_image(&self) -> Result<String, Error> {
        self.bins.image_name("busybox")
    }

    /// The last lines of `containerd` or `kubelet`'s log, for failure messages.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        crate::process::log_tail(&self.dir.path().join(format!("{component}.log")), lines)
    }

    /// [`crate::eventually_within`], failing with the last lines of the kubelet's and
    /// containerd's logs: what a test on the real node wants to see when a pod never got where
    /// it waited.
    pub async fn eventually<T, F: AsyncFn() -> Option<T>>(
        &self,
        what: &str,
        timeout: Duration,
        check: F,
    ) -> T {
        crate::poll(timeout, check, || {
            format!(
                "timed out after {timeout:?} waiting for {what}\n--- kubelet:\n{}\n--- containerd:\n{}",
                self.log_tail("kubelet", 25),
                self.log_tail("containerd", 15),
            )
        })
        .await
    }

    /// Kills the kubelet (SIGKILL: as a crash or a node's kubelet restart looks to pods and
    /// plugins) and starts it again with the same configuration; returns once it is healthy.
    pub async fn restart_kubelet(&mut self) -> Result<(), Error> {
        drop(self.kubelet_process.take());
        self.start_kubelet().await
    }

    /// Kills containerd (SIGKILL; the shims and containers keep running, as they do on a
    /// containerd restart) and starts it again; returns once it answers.
    pub async fn restart_containerd(&mut self) -> Result<(), Error> {
        drop(self.containerd_process.take());
        self.containerd_process = Some(self.containerd.start(&self.bins, &self.namespace).await?);
        Ok(())
    }

    /// Runs `ctr` in the kubelet's namespace of this node's containerd (`tasks ls`, ...).
    pub async fn ctr(&self, args: &[&str]) -> Result<String, Error> {
        self.containerd.ctr(&self.bins, args).await
    }

    async fn start_kubelet(&mut self) -> Result<(), Error> {
        let (program, args) = self
            .namespace
            .command(&self.kubelet_binary, &self.kubelet.args);
        let mut process = Component::start("kubelet", &program, &args, self.dir.path())?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let healthy = http
                .get(&self.kubelet.healthz)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if healthy {
                break;
            }
            process.check_running()?;
            if Instant::now() > deadline {
                return Err(process.not_ready(READY_TIMEOUT.as_secs()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.kubelet_process = Some(process);
        Ok(())
    }

    /// Waits for the Node to be Ready, then removes the taints the node-lifecycle controller
    /// would remove (not-ready, unreachable).
    async fn wait_ready(&mut self) -> Result<(), Error> {
        let nodes = Api::<Node>::all(self.client.clone());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(node) = nodes.get_opt(&self.name).await?
                && is_ready(&node)
            {
                let taints: Vec<_> = node
                    .spec
                    .and_then(|s| s.taints)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
                    .collect();
                let patch = serde_json::json!({ "spec": { "taints": taints } });
                nodes
                    .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                return Ok(());
            }
            if let Some(kubelet) = self.kubelet_process.as_mut() {
                kubelet.check_running()?;
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady {
                    component: format!("Node {}", self.name),
                    seconds: READY_TIMEOUT.as_secs(),
                    log: self.dir.path().join("kubelet.log"),
                    tail: self.log_tail("kubelet", 40),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Runs a tool of the machine (`ip`, `mount`, `unshare`, `nsenter`) to completion; an error
/// with its stderr when it fails.
fn run(program: &str, args: &[&str]) -> Result<(), Error> {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(Error::io(format!("run {program}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Other(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // The kubelet first, so nothing restarts what is being removed; then every process
        // of the pods (their cgroups), the shims (which outlive containerd by design),
        // containerd, and what they all mounted.
        drop(self.kubelet_process.take());
        teardown::remove_cgroup(&self.cgroup_root);
        let dir = self.dir.path().display().to_string();
        teardown::kill_processes_mentioning(&self.containerd.socket.display().to_string());
        drop(self.containerd_process.take());
        // Dropping a process sends SIGKILL without waiting for it.
        teardown::kill_until_gone(&dir, std::time::Duration::from_secs(10));
        teardown::remove_shim_sockets(&self.dir.path().join("containerd/state"));
        teardown::unmount_below(&dir);
        teardown::delete_link(&self.bridge);
    }
}
