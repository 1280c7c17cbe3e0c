//! `/metrics`, `/healthz` and `/readyz`.
//!
//! `/healthz` answers as long as the process serves; `/readyz` while this replica's last
//! leader-election call (as leader or as standby) reached the API server in time, so a replica
//! that cannot reach it is not ready.

use crate::metrics::Metrics;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the replica is ready; shared with the code that knows.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Binds `address` and serves until the returned task is aborted.
pub async fn serve(
    address: SocketAddr,
    metrics: Metrics,
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
    Ok((bound, task))
}

fn respond(path: &str, metrics: &Metrics, readiness: &Readiness) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, metrics.encode()),
        "/healthz" | "/livez" => (StatusCode::OK, "ok".to_string()),
        "/readyz" if readiness.get() => (StatusCode::OK, "ok".to_string()),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the last leader-election call did not reach the API server in time"
                .to_string(),
        ),
        _ => (StatusCode::NOT_FOUND, "not found".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}
