//! The cluster-wide controller of the DRA path: the scheduler allocates; this controller tells
//! it what exists, where, how shareable, and what a filter means.
//!
//! - [`device_class`]: a DeviceClass per DiscoveryConfiguration (with its extended resource
//!   `akri.sh/<name>`) and per PropertyFilter.
//! - [`shared_devices`]: devices seen by several nodes, published once with the nodes that
//!   reach them.
//! - [`property_filter`]: filters compiled to CEL the scheduler evaluates.
//! - [`controller`]: the reconciler tying them together, with status.
//! - [`leader`]: one active replica, through a Lease.
//! - [`metrics`], [`http`]: Prometheus metrics, `/healthz`, `/readyz`.

pub mod controller;
pub mod device_class;
pub mod http;
pub mod leader;
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
/// process should exit and come back as a standby) or the controller stops. Losing
/// leadership drops the controller at once: nothing of it runs after this returns.
pub async fn run_as_leader(
    client: kube::Client,
    config: ControllerConfig,
    lease: LeaseConfig,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<(), Error> {
    lease.validate()?;
    let mut leadership = leader::acquire(client.clone(), lease, move |reached| {
        if reached {
            readiness.ready();
        } else {
            readiness
                .not_ready("the last leader-election call did not reach the API server in time");
        }
    })
    .await;
    metrics.set_leader(true);
    let result = tokio::select! {
        result = controller::run(client, config, metrics.clone()) => result.map_err(Error::from),
        _ = leadership.lost() => Err(Error::LostLeadership),
    };
    metrics.set_leader(false);
    if !matches!(result, Err(Error::LostLeadership)) {
        leadership.release().await;
    }
    result
}
