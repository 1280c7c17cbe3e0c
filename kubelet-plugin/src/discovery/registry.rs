//! The discovery-handler registry: serves Akri's `v0.Registration` on a Unix socket (Akri's
//! default is [`DEFAULT_SOCKET`]), keeps the registered handlers in memory and in a state
//! file (see [`super::state_file`]), and publishes the set through a `watch` channel.
//!
//! A registration under a name already known replaces that handler's endpoint and `shared`
//! flag (one endpoint per name), but only once the endpoint registered before stops
//! answering: while it lives, no other endpoint takes the name (and with it the Secret-derived
//! properties of the name's configurations).
//!
//! A handler may have a directory of its own ([`OwnDirectory`]): the chart's handler pods each
//! mount only theirs, as their `DISCOVERY_HANDLERS_DIRECTORY`, and the agent serves
//! registration in it too. Its name then registers only from there, and always names a socket
//! in it, so no other handler can take the name or replace the socket, live or not. Registering the same thing again changes nothing
//! and wakes no one. Handlers are never dropped because their endpoint fails: the discovery streams
//! retry and report the failure; [`Registry::deregister`] removes one explicitly.

use super::handler::{Endpoint, RegisteredHandler};
use super::state_file;
use akri_proto::discovery::v0 as proto;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{Mutex, watch};
use tonic::{Request, Response, Status};

/// Where Akri's agent serves registration, and so where its handlers look by default.
pub const DEFAULT_SOCKET: &str = "/var/lib/akri/agent-registration.sock";

/// The registration socket's mode: discovery-handler pods (another container, possibly another
/// user in the same group) must connect; nobody else.
pub const SOCKET_MODE: u32 = 0o660;
/// The registration socket's name in a handler's own directory, as Akri's handlers expect it
/// in their `DISCOVERY_HANDLERS_DIRECTORY`.
pub const SOCKET_NAME: &str = "agent-registration.sock";
/// An own directory's mode: its owner (root, the agent) and its group (the handler's) reach
/// into it; nobody else. The group, not the owner, is the handler's: giving the directory away
/// would need CAP_CHOWN, which the agent does not have; joining a group needs only the pod's
/// `supplementalGroups`.
const OWN_DIRECTORY_MODE: u32 = 0o770;
/// The registration socket's mode in an own directory, which already keeps everybody else out:
/// the handler connects whatever its user.
const OWN_SOCKET_MODE: u32 = 0o666;

/// A discovery handler with a directory of its own, `<registration socket's directory>/<name>/`,
/// that only its pod mounts. The agent makes it (mode 0770, group `gid`, the handler's group,
/// which the agent's process must be in when it is not root's) and serves registration in it
/// ([`SOCKET_NAME`]). Given as `name[:gid]` (`gid` defaults to root's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnDirectory {
    pub name: String,
    pub gid: u32,
}

impl std::str::FromStr for OwnDirectory {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (name, gid) = match text.split_once(':') {
            Some((name, gid)) => {
                let gid = gid
                    .parse::<u32>()
                    .map_err(|_| format!("{gid:?} in {text:?} is not a numeric group id"))?;
                (name, gid)
            }
            None => (text, 0),
        };
        akri_devices::validate_handler_name(name)
            .map_err(|reason| format!("handler name {name:?}: {reason}"))?;
        Ok(OwnDirectory {
            name: name.to_string(),
            gid,
        })
    }
}

/// The registered handlers, by name.
pub type Handlers = BTreeMap<String, RegisteredHandler>;

/// Errors of starting the registry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("registration socket {path}: {cause}")]
    Socket {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("discovery handler directory {path}: {cause}")]
    OwnDirectory {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "another process serves the discovery-handler registration socket {path} (a running Akri agent uses the same default path); not taking it over. Stop that process, or give this plugin another path (--discovery-socket; chart value kubeletPlugin.discoveryHandlersDir) and its discovery handlers the same one"
    )]
    InUse { path: PathBuf },
}

/// The registered handlers, served on a registration socket once [`Registry::serve_on`] ran.
/// Dropping it stops serving and removes the socket file; the state file stays for the next
/// start.
#[derive(Debug)]
pub struct Registry {
    socket: PathBuf,
    shared: Arc<Shared>,
    /// The common socket's server, then one per own directory.
    servers: Vec<(PathBuf, tokio::task::JoinHandle<()>)>,
}

#[derive(Debug)]
struct Shared {
    /// The handlers with an own directory: name, directory, owner.
    own: BTreeMap<String, (PathBuf, OwnDirectory)>,
    state_file: PathBuf,
    handlers: watch::Sender<Handlers>,
    /// Orders the state-file writes like the changes they record.
    write: Mutex<()>,
}

/// The handlers recorded in `state_file`; an unreadable file is logged and treated as empty:
/// discovery must start anyway.
fn recorded(state_file: &Path) -> Handlers {
    let known: Handlers = match state_file::load(state_file) {
        Ok(handlers) => handlers
            .into_iter()
            .filter(|h| match akri_devices::validate_handler_name(&h.name) {
                Ok(()) => true,
                Err(reason) => {
                    tracing::warn!(handler = %h.name, %reason, "forgetting a recorded discovery handler whose name is not usable");
                    false
                }
            })
            .map(|h| (h.name.clone(), h))
            .collect(),
        Err(error) => {
            tracing::error!(%error, "ignoring the discovery-handler state file; handlers must register again");
            Handlers::new()
        }
    };
    tracing::info!(
        handlers = ?known.keys().collect::<Vec<_>>(),
        state_file = %state_file.display(),
        "discovery handlers known from the state file"
    );
    known
}

impl Registry {
    /// [`load`](Self::load)s the handlers recorded in `state_file`, then
    /// [`serve_on`](Self::serve_on) `socket`. Needs a Tokio runtime.
    pub fn serve(socket: &Path, state_file: &Path) -> Result<Self, Error> {
        let mut registry = Registry::load(socket, state_file, &[]);
        registry.serve_on()?;
        Ok(registry)
    }

    /// The handlers recorded in `state_file`, not served yet: what a standby process (a
    /// rolling update's new pod, while the old one still serves `socket`) discovers with.
    /// `own` are the handlers with a directory of their own beside `socket`. A recorded
    /// endpoint of theirs outside it (from before they had one) serves until they register
    /// from it, so that an upgrade of the chart keeps their devices.
    pub fn load(socket: &Path, state_file: &Path, own: &[OwnDirectory]) -> Self {
        let parent = socket.parent().unwrap_or(Path::new("/"));
        let own = own
            .iter()
            .map(|o| (o.name.clone(), (parent.join(&o.name), o.clone())))
            .collect();
        Registry {
            socket: socket.to_path_buf(),
            shared: Arc::new(Shared {
                own,
                state_file: state_file.to_path_buf(),
                handlers: watch::Sender::new(recorded(state_file)),
                write: Mutex::new(()),
            }),
            servers: Vec::new(),
        }
    }

    /// Reads the state file again (the process that served the socket until now may have
    /// recorded more), then serves `v0.Registration` on the socket, replacing a stale socket
    /// file and creating its directory; a socket another live process serves is refused
    /// ([`Error::InUse`]).
    pub fn serve_on(&mut self) -> Result<(), Error> {
        if !self.servers.is_empty() {
            return Ok(());
        }
        let socket = &self.socket;
        let socket_error = |cause| Error::Socket {
            path: socket.clone(),
            cause,
        };
        let listener = match node_io::authority::bind_unless_served(socket, SOCKET_MODE) {
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(Error::InUse {
                    path: socket.clone(),
                });
            }
            bound => bound.map_err(socket_error)?,
        };
        let known = recorded(&self.shared.state_file);
        self.shared.handlers.send_if_modified(|handlers| {
            let changed = *handlers != known;
            *handlers = known;
            changed
        });
        let serve = |listener, own| {
            let service = proto::registration_server::RegistrationServer::new(Service {
                shared: self.shared.clone(),
                own,
            });
            let router = tonic::transport::Server::builder().add_service(service);
            dra_plugin::authority::spawn(listener, router, "discovery-handler registration server")
        };
        self.servers.push((socket.clone(), serve(listener, None)));
        tracing::info!(socket = %socket.display(), "serving discovery-handler registration");
        for (name, (dir, owner)) in &self.shared.own {
            // A handler's own directory is the handler's to fill: whatever it put there
            // costs at most its own registration, never the agent's start or another
            // handler's (said in the log, and the handler cannot register until it is
            // put right and the agent restarts).
            let own_socket = dir.join(SOCKET_NAME);
            let served = make_own_directory(dir, owner).and_then(|()| {
                // Staged beside the directory, in ours: see node_io::authority::bind_via.
                let staging = dir.with_file_name(format!(".{name}-{SOCKET_NAME}"));
                node_io::authority::bind_via(&staging, &own_socket, OWN_SOCKET_MODE)
            });
            match served {
                Ok(listener) => {
                    self.servers
                        .push((own_socket.clone(), serve(listener, Some(name.clone()))));
                    tracing::info!(handler = %name, socket = %own_socket.display(), "serving discovery-handler registration in the handler's own directory");
                }
                Err(cause) => {
                    let error = Error::OwnDirectory {
                        path: dir.clone(),
                        cause,
                    };
                    tracing::error!(handler = %name, %error, "not serving registration in the handler's own directory: the handler cannot register");
                }
            }
        }
        Ok(())
    }

    /// The socket handlers register on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The handlers registered now.
    pub fn handlers(&self) -> Handlers {
        self.shared.handlers.borrow().clone()
    }

    /// Changes of the registered set.
    pub fn subscribe(&self) -> watch::Receiver<Handlers> {
        self.shared.handlers.subscribe()
    }

    /// Registers in-process, exactly as a registration over the common socket does.
    pub async fn register(&self, handler: RegisteredHandler) -> Result<(), String> {
        self.shared.register(handler, None).await
    }

    /// Forgets a handler; false if it was not registered.
    pub async fn deregister(&self, name: &str) -> bool {
        let removed = self
            .shared
            .update(|handlers| handlers.remove(name).is_some())
            .await;
        if removed {
            tracing::info!(handler = name, "discovery handler deregistered");
        }
        removed
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        for (socket, server) in &self.servers {
            server.abort();
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// Makes `dir` a directory that only the agent and `owner`'s group reach. Its parent is the
/// agent's, so nobody else can have put a symlink there: changing it by path is safe. Made by
/// the agent or by the kubelet (the handler pod's hostPath), it is root's.
fn make_own_directory(dir: &Path, owner: &OwnDirectory) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::create_dir(dir) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => return Err(error),
        _ => {}
    }
    if !std::fs::symlink_metadata(dir)?.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "exists and is not a directory",
        ));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(OWN_DIRECTORY_MODE))?;
    std::os::unix::fs::chown(dir, None, Some(owner.gid))
}

/// A registration that came through `name`'s own directory `dir`: only `name` registers there,
/// and a socket it names is the file of that name in `dir` (the handler sees `dir` as its
/// `DISCOVERY_HANDLERS_DIRECTORY`, wherever it mounts it).
fn from_own_directory(
    handler: RegisteredHandler,
    name: &str,
    dir: &Path,
) -> Result<RegisteredHandler, String> {
    if handler.name != name {
        return Err(format!(
            "the registration socket in {} registers only discovery handler {name:?}, not {:?}",
            dir.display(),
            handler.name
        ));
    }
    let endpoint = match handler.endpoint {
        Endpoint::Uds(path) => match path.file_name() {
            Some(file) if file != SOCKET_NAME => Endpoint::Uds(dir.join(file)),
            _ => {
                return Err(format!(
                    "discovery handler {name:?}: {} names no socket of its own in its directory",
                    path.display()
                ));
            }
        },
        network => network,
    };
    Ok(RegisteredHandler {
        endpoint,
        ..handler
    })
}

impl Shared {
    /// Records `handler`, which registered through `own`'s directory or (`None`) the common
    /// socket; refuses a name that differs only in case from another handler's (both would be
    /// one DRA driver), a name with an own directory from anywhere else, and, from the common
    /// socket, a name whose registered endpoint is another one that still answers.
    async fn register(&self, handler: RegisteredHandler, own: Option<&str>) -> Result<(), String> {
        let handler = match own.and_then(|name| Some((name, self.own.get(name)?))) {
            Some((name, (dir, _))) => from_own_directory(handler, name, dir)?,
            None => match self
                .own
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(&handler.name))
            {
                Some((name, (dir, _))) => {
                    return Err(format!(
                        "discovery handler {name:?} registers only through its own directory, {}",
                        dir.join(SOCKET_NAME).display()
                    ));
                }
                None => handler,
            },
        };
        let before = self.handlers.borrow().get(&handler.name).cloned();
        if let Some(before) = before
            && own.is_none()
            && before.endpoint != handler.endpoint
            && answers(&before.endpoint).await
        {
            tracing::warn!(handler = %handler.name, registered = %before.endpoint, refused = %handler.endpoint, "refused a second endpoint for a discovery handler whose endpoint still answers");
            return Err(format!(
                "discovery handler {:?} is registered from {}, which still answers; another endpoint ({}) takes the name only once it stops",
                handler.name, before.endpoint, handler.endpoint
            ));
        }
        let (name, endpoint, shared) = (
            handler.name.clone(),
            handler.endpoint.to_string(),
            handler.shared,
        );
        let mut outcome = Ok(None);
        let changed = self
            .update(|handlers| {
                if let Some(other) = handlers
                    .keys()
                    .find(|other| **other != handler.name && other.eq_ignore_ascii_case(&handler.name))
                {
                    outcome = Err(format!(
                        "discovery handler {:?} differs only in case from the registered handler {other:?}; both would be DRA driver {}",
                        handler.name,
                        akri_devices::driver_name(&handler.name)
                    ));
                    return false;
                }
                let previous = handlers.get(&handler.name);
                if previous == Some(&handler) {
                    return false;
                }
                outcome = Ok(previous.map(|p| p.endpoint.to_string()));
                handlers.insert(handler.name.clone(), handler);
                true
            })
            .await;
        match outcome? {
            Some(previous) if changed => {
                tracing::warn!(handler = %name, %previous, %endpoint, shared, "discovery handler registered again from another endpoint; using the new one")
            }
            _ if changed => {
                tracing::info!(handler = %name, %endpoint, shared, "discovery handler registered")
            }
            _ => {
                tracing::debug!(handler = %name, %endpoint, "discovery handler registered again, unchanged")
            }
        }
        Ok(())
    }

    /// Applies `change`; if it changed anything, notifies watchers and rewrites the state
    /// file. A failed write is logged: the registration holds for this run regardless.
    async fn update(&self, change: impl FnOnce(&mut Handlers) -> bool) -> bool {
        let _write = self.write.lock().await;
        if !self.handlers.send_if_modified(change) {
            return false;
        }
        let snapshot: Vec<RegisteredHandler> = self.handlers.borrow().values().cloned().collect();
        let path = self.state_file.clone();
        let saved = tokio::task::spawn_blocking(move || state_file::save(&path, &snapshot)).await;
        match saved {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::error!(%error, "cannot record discovery handlers; they will need to register again after a restart");
            }
            Err(error) => {
                tracing::error!(%error, "writing the discovery-handler state file panicked")
            }
        }
        true
    }
}

struct Service {
    shared: Arc<Shared>,
    /// The handler whose own directory this socket is in; `None` for the common socket.
    own: Option<String>,
}

#[tonic::async_trait]
impl proto::registration_server::Registration for Service {
    async fn register_discovery_handler(
        &self,
        request: Request<proto::RegisterDiscoveryHandlerRequest>,
    ) -> Result<Response<proto::Empty>, Status> {
        let handler = RegisteredHandler::try_from(request.into_inner()).map_err(|error| {
            tracing::warn!(%error, "refused a discovery-handler registration");
            Status::invalid_argument(error.to_string())
        })?;
        let own = self.own.as_deref();
        self.shared.register(handler, own).await.map_err(|error| {
            tracing::warn!(%error, "refused a discovery-handler registration");
            Status::already_exists(error)
        })?;
        Ok(Response::new(proto::Empty {}))
    }

    async fn query_device_info(
        &self,
        _: Request<proto::QueryDeviceInfoRequest>,
    ) -> Result<Response<proto::QueryDeviceInfoResponse>, Status> {
        Err(Status::unimplemented(
            "QueryDeviceInfo is not supported: this agent has no external device inventory to query",
        ))
    }
}

/// How long a registered endpoint has to accept a connection to count as alive.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a handler serves on `endpoint` now (it accepts a gRPC connection).
async fn answers(endpoint: &super::Endpoint) -> bool {
    matches!(
        tokio::time::timeout(ANSWER_TIMEOUT, super::connect::channel(endpoint)).await,
        Ok(Ok(_))
    )
}
