//! The kubelet of a real test node: its configuration and flags.

use crate::Error;
use std::path::{Path, PathBuf};

/// How to start (and restart) one kubelet.
#[derive(Clone, Debug)]
pub(super) struct Kubelet {
    pub args: Vec<String>,
    pub root_dir: PathBuf,
    pub healthz: String,
}

/// What the configuration is made of.
pub(super) struct KubeletSettings<'a> {
    pub node: &'a str,
    pub dir: &'a Path,
    pub kubeconfig: &'a Path,
    pub containerd_socket: &'a Path,
    pub cgroup_root: &'a str,
    pub address: std::net::Ipv4Addr,
    pub feature_gates: &'a str,
    pub port: u16,
    pub healthz_port: u16,
}

impl Kubelet {
    /// Writes the KubeletConfiguration and returns the flags that use it.
    pub fn configure(settings: &KubeletSettings<'_>) -> Result<Self, Error> {
        let dir = settings.dir;
        let root_dir = dir.join("kubelet");
        let pod_logs = dir.join("pod-logs");
        for sub in [&root_dir, &pod_logs] {
            std::fs::create_dir_all(sub).map_err(Error::io(format!("create {}", sub.display())))?;
        }
        let config = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // Serves on the node's own address only (see `network`), where the API server
            // reaches it as the node's InternalIP, for logs. Anonymous requests with
            // AlwaysAllow: the API server of the test control plane has no kubelet client
            // certificate, and the address is reachable from this machine only.
            "address": settings.address.to_string(),
            "port": settings.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": settings.healthz_port,
            "authentication": {
                "anonymous": { "enabled": true },
                "webhook": { "enabled": false },
            },
            "authorization": { "mode": "AlwaysAllow" },
            "containerRuntimeEndpoint": format!("unix://{}", settings.containerd_socket.display()),
            // cgroupfs, as containerd is configured (SystemdCgroup = false): a test machine
            // need not run systemd. Every pod's cgroup is under the node's own root, so the
            // teardown finds each process of the node there, and two nodes never share one.
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", settings.cgroup_root),
            // Kubelets from 1.35 on refuse cgroup v1 hosts unless told otherwise; machines
            // like this one (a VM with cgroup v1 controllers and a cgroup2 hierarchy at
            // /sys/fs/cgroup/unified) are such hosts. A no-op on cgroup v2.
            "failCgroupV1": false,
            "failSwapOn": false,
            // The machine's disk is shared with the build and may be nearly full (CI once had
            // under 1% free): eviction would reject every new pod with DiskPressure, and image
            // GC would take the imported images (pause and busybox, which cannot be pulled
            // back) away. The kubelet ignores a "0%" threshold, so these turn each signal off rather than lowering it;
            // signals left out of the map are not defaulted back in.
            "evictionHard": {
                "memory.available": "0%",
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
                "imagefs.inodesFree": "0%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": pod_logs,
            // No cluster DNS and not the host's resolver in pods.
            "resolvConf": "",
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
        });
        let config_path = dir.join("kubelet.json");
        std::fs::write(&config_path, config.to_string())
            .map_err(Error::io("write the kubelet configuration"))?;
        let args = vec![
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", settings.kubeconfig.display()),
            format!("--root-dir={}", root_dir.display()),
            format!("--cert-dir={}", root_dir.join("pki").display()),
            format!("--hostname-override={}", settings.node),
            format!("--node-ip={}", settings.address),
            format!("--feature-gates={}", settings.feature_gates),
            "--v=2".to_string(),
        ];
        Ok(Kubelet {
            args,
            root_dir,
            healthz: format!("http://127.0.0.1:{}/healthz", settings.healthz_port),
        })
    }
}
