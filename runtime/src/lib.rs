//! What every akri binary runs with, so each `main` is flags and wiring only: one tracing
//! setup ([`init_logging`]), one `/healthz` `/readyz` `/metrics` server ([`http`]), one
//! shutdown signal ([`stopped`]), one leader elector ([`leader`]), one way controllers cache
//! what they read ([`reflect`], [`reflect_as`]).

pub mod http;
pub mod leader;

use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

/// A store of what `api` lists (narrowed by `config`), kept current by the returned stream of
/// touched objects, which a controller watches (`watches_stream`) or polls. Managed fields
/// are dropped: nothing reads them, and they are much of an object's size in memory.
pub fn reflect<K>(
    api: kube::Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    reflect_as(api, config, |mut o: K| {
        kube::ResourceExt::managed_fields_mut(&mut o).clear();
        o
    })
}

/// [`reflect`], keeping (and passing on) `view(object)` instead of each object: for a store of
/// many large objects of which a controller reads little, e.g. the devices of ResourceSlices.
pub fn reflect_as<K, V>(
    api: kube::Api<K>,
    config: watcher::Config,
    view: impl Fn(K) -> V + Send + 'static,
) -> (
    Store<V>,
    impl futures::Stream<Item = Result<V, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
    V: kube::Resource + Clone + Send + Sync + 'static,
    V::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    use futures::TryStreamExt;
    let (store, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .map_ok(move |event| match event {
            watcher::Event::Apply(o) => watcher::Event::Apply(view(o)),
            watcher::Event::Delete(o) => watcher::Event::Delete(view(o)),
            watcher::Event::InitApply(o) => watcher::Event::InitApply(view(o)),
            watcher::Event::Init => watcher::Event::Init,
            watcher::Event::InitDone => watcher::Event::InitDone,
        })
        .reflect(writer)
        .touched_objects();
    (store, stream)
}

/// Whether `store` has been filled by its first LIST, asked without waiting. A reconcile
/// that finds a store not yet listed comes back after [`LISTED_POLL`] instead of waiting.
///
/// Nothing here awaits kube's `Store::wait_until_ready` from more than one task: it keeps
/// one waker (a oneshot receiver's), so of the reconciles waiting there before the first LIST
/// only the one that looked last is woken and the others wait for ever (the driver-controller
/// saw 5 of 10 configurations never reconciled; the broker-controller, a template that never
/// got a status). This asks with `now_or_never`, whose no-op waker takes the place of a
/// waiting task's: a store is asked only where no task waits on it, or where the one that
/// waits is polled again anyway (kube's controller runner, woken by its own queue, waits on
/// the store of the objects it reconciles).
pub fn listed<K>(store: &Store<K>) -> bool
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    use futures::FutureExt;
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// How soon a reconcile that came before its stores were listed ([`listed`]) comes back.
pub const LISTED_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// A flag for an optional API-server feature: `auto` asks the API server at start (the
/// capability probes of `dra_plugin::api_support`), `on` and `off` force the answer, for
/// clusters where the probe cannot be made or an operator wants one model on every node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    #[default]
    Auto,
    #[value(alias = "true")]
    On,
    #[value(alias = "false")]
    Off,
}

impl Switch {
    /// The forced answer; `None` for `auto`.
    pub fn forced(self) -> Option<bool> {
        match self {
            Switch::Auto => None,
            Switch::On => Some(true),
            Switch::Off => Some(false),
        }
    }
}

/// The flags of the components that publish devices (kubelet-plugin: node-local ones;
/// driver-controller: shared ones): what happens to a device that vanishes while a claim
/// holds it (`dra_plugin::vanished`). Set them alike on both.
#[derive(Clone, Debug, clap::Args)]
pub struct VanishedArgs {
    /// Seconds a device that vanished while a pod holds it stays published with a NoSchedule
    /// taint before the taint turns NoExecute and the pods that hold it are evicted.
    #[arg(long, default_value_t = 300)]
    pub vanished_device_grace_seconds: u64,
    /// Whether the API server keeps device taints (DRADeviceTaints): `auto` asks it with a
    /// dry-run probe at start. Without them a vanished device leaves its slice at once.
    #[arg(long, value_enum, default_value_t = Switch::Auto)]
    pub device_taints: Switch,
}

impl VanishedArgs {
    /// The grace before `NoExecute`.
    pub fn grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.vanished_device_grace_seconds)
    }
}

/// A Warning Event on `object`, from `reporter` (`controller`, `instance`): what an operator
/// must hear of even if nobody reads the log (`kubectl describe` and `kubectl events` show
/// it). Best effort: a failure is logged.
pub async fn warn_event(
    client: kube::Client,
    reporter: kube::runtime::events::Reporter,
    object: k8s_openapi::api::core::v1::ObjectReference,
    reason: &str,
    note: String,
) {
    use kube::runtime::events::{Event, EventType, Recorder};
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        // The API server refuses longer notes.
        note: Some(note.chars().take(1024).collect()),
        action: "Start".into(),
        secondary: None,
    };
    if let Err(error) = Recorder::new(client, reporter)
        .publish(&event, &object)
        .await
    {
        tracing::warn!(%error, %reason, "recording a Warning Event failed");
    }
}

/// The flags every akri binary has: where its endpoints are served, and how it logs.
#[derive(Clone, Debug, clap::Args)]
pub struct ProcessArgs {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_address: std::net::SocketAddr,
    /// Log as JSON.
    #[arg(long)]
    pub log_json: bool,
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), as text or as JSON lines.
pub fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.init();
    }
}

/// Completes on Ctrl-C or SIGTERM (what the kubelet sends before it kills a container).
pub async fn stopped() -> std::io::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    tracing::info!("stopping");
    Ok(())
}

/// The Tokio runtime a process runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workers {
    /// Everything on the thread that calls [`block_on`].
    CurrentThread,
    /// This many worker threads.
    Threads(usize),
    /// One worker thread per core (Tokio's default).
    PerCore,
}

/// Runs a process's `main` future to completion on a new Tokio runtime of `workers`.
///
/// A component's library calls this from a plain (not `async`) function, which its binary
/// calls after parsing its flags. Were the binary an `async fn main` awaiting the library, a
/// release build would compile all the async code it reaches a second time, in the binary: it
/// shares no generic or async code between crates. That was 60 to 160 s of CPU per binary and
/// target, a third of the images' build.
pub fn block_on<F: std::future::Future>(workers: Workers, main: F) -> std::io::Result<F::Output> {
    let mut builder = match workers {
        Workers::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Workers::Threads(_) | Workers::PerCore => tokio::runtime::Builder::new_multi_thread(),
    };
    if let Workers::Threads(threads) = workers {
        builder.worker_threads(threads);
    }
    Ok(builder.enable_all().build()?.block_on(main))
}

/// A spawned task that ends with its owner (a controller's side loops, a handler's health
/// server).
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::listed;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, watcher};

    /// Why [`listed`] asks instead of waiting: of two tasks awaiting kube's
    /// `Store::wait_until_ready` before the first LIST, only the second is woken. Should
    /// kube fix this, the test fails and waiting can come back.
    #[tokio::test]
    async fn kube_wakes_only_the_last_waiter_of_a_store() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let first = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await.is_ok() }
        });
        let second = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await.is_ok() }
        });
        // Both wait (a current-thread runtime: each ran to its first await).
        tokio::task::yield_now().await;
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert!(listed(&store));
        assert!(second.await.unwrap(), "the last waiter is woken");
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!first.is_finished(), "the first waiter was woken after all");
        first.abort();
    }
}
