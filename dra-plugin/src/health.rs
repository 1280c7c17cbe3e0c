//! Device health for the kubelet: the `v1alpha1.DRAResourceHealth` stream.
//!
//! The kubelet opens `NodeWatchResources` on the driver's socket and keeps the latest
//! snapshot; it shows unhealthy devices in the status of the pods that use them. Each send is
//! the complete current list, so a reconnecting kubelet needs no history.

use akri_proto::dra::health::v1alpha1 as api;
use std::collections::BTreeMap;
use std::pin::Pin;
use tokio::sync::watch;
use tokio_stream::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

/// The health of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    /// Why, for an unhealthy device (e.g. "the discovery handler no longer reports it").
    pub message: String,
    /// Unix seconds of the last change.
    pub since: i64,
}

/// The health of every device of a driver on this node, keyed by (pool, device). Clones share
/// the same state.
#[derive(Clone)]
pub struct HealthReporter {
    devices: watch::Sender<BTreeMap<(String, String), Health>>,
}

impl Default for HealthReporter {
    fn default() -> Self {
        HealthReporter {
            devices: watch::channel(BTreeMap::new()).0,
        }
    }
}

impl HealthReporter {
    /// Records a device's health; subscribers hear only real changes.
    pub fn set(&self, pool: &str, device: &str, healthy: bool, message: &str) {
        self.devices.send_if_modified(|devices| {
            let key = (pool.to_string(), device.to_string());
            match devices.get(&key) {
                Some(h) if h.healthy == healthy && h.message == message => false,
                _ => {
                    devices.insert(
                        key,
                        Health {
                            healthy,
                            message: message.to_string(),
                            since: now(),
                        },
                    );
                    true
                }
            }
        });
    }

    /// Forgets a device (it is no longer published at all).
    pub fn remove(&self, pool: &str, device: &str) {
        self.devices.send_if_modified(|devices| {
            devices
                .remove(&(pool.to_string(), device.to_string()))
                .is_some()
        });
    }

    /// The current health of a device, if known.
    pub fn get(&self, pool: &str, device: &str) -> Option<Health> {
        self.devices
            .borrow()
            .get(&(pool.to_string(), device.to_string()))
            .cloned()
    }

    /// The gRPC service to serve on the driver's socket.
    pub fn service(&self) -> api::dra_resource_health_server::DraResourceHealthServer<Self> {
        api::dra_resource_health_server::DraResourceHealthServer::new(self.clone())
    }

    fn snapshot(devices: &BTreeMap<(String, String), Health>) -> api::NodeWatchResourcesResponse {
        api::NodeWatchResourcesResponse {
            devices: devices
                .iter()
                .map(|((pool, device), health)| api::DeviceHealth {
                    device: Some(api::DeviceIdentifier {
                        pool_name: pool.clone(),
                        device_name: device.clone(),
                    }),
                    health: if health.healthy {
                        api::HealthStatus::Healthy
                    } else {
                        api::HealthStatus::Unhealthy
                    } as i32,
                    last_updated_time: health.since,
                    health_check_timeout_seconds: 0,
                    message: health.message.clone(),
                })
                .collect(),
        }
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

type HealthStream =
    Pin<Box<dyn Stream<Item = Result<api::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl api::dra_resource_health_server::DraResourceHealth for HealthReporter {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<api::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        // WatchStream yields the current value first, then every change.
        let stream =
            WatchStream::new(self.devices.subscribe()).map(|devices| Ok(Self::snapshot(&devices)));
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::dra_resource_health_server::DraResourceHealth;

    #[tokio::test]
    async fn streams_the_current_snapshot_then_changes() {
        let reporter = HealthReporter::default();
        reporter.set("node-a", "dev-0", true, "");
        let mut stream = reporter
            .node_watch_resources(Request::new(api::NodeWatchResourcesRequest {}))
            .await
            .unwrap()
            .into_inner();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 1);
        assert_eq!(first.devices[0].health, api::HealthStatus::Healthy as i32);

        reporter.set("node-a", "dev-0", true, ""); // no change, no message
        reporter.set("node-a", "dev-0", false, "gone");
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(
            second.devices[0].health,
            api::HealthStatus::Unhealthy as i32
        );
        assert_eq!(second.devices[0].message, "gone");
        assert_eq!(
            reporter.get("node-a", "dev-0").map(|h| h.healthy),
            Some(false)
        );

        reporter.remove("node-a", "dev-0");
        assert!(stream.next().await.unwrap().unwrap().devices.is_empty());
    }
}
