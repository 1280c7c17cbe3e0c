//! The thin binary around a handler: serve it on `<handlers dir>/<name>.sock`, register it
//! with the node agent on `<handlers dir>/agent-registration.sock` (Akri's layout, so the
//! binary works with Akri's agent as well as ours), keep the registration fresh, and stop on
//! SIGTERM.

use crate::health::Health;
use crate::registration::{self, Endpoint, RegisteredHandler};
use crate::serve::{self, Discover, Served};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a registered handler registers again. Our agent keeps registrations across its
/// restarts; Akri's agent forgets them, and a handler registering again is how it learns
/// them back. Registering again changes nothing on either.
const REREGISTER_EVERY: Duration = Duration::from_secs(30);
/// The longest wait between two failed registrations (the agent not there yet).
const RETRY_AT_MOST: Duration = Duration::from_secs(10);

/// The flags every handler binary has.
#[derive(Clone, Debug, clap::Args)]
pub struct HandlerArgs {
    /// The directory of the agent's registration socket and of this handler's socket
    /// (Akri's `DISCOVERY_HANDLERS_DIRECTORY`).
    #[arg(
        long,
        env = "DISCOVERY_HANDLERS_DIRECTORY",
        default_value = "/var/lib/akri"
    )]
    pub handlers_dir: PathBuf,
    /// The agent's registration socket [default: <handlers-dir>/agent-registration.sock].
    #[arg(long)]
    pub registration_socket: Option<PathBuf>,
    /// Where this handler serves [default: <handlers-dir>/<name>.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Log as JSON.
    #[arg(long)]
    pub log_json: bool,
    /// Serve `/healthz`, `/readyz` (ready once registered with the node agent) and
    /// `/metrics` on this address; none when absent.
    #[arg(long)]
    pub health_address: Option<std::net::SocketAddr>,
}

/// Errors that end a handler binary.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Serve(#[from] serve::Error),
    #[error("waiting for SIGTERM: {0}")]
    Signal(std::io::Error),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// [`run`] on a runtime of its own, the handler made by `make` on it: what a handler library's
/// own `run_process` calls, so that its binary awaits nothing (`akri_runtime::block_on` says
/// why).
pub fn run_process<D: Discover>(
    make: impl FnOnce() -> D,
    name: &str,
    shared: bool,
    args: HandlerArgs,
) -> Result<(), Error> {
    let main = async move { run(make(), name, shared, args).await };
    akri_runtime::block_on(akri_runtime::Workers::PerCore, main).map_err(Error::Runtime)?
}

/// Serves `handler` as `name` until SIGTERM or Ctrl-C, registered with the agent the whole
/// time. Logging is set up here.
pub async fn run<D: Discover>(
    handler: D,
    name: &str,
    shared: bool,
    args: HandlerArgs,
) -> Result<(), Error> {
    akri_runtime::init_logging(args.log_json);
    let socket = args
        .socket
        .unwrap_or_else(|| args.handlers_dir.join(format!("{name}.sock")));
    let registration_socket = args
        .registration_socket
        .unwrap_or_else(|| args.handlers_dir.join("agent-registration.sock"));
    let listener = tokio::select! {
        bound = bind_once_allowed(&socket) => bound?,
        result = akri_runtime::stopped() => return result.map_err(Error::Signal),
    };
    let health = Health::default();
    // Discovery goes on without the endpoints when their address is taken (another process
    // on the node's network): a handler's work is discovery, and the failing probe and this
    // warning say what is wrong.
    let _health_server = match args.health_address {
        Some(address) => {
            let encode = {
                let health = health.clone();
                move || health.encode()
            };
            match akri_runtime::http::serve(address, encode, health.readiness.clone()).await {
                Ok((_, task)) => Some(akri_runtime::AbortOnDrop(task)),
                Err(error) => {
                    tracing::warn!(%address, %error, "cannot serve /healthz, /readyz and /metrics; discovering without them");
                    None
                }
            }
        }
        None => None,
    };
    let served = Served::counted(handler, listener, &socket, Some(health.discovery.clone()));
    tracing::info!(name, socket = %socket.display(), shared, "serving the discovery handler");
    let registered = RegisteredHandler {
        name: name.to_string(),
        endpoint: Endpoint::Uds(socket),
        shared,
    };
    tokio::select! {
        () = keep_registered(registration_socket, registered, &health) => unreachable!(),
        result = akri_runtime::stopped() => result.map_err(Error::Signal)?,
    }
    drop(served);
    Ok(())
}

/// Binds the handler's socket, waiting while its directory refuses this user: the chart's
/// kubelet-plugin gives a handler's own directory the handler's group only once it runs
/// (until then the directory is the kubelet's: root's, 0755).
async fn bind_once_allowed(socket: &Path) -> Result<tokio::net::UnixListener, serve::Error> {
    let mut retry = Duration::from_millis(250);
    loop {
        match serve::bind(socket) {
            Err(serve::Error::Socket { cause, .. })
                if cause.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                tracing::warn!(socket = %socket.display(), %cause, retry_in = ?retry, "waiting for the node agent to give this handler its directory");
                tokio::time::sleep(retry).await;
                // Short: the wait ends when the agent runs, not with a failure mode.
                retry = (retry * 2).min(Duration::from_secs(2));
            }
            bound => return bound,
        }
    }
}

/// Registers now, again every [`REREGISTER_EVERY`], and retries failures with a backoff.
async fn keep_registered(
    registration_socket: PathBuf,
    handler: RegisteredHandler,
    health: &Health,
) {
    let mut retry = Duration::from_millis(250);
    let mut registered = false;
    loop {
        match registration::register(&registration_socket, &handler).await {
            Ok(()) => {
                health.registered();
                if !registered {
                    tracing::info!(socket = %registration_socket.display(), "registered with the node agent");
                }
                registered = true;
                retry = Duration::from_millis(250);
                tokio::time::sleep(REREGISTER_EVERY).await;
            }
            Err(error) => {
                health.not_registered(&format!("{} ({error})", registration_socket.display()));
                tracing::warn!(%error, retry_in = ?retry, "registering with the node agent");
                registered = false;
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_AT_MOST);
            }
        }
    }
}
