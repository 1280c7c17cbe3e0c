//! What the node agent is configured with ([`AgentConfig`]): the binary's flags, or a test's
//! settings ([`AgentConfig::embedded`]).

use crate::discovery::debug_echo::DebugEchoConfig;
use crate::embedded::Embedded;
use crate::instance_plan::Grace;
use crate::legacy::LegacyOptions;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the agent keeps and finds things on the node.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node_name: String,
    /// Namespace the Instances are written to.
    pub instance_namespace: String,
    /// This process's pod UID, for rolling updates: while another agent holds the node (the
    /// pod being replaced), this one stands by, serving its DRA drivers beside it under
    /// sockets of its own and writing nothing else, and leads once that one exits.
    /// Without it, it waits for the other to exit before it starts.
    pub pod_uid: Option<String>,
    /// The kubelet's plugin registry directory.
    pub registry_dir: PathBuf,
    /// Parent of each driver's socket directory (the kubelet's `plugins/`).
    pub plugins_dir: PathBuf,
    /// Where CDI specs are written (the container runtime's CDI spec directory).
    pub cdi_dir: PathBuf,
    /// Give containers each device's metadata file (KEP-5304, [`dra_plugin::metadata`]):
    /// its slice's attributes at the standard path.
    pub device_metadata: bool,
    /// Checkpoints and the handler registrations.
    pub state_dir: PathBuf,
    /// Akri's discovery-handler registration socket.
    pub discovery_socket: PathBuf,
    /// Discovery handlers with a directory of their own beside `discovery_socket`, the only
    /// place their names register from ([`crate::discovery::registry::OwnDirectory`]).
    pub own_handler_directories: Vec<crate::discovery::registry::OwnDirectory>,
    /// Run the embedded debugEcho handler.
    pub debug_echo: Option<DebugEchoConfig>,
    /// Discovery handlers to serve in this process ([`crate::embedded`]), each on
    /// `<discovery socket's directory>/<name>.sock`.
    pub embedded_handlers: Vec<Embedded>,
    /// Whether the API server keeps consumable capacity; `None` asks it at start (a dry-run
    /// probe). Decides, with each configuration's `uniqueDevices`, how capacity > 1 is
    /// modelled ([`akri_devices::Sharing::for_configuration`]).
    pub consumable_capacity: Option<bool>,
    /// How long an Instance outlives its device's disappearance from this node (node-local
    /// and shared devices).
    pub instance_grace: Grace,
    /// The most Instances this node keeps of one configuration (those within their grace
    /// included): a handler reporting new ids on every scan is bounded, and the
    /// configuration's status says so ([`crate::instance_plan::Step::Limited`]).
    pub max_instances_per_configuration: usize,
    /// How long a device that vanished while a claim holds it stays `NoSchedule`-tainted
    /// before the taint turns `NoExecute` ([`dra_plugin::vanished`]).
    pub vanished_grace: Duration,
    /// Whether the API server keeps device taints; `None` asks it at start (a dry-run probe).
    pub device_taints: Option<bool>,
    /// How long a (re)started agent leaves the node's slices and Instances as they are while
    /// it waits for every configuration's discovery to answer ([`StartupGate`]).
    pub startup_wait: Duration,
    /// Namespaces whose Secrets and ConfigMaps discovery properties may name; `None`: any.
    pub property_namespaces: Option<BTreeSet<String>>,
    /// The Secrets (by name, in those namespaces) discovery properties may name; `None`: any.
    pub property_secrets: Option<BTreeSet<String>>,
    /// What the devices of each handler kind may bring into containers where their
    /// configuration does not say (`containerAccess`); other kinds keep the built-in default
    /// ([`crate::discovery::Access::of`]).
    pub handler_access: BTreeMap<String, akri_api::v1::ContainerAccess>,
    /// Where this process sees the host's `/dev/`: the device nodes handlers report are
    /// resolved there ([`crate::discovery::Access::admit`]).
    pub host_dev: PathBuf,
    /// Serve DRA: v1 DiscoveryConfigurations published as ResourceSlices and Instances, a
    /// kubelet plugin per discovery handler ([`crate::dra_sink`]). `None` asks the API server
    /// at start: DRA is off where it serves no `resource.k8s.io/v1` (1.33 and older), and
    /// the legacy device plugins, if asked for, run alone.
    pub dra: Option<bool>,
    /// Also serve `akri.sh/v0` Configurations as device plugins ([`crate::legacy`]).
    pub legacy: Option<LegacyOptions>,
    /// How long a served DRA driver may wait for a kubelet to take it before the agent is
    /// not ready with the reason ([`crate::kubelet_registration`]).
    pub kubelet_registration_timeout: Duration,
    /// Whether shared devices allocated to this node are checked at binding
    /// ([`crate::binding_check`]); `None` asks the API server whether it keeps binding
    /// conditions.
    pub binding_conditions: Option<bool>,
    /// A device's network endpoint that has not accepted a connection after this fails its
    /// binding check.
    pub binding_check_timeout: Duration,
    /// How often the node loop passes without a change (retrying what failed; [`RESYNC`]).
    pub resync: Duration,
}

/// How often the node loop passes without a change, by default.
pub const RESYNC: Duration = Duration::from_secs(30);

impl AgentConfig {
    /// An agent of `node_name` that keeps everything under `dir` (kubelet directories, CDI
    /// specs, state, the registration socket) and runs the embedded debugEcho handler, its
    /// availability file `dir/availability.txt` polled every 100 ms: the agent embedded in a
    /// test or a benchmark. Instances go as soon as their device does, start-up waits at most
    /// 10 s, the capacity model and device taints are asked of the API server, a vanished held
    /// device turns `NoExecute` after 5 minutes, legacy mode is off. Point the
    /// kubelet directories at a kubelet with [`AgentConfig::kubelet_dirs`].
    pub fn embedded(node_name: &str, instance_namespace: &str, dir: &Path) -> Self {
        let mut echo = DebugEchoConfig::new(dir.join("debug-echo.sock"));
        echo.availability_file = dir.join("availability.txt");
        echo.poll_interval = Duration::from_millis(100);
        AgentConfig {
            node_name: node_name.to_string(),
            instance_namespace: instance_namespace.to_string(),
            pod_uid: None,
            registry_dir: dir.join("registry"),
            plugins_dir: dir.join("plugins"),
            cdi_dir: dir.join("cdi"),
            device_metadata: true,
            state_dir: dir.join("state"),
            discovery_socket: dir.join("handlers/agent-registration.sock"),
            own_handler_directories: Vec::new(),
            debug_echo: Some(echo),
            embedded_handlers: Vec::new(),
            consumable_capacity: None,
            instance_grace: Grace::uniform(Duration::ZERO),
            max_instances_per_configuration: crate::instance_plan::MAX_INSTANCES_PER_CONFIGURATION,
            vanished_grace: Duration::from_secs(300),
            device_taints: None,
            startup_wait: Duration::from_secs(10),
            property_namespaces: None,
            property_secrets: None,
            handler_access: BTreeMap::new(),
            host_dev: PathBuf::from("/dev"),
            dra: Some(true),
            legacy: None,
            kubelet_registration_timeout: Duration::from_secs(60),
            binding_conditions: None,
            binding_check_timeout: Duration::from_secs(5),
            resync: RESYNC,
        }
    }

    /// Uses a kubelet's plugin registry, plugins and CDI directories.
    pub fn kubelet_dirs(mut self, registry: PathBuf, plugins: PathBuf, cdi: PathBuf) -> Self {
        self.registry_dir = registry;
        self.plugins_dir = plugins;
        self.cdi_dir = cdi;
        self
    }

    /// The embedded debugEcho handler's settings, for tests to adjust.
    pub fn debug_echo_mut(&mut self) -> &mut DebugEchoConfig {
        self.debug_echo
            .get_or_insert_with(|| DebugEchoConfig::new(self.state_dir.join("debug-echo.sock")))
    }
}
