//! `/metrics`, `/healthz` (`/livez`) and `/readyz` on one plain-HTTP port.
//!
//! `/healthz` answers as long as the process serves; `/readyz` says 503 with the reason the
//! component gave while it is not ready.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Whether the component is ready, and if not why; shared with the code that knows. Starts
/// not ready ("starting"). A note (a part of the component that is off, and why) shows beside
/// either answer.
#[derive(Clone, Debug)]
pub struct Readiness(Arc<Mutex<State>>);

#[derive(Debug)]
struct State {
    not_ready: Option<String>,
    note: Option<String>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness(Arc::new(Mutex::new(State {
            not_ready: Some("starting".into()),
            note: None,
        })))
    }
}

impl Readiness {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().expect("readiness lock")
    }

    pub fn ready(&self) {
        self.state().not_ready = None;
    }

    pub fn not_ready(&self, reason: impl Into<String>) {
        self.state().not_ready = Some(reason.into());
    }

    pub fn is_ready(&self) -> bool {
        self.state().not_ready.is_none()
    }

    /// Why it is not ready; `None` when it is.
    pub fn reason(&self) -> Option<String> {
        self.state().not_ready.clone()
    }

    /// Says on every answer of `/readyz` what is off and why (ready or not).
    pub fn note(&self, note: impl Into<String>) {
        self.state().note = Some(note.into());
    }

    /// What `/readyz` answers: `ok` or `not ready: <reason>`, then `; <note>`.
    fn answer(&self) -> (StatusCode, String) {
        let state = self.state();
        let (status, mut body) = match &state.not_ready {
            None => (StatusCode::OK, "ok".to_string()),
            Some(reason) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {reason}"),
            ),
        };
        if let Some(note) = &state.note {
            body = format!("{body}; {note}");
        }
        (status, body)
    }
}

/// Binds `address` and serves until the returned task is aborted; `metrics` renders the
/// Prometheus text exposition format.
pub async fn serve(
    address: SocketAddr,
    metrics: impl Fn() -> String + Clone + Send + Sync + 'static,
    readiness: Readiness,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (metrics, readiness) = (metrics.clone(), readiness.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<_>| {
                    let response = respond(request.uri().path(), &metrics, &readiness);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                if let Err(error) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%error, "metrics connection");
                }
            });
        }
    });
    tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");
    Ok((bound, task))
}

/// A Prometheus registry in the text exposition format, what `/metrics` serves.
pub fn encode(registry: &prometheus_client::registry::Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)
        .expect("writing to a String cannot fail");
    out
}

fn respond(
    path: &str,
    metrics: &impl Fn() -> String,
    readiness: &Readiness,
) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, metrics()),
        "/healthz" | "/livez" => (StatusCode::OK, "ok".to_string()),
        "/readyz" => readiness.answer(),
        _ => (StatusCode::NOT_FOUND, "not found".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain HTTP/1.1 GET (no client library: in a workspace build reqwest's TLS features
    /// are unified with the test crates', and it then refuses to build without a crypto
    /// provider, although this request never uses TLS).
    async fn get(address: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, body.to_string())
    }

    #[tokio::test]
    async fn readiness_and_metrics_are_served() {
        let readiness = Readiness::default();
        let (address, _server) = serve(
            "127.0.0.1:0".parse().unwrap(),
            || "up 1\n".to_string(),
            readiness.clone(),
        )
        .await
        .unwrap();
        assert_eq!(get(address, "/healthz").await, (200, "ok".into()));
        assert_eq!(
            get(address, "/readyz").await,
            (503, "not ready: starting".into())
        );
        readiness.ready();
        assert_eq!(get(address, "/readyz").await, (200, "ok".into()));
        readiness.not_ready("the API server is unreachable");
        assert_eq!(
            get(address, "/readyz").await,
            (503, "not ready: the API server is unreachable".into())
        );
        readiness.note("DRA is off");
        assert_eq!(
            get(address, "/readyz").await,
            (
                503,
                "not ready: the API server is unreachable; DRA is off".into()
            )
        );
        readiness.ready();
        assert_eq!(
            get(address, "/readyz").await,
            (200, "ok; DRA is off".into())
        );
        assert_eq!(get(address, "/metrics").await, (200, "up 1\n".into()));
        assert_eq!(get(address, "/nothing").await.0, 404);
    }
}
