//! The per-node Akri DRA kubelet plugin; `main.rs` is the thin binary around this library.

pub mod discovery;

pub mod agent;
pub mod binding_check;
mod config;
mod config_watch;
mod device_health;
mod device_plan;
pub mod discovery_errors;
pub mod dra_sink;
pub mod driver;
pub mod embedded;
mod handler_lease;
pub mod instance_plan;
mod instance_view;
pub mod instances;
mod kubelet_registration;
mod leader;
pub mod legacy;
pub mod metrics;
pub mod node_devices;
pub mod node_discovery;
pub mod node_events;
mod node_loop;
pub mod node_plan;
pub mod properties;
pub mod same_name;
mod sink;
pub mod startup;
pub mod state_dir;
pub mod streams;
pub mod vanished;

use std::time::Duration;

/// How long one API call of the node agent may take. A call on a connection that died
/// silently (a partition, a stalled load balancer) would otherwise wait for the client's read
/// timeout of minutes, and with it every later publication, status and Instance write.
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs one API call, failing it after [`API_CALL_TIMEOUT`].
pub async fn api_call<T>(
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(API_CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|elapsed| Err(kube::Error::Service(Box::new(elapsed))))
}
