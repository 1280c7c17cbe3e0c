//! One discovery stream: a `Discover` call to one handler for one configuration, kept alive.
//!
//! [`DiscoveryStream::start`] connects to the handler, calls `Discover` and yields
//! [`DiscoveryEvent::Devices`] with the complete current list each time the handler sends a
//! valid one. When anything goes wrong it yields [`DiscoveryEvent::Error`], for the caller to
//! show in the configuration's status, and reconnects on its own after an exponential
//! backoff ([`StreamConfig::min_backoff`] doubling up to [`StreamConfig::max_backoff`],
//! reset once a reconnected stream delivers a valid list).
//!
//! An `Error` does not mean the devices vanished, only that the list is unknown for now; the
//! caller decides how long to keep the last list (a grace period).
//!
//! A device list that fails [`validate`] (an empty or duplicate id, too many devices) is
//! reported as an error and the stream stays open: the handler's next list may be valid.
//! A message prost cannot decode (e.g. non-UTF-8 in a string) ends the call, so it is
//! reported and the stream reconnects.
//!
//! Hangs: [`StreamConfig::open_timeout`] bounds connecting and the handler's answer to
//! `Discover` (its response headers), not the first device list. Akri's handlers may stay
//! silent for good after answering: ONVIF, for instance, sends a list only when the set of
//! cameras changes, so with no camera it never sends one. A handler on a network endpoint
//! that vanishes while silent is caught by HTTP/2 keepalive (see [`super::connect`]); one on
//! a Unix socket closes the connection when its process dies, and is pinged too, more often,
//! so that one whose process wedges is caught as well.

use super::backoff::Backoff;
use super::connect;
use super::device::{DEFAULT_MAX_DEVICES, DiscoveredDevice, InvalidDevices, validate};
use super::handler::RegisteredHandler;
use akri_proto::discovery::v0 as proto;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Events buffered between the stream's task and its reader.
const EVENT_BUFFER: usize = 16;

/// What to ask a handler for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryRequest {
    /// The configuration's `discoveryDetails`, verbatim (usually YAML).
    pub details: String,
    /// Resolved `discoveryProperties` (Secret/ConfigMap values already read).
    pub properties: BTreeMap<String, Vec<u8>>,
}

/// Timeouts, backoff and limits of a stream.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// Bound on connecting plus the handler's answer to `Discover`.
    pub open_timeout: Duration,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Lists with more devices are refused.
    pub max_devices: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            open_timeout: Duration::from_secs(10),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            max_devices: DEFAULT_MAX_DEVICES,
        }
    }
}

/// What a stream yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiscoveryEvent {
    /// The handler's complete current device list, validated, sorted by id.
    Devices(Vec<DiscoveredDevice>),
    /// Something went wrong; the stream retries on its own.
    Error(StreamError),
}

/// Why a stream has no device list right now. Its `Display` is meant for a status message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("discovery handler {handler}: {message}")]
    Connect { handler: String, message: String },
    #[error("discovery handler {handler} at {endpoint} did not answer Discover within {timeout:?}")]
    Timeout {
        handler: String,
        endpoint: String,
        timeout: Duration,
    },
    #[error("discovery handler {handler}: Discover failed: {code:?}: {message}")]
    Status {
        handler: String,
        code: tonic::Code,
        message: String,
    },
    #[error("discovery handler {handler} ended its Discover stream")]
    Ended { handler: String },
    #[error("discovery handler {handler} sent an invalid device list: {cause}")]
    InvalidDevices {
        handler: String,
        cause: InvalidDevices,
    },
}

/// A running discovery stream; read it with [`DiscoveryStream::next_event`] or as a
/// [`tokio_stream::Stream`]. Dropping it ends the `Discover` call.
#[derive(Debug)]
pub struct DiscoveryStream {
    events: mpsc::Receiver<DiscoveryEvent>,
    task: JoinHandle<()>,
}

impl DiscoveryStream {
    /// Starts discovering with `handler`. Needs a Tokio runtime.
    pub fn start(
        handler: RegisteredHandler,
        request: DiscoveryRequest,
        config: StreamConfig,
    ) -> Self {
        let (tx, events) = mpsc::channel(EVENT_BUFFER);
        let task = tokio::spawn(run(handler, request, config, tx));
        DiscoveryStream { events, task }
    }

    /// The next event; never `None` while the stream lives.
    pub async fn next_event(&mut self) -> Option<DiscoveryEvent> {
        self.events.recv().await
    }
}

impl tokio_stream::Stream for DiscoveryStream {
    type Item = DiscoveryEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_recv(cx)
    }
}

impl Drop for DiscoveryStream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How one connection ended.
enum SessionEnd {
    /// Nobody reads the events any more.
    Closed,
    Failed {
        error: StreamError,
        /// A valid list came through on this connection.
        delivered: bool,
    },
}

async fn run(
    handler: RegisteredHandler,
    request: DiscoveryRequest,
    config: StreamConfig,
    tx: mpsc::Sender<DiscoveryEvent>,
) {
    let mut backoff = Backoff::new(config.min_backoff, config.max_backoff);
    let request = proto::DiscoverRequest {
        discovery_details: request.details,
        discovery_properties: request
            .properties
            .into_iter()
            .map(|(k, v)| (k, proto::ByteData { vec: Some(v) }))
            .collect(),
    };
    loop {
        let (error, delivered) = match session(&handler, &request, &config, &tx).await {
            SessionEnd::Closed => return,
            SessionEnd::Failed { error, delivered } => (error, delivered),
        };
        if delivered {
            backoff.reset();
        }
        let delay = backoff.next_delay();
        tracing::warn!(
            handler = %handler.name,
            endpoint = %handler.endpoint,
            %error,
            retry_in = ?delay,
            "discovery stream failed"
        );
        if tx.send(DiscoveryEvent::Error(error)).await.is_err() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = tx.closed() => return,
        }
    }
}

async fn session(
    handler: &RegisteredHandler,
    request: &proto::DiscoverRequest,
    config: &StreamConfig,
    tx: &mpsc::Sender<DiscoveryEvent>,
) -> SessionEnd {
    let name = &handler.name;
    let failed = |error| SessionEnd::Failed {
        error,
        delivered: false,
    };
    let open = async {
        let channel =
            connect::channel(&handler.endpoint)
                .await
                .map_err(|e| StreamError::Connect {
                    handler: name.clone(),
                    message: error_chain(&e),
                })?;
        proto::discovery_handler_client::DiscoveryHandlerClient::new(channel)
            .discover(request.clone())
            .await
            .map_err(|status| status_error(name, &status))
    };
    let opened = tokio::select! {
        opened = tokio::time::timeout(config.open_timeout, open) => opened,
        () = tx.closed() => return SessionEnd::Closed,
    };
    let mut stream = match opened {
        Err(_) => {
            return failed(StreamError::Timeout {
                handler: name.clone(),
                endpoint: handler.endpoint.to_string(),
                timeout: config.open_timeout,
            });
        }
        Ok(Err(error)) => return failed(error),
        Ok(Ok(response)) => response.into_inner(),
    };
    tracing::debug!(handler = %name, endpoint = %handler.endpoint, "discovery stream open");
    let mut delivered = false;
    loop {
        let message = tokio::select! {
            message = stream.message() => message,
            () = tx.closed() => return SessionEnd::Closed,
        };
        let event = match message {
            Ok(Some(response)) => match validate(response.devices, config.max_devices) {
                Ok(devices) => {
                    tracing::debug!(handler = %name, devices = devices.len(), "device list received");
                    delivered = true;
                    DiscoveryEvent::Devices(devices)
                }
                Err(cause) => {
                    tracing::warn!(handler = %name, error = %cause, "invalid device list refused");
                    DiscoveryEvent::Error(StreamError::InvalidDevices {
                        handler: name.clone(),
                        cause,
                    })
                }
            },
            Ok(None) => {
                return SessionEnd::Failed {
                    error: StreamError::Ended {
                        handler: name.clone(),
                    },
                    delivered,
                };
            }
            Err(status) => {
                return SessionEnd::Failed {
                    error: status_error(name, &status),
                    delivered,
                };
            }
        };
        if tx.send(event).await.is_err() {
            return SessionEnd::Closed;
        }
    }
}

fn status_error(handler: &str, status: &tonic::Status) -> StreamError {
    StreamError::Status {
        handler: handler.to_string(),
        code: status.code(),
        message: with_sources(
            status.message().to_string(),
            std::error::Error::source(status),
        ),
    }
}

/// An error and its sources, `: `-separated (tonic's transport errors say little on top).
fn error_chain(error: &dyn std::error::Error) -> String {
    with_sources(error.to_string(), error.source())
}

/// `text` followed by what `source` and its sources add to it. Sources often repeat the end
/// of the text before them ("h2 error: reading a body" + "reading a body: broken pipe"), so
/// only the new part is appended.
fn with_sources(mut text: String, mut source: Option<&dyn std::error::Error>) -> String {
    while let Some(error) = source {
        let next = error.to_string();
        if !text.contains(&next) {
            let overlap = std::iter::once(0)
                .chain(text.match_indices(": ").map(|(i, _)| i + 2))
                .find(|&i| next.starts_with(&text[i..]));
            match overlap {
                Some(i) => {
                    let added = next[text.len() - i..].to_string();
                    text.push_str(&added);
                }
                None => {
                    text.push_str(": ");
                    text.push_str(&next);
                }
            }
        }
        source = error.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Chain(&'static str, Option<Box<Chain>>);

    impl std::fmt::Display for Chain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Chain {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|c| c as _)
        }
    }

    #[test]
    fn sources_add_only_what_is_new() {
        let error = Chain(
            "transport error",
            Some(Box::new(Chain(
                "reading a body",
                Some(Box::new(Chain(
                    "reading a body: broken pipe",
                    Some(Box::new(Chain("broken pipe", None))),
                ))),
            ))),
        );
        assert_eq!(
            error_chain(&error),
            "transport error: reading a body: broken pipe"
        );
    }
}
