//! The broker-controller: BrokerTemplates turn discovered devices into running workloads,
//! each bound to its device through a ResourceClaim the scheduler allocates.
//!
//! - [`render`]: one template object for one Instance (`$(AKRI_*)` values, names, the claim).
//! - [`desired`]: every object a template wants now.
//! - [`apply`]: server-side apply of those, deletion of the rest.
//! - [`controller`]: the reconciler and its watches, with status.
//! - [`metrics`]: Prometheus metrics.
//!
//! It reads Instances and never writes them (seed 004): allocation is the scheduler's.

pub mod apply;
pub mod controller;
pub mod desired;
pub mod metrics;
pub mod render;

use akri_runtime::http::Readiness;
use akri_runtime::leader::{self, LeaseConfig};
use controller::ControllerConfig;
use metrics::Metrics;

/// Why the process stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connecting to the API server: {0}")]
    Client(kube::Error),
    #[error("serving /metrics, /healthz and /readyz: {0}")]
    Http(std::io::Error),
    #[error(transparent)]
    Lead(#[from] leader::LeadError),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// The process: the client of its ServiceAccount (or kubeconfig), the metrics and health
/// endpoints on `metrics_address`, then the controller while this replica holds the Lease,
/// until SIGTERM hands the Lease over (a rolling update's new pod takes over at once).
pub fn run_process(
    config: ControllerConfig,
    lease: LeaseConfig,
    metrics_address: std::net::SocketAddr,
) -> Result<(), Error> {
    let main = async move {
        let client = kube::Client::try_default().await.map_err(Error::Client)?;
        let metrics = Metrics::default();
        let readiness = Readiness::default();
        let encoder = metrics.clone();
        let (_, _server) =
            akri_runtime::http::serve(metrics_address, move || encoder.encode(), readiness.clone())
                .await
                .map_err(Error::Http)?;
        let leading = metrics.clone();
        let work = controller::run(client.clone(), config, metrics);
        let stop = leader::stop_signal();
        leader::lead(
            client,
            lease,
            readiness,
            move |l| leading.set_leader(l),
            work,
            stop,
        )
        .await?;
        Ok(())
    };
    akri_runtime::block_on(akri_runtime::Workers::PerCore, main).map_err(Error::Runtime)?
}
