//! What a device plugin decides, and the gRPC service that puts it in front of the kubelet.
//!
//! The kubelet's device manager calls, for every container that requests the resource,
//! `GetPreferredAllocation` (when the plugin offers it) and then `Allocate`, each with one
//! container request; `ListAndWatch` is one long stream per registration that carries every
//! change of the advertised devices.

use kubelet_proto::deviceplugin::v1beta1 as api;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// One advertised device: an id the kubelet hands back in `Allocate`, and whether it may be
/// allocated now.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Device {
    pub id: String,
    pub healthy: bool,
}

impl Device {
    pub fn healthy(id: impl Into<String>) -> Self {
        Device {
            id: id.into(),
            healthy: true,
        }
    }

    pub fn unhealthy(id: impl Into<String>) -> Self {
        Device {
            id: id.into(),
            healthy: false,
        }
    }
}

impl From<&Device> for api::Device {
    fn from(device: &Device) -> Self {
        api::Device {
            id: device.id.clone(),
            health: if device.healthy {
                api::HEALTHY
            } else {
                api::UNHEALTHY
            }
            .to_string(),
            topology: None,
        }
    }
}

/// A device plugin. Errors fail the one request they answer; the kubelet shows their
/// message in the pod's events (an `Allocate` error makes the pod fail admission).
#[tonic::async_trait]
pub trait DevicePlugin: Send + Sync + 'static {
    /// The advertised devices and their changes: `ListAndWatch` sends every new value.
    fn devices(&self) -> watch::Receiver<Vec<Device>>;

    /// Whether the kubelet should ask [`preferred`](Self::preferred) before allocating.
    fn offers_preferred_allocation(&self) -> bool {
        false
    }

    /// The ids this plugin would rather have allocated to one container, `size` of them,
    /// all of `must_include` among them, all from `available`.
    async fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, Status> {
        let mut chosen: Vec<String> = must_include.to_vec();
        for id in available {
            if chosen.len() >= size {
                break;
            }
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        Ok(chosen)
    }

    /// Allocates devices to containers, one response per request, in order.
    async fn allocate(
        &self,
        requests: &[Vec<String>],
    ) -> Result<Vec<api::ContainerAllocateResponse>, Status>;
}

/// The gRPC service of one plugin: [`DevicePlugin`] plus a switch that ends every
/// `ListAndWatch` stream with an empty device list (see [`crate::ServedPlugin::shutdown`]).
pub(crate) struct Service<P> {
    pub(crate) plugin: Arc<P>,
    pub(crate) closing: watch::Sender<bool>,
    /// Told when the kubelet ends a `ListAndWatch` stream this plugin did not end: the
    /// kubelet has dropped the registration (see [`crate::ServedPlugin`]).
    pub(crate) dropped: Arc<tokio::sync::Notify>,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<P: DevicePlugin> api::device_plugin_server::DevicePlugin for Service<P> {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: self.plugin.offers_preferred_allocation(),
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut devices = self.plugin.devices();
        let mut closing = self.closing.subscribe();
        let dropped = self.dropped.clone();
        let stream = async_stream(move |tx| async move {
            loop {
                if *closing.borrow_and_update() {
                    // Leave the kubelet with no devices of this resource (capacity 0) rather
                    // than the last list, which it would keep for its grace period.
                    let _ = tx
                        .send(Ok(api::ListAndWatchResponse { devices: vec![] }))
                        .await;
                    return;
                }
                let list = devices
                    .borrow_and_update()
                    .iter()
                    .map(api::Device::from)
                    .collect();
                let sent = tx.send(Ok(api::ListAndWatchResponse { devices: list }));
                if sent.await.is_err() {
                    dropped.notify_one();
                    return;
                }
                tokio::select! {
                    changed = devices.changed() => if changed.is_err() { return },
                    _ = closing.changed() => {}
                    _ = tx.closed() => {
                        dropped.notify_one();
                        return;
                    }
                }
            }
        });
        Ok(Response::new(stream))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in request.into_inner().container_requests {
            let size = usize::try_from(container.allocation_size)
                .map_err(|_| Status::invalid_argument("negative allocation size"))?;
            let device_ids = self
                .plugin
                .preferred(
                    &container.available_device_ids,
                    &container.must_include_device_ids,
                    size,
                )
                .await?;
            container_responses.push(api::ContainerPreferredAllocationResponse { device_ids });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let requests: Vec<Vec<String>> = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|c| c.devices_ids)
            .collect();
        let container_responses = self.plugin.allocate(&requests).await?;
        if container_responses.len() != requests.len() {
            return Err(Status::internal(format!(
                "the plugin answered {} container requests with {} responses",
                requests.len(),
                container_responses.len()
            )));
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// A stream fed by a task: `body` sends items on the channel it is given.
fn async_stream<F, Fut>(body: F) -> DeviceStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<api::ListAndWatchResponse, Status>>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(body(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
