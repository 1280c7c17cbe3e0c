//! The driver-controller binary: flags, logging, metrics endpoint, leader election.

use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::http::{self, Readiness};
use akri_driver_controller::leader::LeaseConfig;
use akri_driver_controller::metrics::Metrics;
use akri_runtime::Switch;
use clap::Parser;
use std::net::SocketAddr;
use std::time::Duration;

/// Cluster-wide DRA controller: DeviceClasses, shared-device ResourceSlices, PropertyFilter
/// compilation.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Namespace the kubelet-plugins write Instances to.
    #[arg(long, env = "AKRI_INSTANCE_NAMESPACE", default_value = "akri")]
    instance_namespace: String,
    /// Namespace of the leader-election Lease (usually the controller's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "akri")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "akri-driver-controller")]
    lease_name: String,
    /// This replica's name (the pod name; the host name when not given). The identity in the
    /// Lease is this name and a random suffix of the process.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds an unrenewed Lease stays taken: how long a standby waits for a dead leader.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Seconds the leader retries a failing renewal before it stops acting (less than the
    /// lease duration).
    #[arg(long, default_value_t = 10)]
    lease_renew_deadline_seconds: u64,
    /// Seconds between renewals (and attempts by standbys).
    #[arg(long, default_value_t = 2)]
    lease_retry_seconds: u64,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,
    /// Milliseconds within which changes are reconciled together.
    #[arg(long, default_value_t = 500)]
    debounce_ms: u64,
    /// Whether the API server keeps consumable capacity (DRAConsumableCapacity): `auto` asks
    /// it with a dry-run probe at start. Set it as the kubelet-plugins' flag of that name, so
    /// shared and node-local devices follow one model.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    consumable_capacity: Switch,
    /// Log as JSON.
    #[arg(long)]
    log_json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    akri_runtime::init_logging(args.log_json);
    let client = kube::Client::try_default().await?;
    let metrics = Metrics::default();
    let readiness = Readiness::default();
    let (_, _server) =
        http::serve(args.metrics_address, metrics.clone(), readiness.clone()).await?;

    let replica = args
        .identity
        .unwrap_or_else(akri_driver_controller::leader::default_replica_name);
    let mut lease = LeaseConfig::new(&args.lease_namespace, &args.lease_name, &replica);
    lease.lease_duration = Duration::from_secs(args.lease_duration_seconds);
    lease.renew_deadline = Duration::from_secs(args.lease_renew_deadline_seconds);
    lease.retry_period = Duration::from_secs(args.lease_retry_seconds);
    let mut config = ControllerConfig::new(&args.instance_namespace);
    config.debounce = Duration::from_millis(args.debounce_ms);
    config.consumable_capacity = args.consumable_capacity.forced();

    tokio::select! {
        result = akri_driver_controller::run_as_leader(client, config, lease, metrics, readiness) => {
            result?;
        }
        stopped = akri_runtime::stopped() => stopped?,
    }
    Ok(())
}
