//! The kubelet's own managers for one simulated node (`hack/k8s/kubelet-peer`), driven over
//! its local HTTP API.

use crate::process::Component;
use crate::{ControlPlane, Error};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A running kubelet peer: plugin watcher + DRA manager + device manager of one node.
#[derive(Debug)]
pub struct KubeletPeer {
    component: Component,
    url: String,
    http: reqwest::Client,
    node_name: String,
    dir: tempfile::TempDir,
}

impl KubeletPeer {
    /// Starts the peer for `node_name` against the control plane, with fresh directories.
    pub async fn start(control_plane: &ControlPlane, node_name: &str) -> Result<Self, Error> {
        let binary = control_plane.bins().kubelet_peer()?;
        let dir = tempfile::Builder::new()
            .prefix("akri-kubelet-")
            .tempdir()
            .map_err(Error::io("create the kubelet peer directory"))?;
        for sub in [
            "plugins_registry",
            "plugins",
            "device-plugins",
            "state",
            "cdi",
            "pod-resources",
        ] {
            std::fs::create_dir_all(dir.path().join(sub))
                .map_err(Error::io(format!("create {sub}")))?;
        }
        let args = vec![
            format!("--kubeconfig={}", control_plane.kubeconfig().display()),
            format!("--node-name={node_name}"),
            format!(
                "--plugins-registry-dir={}",
                dir.path().join("plugins_registry").display()
            ),
            format!(
                "--device-plugin-dir={}",
                dir.path().join("device-plugins").display()
            ),
            format!("--state-dir={}", dir.path().join("state").display()),
            format!("--cdi-dir={}", dir.path().join("cdi").display()),
            format!(
                "--pod-resources-socket={}",
                dir.path().join("pod-resources/kubelet.sock").display()
            ),
            "--listen=127.0.0.1:0".to_string(),
        ];
        let mut component = Component::start_piped(
            &format!("kubelet-peer-{node_name}"),
            &binary,
            &args,
            dir.path(),
        )?;
        let stdout = component
            .take_stdout()
            .ok_or_else(|| Error::Other("kubelet peer stdout not piped".into()))?;
        // The peer prints `READY <url>` once its managers run.
        let first_line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            line
        });
        let line = match tokio::time::timeout(Duration::from_secs(60), first_line).await {
            Ok(Ok(line)) => line,
            _ => return Err(component.not_ready(60)),
        };
        let Some(url) = line.trim().strip_prefix("READY ") else {
            component.check_running()?;
            return Err(Error::Other(format!(
                "kubelet peer printed {line:?} instead of READY"
            )));
        };
        Ok(KubeletPeer {
            url: url.to_string(),
            component,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            node_name: node_name.to_string(),
            dir,
        })
    }

    /// The simulated node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The kubelet plugin registration directory the plugin watcher watches.
    pub fn registry_dir(&self) -> PathBuf {
        self.dir.path().join("plugins_registry")
    }

    /// A directory for plugins' own service sockets (the kubelet's `plugins/`).
    pub fn plugins_dir(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// The device manager's socket directory (device plugins register on `kubelet.sock` here).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.dir.path().join("device-plugins")
    }

    /// The kubelet's pod-resources socket (served by the kubelet's own pod-resources server
    /// over the peer's pods and device manager).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.dir.path().join("pod-resources/kubelet.sock")
    }

    /// Where CDI spec files are read from by [`cdi_inject`](Self::cdi_inject).
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// The peer's log file.
    pub fn log(&self) -> &Path {
        &self.component.log
    }

    /// DRA drivers registered with the DRA manager.
    pub async fn drivers(&self) -> Result<Vec<String>, Error> {
        let body: Value = self.call("GET", "/dra/drivers", None).await?;
        Ok(serde_json::from_value(body["drivers"].clone()).unwrap_or_default())
    }

    /// The service sockets the DRA manager holds for `driver` (two during a rolling update).
    pub async fn driver_endpoints(&self, driver: &str) -> Result<Vec<String>, Error> {
        let body: Value = self.call("GET", "/dra/drivers", None).await?;
        Ok(serde_json::from_value(body["endpoints"][driver].clone()).unwrap_or_default())
    }

    /// Waits until `driver` is registered with the DRA manager.
    pub async fn wait_for_driver(&self, driver: &str, timeout: Duration) -> Result<(), Error> {
        let start = Instant::now();
        loop {
            if self.drivers().await?.iter().any(|d| d == driver) {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(Error::Other(format!(
                    "DRA driver {driver} did not register with the kubelet peer of {} within {timeout:?}; peer log tail:\n{}",
                    self.node_name,
                    crate::process::log_tail(self.log(), 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Prepares the pod's claims as the kubelet does before starting it; returns the CDI
    /// device ids per container.
    pub async fn prepare(
        &self,
        namespace: &str,
        pod: &str,
    ) -> Result<BTreeMap<String, Vec<String>>, Error> {
        let body: Value = self
            .call(
                "POST",
                "/dra/prepare",
                Some(json!({"namespace": namespace, "name": pod})),
            )
            .await?;
        serde_json::from_value(body["containers"].clone())
            .map_err(|e| Error::Other(format!("prepare answer {body}: {e}")))
    }

    /// Unprepares the pod's claims as the kubelet does after the pod stopped.
    pub async fn unprepare(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        let _: Value = self
            .call(
                "POST",
                "/dra/unprepare",
                Some(json!({"namespace": namespace, "name": pod})),
            )
            .await?;
        Ok(())
    }

    /// The device manager's view of the node: `{"capacity", "allocatable", "deleted"}`.
    pub async fn device_capacity(&self) -> Result<Value, Error> {
        self.call("GET", "/devices/capacity", None).await
    }

    /// The ids of each device-plugin resource's healthy devices, as the device manager holds
    /// them (sorted).
    pub async fn allocatable_devices(&self) -> Result<BTreeMap<String, Vec<String>>, Error> {
        let body: Value = self.call("GET", "/devices/allocatable", None).await?;
        serde_json::from_value(body["allocatable"].clone())
            .map_err(|e| Error::Other(format!("allocatable answer {body}: {e}")))
    }

    /// Runs the device manager's admission for one container of a pod and returns the
    /// options the runtime would get (devices, envs, mounts, annotations, CDI devices).
    pub async fn allocate(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Result<Value, Error> {
        self.call(
            "POST",
            "/devices/allocate",
            Some(json!({"namespace": namespace, "name": pod, "container": container})),
        )
        .await
    }

    /// The device health the kubelet's DRA manager recorded, per driver:
    /// `{"drivers": {"<driver>": [{"pool", "device", "health", "message", ...}]}}`.
    pub async fn dra_health(&self) -> Result<Value, Error> {
        self.call("GET", "/dra/health", None).await
    }

    /// The DRA health the kubelet would write into a prepared pod's status, with its rules
    /// (a device not heard of for its health-check timeout is Unknown):
    /// `{"containers": {"<container>": [{"name": "claim:<claim>", "resources": [{"resourceID",
    /// "health"}]}]}}`.
    pub async fn pod_health(&self, namespace: &str, name: &str) -> Result<Value, Error> {
        self.call(
            "POST",
            "/dra/health/pod",
            Some(json!({ "namespace": namespace, "name": name })),
        )
        .await
    }

    /// Tells the device manager that the pod stopped running: its devices are freed and the
    /// pod-resources API no longer lists it.
    pub async fn release(&self, namespace: &str, pod: &str) -> Result<(), Error> {
        let _: Value = self
            .call(
                "POST",
                "/devices/release",
                Some(json!({"namespace": namespace, "name": pod})),
            )
            .await?;
        Ok(())
    }

    /// Stops and restarts the managers on the same directories, as a kubelet restart would.
    pub async fn restart(&self) -> Result<(), Error> {
        let _: Value = self.call("POST", "/restart", None).await?;
        Ok(())
    }

    /// Resolves CDI ids with the reference CDI library against the spec files in
    /// [`cdi_dir`](Self::cdi_dir) and returns the OCI edits (`env`, `mounts`, `devices`, ...).
    pub async fn cdi_inject(&self, devices: &[String]) -> Result<Value, Error> {
        self.call("POST", "/cdi/inject", Some(json!({"devices": devices})))
            .await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<T, Error> {
        let url = format!("{}{path}", self.url);
        let request = match method {
            "GET" => self.http.get(&url),
            _ => self.http.post(&url).json(&body.unwrap_or(json!({}))),
        };
        let response = request.send().await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            return Err(Error::Peer {
                call: format!("{method} {path}"),
                status: status.as_u16(),
                body: text,
            });
        }
        serde_json::from_str(&text)
            .map_err(|e| Error::Other(format!("{method} {path} answered {text:?}: {e}")))
    }
}
