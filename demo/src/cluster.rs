//! The demo's cluster: a local control plane, two nodes (real ones, containerd + kubelet,
//! where this machine can run them; else simulated, the kubelet's own DRA code as their
//! kubelet), the real kubelet-plugin binary with the embedded debugEcho handler beside each,
//! and the real driver-controller binary.

use crate::progress::step;
use akri_testing::{Component, ControlPlane, ControlPlaneOptions, KubeletPeer, RealNode};
use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
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
}

impl Binaries {
    pub fn beside(dir: &Path) -> anyhow::Result<Self> {
        let find = |name: &str| {
            let path = dir.join(name);
            anyhow::ensure!(
                path.is_file(),
                "{} is missing: build it with `cargo build -p {name}` (hack/demo.sh does)",
                path.display()
            );
            Ok(path)
        };
        Ok(Binaries {
            kubelet_plugin: find("akri-kubelet-plugin")?,
            driver_controller: find("akri-driver-controller")?,
        })
    }
}

/// The image the example pod runs (`examples/debug-echo/03-claim-and-pod.yaml`). Nothing is
/// pulled here: on a real node it is the test image (Debian's busybox-static) under this name.
pub const EXAMPLE_IMAGE: &str = "docker.io/library/busybox:1.37";

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
    /// The plugin's `/metrics`, `/healthz`, `/readyz`.
    pub metrics: String,
    _plugin: Component,
}

pub struct Cluster {
    pub cp: ControlPlane,
    /// Real nodes (pods run), not simulated ones.
    pub real: bool,
    pub client: kube::Client,
    pub nodes: Vec<Node>,
    pub kubectl: PathBuf,
    pub logs: PathBuf,
    _controller: Component,
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

        let cp = step(
            "control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager",
            ControlPlane::start(ControlPlaneOptions::full()),
        )
        .await
        .context("the control plane did not start (hack/k8s-bins.sh builds it)")?;
        let kubectl = cp.bins().require("kubectl")?;
        let client = cp.client().await?;
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

        let real = match (kind, RealNode::available(&cp)) {
            (NodeKind::Simulated, _) => false,
            (_, Ok(())) => true,
            (NodeKind::Real, Err(why)) => {
                anyhow::bail!("real nodes were asked for but cannot run here: {why}")
            }
            (NodeKind::RealWherePossible, Err(why)) => {
                println!("  real nodes are not available here ({why}): simulated nodes");
                false
            }
        };
        let kubeconfig = cp.kubeconfig().as_os_str().to_owned();
        let env: [(&str, &OsStr); 2] = [
            ("KUBECONFIG", &kubeconfig),
            ("RUST_LOG", OsStr::new("info")),
        ];
        let mut nodes = Vec::new();
        for (name, hidden) in NODES {
            let what = if real {
                "containerd, kubelet"
            } else {
                "kubelet peer"
            };
            let node = step(
                &format!("{name}: {what} and kubelet-plugin with debugEcho"),
                async {
                    let kubelet = if real {
                        let node = RealNode::start(&cp, name).await?;
                        node.tag_image("busybox", EXAMPLE_IMAGE).await?;
                        Kubelet::Real(Box::new(node))
                    } else {
                        cp.create_node(name).await?;
                        Kubelet::Simulated(KubeletPeer::start(&cp, name).await?)
                    };
                    let (registry, plugins, cdi) = match &kubelet {
                        Kubelet::Real(n) => (n.registry_dir(), n.plugins_dir(), n.cdi_dir()),
                        Kubelet::Simulated(p) => (p.registry_dir(), p.plugins_dir(), p.cdi_dir()),
                    };
                    let home = dir.path().join(name);
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
                        &logs,
                    )?;
                    let node = Node {
                        name: name.to_string(),
                        kubelet,
                        metrics,
                        _plugin: plugin,
                    };
                    node.wait_registered().await.with_context(|| {
                        format!(
                            "the plugin did not register; see {}",
                            node._plugin.log().display()
                        )
                    })?;
                    anyhow::Ok(node)
                },
            )
            .await?;
            nodes.push(node);
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
                &logs,
            )?)
        })
        .await?;

        Ok(Cluster {
            cp,
            real,
            client,
            nodes,
            kubectl,
            logs,
            _controller: controller,
            _dir: dir,
        })
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
