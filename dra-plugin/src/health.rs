//! Device health for the kubelet: the `DRAResourceHealth` stream, served as `v1` (Kubernetes
//! 1.37, which prefers it) and `v1alpha1` (the kubelets before; read until 1.39), both
//! advertised at registration. The two carry the same messages.
//!
//! The kubelet opens `NodeWatchResources` on the driver's socket and keeps the latest
//! report; it shows unhealthy devices in the status of the pods that use them. A device it
//! has not heard of for its health-check timeout (30 s by default) turns Unknown.
//!
//! The driver vouches for a device with [`HealthReporter::set`] and must do so again at least
//! every [`RESEND_INTERVAL`] while it still knows the device's health. The reporter sends
//! every change at once and every [`RESEND_INTERVAL`] the devices vouched for within the
//! last [`CONFIRMED_FOR`]; a device nobody vouches for any more drops out of the reports,
//! and the kubelet turns it Unknown [`HEALTH_CHECK_TIMEOUT`] later. The library never keeps
//! a device "Healthy" by itself: a driver whose monitor wedges stops vouching, and its
//! devices decay, as with upstream's `kubeletplugin` helper.

use kubelet_proto::dra::health::{v1, v1alpha1};
use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// How often the unchanged health of every device is sent again.
pub const RESEND_INTERVAL: Duration = Duration::from_secs(10);
/// The health-check timeout each device is reported with: three resends.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one [`HealthReporter::set`] keeps a device in the resends: two intervals, so that
/// a driver vouching every interval never misses one by a tick's jitter.
pub const CONFIRMED_FOR: Duration = Duration::from_secs(2 * RESEND_INTERVAL.as_secs());

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

/// A device's health and when the driver last vouched for it.
#[derive(Clone, Debug)]
struct Entry {
    health: Health,
    confirmed: Instant,
}

/// The health of every device of a driver on this node, keyed by (pool, device). Clones share
/// the same state.
#[derive(Clone)]
pub struct HealthReporter {
    devices: watch::Sender<BTreeMap<(String, String), Entry>>,
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
    fn confirmed_for(&self) -> Duration {
        2 * self.resend
    }

    /// Vouches for a device's health, now. Subscribers hear of a change at once, and of a
    /// device vouched for again after it had dropped out of the reports.
    pub fn set(&self, pool: &str, device: &str, healthy: bool, message: &str) {
        let now = Instant::now();
        let confirmed_for = self.confirmed_for();
        self.devices.send_if_modified(|devices| {
            let key = (pool.to_string(), device.to_string());
            match devices.get_mut(&key) {
                Some(e) if e.health.healthy == healthy && e.health.message == message => {
                    let lapsed = now.duration_since(e.confirmed) > confirmed_for;
                    e.confirmed = now;
                    lapsed
                }
                _ => {
                    let health = Health {
                        healthy,
                        message: message.to_string(),
                        since: unix_now(),
                    };
                    devices.insert(
                        key,
                        Entry {
                            health,
                            confirmed: now,
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

    /// The last health recorded for a device, vouched for recently or not.
    #[cfg(test)]
    pub(crate) fn get(&self, pool: &str, device: &str) -> Option<Health> {
        self.devices
            .borrow()
            .get(&(pool.to_string(), device.to_string()))
            .map(|e| e.health.clone())
    }

    /// The gRPC service, `v1` (Kubernetes 1.37 and later).
    pub fn service(&self) -> v1::dra_resource_health_server::DraResourceHealthServer<Self> {
        v1::dra_resource_health_server::DraResourceHealthServer::new(self.clone())
    }

    /// The gRPC service, `v1alpha1` (the kubelets before 1.37).
    pub(crate) fn service_v1alpha1(
        &self,
    ) -> v1alpha1::dra_resource_health_server::DraResourceHealthServer<Self> {
        v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(self.clone())
    }

    /// What to send now: the devices vouched for within [`CONFIRMED_FOR`].
    fn snapshot(
        &self,
        devices: &BTreeMap<(String, String), Entry>,
    ) -> v1::NodeWatchResourcesResponse {
        let now = Instant::now();
        v1::NodeWatchResourcesResponse {
            devices: (devices.iter())
                .filter(|(_, e)| now.duration_since(e.confirmed) <= self.confirmed_for())
                .map(|((pool, device), e)| v1::DeviceHealth {
                    device: Some(v1::DeviceIdentifier {
                        pool_name: pool.clone(),
                        device_name: device.clone(),
                    }),
                    health: if e.health.healthy {
                        v1::HealthStatus::Healthy
                    } else {
                        v1::HealthStatus::Unhealthy
                    } as i32,
                    last_updated_time: e.health.since,
                    health_check_timeout_seconds: HEALTH_CHECK_TIMEOUT.as_secs() as i64,
                    message: e.health.message.clone(),
                })
                .collect(),
        }
    }

    /// The reports of one kubelet stream, each converted by `convert`: the current one
    /// first, then at every change and every resend interval, until the kubelet goes away.
    fn watch<T: Send + 'static>(
        &self,
        convert: fn(v1::NodeWatchResourcesResponse) -> T,
    ) -> Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>> {
        let reporter = self.clone();
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
                let report = reporter.snapshot(&devices.borrow_and_update());
                if tx.send(Ok(convert(report))).await.is_err() {
                    return;
                }
            }
        });
        Box::pin(ReceiverStream::new(rx))
    }
}

/// The same message in `v1alpha1`.
fn to_v1alpha1(report: v1::NodeWatchResourcesResponse) -> v1alpha1::NodeWatchResourcesResponse {
    v1alpha1::NodeWatchResourcesResponse {
        devices: (report.devices.into_iter())
            .map(|d| v1alpha1::DeviceHealth {
                device: d.device.map(|id| v1alpha1::DeviceIdentifier {
                    pool_name: id.pool_name,
                    device_name: id.device_name,
                }),
                health: d.health,
                last_updated_time: d.last_updated_time,
                health_check_timeout_seconds: d.health_check_timeout_seconds,
                message: d.message,
            })
            .collect(),
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

type Reports<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl v1::dra_resource_health_server::DraResourceHealth for HealthReporter {
    type NodeWatchResourcesStream = Reports<v1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.watch(|report| report)))
    }
}

#[tonic::async_trait]
impl v1alpha1::dra_resource_health_server::DraResourceHealth for HealthReporter {
    type NodeWatchResourcesStream = Reports<v1alpha1::NodeWatchResourcesResponse>;

    async fn node_watch_resources(
        &self,
        _: Request<v1alpha1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        Ok(Response::new(self.watch(to_v1alpha1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// The stream a 1.37 kubelet opens.
    async fn watch(reporter: &HealthReporter) -> Reports<v1::NodeWatchResourcesResponse> {
        use v1::dra_resource_health_server::DraResourceHealth;
        reporter
            .node_watch_resources(Request::new(v1::NodeWatchResourcesRequest {}))
            .await
            .unwrap()
            .into_inner()
    }

    fn names(report: &v1::NodeWatchResourcesResponse) -> Vec<&str> {
        (report.devices.iter())
            .map(|d| d.device.as_ref().unwrap().device_name.as_str())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn resends_what_the_driver_vouches_for_within_the_timeout_it_declares() {
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
            reporter.set("node-a", "dev-0", true, ""); // the driver vouches again
            let again = stream.next().await.unwrap().unwrap();
            assert_eq!(again, first, "the same list, nothing having changed");
        }
        let per_send = start.elapsed() / 6;
        assert_eq!(per_send, RESEND_INTERVAL);
        assert!(3 * per_send <= HEALTH_CHECK_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_device_nobody_vouches_for_drops_out_and_returns_when_vouched_for() {
        let reporter = HealthReporter::default();
        reporter.set("node-a", "dev-0", true, "");
        reporter.set("node-a", "dev-1", true, "");
        let mut stream = watch(&reporter).await;
        assert_eq!(
            names(&stream.next().await.unwrap().unwrap()),
            ["dev-0", "dev-1"]
        );
        // Only dev-0 is vouched for from now on (dev-1's monitor wedged).
        let start = tokio::time::Instant::now();
        let dropped = loop {
            reporter.set("node-a", "dev-0", true, "");
            let report = stream.next().await.unwrap().unwrap();
            if names(&report) == ["dev-0"] {
                break start.elapsed();
            }
            assert_eq!(names(&report), ["dev-0", "dev-1"]);
        };
        assert!(
            dropped > CONFIRMED_FOR && dropped <= CONFIRMED_FOR + RESEND_INTERVAL,
            "{dropped:?}"
        );
        // The library's resends alone never bring it back.
        reporter.set("node-a", "dev-0", true, "");
        assert_eq!(names(&stream.next().await.unwrap().unwrap()), ["dev-0"]);
        // Vouched for again: sent at once, not at the next resend.
        let before = tokio::time::Instant::now();
        reporter.set("node-a", "dev-1", true, "");
        assert_eq!(
            names(&stream.next().await.unwrap().unwrap()),
            ["dev-0", "dev-1"]
        );
        assert_eq!(before.elapsed(), Duration::ZERO);
        assert!(reporter.get("node-a", "dev-1").unwrap().healthy);
    }

    /// What a kubelet before 1.37 reads: the same reports in `v1alpha1`.
    #[tokio::test]
    async fn streams_the_current_snapshot_then_changes_in_v1alpha1() {
        use v1alpha1::dra_resource_health_server::DraResourceHealth;
        let reporter = HealthReporter::default();
        reporter.set("node-a", "dev-0", true, "");
        let mut stream = reporter
            .node_watch_resources(Request::new(v1alpha1::NodeWatchResourcesRequest {}))
            .await
            .unwrap()
            .into_inner();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 1);
        assert_eq!(
            first.devices[0].health,
            v1alpha1::HealthStatus::Healthy as i32
        );
        assert_eq!(
            first.devices[0].device.as_ref().unwrap().pool_name,
            "node-a"
        );

        reporter.set("node-a", "dev-0", true, ""); // no change, no message
        reporter.set("node-a", "dev-0", false, "gone");
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(
            second.devices[0].health,
            v1alpha1::HealthStatus::Unhealthy as i32
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
