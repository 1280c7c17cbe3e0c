//! The demo's cluster: a local control plane, two simulated nodes (the kubelet's own DRA
//! code as their kubelet, the real kubelet-plugin binary with the embedded debugEcho handler
//! beside each) and the real driver-controller binary.

use crate::progress::step;
use akri_testing::{Component, ControlPlane, ControlPlaneOptions, KubeletPeer};
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

pub struct Node {
    pub name: String,
    pub peer: KubeletPeer,
    /// The plugin's `/metrics`, `/healthz`, `/readyz`.
    pub metrics: String,
    _plugin: Component,
}

pub struct Cluster {
    pub cp: ControlPlane,
    pub client: kube::Client,
    pub nodes: Vec<Node>,
    pub kubectl: PathBuf,
    pub logs: PathBuf,
    _controller: Component,
    _dir: tempfile::TempDir,
}

impl Cluster {
    pub async fn start(binaries: &Binaries) -> anyhow::Result<Cluster> {
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

        let kubeconfig = cp.kubeconfig().as_os_str().to_owned();
        let env: [(&str, &OsStr); 2] = [
            ("KUBECONFIG", &kubeconfig),
            ("RUST_LOG", OsStr::new("info")),
        ];
        let mut nodes = Vec::new();
        for (name, hidden) in NODES {
            let node = step(
                &format!("{name}: kubelet peer and kubelet-plugin with debugEcho"),
                async {
                    cp.create_node(name).await?;
                    let peer = KubeletPeer::start(&cp, name).await?;
                    let home = dir.path().join(name);
                    std::fs::create_dir_all(home.join("handlers"))?;
                    let availability = home.join("debug-echo-availability.txt");
                    std::fs::write(&availability, hidden)?;
                    let metrics = format!("127.0.0.1:{}", akri_testing::free_port()?);
                    let args: Vec<String> = [
                        ("--node-name", name.into()),
                        ("--instance-namespace", NAMESPACE.into()),
                        ("--registry-dir", peer.registry_dir()),
                        ("--plugins-dir", peer.plugins_dir()),
                        ("--cdi-dir", peer.cdi_dir()),
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
                    peer.wait_for_driver(DRIVER, Duration::from_secs(60))
                        .await
                        .with_context(|| {
                            format!(
                                "the plugin did not register; see {}",
                                plugin.log().display()
                            )
                        })?;
                    anyhow::Ok(Node {
                        name: name.to_string(),
                        peer,
                        metrics,
                        _plugin: plugin,
                    })
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
    /// GET one of the plugin's HTTP endpoints: (status, body).
    pub async fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let response = reqwest::get(format!("http://{}{path}", self.metrics)).await?;
        Ok((response.status().as_u16(), response.text().await?))
    }
}
