//! A client whose LISTs of some resources are slow: the API server answers at once, the
//! answer reaches the client late, as from a big or busy cluster. Watches, single-object
//! reads and writes are untouched, so only the initial fill of a reflector waits. It also
//! counts the LISTs it sent (with no delay set it only counts).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// A tower layer for `kube::client::ClientBuilder::with_layer`: delays the response of every
/// LIST whose collection path ends with `/<plural>` by that plural's delay.
#[derive(Clone, Debug, Default)]
pub struct SlowLists {
    delays: Vec<(String, Duration)>,
    /// The path of every GET sent but a watch (LISTs among them), shared by the clones.
    sent: Arc<Mutex<Vec<String>>>,
}

impl SlowLists {
    pub fn new() -> Self {
        SlowLists::default()
    }

    /// Delays LISTs of `plural` (e.g. `instances`) by `delay`.
    pub fn delay(mut self, plural: &str, delay: Duration) -> Self {
        self.delays.push((format!("/{plural}"), delay));
        self
    }

    /// A client of `config` with these delays.
    pub fn client(&self, config: kube::Config) -> Result<kube::Client, crate::Error> {
        Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(self)
            .build())
    }

    /// How many LISTs of `plural` the client has sent so far.
    pub fn count(&self, plural: &str) -> usize {
        let suffix = format!("/{plural}");
        let sent = self.sent.lock().expect("LIST log");
        sent.iter().filter(|path| path.ends_with(&suffix)).count()
    }

    /// How many reads (GETs of one object and LISTs, not watches) of paths containing
    /// `fragment` (e.g. `/secrets`) the client has sent so far.
    pub fn reads(&self, fragment: &str) -> usize {
        let sent = self.sent.lock().expect("LIST log");
        sent.iter().filter(|path| path.contains(fragment)).count()
    }

    /// Records the request if it is a LIST, and says how long to hold its answer back.
    fn delay_of<B>(&self, request: &http::Request<B>) -> Duration {
        let watch = request
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        if request.method() != http::Method::GET || watch {
            return Duration::ZERO;
        }
        let path = request.uri().path();
        // Every GET but a watch; `count` tells LISTs by their collection path (a GET of one
        // object ends with its name).
        (self.sent.lock().expect("LIST log")).push(path.to_string());
        self.delays
            .iter()
            .find(|(suffix, _)| path.ends_with(suffix.as_str()))
            .map_or(Duration::ZERO, |(_, delay)| *delay)
    }
}

impl<S> tower::Layer<S> for SlowLists {
    type Service = SlowListsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        SlowListsService {
            inner,
            lists: self.clone(),
        }
    }
}

/// The service of [`SlowLists`].
pub struct SlowListsService<S> {
    inner: S,
    lists: SlowLists,
}

impl<S, B> tower::Service<http::Request<B>> for SlowListsService<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let delay = self.lists.delay_of(&request);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            tokio::time::sleep(delay).await;
            response
        })
    }
}
