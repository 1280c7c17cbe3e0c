//! Device health for the kubelet: the `v1alpha1.DRAResourceHealth` stream.
//!
//! The kubelet opens `NodeWatchResources` on the driver's socket and keeps the latest
//! snapshot; it shows unhealthy devices in the status of the pods that use them. Each send is
//! the complete current list, so a reconnecting kubelet needs no history.
//!
//! The kubelet forgets what it has not heard for a device's health-check timeout (30 s by
//! default) and reports the device's health as Unknown. So the whole list is sent again every
//! [`RESEND_INTERVAL`] although nothing changed, each device with an explicit
//! [`HEALTH_CHECK_TIMEOUT`] of three intervals; a change is sent at once. (Kubernetes 1.36
//! still offers this service as `v1alpha1` only; there is no `v1` to serve yet.)

use kubelet_proto::dra::health::v1alpha1 as api;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// How often the unchanged health of every device is sent again.
pub const RESEND_INTERVAL: Duration = Duration::from_secs(10);
/// The health-check timeout each device is reported with: three resends.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// The health of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// Whether the device is healthy.
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
    resend: Duration,
}

impl Default for HealthReporter {
    fn default() -> Self {
        HealthReporter {
            devices: watch::channel(BTreeMap::new()).0,
            resend: RESEND_INTERVAL,
        }
    }
}

impl HealthReporter {
    /// Resends every `interval` instead of [`RESEND_INTERVAL`] (tests).
    pub fn with_resend_interval(mut self, interval: Duration) -> Self {
        self.resend = interval;
        self
    }

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
                    health_check_timeout_seconds: HEALTH_CHECK_TIMEOUT.as_secs() as i64,
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
        // The current list first, then at every change and every resend interval, until the
        // kubelet goes away.
        let mut devices = self.devices.subscribe();
        let mut resend = tokio::time::interval(self.resend);
        resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = resend.tick() => {}
                    changed = devices.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        resend.reset();
                    }
                    () = tx.closed() => return,
                }
                let snapshot = Self::snapshot(&devices.borrow_and_update());
                if tx.send(Ok(snapshot)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::dra_resource_health_server::DraResourceHealth;
    use tokio_stream::StreamExt;

    /// The stream the kubelet opens.
    async fn watch(reporter: &HealthReporter) -> HealthStream {
        reporter
            .node_watch_resources(Request::new(api::NodeWatchResourcesRequest {}))
            .await
            .unwrap()
            .into_inner()
    }

    #[tokio::test(start_paused = true)]
    async fn resends_the_unchanged_list_within_the_timeout_it_declares() {
        let reporter = HealthReporter::default();
        reporter.set("node-a", "dev-0", true, "");
        let mut stream = watch(&reporter).await;
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(
            first.devices[0].health_check_timeout_seconds,
            HEALTH_CHECK_TIMEOUT.as_secs() as i64
        );
        let start = tokio::time::Instant::now();
        for _ in 0..6 {
            let again = stream.next().await.unwrap().unwrap();
            assert_eq!(again, first, "the same list, nothing having changed");
        }
        let per_send = start.elapsed() / 6;
        assert_eq!(per_send, RESEND_INTERVAL);
        assert!(3 * per_send <= HEALTH_CHECK_TIMEOUT);
    }

    #[tokio::test]
    async fn streams_the_current_snapshot_then_changes() {
        let reporter = HealthReporter::default();
        reporter.set("node-a", "dev-0", true, "");
        let mut stream = watch(&reporter).await;
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
