//! The broker-controller binary: flags and logging; the process itself is the library's
//! [`akri_broker_controller::run_process`].

use akri_broker_controller::controller::ControllerConfig;
use akri_runtime::leader::LeaseArgs;
use clap::Parser;
use std::time::Duration;

/// Turns BrokerTemplates into workloads bound to their devices through ResourceClaims.
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
    /// Seconds after which every BrokerTemplate is looked at again without a change.
    #[arg(long, default_value_t = 300)]
    resync_seconds: u64,
    /// The namespaces whose BrokerTemplates it serves, comma-separated (it may write only
    /// there); all when none are given.
    #[arg(long, value_delimiter = ',')]
    namespaces: Vec<String>,
    #[command(flatten)]
    process: akri_runtime::ProcessArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    akri_runtime::init_logging(args.process.log_json);
    let lease = args.lease.config("akri-broker-controller");
    let mut config = ControllerConfig::new(&args.instance_namespace);
    config.debounce = Duration::from_millis(args.debounce_ms);
    config.resync = Duration::from_secs(args.resync_seconds);
    if !args.namespaces.is_empty() {
        config.namespaces = Some(args.namespaces.into_iter().collect());
    }
    akri_broker_controller::run_process(config, lease, args.process.metrics_address)?;
    Ok(())
}
