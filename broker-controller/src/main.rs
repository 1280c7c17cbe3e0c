//! The broker-controller binary: flags, logging, metrics endpoint, leader election.

use akri_broker_controller::controller::{self, ControllerConfig};
use akri_broker_controller::metrics::Metrics;
use akri_runtime::http::Readiness;
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    akri_runtime::init_logging(args.process.log_json);
    let client = kube::Client::try_default().await?;
    let metrics = Metrics::default();
    let readiness = Readiness::default();
    let encoder = metrics.clone();
    let (_, _server) = akri_runtime::http::serve(
        args.process.metrics_address,
        move || encoder.encode(),
        readiness.clone(),
    )
    .await?;
    let lease = args.lease.config("akri-broker-controller");
    let mut config = ControllerConfig::new(&args.instance_namespace);
    config.debounce = Duration::from_millis(args.debounce_ms);
    config.resync = Duration::from_secs(args.resync_seconds);
    if !args.namespaces.is_empty() {
        config.namespaces = Some(args.namespaces.into_iter().collect());
    }

    let leading = metrics.clone();
    let work = controller::run(client.clone(), config, metrics);
    // SIGTERM hands the Lease over (a rolling update's new pod takes over at once).
    let stop = akri_runtime::leader::stop_signal();
    akri_runtime::leader::lead(
        client,
        lease,
        readiness,
        move |l| leading.set_leader(l),
        work,
        stop,
    )
    .await?;
    Ok(())
}
