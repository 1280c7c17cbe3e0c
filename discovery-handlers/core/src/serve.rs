//! Serving `v0.DiscoveryHandler` for a [`Discover`] implementation on a Unix socket.

use crate::health::DiscoveryMetrics;
use crate::proto;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// A discovery handler's discovery, for one configuration at a time.
pub trait Discover: Send + Sync + 'static {
    /// Checks the configuration's `discoveryDetails` and `discoveryProperties` and starts
    /// discovering for it. An error fails this `Discover` call only (the agent shows its
    /// message in the configuration's status and retries); details that are wrong must be
    /// refused here, not discovered with as if empty. Discovery runs on a task of the
    /// handler's own, sending to `lists` until [`DeviceLists::send`] says the agent is gone.
    fn start(&self, request: proto::DiscoverRequest, lists: DeviceLists) -> Result<(), Status>;
}

/// Where a discovery sends its device lists: each list is complete (the protocol has no
/// deltas), and only a list that differs from the last one sent goes out.
#[derive(Debug)]
pub struct DeviceLists {
    tx: mpsc::Sender<Result<proto::DiscoverResponse, Status>>,
    last: Option<Vec<proto::Device>>,
    /// Counted while it is open (a stream), with its last list's devices.
    metrics: Option<DiscoveryMetrics>,
}

impl DeviceLists {
    /// A sink and the stream the agent reads.
    pub fn channel() -> (
        Self,
        ReceiverStream<Result<proto::DiscoverResponse, Status>>,
    ) {
        let (tx, rx) = mpsc::channel(4);
        let lists = DeviceLists {
            tx,
            last: None,
            metrics: None,
        };
        (lists, ReceiverStream::new(rx))
    }

    /// [`channel`](Self::channel), counted in `metrics` while open.
    fn counted(
        metrics: Option<DiscoveryMetrics>,
    ) -> (
        Self,
        ReceiverStream<Result<proto::DiscoverResponse, Status>>,
    ) {
        let (mut lists, stream) = Self::channel();
        if let Some(metrics) = &metrics {
            metrics.streams.inc();
        }
        lists.metrics = metrics;
        (lists, stream)
    }

    fn sent_devices(&self) -> i64 {
        self.last.as_ref().map_or(0, |l| l.len() as i64)
    }

    /// Sends `devices` (sorted by id, so that order never counts as a change) unless they
    /// are what was sent last. False once the agent has gone away: the discovery should stop.
    pub async fn send(&mut self, mut devices: Vec<proto::Device>) -> bool {
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        if self.last.as_ref() == Some(&devices) {
            return !self.tx.is_closed();
        }
        let response = proto::DiscoverResponse {
            devices: devices.clone(),
        };
        if self.tx.send(Ok(response)).await.is_err() {
            return false;
        }
        if let Some(metrics) = &self.metrics {
            metrics.lists.inc();
            metrics
                .devices
                .inc_by(devices.len() as i64 - self.sent_devices());
        }
        self.last = Some(devices);
        true
    }

    /// Ends the stream with an error the agent shows in the configuration's status (it
    /// calls `Discover` again after a backoff).
    pub async fn fail(self, status: Status) {
        let _ = self.tx.send(Err(status)).await;
    }

    /// Completes when the agent has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

impl Drop for DeviceLists {
    fn drop(&mut self) {
        if let Some(metrics) = &self.metrics {
            metrics.streams.dec();
            metrics.devices.dec_by(self.sent_devices());
        }
    }
}

/// Errors of serving a handler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovery handler socket {path}: {cause}")]
    Socket {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Who may call a handler: its user and its group. The node agent connects as the owner (both
/// root) or through the group of the handler's own directory (a non-root handler), which keeps
/// everybody else out.
const SOCKET_MODE: u32 = 0o660;

/// Binds a handler's socket at `socket`: mode 0660, a stale socket file replaced.
pub fn bind(socket: &Path) -> Result<UnixListener, Error> {
    node_io::authority::bind(socket, SOCKET_MODE).map_err(|cause| Error::Socket {
        path: socket.to_path_buf(),
        cause,
    })
}

/// A handler served on a Unix socket. Dropping it stops serving and removes the socket file.
#[derive(Debug)]
pub struct Served {
    socket: PathBuf,
    server: tokio::task::JoinHandle<()>,
}

impl Served {
    /// Serves `handler` on `socket` ([`bind`]). Needs a Tokio
    /// runtime.
    pub fn start<D: Discover>(handler: D, socket: &Path) -> Result<Self, Error> {
        Ok(Served::on(handler, bind(socket)?, socket))
    }

    /// Serves `handler` on `listener`, bound at `socket` by [`bind`]. Needs a Tokio runtime.
    pub fn on<D: Discover>(handler: D, listener: UnixListener, socket: &Path) -> Self {
        Self::counted(handler, listener, socket, None)
    }

    /// [`on`](Self::on), its discovery counted in `metrics` (a handler binary's `/metrics`).
    pub fn counted<D: Discover>(
        handler: D,
        listener: UnixListener,
        socket: &Path,
        metrics: Option<DiscoveryMetrics>,
    ) -> Self {
        let service = proto::discovery_handler_server::DiscoveryHandlerServer::new(Service {
            handler: Arc::new(handler),
            metrics,
        });
        let router = tonic::transport::Server::builder().add_service(service);
        let server = node_io::authority::spawn(listener, router, "discovery handler server");
        Served {
            socket: socket.to_path_buf(),
            server,
        }
    }

    /// Where it serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct Service<D> {
    handler: Arc<D>,
    metrics: Option<DiscoveryMetrics>,
}

#[tonic::async_trait]
impl<D: Discover> proto::discovery_handler_server::DiscoveryHandler for Service<D> {
    type DiscoverStream = ReceiverStream<Result<proto::DiscoverResponse, Status>>;

    async fn discover(
        &self,
        request: Request<proto::DiscoverRequest>,
    ) -> Result<Response<Self::DiscoverStream>, Status> {
        let (lists, stream) = DeviceLists::counted(self.metrics.clone());
        let started = self.handler.start(request.into_inner(), lists);
        if let Some(metrics) = &self.metrics {
            metrics.called(if started.is_ok() { "ok" } else { "refused" });
        }
        started?;
        Ok(Response::new(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    fn device(id: &str) -> proto::Device {
        proto::Device {
            id: id.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn only_changed_lists_go_out_in_id_order() {
        let (mut lists, stream) = DeviceLists::channel();
        assert!(lists.send(vec![device("b"), device("a")]).await);
        assert!(lists.send(vec![device("a"), device("b")]).await);
        assert!(lists.send(vec![device("a")]).await);
        drop(lists);
        let sent: Vec<Vec<String>> = stream
            .map(|r| r.unwrap().devices.into_iter().map(|d| d.id).collect())
            .collect()
            .await;
        assert_eq!(sent, [vec!["a", "b"], vec!["a"]]);
    }

    #[tokio::test]
    async fn a_counted_stream_says_what_it_sent_until_it_closes() {
        let metrics = DiscoveryMetrics::default();
        let (mut lists, _stream) = DeviceLists::counted(Some(metrics.clone()));
        assert_eq!(metrics.streams.get(), 1);
        assert!(lists.send(vec![device("a"), device("b")]).await);
        assert!(lists.send(vec![device("a"), device("b")]).await);
        assert!(lists.send(vec![device("a")]).await);
        assert_eq!((metrics.devices.get(), metrics.lists.get()), (1, 2));
        drop(lists);
        assert_eq!((metrics.streams.get(), metrics.devices.get()), (0, 0));
    }

    #[tokio::test]
    async fn a_gone_agent_stops_the_discovery() {
        let (mut lists, stream) = DeviceLists::channel();
        drop(stream);
        assert!(!lists.send(vec![device("a")]).await);
    }
}
