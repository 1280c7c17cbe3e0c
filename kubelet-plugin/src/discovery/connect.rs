//! The client side: gRPC channels to a handler's endpoint.

use super::handler::Endpoint;
use std::path::Path;
use std::time::Duration;
use tonic::transport::Channel;

/// HTTP/2 keepalive on network endpoints, so a vanished host is noticed even while its
/// handler is (legitimately) silent. grpc-go servers answer pings more frequent than every
/// 5 minutes with GOAWAY `too_many_pings`, hence the long interval.
const NETWORK_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(6 * 60);
const NETWORK_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// HTTP/2 keepalive on Unix sockets, so a handler that stops answering (its process wedged
/// or stopped) is noticed within 20 s: its devices' health then decays to Unknown until it
/// answers again. Akri's handlers (Rust, hyper) answer pings at any rate; a handler on
/// grpc-go must allow them (`keepalive.EnforcementPolicy{MinTime: 10 * time.Second}`).
const LOCAL_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const LOCAL_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of connecting to a handler or to a registration socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid network endpoint {endpoint:?}: {cause}")]
    InvalidUri {
        endpoint: String,
        cause: tonic::transport::Error,
    },
    #[error("cannot connect to {endpoint}: {cause}")]
    Connect {
        endpoint: String,
        cause: tonic::transport::Error,
    },
}

/// Connects to `endpoint` (eagerly: a dead endpoint fails here).
pub async fn channel(endpoint: &Endpoint) -> Result<Channel, Error> {
    match endpoint {
        Endpoint::Uds(path) => unix_channel(path).await,
        Endpoint::Network(address) => {
            let uri = if address.contains("://") {
                address.clone()
            } else {
                format!("http://{address}")
            };
            let invalid = |cause| Error::InvalidUri {
                endpoint: address.clone(),
                cause,
            };
            tonic::transport::Endpoint::from_shared(uri)
                .map_err(invalid)?
                .http2_keep_alive_interval(NETWORK_KEEPALIVE_INTERVAL)
                .keep_alive_timeout(NETWORK_KEEPALIVE_TIMEOUT)
                // As below: without it, a connection carrying only the Discover stream is
                // never pinged.
                .keep_alive_while_idle(true)
                .connect()
                .await
                .map_err(|cause| Error::Connect {
                    endpoint: address.clone(),
                    cause,
                })
        }
    }
}

/// Connects to a gRPC server on a Unix socket.
pub async fn unix_channel(path: &Path) -> Result<Channel, Error> {
    let endpoint = tonic::transport::Endpoint::from_static("http://localhost")
        .http2_keep_alive_interval(LOCAL_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(LOCAL_KEEPALIVE_TIMEOUT)
        // hyper counts a connection whose only stream is a long-lived response as idle, and
        // pings an idle one only when told to.
        .keep_alive_while_idle(true);
    dra_plugin::authority::connect_with(endpoint, path)
        .await
        .map_err(|source| Error::Connect {
            endpoint: format!("unix:{}", path.display()),
            cause: source,
        })
}
