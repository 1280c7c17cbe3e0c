//! The cluster-wide controller of the DRA path: the scheduler allocates; this controller tells
//! it what exists, where, how shareable, and what a filter means.
//!
//! - [`device_class`]: a DeviceClass per DiscoveryConfiguration (with its extended resource
//!   `akri.sh/<name>`) and per PropertyFilter.
//! - [`shared_devices`]: devices seen by several nodes, published once with the nodes that
//!   reach them.
//! - [`property_filter`]: filters compiled to CEL the scheduler evaluates.
//! - [`controller`]: the reconciler tying them together, with status.
//! - [`legacy_slots`]: the legacy device plugins' slots of deleted and lost nodes, freed
//!   (the one part that also runs without DRA).
//! - [`spec_mirror`]: the DiscoveryConfigurations' specs mirrored for the nodes, which so
//!   hear of no status write.
//! - [`leader`]: one active replica, through a Lease (`akri_runtime`'s).
//! - [`metrics`], [`http`]: Prometheus metrics, `/healthz`, `/readyz`.

pub mod controller;
pub mod device_class;
pub mod http;
pub mod legacy_slots;
/// The one leader elector, `akri_runtime`'s.
pub use akri_runtime::leader;
pub mod metrics;
pub mod property_filter;
pub mod shared_devices;
pub mod spec_mirror;

use controller::ControllerConfig;
use http::Readiness;
use leader::LeaseConfig;
use metrics::Metrics;

/// Why the replica stopped acting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Controller(#[from] controller::Error),
    #[error("lost the leader lease; stopping so that only one replica acts")]
    LostLeadership,
    #[error(transparent)]
    Leader(#[from] leader::Error),
    #[error("connecting to the API server: {0}")]
    Client(kube::Error),
    #[error("serving /metrics, /healthz and /readyz: {0}")]
    Http(std::io::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Waits to be the leader, then runs the controller until leadership is lost (an error: the
/// process should exit and come back as a standby), the controller stops, or `stop`
/// completes (the Lease is then handed over). Losing leadership drops the controller at once:
/// nothing of it runs after this returns.
pub async fn run_as_leader(
    client: kube::Client,
    config: ControllerConfig,
    lease: LeaseConfig,
    metrics: Metrics,
    readiness: Readiness,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let leading = metrics.clone();
    let slots = legacy_slots::run(client.clone(), config.legacy_slots.clone(), metrics.clone());
    let working = client.clone();
    let work = async move {
        if !config.dra {
            slots.await;
            return Ok(());
        }
        tokio::select! {
            result = controller::run(working, config, metrics) => result,
            () = slots => Ok(()),
        }
    };
    match leader::lead(
        client,
        lease,
        readiness,
        move |l| leading.set_leader(l),
        work,
        stop,
    )
    .await
    {
        Ok(Some(result)) => result.map_err(Error::from),
        Ok(None) => Ok(()),
        Err(leader::LeadError::Lost) => Err(Error::LostLeadership),
        Err(leader::LeadError::Lease(error)) => Err(Error::Leader(error)),
    }
}

/// The process: the client of its ServiceAccount (or kubeconfig), the metrics and health
/// endpoints on `metrics_address`, then [`run_as_leader`] until SIGTERM hands the Lease over
/// (a rolling update's new pod takes over at once).
pub fn run_process(
    config: ControllerConfig,
    lease: LeaseConfig,
    metrics_address: std::net::SocketAddr,
) -> Result<(), Error> {
    // One worker thread: the controller waits on the API server, and one worker keeps up with
    // 10,000 Instances (the convergence bench publishes them as fast as with two). Each more
    // worker is one more glibc malloc arena, and the default is one per core: 72 MB resident
    // with two instead of 62 at 10,000 Instances, more on a bigger node (docs/performance.md).
    let main = async move {
        let client = kube::Client::try_default().await.map_err(Error::Client)?;
        let metrics = Metrics::default();
        let readiness = Readiness::default();
        let (_, _server) = http::serve(metrics_address, metrics.clone(), readiness.clone())
            .await
            .map_err(Error::Http)?;
        let stop = leader::stop_signal();
        run_as_leader(client, config, lease, metrics, readiness, stop).await
    };
    akri_runtime::block_on(akri_runtime::Workers::Threads(1), main).map_err(Error::Runtime)?
}
