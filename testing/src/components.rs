//! The project's components in a test's runtime, for the suites that start several: a
//! simulated node (a Node object, the kubelet's own managers as the Go peer, the node agent
//! with its embedded debugEcho handler) and the two controllers, reacting within 100 ms.

use crate::{ControlPlane, ControlPlaneOptions, KubeletPeer};
use akri_api::v1::Instance;
use akri_kubelet_plugin::agent::{self, AgentConfig};
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Waits until `agent`'s handlers report `device` of `driver` (its DRA device name: an
/// Instance name, or a slot device; for the legacy path the driver is the namespace) or, with
/// `reported` false, no longer do: what the agent acts on next. Within a grace nothing in the
/// API shows it, so the agent's own view is the event to wait for; what a test asserts is
/// still read from the API server.
pub async fn wait_reported(agent: &agent::Agent, (driver, device): (&str, &str), reported: bool) {
    let what = match reported {
        true => format!("{device} reported"),
        false => format!("{device} no longer reported"),
    };
    crate::eventually(&what, async || {
        (agent.devices().lookup(driver, device).is_some() == reported).then_some(())
    })
    .await;
}

/// A node: a Node object, the kubelet's own managers (peer) and the node agent.
pub struct SimNode {
    pub name: String,
    pub peer: KubeletPeer,
    pub agent: agent::Agent,
    /// What the agent was started with (another agent of the node starts from it).
    pub config: AgentConfig,
    /// The embedded debugEcho handler's availability file ("OFFLINE" hides every device).
    pub availability: PathBuf,
    _dir: tempfile::TempDir,
}

impl SimNode {
    /// Waits until two more passes have begun than now: the pass under way (if one is) has
    /// ended and a whole pass has run after it, so whatever the agent had seen by now has been
    /// acted on. A later event, in place of a quiet window.
    pub async fn whole_pass(&self) {
        let before = self.passes();
        crate::eventually("two passes of the agent", async || {
            (self.passes() >= before + 2.0).then_some(())
        })
        .await;
    }

    /// Starts a node whose agent ([`AgentConfig::embedded`], pointed at the peer's kubelet
    /// directories) writes Instances to `instance_namespace`, after `adjust` had its say.
    pub async fn start(
        cp: &ControlPlane,
        client: &kube::Client,
        instance_namespace: &str,
        adjust: impl FnOnce(&mut AgentConfig, &KubeletPeer),
    ) -> SimNode {
        let name = ControlPlane::unique_name("node");
        Self::start_named(cp, client, &name, instance_namespace, adjust).await
    }

    /// [`start`](Self::start) as Node `name` (one that objects already name).
    pub async fn start_named(
        cp: &ControlPlane,
        client: &kube::Client,
        name: &str,
        instance_namespace: &str,
        adjust: impl FnOnce(&mut AgentConfig, &KubeletPeer),
    ) -> SimNode {
        let name = name.to_string();
        cp.create_node(&name).await.expect("node created");
        let peer = KubeletPeer::start(cp, &name).await.expect("kubelet peer");
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut config = AgentConfig::embedded(&name, instance_namespace, dir.path()).kubelet_dirs(
            peer.registry_dir(),
            peer.plugins_dir(),
            peer.cdi_dir(),
        );
        adjust(&mut config, &peer);
        let availability = (config.debug_echo.as_ref())
            .map(|echo| echo.availability_file.clone())
            .unwrap_or_default();
        let agent = agent::start(client.clone(), config.clone())
            .await
            .expect("agent starts");
        SimNode {
            name,
            peer,
            agent,
            config,
            availability,
            _dir: dir,
        }
    }

    /// The passes the node's agent has made (its `akri_kubelet_plugin_passes_total`): a clock
    /// for "at rest" checks, which wait for passes instead of time.
    pub fn passes(&self) -> f64 {
        self.metric("akri_kubelet_plugin_passes_total")
    }

    /// The value of one series of the node agent's metrics, `name{labels}` as exposed.
    pub fn metric(&self, series: &str) -> f64 {
        (self.agent.metrics().encode().lines())
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the agent exposes {series}"))
    }

    /// Waits until the node's kubelet took the debugEcho DRA driver (a pod can be prepared).
    pub async fn registered(self) -> SimNode {
        (self.peer)
            .wait_for_driver("debugecho.akri.sh", Duration::from_secs(60))
            .await
            .expect("the kubelet-plugin registers");
        self
    }
}

/// The kubelet-plugin's binary `bin` as a node's process: node `node`, Instances in
/// `namespace`, API access as `kubeconfig` says, the kubelet's directories `kubelet`
/// (plugin registry, plugins, CDI), its state, registration socket and embedded debugEcho
/// handler (availability file `dir/availability.txt`) under `dir`, metrics on a free port
/// (several run at once). The caller adds its own flags, environment and output.
pub fn agent_command(
    bin: &std::path::Path,
    kubeconfig: &std::path::Path,
    (node, namespace): (&str, &str),
    kubelet: [PathBuf; 3],
    dir: &std::path::Path,
) -> tokio::process::Command {
    let [registry, plugins, cdi] = kubelet;
    let mut command = tokio::process::Command::new(bin);
    command
        .env("KUBECONFIG", kubeconfig)
        .args(["--node-name", node, "--instance-namespace", namespace])
        .args(["--metrics-address", "127.0.0.1:0"])
        .arg("--registry-dir")
        .arg(registry)
        .arg("--plugins-dir")
        .arg(plugins)
        .arg("--cdi-dir")
        .arg(cdi)
        .arg("--state-dir")
        .arg(dir.join("state"))
        // Its own directory: handler pods mount it, so the state must be elsewhere.
        .arg("--discovery-socket")
        .arg(dir.join("handlers/registration.sock"))
        .arg("--debug-echo-socket")
        .arg(dir.join("echo.sock"))
        .arg("--debug-echo-availability-file")
        .arg(dir.join("availability.txt"))
        .kill_on_drop(true);
    command
}

/// A control plane started with `options` and the akri.sh CRDs (installed before the garbage
/// collector starts, so that it sees a BrokerTemplate's deletion at once, as on a cluster
/// where they were installed long before), a client, and the namespaces `akri` (Instances,
/// the controllers') and `apps` (workloads, brokers), as (control plane, client, akri, apps).
pub async fn akri_and_apps(
    options: ControlPlaneOptions,
) -> (ControlPlane, kube::Client, String, String) {
    crate::test_logs();
    let cp = ControlPlane::start(ControlPlaneOptions {
        crds: akri_api::crds::all(),
        ..options
    })
    .await
    .expect("control plane");
    let client = cp.client().await.expect("client");
    let akri = cp.create_namespace("akri").await.expect("namespace");
    let apps = cp.create_namespace("apps").await.expect("namespace");
    (cp, client, akri, apps)
}

/// The driver-controller (DeviceClasses, shared devices) for the Instances in `namespace`.
pub fn spawn_driver_controller(client: &kube::Client, namespace: &str) -> JoinHandle<()> {
    let mut config = akri_driver_controller::controller::ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    let client = client.clone();
    tokio::spawn(async move {
        akri_driver_controller::controller::run(client, config, Default::default())
            .await
            .expect("driver-controller runs")
    })
}

/// The driver-controller's mirrors of the DiscoveryConfigurations' specs in `namespace`, which
/// node agents read them from ([`akri_api::v1::spec_mirror`]): for the tests that run node
/// agents without the driver-controller ([`spawn_driver_controller`] runs them too).
pub fn spawn_spec_mirror(client: &kube::Client, namespace: &str) -> JoinHandle<()> {
    let config = akri_driver_controller::controller::ControllerConfig::new(namespace);
    tokio::spawn(akri_driver_controller::spec_mirror::run(
        client.clone(),
        namespace.to_string(),
        config.field_manager,
        Default::default(),
    ))
}

/// The driver-controller's freeing of the legacy slots deleted and lost (not Ready past
/// `node_lost_grace`) nodes hold in the Instances of `namespaces`.
pub fn spawn_legacy_slot_freer(
    client: &kube::Client,
    namespaces: &[&str],
    node_lost_grace: Duration,
) -> JoinHandle<()> {
    let config = akri_driver_controller::legacy_slots::LegacySlotsConfig {
        namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
        node_lost_grace,
    };
    tokio::spawn(akri_driver_controller::legacy_slots::run(
        client.clone(),
        config,
        Default::default(),
    ))
}

/// The broker-controller for the Instances in `namespace`, and its metrics.
pub fn spawn_broker_controller(
    client: &kube::Client,
    namespace: &str,
) -> (JoinHandle<()>, akri_broker_controller::metrics::Metrics) {
    spawn_broker_controller_serving(client, namespace, None)
}

/// [`spawn_broker_controller`] serving the BrokerTemplates of `served` namespaces only
/// (`--namespaces`), or of all.
pub fn spawn_broker_controller_serving(
    client: &kube::Client,
    namespace: &str,
    served: Option<&[&str]>,
) -> (JoinHandle<()>, akri_broker_controller::metrics::Metrics) {
    use akri_broker_controller::controller::{self, ControllerConfig};
    let mut config = ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    config.namespaces = served.map(|s| s.iter().map(|n| n.to_string()).collect());
    let metrics = akri_broker_controller::metrics::Metrics::default();
    let task = tokio::spawn(controller::run(client.clone(), config, metrics.clone()));
    (task, metrics)
}

/// The Instances of `configuration` in `namespace` (name -> sorted nodes that reach it), once
/// `ready` says they are all there.
pub async fn instances(
    client: &kube::Client,
    namespace: &str,
    configuration: &str,
    ready: impl Fn(&BTreeMap<String, Vec<String>>) -> bool,
) -> BTreeMap<String, Vec<String>> {
    let api = Api::<Instance>::namespaced(client.clone(), namespace);
    let what = format!("the Instances of {configuration} in {namespace}");
    crate::eventually(&what, async || {
        let list = api.list(&Default::default()).await.ok()?;
        let found: BTreeMap<String, Vec<String>> = list
            .items
            .iter()
            .filter(|i| i.spec.configuration_name == configuration)
            .map(|i| {
                let mut nodes = i.spec.nodes.clone();
                nodes.sort();
                (i.name_any(), nodes)
            })
            .collect();
        ready(&found).then_some(found)
    })
    .await
}
