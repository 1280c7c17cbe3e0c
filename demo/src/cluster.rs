//! The demo's cluster: a local control plane and two nodes. Real nodes (containerd + kubelet,
//! where this machine can run them) get the product as users install it ([`crate::chart`]):
//! the images, `helm install`, the kubelet-plugin DaemonSet's pods on the nodes and the
//! controllers as Deployments. Simulated nodes (the kubelet's own DRA code as their kubelet)
//! get the real kubelet-plugin binary with the embedded debugEcho handler beside each, and the
//! real driver-controller binary, as processes.

use crate::chart::{self, Images};
use crate::progress::step;
use akri_testing::{BinDir, Component, ControlPlane, ControlPlaneOptions, KubeletPeer, RealNode};
use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the Instances (and the controller's Lease) live, as with the chart's default.
pub const NAMESPACE: &str = "akri";
/// The embedded debugEcho handler's DRA driver.
pub const DRIVER: &str = "debugecho.akri.sh";
/// The simulated nodes, and the debugEcho descriptions each of them does not see.
pub const NODES: [(&str, &str); 2] = [("node-a", ""), ("node-b", "dock")];

/// Our binaries, built next to this one (`hack/demo.sh` builds them together).
pub struct Binaries {
    pub kubelet_plugin: PathBuf,
    pub driver_controller: PathBuf,
    /// The kubectl plugin the user guide's `kubectl akri devices` runs.
    pub kubectl_akri: PathBuf,
}

impl Binaries {
    pub fn beside(dir: &Path) -> anyhow::Result<Self> {
        let find = |name: &str| {
            let path = dir.join(name);
            anyhow::ensure!(
                path.is_file(),
                "{} is missing: build it with `cargo build --bin {name}` (hack/demo.sh does)",
                path.display()
            );
            Ok(path)
        };
        Ok(Binaries {
            kubelet_plugin: find("akri-kubelet-plugin")?,
            driver_controller: find("akri-driver-controller")?,
            kubectl_akri: find("kubectl-akri")?,
        })
    }
}

/// The image the example pod runs (`examples/debug-echo/03-claim-and-pod.yaml`). Nothing is
/// pulled here: on a real node it is the test image (Debian's busybox-static) under this name.
pub const EXAMPLE_IMAGE: &str = "registry.k8s.io/e2e-test-images/busybox:1.36.1-1";

/// What a node's kubelet is.
pub enum Kubelet {
    /// containerd + the kubelet: pods really run.
    Real(Box<RealNode>),
    /// The kubelet's DRA and device managers only; the demo plays the kubelet's part.
    Simulated(KubeletPeer),
}

pub struct Node {
    pub name: String,
    pub kubelet: Kubelet,
    /// The plugin's `/metrics`, `/healthz`, `/readyz` (host:port).
    pub metrics: String,
    /// The plugin process (simulated nodes; on real ones it is the DaemonSet's pod).
    _plugin: Option<Component>,
}

pub struct Cluster {
    pub cp: ControlPlane,
    /// Real nodes (pods run), not simulated ones.
    pub real: bool,
    pub client: kube::Client,
    pub nodes: Vec<Node>,
    pub kubectl: PathBuf,
    pub logs: PathBuf,
    /// The images the chart runs (real nodes).
    pub images: Option<Images>,
    /// The controller process (simulated nodes; on real ones it is the chart's Deployment).
    _controller: Option<Component>,
    _dir: tempfile::TempDir,
}

/// Which nodes the demo runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// containerd + the kubelet, or an error where this machine cannot run them.
    Real,
    /// Real ones where this machine can run them, else simulated ones (saying why).
    RealWherePossible,
    /// The kubelet's DRA code only, no containers.
    Simulated,
}

impl Cluster {
    /// Starts everything, with the kind of nodes asked for.
    pub async fn start(binaries: &Binaries, kind: NodeKind) -> anyhow::Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("akri-demo-").tempdir()?;
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs)?;

        let real = match (kind, real_nodes_available().await) {
            (NodeKind::Simulated, _) => None,
            (_, Ok(images)) => Some(images),
            (NodeKind::Real, Err(why)) => {
                anyhow::bail!("real nodes were asked for but cannot run here: {why}")
            }
            (NodeKind::RealWherePossible, Err(why)) => {
                println!("  real nodes are not available here ({why}): simulated nodes");
                None
            }
        };
        let (what, options) = match real {
            Some(_) => (
                "control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kube-proxy",
                ControlPlaneOptions::with_services(),
            ),
            None => (
                "control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager",
                ControlPlaneOptions::full(),
            ),
        };
        let cp = step(what, ControlPlane::start(options))
            .await
            .context("the control plane did not start (hack/k8s-bins.sh builds it)")?;
        let kubectl = cp.bins().require("kubectl")?;
        let client = cp.client().await?;
        let mut cluster = Cluster {
            cp,
            real: real.is_some(),
            client,
            nodes: Vec::new(),
            kubectl,
            logs,
            images: None,
            _controller: None,
            _dir: dir,
        };
        match real {
            Some(images) => {
                cluster.install_chart(&images).await?;
                cluster.images = Some(images);
            }
            None => cluster.run_processes(binaries).await?,
        }
        Ok(cluster)
    }

    /// Real nodes pulling from the registry, then the chart from it, as the Quickstart says.
    async fn install_chart(&mut self, images: &Images) -> anyhow::Result<()> {
        step(
            &format!("namespace {NAMESPACE}, labelled for the chart's Pod Security level"),
            async {
                let manifest = chart::repo().join("examples/akri-namespace.yaml");
                self.kubectl(&["apply", "-f", &manifest.display().to_string()])
            },
        )
        .await?;
        let mut real_nodes = Vec::new();
        for (name, hidden) in NODES {
            let node = step(
                &format!(
                    "{name}: containerd (pulling from {REGISTRY}), kubelet",
                    REGISTRY = chart::REGISTRY
                ),
                async {
                    let node = RealNode::start(&self.cp, name).await?;
                    node.tag_image("busybox", EXAMPLE_IMAGE).await?;
                    // What the node's debugEcho devices do not see: the chart keeps the
                    // availability file on the node (docs/discovery-handlers.md).
                    node.host_shell(&format!(
                        "mkdir -p /var/lib/akri && printf '{hidden}' > /var/lib/akri/debug-echo-availability.txt"
                    ))?;
                    anyhow::Ok(node)
                },
            )
            .await?;
            real_nodes.push(node);
        }
        step(
            &format!(
                "helm install akri {} --version {}: kubelet-plugin DaemonSet, driver-controller, broker-controller",
                chart::CHART,
                images.tag
            ),
            chart::install(self.cp.kubeconfig(), images),
        )
        .await
        .map_err(|e| e.context(self.diagnostics()))?;
        let pods = Api::<Pod>::namespaced(self.client.clone(), NAMESPACE);
        let plugins = pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=kubelet-plugin"))
            .await?
            .items;
        for (node, (name, _)) in real_nodes.into_iter().zip(NODES) {
            let pod = plugins
                .iter()
                .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name))
                .with_context(|| format!("no kubelet-plugin pod on {name}"))?;
            let ip = pod
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .with_context(|| format!("the kubelet-plugin pod on {name} has no IP"))?;
            let node = Node {
                name: name.to_string(),
                kubelet: Kubelet::Real(Box::new(node)),
                metrics: format!("{ip}:8080"),
                _plugin: None,
            };
            node.wait_registered().await?;
            // The kubelet called the plugin back over its registration socket: both found
            // each other through the chart's host paths.
            let name = pod.metadata.name.clone().unwrap_or_default();
            crate::progress::wait_for(
                &format!("{name} says the kubelet of {} registered it", node.name),
                Duration::from_secs(60),
                async || {
                    let logs = pods.logs(&name, &Default::default()).await?;
                    Ok(logs.contains("registered with the kubelet").then_some(()))
                },
            )
            .await?;
            self.nodes.push(node);
        }
        Ok(())
    }

    /// Simulated nodes, with our binaries as processes beside them.
    async fn run_processes(&mut self, binaries: &Binaries) -> anyhow::Result<()> {
        let (cp, client, dir, logs) = (&self.cp, &self.client, self._dir.path(), &self.logs);
        step("CRDs and the akri namespace", async {
            cp.install_crds(&akri_api::crds::all()).await?;
            let namespace = serde_json::from_value(serde_json::json!({
                "metadata": { "name": NAMESPACE },
            }))?;
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &namespace)
                .await?;
            anyhow::Ok(())
        })
        .await?;

        let kubeconfig = cp.kubeconfig().as_os_str().to_owned();
        let env: [(&str, &OsStr); 2] = [
            ("KUBECONFIG", &kubeconfig),
            ("RUST_LOG", OsStr::new("info")),
        ];
        for (name, hidden) in NODES {
            let node = step(
                &format!("{name}: kubelet peer and kubelet-plugin with debugEcho"),
                async {
                    cp.create_node(name).await?;
                    let peer = KubeletPeer::start(cp, name).await?;
                    let (registry, plugins, cdi) =
                        (peer.registry_dir(), peer.plugins_dir(), peer.cdi_dir());
                    let home = dir.join(name);
                    std::fs::create_dir_all(home.join("handlers"))?;
                    let availability = home.join("debug-echo-availability.txt");
                    std::fs::write(&availability, hidden)?;
                    let metrics = format!("127.0.0.1:{}", akri_testing::free_port()?);
                    let args: Vec<String> = [
                        ("--node-name", name.into()),
                        ("--instance-namespace", NAMESPACE.into()),
                        ("--registry-dir", registry),
                        ("--plugins-dir", plugins),
                        ("--cdi-dir", cdi),
                        ("--state-dir", home.join("state")),
                        (
                            "--discovery-socket",
                            home.join("handlers/registration.sock"),
                        ),
                        ("--debug-echo-socket", home.join("handlers/debug-echo.sock")),
                        ("--debug-echo-availability-file", availability),
                        ("--metrics-address", metrics.clone().into()),
                    ]
                    .into_iter()
                    .flat_map(|(flag, value): (&str, PathBuf)| {
                        [flag.to_string(), value.display().to_string()]
                    })
                    .chain(["--debug-echo-shared".to_string()])
                    .collect();
                    let plugin = Component::start_with_env(
                        &format!("kubelet-plugin-{name}"),
                        &binaries.kubelet_plugin,
                        &args,
                        &env,
                        logs,
                    )?;
                    let log = plugin.log().to_path_buf();
                    let node = Node {
                        name: name.to_string(),
                        kubelet: Kubelet::Simulated(peer),
                        metrics,
                        _plugin: Some(plugin),
                    };
                    node.wait_registered().await.with_context(|| {
                        format!("the plugin did not register; see {}", log.display())
                    })?;
                    anyhow::Ok(node)
                },
            )
            .await?;
            self.nodes.push(node);
        }

        let controller = step("driver-controller", async {
            let metrics = format!("127.0.0.1:{}", akri_testing::free_port()?);
            let args = [
                "--instance-namespace",
                NAMESPACE,
                "--lease-namespace",
                NAMESPACE,
                "--metrics-address",
                &metrics,
            ]
            .map(String::from);
            anyhow::Ok(Component::start_with_env(
                "driver-controller",
                &binaries.driver_controller,
                &args,
                &env,
                logs,
            )?)
        })
        .await?;
        self._controller = Some(controller);
        Ok(())
    }

    /// What a person would look at next when something did not come up: pods, claims,
    /// events and the components' logs.
    pub fn diagnostics(&self) -> String {
        let text = |r: anyhow::Result<String>| r.unwrap_or_else(|e| format!("{e:#}"));
        let mut out = String::new();
        let commands: [&[&str]; 2] = [
            &["get", "pods,resourceclaims", "-A", "-o", "wide"],
            &["get", "events", "-A", "--sort-by=.lastTimestamp"],
        ];
        for args in commands {
            out += &format!(
                "$ kubectl {}\n{}\n",
                args.join(" "),
                text(self.kubectl(args))
            );
        }
        for component in ["kubelet-plugin", "driver-controller", "broker-controller"] {
            let selector = format!("app.kubernetes.io/component={component}");
            let args = [
                "logs",
                "-n",
                NAMESPACE,
                "-l",
                &selector,
                "--prefix",
                "--tail=15",
            ];
            out += &format!(
                "$ kubectl {}\n{}\n",
                args.join(" "),
                text(self.kubectl(&args))
            );
        }
        out
    }

    /// Runs the kubectl built from the same Kubernetes source against this cluster.
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = std::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig())
            .args(args)
            .output()
            .with_context(|| format!("run {}", self.kubectl.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

impl Node {
    /// Waits until the kubelet knows the plugin's driver: the peer says so; a real kubelet's
    /// registration shows in the plugin's readiness.
    async fn wait_registered(&self) -> anyhow::Result<()> {
        match &self.kubelet {
            Kubelet::Simulated(peer) => {
                peer.wait_for_driver(DRIVER, Duration::from_secs(60))
                    .await?;
            }
            Kubelet::Real(_) => {
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while !matches!(self.http_get("/readyz").await, Ok((200, _))) {
                    anyhow::ensure!(std::time::Instant::now() < deadline, "not ready after 60 s");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        Ok(())
    }

    /// GET one of the plugin's HTTP endpoints: (status, body).
    pub async fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = reqwest::get(format!("http://{}{path}", self.metrics)).await?;
        Ok((response.status().as_u16(), response.text().await?))
    }
}

/// Whether real nodes can run here, with the images they run: `Err` says what is missing.
async fn real_nodes_available() -> Result<Images, String> {
    let bins = BinDir::from_env().map_err(|e| e.to_string())?;
    RealNode::available(&bins)?;
    Images::pushed().await.map_err(|e| format!("{e:#}"))
}
