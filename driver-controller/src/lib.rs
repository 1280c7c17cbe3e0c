//! The cluster-wide controller of the DRA path: the scheduler allocates; this controller tells
//! it what exists, where, how shareable, and what a filter means.
//!
//! - [`device_class`]: a DeviceClass per DiscoveryConfiguration (with its extended resource
//!   `akri.sh/<name>`) and per PropertyFilter.
//! - [`shared_devices`]: devices seen by several nodes, published once with the nodes that
//!   reach them.
//! - [`property_filter`]: filters compiled to CEL the scheduler evaluates.
//! - [`controller`]: the reconciler tying them together, with status.
//! - [`leader`]: one active replica, through a Lease (`akri_runtime`'s).
//! - [`metrics`], [`http`]: Prometheus metrics, `/healthz`, `/readyz`.

pub mod controller;
pub mod device_class;
pub mod http;
/// The one leader elector, `akri_runtime`'s.
pub use akri_runtime::leader;
pub mod metrics;
pub mod property_filter;
pub mod shared_devices;

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
    let work = controller::run(client.clone(), config, metrics);
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
