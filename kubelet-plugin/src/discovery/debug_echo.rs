//! The embedded `debugEcho` discovery handler, compatible with Akri's, so the whole
//! discovery path runs without hardware.
//!
//! Discovery details are YAML, `descriptions: [foo0, foo1]`; each description is a device
//! with id = the description and the property `DEBUG_ECHO_DESCRIPTION=<description>`, as in
//! Akri. Which devices are online comes from an availability file (format in
//! [`availability`]), polled every [`DebugEchoConfig::poll_interval`]; a new list is sent
//! whenever the result changes, the first one right away.
//!
//! It serves `v0.DiscoveryHandler` on its own Unix socket and registers through the
//! registration socket like any external handler.

pub mod availability;

use super::connect;
use super::handler::{Endpoint, RegisteredHandler};
use akri_proto::discovery::v0 as proto;
use availability::Availability;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The name configurations use, as in Akri.
pub const NAME: &str = "debugEcho";
/// The property carrying a device's description, as in Akri.
pub const DESCRIPTION_PROPERTY: &str = "DEBUG_ECHO_DESCRIPTION";
/// Akri's availability file.
pub const DEFAULT_AVAILABILITY_FILE: &str = "/tmp/debug-echo-availability.txt";
/// How often the availability file is read, by default.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How to run the handler.
#[derive(Clone, Debug)]
pub struct DebugEchoConfig {
    /// Where to serve `v0.DiscoveryHandler`.
    pub socket: PathBuf,
    pub availability_file: PathBuf,
    pub poll_interval: Duration,
    /// Registered as shared (devices visible from several nodes); false by default.
    pub shared: bool,
}

impl DebugEchoConfig {
    /// Serving on `socket`, with Akri's availability file, not shared.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        DebugEchoConfig {
            socket: socket.into(),
            availability_file: DEFAULT_AVAILABILITY_FILE.into(),
            poll_interval: DEFAULT_POLL_INTERVAL,
            shared: false,
        }
    }
}

/// Errors of running the handler.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("debugEcho socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("debugEcho registration: {0}")]
    Register(#[from] connect::Error),
}

/// A served debugEcho handler. Dropping it stops serving and removes the socket file.
#[derive(Debug)]
pub struct DebugEcho {
    handler: RegisteredHandler,
    socket: PathBuf,
    server: tokio::task::JoinHandle<()>,
}

impl DebugEcho {
    /// Serves on `config.socket`, replacing a stale socket file. Needs a Tokio runtime.
    pub fn serve(config: DebugEchoConfig) -> Result<Self, Error> {
        let socket = config.socket.clone();
        let socket_error = |source| Error::Socket {
            path: socket.clone(),
            source,
        };
        let listener = dra_plugin::authority::bind(&socket, dra_plugin::authority::OWNER_ONLY)
            .map_err(socket_error)?;
        let handler = RegisteredHandler {
            name: NAME.to_string(),
            endpoint: Endpoint::Uds(socket.clone()),
            shared: config.shared,
        };
        let service = proto::discovery_handler_server::DiscoveryHandlerServer::new(Service {
            availability_file: config.availability_file,
            poll_interval: config.poll_interval,
        });
        let server = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(dra_plugin::authority::incoming(listener))
                .await;
            if let Err(error) = result {
                tracing::error!(%error, "debugEcho discovery handler stopped");
            }
        });
        tracing::info!(socket = %socket.display(), shared = config.shared, "serving the debugEcho discovery handler");
        Ok(DebugEcho {
            handler,
            socket,
            server,
        })
    }

    /// How it registers.
    pub fn handler(&self) -> &RegisteredHandler {
        &self.handler
    }

    /// Registers through `registration_socket`, like an external handler.
    pub async fn register(&self, registration_socket: &Path) -> Result<(), Error> {
        connect::register(registration_socket, &self.handler).await?;
        Ok(())
    }
}

impl Drop for DebugEcho {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Akri's debugEcho discovery details.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Details {
    descriptions: Vec<String>,
}

struct Service {
    availability_file: PathBuf,
    poll_interval: Duration,
}

#[tonic::async_trait]
impl proto::discovery_handler_server::DiscoveryHandler for Service {
    type DiscoverStream = ReceiverStream<Result<proto::DiscoverResponse, Status>>;

    async fn discover(
        &self,
        request: Request<proto::DiscoverRequest>,
    ) -> Result<Response<Self::DiscoverStream>, Status> {
        let details: Details = serde_yaml::from_str(&request.get_ref().discovery_details)
            .map_err(|e| Status::invalid_argument(format!("debugEcho discovery details: {e}")))?;
        tracing::info!(descriptions = ?details.descriptions, "debugEcho Discover");
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(report(
            details.descriptions,
            self.availability_file.clone(),
            self.poll_interval,
            tx,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Sends the online devices now and whenever they change, until the caller goes away.
async fn report(
    descriptions: Vec<String>,
    availability_file: PathBuf,
    poll_interval: Duration,
    tx: mpsc::Sender<Result<proto::DiscoverResponse, Status>>,
) {
    let mut last = None;
    loop {
        let online = devices(&descriptions, &Availability::read(&availability_file).await);
        if last.as_ref() != Some(&online) {
            tracing::debug!(devices = online.len(), "debugEcho device list changed");
            let response = proto::DiscoverResponse {
                devices: online.clone(),
            };
            if tx.send(Ok(response)).await.is_err() {
                return;
            }
            last = Some(online);
        }
        tokio::select! {
            () = tokio::time::sleep(poll_interval) => {}
            () = tx.closed() => return,
        }
    }
}

fn devices(descriptions: &[String], availability: &Availability) -> Vec<proto::Device> {
    descriptions
        .iter()
        .filter(|d| availability.is_online(d))
        .map(|description| proto::Device {
            id: description.clone(),
            properties: [(DESCRIPTION_PROPERTY.to_string(), description.clone())].into(),
            mounts: Vec::new(),
            device_specs: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_are_akris() {
        let details: Details = serde_yaml::from_str("descriptions:\n- foo0\n- \"foo1\"\n").unwrap();
        assert_eq!(details.descriptions, ["foo0", "foo1"]);
        assert!(serde_yaml::from_str::<Details>("").is_err());
    }

    #[test]
    fn devices_follow_availability() {
        let descriptions = vec!["foo0".to_string(), "foo1".to_string()];
        let all = devices(&descriptions, &Availability::parse(""));
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].id, "foo1");
        assert_eq!(all[1].properties[DESCRIPTION_PROPERTY], "foo1");
        let one = devices(&descriptions, &Availability::parse("foo1\n"));
        assert_eq!(
            one.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
            ["foo0"]
        );
        assert!(devices(&descriptions, &Availability::AllOffline).is_empty());
    }
}
