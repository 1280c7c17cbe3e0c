//! The `kubernetes` Service for pods on real test nodes, as a cluster gives it: pods reach the
//! API server at `KUBERNETES_SERVICE_HOST` (the service network's first address), which the
//! real kube-proxy (built by `hack/k8s-bins.sh` with the kubelet) turns into the API server's
//! advertised address. This is what the chart's components use in their pods (kube-rs'
//! in-cluster configuration), so it is what a test of the installed product needs.
//!
//! The API server then listens on an address of its own instead of loopback, which pods reach
//! through their node's bridge: one from RFC 2544's benchmarking range (as the nodes' own,
//! [`crate::real_node`]), on a link of its own that the teardown of dead runs removes like a
//! node's bridge. kube-proxy programs this machine's nftables (table `kube-proxy`): one
//! control plane with services runs at a time, which is why only the tests that install the
//! chart on real nodes (one shared control plane) and the demo ask for it.

use crate::bins::BinDir;
use crate::process::Component;
use crate::{Error, free_port};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

/// The Service network (`--service-cluster-ip-range`); its first address is the `kubernetes`
/// Service's ClusterIP, which the serving certificate carries.
pub(crate) const SERVICE_RANGE: &str = "10.96.0.0/16";
pub(crate) const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// The API server's own address and link.
pub(crate) struct ApiServerAddress {
    pub address: Ipv4Addr,
    link: String,
}

impl ApiServerAddress {
    /// Creates the link carrying this process's API server address.
    pub fn create() -> Result<Self, Error> {
        let pid = std::process::id();
        crate::real_node::sweep_dead_runs();
        let (link, network) = crate::real_node::api_server_link(pid);
        crate::real_node::create_bridge(&link, &network)?;
        Ok(ApiServerAddress {
            address: network.address,
            link,
        })
    }
}

impl Drop for ApiServerAddress {
    fn drop(&mut self) {
        crate::real_node::delete_link(&self.link);
    }
}

/// kube-proxy, in nftables mode, for the whole machine.
pub(crate) struct KubeProxy {
    process: Option<Component>,
}

impl KubeProxy {
    /// Starts kube-proxy against the API server of `kubeconfig` and waits until its rules
    /// lead the `kubernetes` Service somewhere (its `/healthz` also weighs the IPv6 family,
    /// which pods here do not use).
    pub async fn start(bins: &BinDir, dir: &Path, kubeconfig: &Path) -> Result<Self, Error> {
        // Conntrack sizes and timeouts 0: leave the machine's sysctls as they are.
        let config = serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": { "kubeconfig": kubeconfig },
            "hostnameOverride": "akri-testing-kube-proxy",
            "healthzBindAddress": format!("127.0.0.1:{}", free_port()?),
            "metricsBindAddress": format!("127.0.0.1:{}", free_port()?),
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        });
        let path = dir.join("kube-proxy.json");
        std::fs::write(&path, config.to_string())
            .map_err(Error::io("write kube-proxy's configuration"))?;
        let mut process = Component::start(
            "kube-proxy",
            &bins.require("kube-proxy")?,
            &[format!("--config={}", path.display()), "--v=2".into()],
            dir,
        )?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !leads_the_kubernetes_service() {
            process.check_running()?;
            if Instant::now() > deadline {
                return Err(process.not_ready(60));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(KubeProxy {
            process: Some(process),
        })
    }
}

/// Whether kube-proxy's IPv4 table has the `kubernetes` Service's ClusterIP in it.
fn leads_the_kubernetes_service() -> bool {
    std::process::Command::new("nft")
        .args(["list", "table", "ip", "kube-proxy"])
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains(&KUBERNETES_SERVICE_IP.to_string())
        })
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        drop(self.process.take());
        // Its rules would send the next control plane's pods to this one's address.
        for family in ["ip", "ip6"] {
            let _ = std::process::Command::new("nft")
                .args(["delete", "table", family, "kube-proxy"])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
