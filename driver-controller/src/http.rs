//! `/metrics`, `/healthz` and `/readyz`: the one server of `akri_runtime::http`, with the
//! driver-controller's metrics. `/readyz` is ready while this replica's last leader-election
//! call (as leader or as standby) reached the API server in time, so a replica that cannot
//! reach it is not ready.

use crate::metrics::Metrics;
pub use akri_runtime::http::Readiness;
use std::net::SocketAddr;

/// Binds `address` and serves until the returned task is aborted.
pub async fn serve(
    address: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    akri_runtime::http::serve(address, move || metrics.encode(), readiness).await
}
