//! The driver-controller binary: flags and logging; the process itself is the library's
//! [`akri_driver_controller::run_process`].

use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::legacy_slots::LegacySlotsConfig;
use akri_runtime::Switch;
use akri_runtime::leader::LeaseArgs;
use clap::Parser;
use std::time::Duration;

/// Cluster-wide DRA controller: DeviceClasses, shared-device ResourceSlices, PropertyFilter
/// compilation; and the legacy slots of deleted and lost nodes.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Namespace the kubelet-plugins write Instances to.
    #[arg(long, env = "AKRI_INSTANCE_NAMESPACE", default_value = "akri")]
    instance_namespace: String,
    #[command(flatten)]
    lease: LeaseArgs,
    /// Milliseconds within which changes are reconciled together.
    #[arg(long, default_value_t = 500)]
    debounce_ms: u64,
    /// Whether the API server keeps consumable capacity (DRAConsumableCapacity): `auto` asks
    /// it with a dry-run probe at start. Set it as the kubelet-plugins' flag of that name, so
    /// shared and node-local devices follow one model.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    consumable_capacity: Switch,
    /// Whether shared devices wait, at binding, for the chosen node to reach them
    /// (DRADeviceBindingConditions, beta from 1.36): `auto` asks the API server with a
    /// dry-run probe at start. Set it as the kubelet-plugins' flag of that name.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    binding_conditions: Switch,
    #[command(flatten)]
    vanished: akri_runtime::VanishedArgs,
    /// Seconds a node may stay not Ready before shared devices are no longer offered there
    /// (its kubelet-plugin cannot take it out of their Instances; it counts again once Ready).
    #[arg(long, default_value_t = 300)]
    node_lost_grace_seconds: u64,
    /// Whether the cluster serves DRA (resource.k8s.io/v1): `off` (a legacy-only cluster)
    /// runs only the freeing of gone nodes' legacy slots.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    dra: Switch,
    /// The namespaces whose v0 Configurations the kubelet-plugins serve as device plugins
    /// (comma separated; their --legacy-namespaces): the slots deleted and lost nodes hold
    /// in those Instances are freed. None: no slot is.
    #[arg(long, value_delimiter = ',')]
    legacy_namespaces: Vec<String>,
    /// Seconds a node stays not Ready (powered off, its Node object kept) before the legacy
    /// slots it holds are freed.
    #[arg(long, default_value_t = 300)]
    legacy_node_lost_grace_seconds: u64,
    #[command(flatten)]
    process: akri_runtime::ProcessArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    akri_runtime::init_logging(args.process.log_json);
    let lease = args.lease.config("akri-driver-controller");
    let mut config = ControllerConfig::new(&args.instance_namespace);
    config.debounce = Duration::from_millis(args.debounce_ms);
    config.consumable_capacity = args.consumable_capacity.forced();
    config.device_taints = args.vanished.device_taints.forced();
    config.binding_conditions = args.binding_conditions.forced();
    config.vanished_grace = args.vanished.grace();
    config.node_lost_grace = Duration::from_secs(args.node_lost_grace_seconds);
    config.dra = args.dra != Switch::Off;
    config.legacy_slots = LegacySlotsConfig {
        namespaces: args
            .legacy_namespaces
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect(),
        node_lost_grace: Duration::from_secs(args.legacy_node_lost_grace_seconds),
    };
    akri_driver_controller::run_process(config, lease, args.process.metrics_address)?;
    Ok(())
}
