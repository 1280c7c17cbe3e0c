//! akri-kubelet-plugin: the per-node DRA kubelet plugin (DaemonSet). Flags and wiring only;
//! the behaviour lives in the library (`agent`).

use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_kubelet_plugin::discovery::debug_echo::DebugEchoConfig;
use akri_kubelet_plugin::instance_plan::Grace;
use akri_kubelet_plugin::legacy::LegacyOptions;
use akri_runtime::Switch;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// Discovers devices through Akri discovery handlers and serves them to the kubelet as DRA
/// drivers (`<handler>.akri.sh`).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// This node's name (the Node object).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Namespace the Instances are written to.
    #[arg(long, env = "POD_NAMESPACE", default_value = "akri")]
    instance_namespace: String,
    /// This pod's UID (the downward API's `metadata.uid`): during a rolling update the new
    /// pod then serves beside the old one (its own kubelet-plugin sockets, the prepared
    /// claims shared) and takes over when the old one exits. Without it, a second process
    /// waits for the first to exit.
    #[arg(long, env = "POD_UID")]
    pod_uid: Option<String>,
    /// The kubelet's plugin registry directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    registry_dir: PathBuf,
    /// Parent directory of each driver's socket directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins")]
    plugins_dir: PathBuf,
    /// CDI spec directory of the container runtime.
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// Give each container a file with its devices' attributes at the standard path,
    /// /var/run/kubernetes.io/dra-device-attributes/... (KEP-5304, device metadata), through
    /// a CDI bind mount.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    device_metadata: bool,
    /// Checkpoints and discovery-handler registrations (must survive restarts). Never inside
    /// the registration socket's directory, which discovery-handler pods mount.
    #[arg(long, default_value = "/var/lib/akri-kubelet-plugin")]
    state_dir: PathBuf,
    /// Akri's discovery-handler registration socket.
    #[arg(long, default_value = "/var/lib/akri/agent-registration.sock")]
    discovery_socket: PathBuf,
    /// A discovery handler with a directory of its own, NAME[:GID] (repeatable): made beside
    /// the registration socket (`<dir>/NAME/`, mode 0770, group GID, the handler's, which this
    /// process must be in: the chart's supplementalGroups), served registration in, and the
    /// only place NAME registers from. Its pod mounts only that directory, so no other handler
    /// can take its name or replace its socket.
    #[arg(long = "own-handler-directory", value_name = "NAME[:GID]")]
    own_handler_directories: Vec<akri_kubelet_plugin::discovery::registry::OwnDirectory>,
    /// Run the embedded debugEcho discovery handler, serving on this socket.
    #[arg(long)]
    debug_echo_socket: Option<PathBuf>,
    /// The debugEcho availability file ("OFFLINE" hides every device; otherwise one offline
    /// description per line).
    #[arg(long, default_value = "/tmp/debug-echo-availability.txt")]
    debug_echo_availability_file: PathBuf,
    /// Register the embedded debugEcho handler as shared: a description seen from several
    /// nodes is one device that each of them reaches.
    #[arg(long)]
    debug_echo_shared: bool,
    /// Discovery handlers to run inside this process (comma separated), each serving on
    /// <discovery socket's directory>/<name>.sock, instead of DaemonSets of their own: udev
    /// (mount the host's /run/udev), opcua, onvif (needs the cameras' network), static
    /// (devices configurations list by hand; it has no DaemonSet).
    #[arg(long, value_enum, value_delimiter = ',')]
    embed_handlers: Vec<akri_kubelet_plugin::embedded::Embedded>,
    /// Whether the API server keeps consumable capacity (DRAConsumableCapacity): `auto` asks
    /// it with a dry-run probe at start.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    consumable_capacity: Switch,
    /// Whether shared devices the scheduler allocated for this node are checked from here
    /// before their pod is bound (binding conditions, DRADeviceBindingConditions): `auto`
    /// asks the API server with a dry-run probe at start. Set it as the driver-controller's
    /// flag of that name.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    binding_conditions: Switch,
    /// Seconds a shared device's network endpoint may take to accept a connection in its
    /// binding check before the check fails (and the scheduler tries again elsewhere).
    #[arg(long, default_value_t = 5)]
    binding_check_timeout_seconds: u64,
    /// Seconds an Instance of a node-local device outlives its disappearance (flapping
    /// devices).
    #[arg(long, default_value_t = 30)]
    instance_grace_seconds: u64,
    /// Seconds an Instance of a shared (network) device outlives its disappearance from this
    /// node: a rebooting IP camera keeps its Instance and its brokers (Akri: 300).
    #[arg(long, default_value_t = 300)]
    shared_instance_grace_seconds: u64,
    #[command(flatten)]
    vanished: akri_runtime::VanishedArgs,
    /// Seconds a (re)started plugin leaves the node's slices and Instances untouched while it
    /// waits for every configuration's discovery handler to report.
    #[arg(long, default_value_t = 30)]
    startup_wait_seconds: u64,
    /// Seconds a DRA driver may wait for the kubelet to take it (through the registration
    /// socket in --registry-dir) before the plugin is not ready, saying so: a registry
    /// directory no kubelet watches otherwise fails no call, and no pod gets a device.
    #[arg(long, default_value_t = 60)]
    kubelet_registration_timeout_seconds: u64,
    /// Namespaces whose Secrets and ConfigMaps discovery properties may name (comma
    /// separated); empty: any. Match the RoleBindings that grant the reads.
    #[arg(long, value_delimiter = ',')]
    property_namespaces: Vec<String>,
    /// The names of the Secrets (in --property-namespaces) discovery properties may read
    /// (comma separated; given but empty: none); not given: any. Match the Role that grants
    /// reads by name: a reference to another Secret is refused on the node, said in the
    /// configuration's status.
    #[arg(long, value_delimiter = ',')]
    property_secrets: Option<Vec<String>>,
    /// What the devices of each discovery handler kind may bring into containers where their
    /// configuration has no `containerAccess`, as JSON: `{"<handler>": {"deviceNodes":
    /// [{"path": "/dev/ttyUSB", "writable": true}], "mounts": [{"path": "/srv/"}],
    /// "environment": ["BAUD"]}}`. Kinds not named keep the built-in default (udev:
    /// character devices under /dev/, not the host's memory; others: none; each kind its
    /// known properties).
    #[arg(long, value_parser = handler_access, default_value = "{}")]
    handler_container_access: HandlerAccess,
    /// The most Instances this node keeps of one configuration, those within their grace
    /// included: a handler reporting new device ids on every scan (a LAN peer answering
    /// probes with fresh uuids) is bounded, and the configuration's status says so.
    #[arg(long, default_value_t = akri_kubelet_plugin::instance_plan::MAX_INSTANCES_PER_CONFIGURATION)]
    max_instances_per_configuration: usize,
    /// Where this process sees the host's /dev (the chart mounts it read-only): the device
    /// nodes handlers report are resolved there, symlinks and all, before they are checked.
    #[arg(long, default_value = "/dev")]
    host_dev: PathBuf,
    /// Serve DRA (`resource.k8s.io/v1`): DiscoveryConfigurations published as ResourceSlices,
    /// a kubelet plugin per discovery handler. `auto` serves it where the API server serves
    /// resource.k8s.io/v1; where it does not (1.33 and older), or with `off`, the legacy
    /// device plugins (--legacy-device-plugins) run alone.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    dra: Switch,
    /// Also serve Akri v0 Configurations (`akri.sh/v0`) as device plugins, for clusters
    /// without DRA: Instance- and Configuration-level resources sharing `deviceUsage` slots.
    #[arg(long)]
    legacy_device_plugins: bool,
    /// The kubelet's device-plugin directory.
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    device_plugin_dir: PathBuf,
    /// The kubelet's pod-resources socket: which containers hold which slots.
    #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pod_resources_socket: PathBuf,
    /// Seconds a slot with no container behind it stays held before it is freed.
    #[arg(long, default_value_t = 300)]
    slot_reclaim_grace_seconds: u64,
    /// The namespaces whose v0 Configurations the legacy device plugins serve (comma
    /// separated); not given: the Instances' namespace (--instance-namespace) only. A
    /// Configuration elsewhere is ignored, and the log says so.
    #[arg(long, value_delimiter = ',')]
    legacy_namespaces: Vec<String>,
    /// The v0 Configurations' `brokerProperties` names handed to containers (comma
    /// separated); the others are left out, and the log says so. A Configuration's
    /// environment reaches every namespace's pods that ask for its resources.
    #[arg(long, value_delimiter = ',')]
    legacy_broker_property_names: Vec<String>,
    #[command(flatten)]
    process: akri_runtime::ProcessArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.dra != Switch::Off || args.legacy_device_plugins,
        "nothing to serve: --dra=off needs --legacy-device-plugins"
    );
    akri_runtime::init_logging(args.process.log_json);
    let debug_echo = args.debug_echo_socket.map(|socket| DebugEchoConfig {
        availability_file: args.debug_echo_availability_file,
        shared: args.debug_echo_shared,
        ..DebugEchoConfig::new(socket)
    });
    let config = AgentConfig {
        node_name: args.node_name,
        instance_namespace: args.instance_namespace.clone(),
        pod_uid: args.pod_uid.filter(|uid| !uid.is_empty()),
        registry_dir: args.registry_dir,
        plugins_dir: args.plugins_dir,
        cdi_dir: args.cdi_dir,
        device_metadata: args.device_metadata,
        state_dir: args.state_dir,
        discovery_socket: args.discovery_socket,
        own_handler_directories: args.own_handler_directories,
        debug_echo,
        embedded_handlers: args.embed_handlers,
        consumable_capacity: args.consumable_capacity.forced(),
        instance_grace: Grace {
            unshared: Duration::from_secs(args.instance_grace_seconds),
            shared: Duration::from_secs(args.shared_instance_grace_seconds),
        },
        vanished_grace: args.vanished.grace(),
        device_taints: args.vanished.device_taints.forced(),
        startup_wait: Duration::from_secs(args.startup_wait_seconds),
        kubelet_registration_timeout: Duration::from_secs(
            args.kubelet_registration_timeout_seconds,
        ),
        property_namespaces: (!args.property_namespaces.is_empty())
            .then(|| args.property_namespaces.into_iter().collect()),
        property_secrets: (args.property_secrets)
            .map(|names| names.into_iter().filter(|n| !n.is_empty()).collect()),
        handler_access: args.handler_container_access,
        host_dev: args.host_dev,
        max_instances_per_configuration: args.max_instances_per_configuration,
        dra: args.dra.forced(),
        binding_conditions: args.binding_conditions.forced(),
        binding_check_timeout: Duration::from_secs(args.binding_check_timeout_seconds),
        resync: akri_kubelet_plugin::agent::RESYNC,
        legacy: args.legacy_device_plugins.then(|| LegacyOptions {
            device_plugin_dir: args.device_plugin_dir,
            pod_resources_socket: Some(args.pod_resources_socket),
            reclaim_grace: Duration::from_secs(args.slot_reclaim_grace_seconds),
            reclaim_interval: Duration::from_secs(10),
            namespaces: match args.legacy_namespaces.is_empty() {
                true => [args.instance_namespace].into(),
                false => args.legacy_namespaces.into_iter().collect(),
            },
            broker_property_names: (args.legacy_broker_property_names.into_iter())
                .filter(|n| !n.is_empty())
                .collect(),
        }),
    };
    agent::run_process(config, args.process.metrics_address)?;
    Ok(())
}

type HandlerAccess = std::collections::BTreeMap<String, akri_api::v1::ContainerAccess>;

/// Parses `--handler-container-access`.
fn handler_access(json: &str) -> Result<HandlerAccess, String> {
    serde_json::from_str(json)
        .map_err(|e| format!("not a map of handler names to containerAccess: {e}"))
}
