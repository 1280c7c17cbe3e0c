//! A served device plugin: its socket in the kubelet's device-plugin directory, and its
//! registration, kept across kubelet restarts.
//!
//! A starting kubelet empties the device-plugin directory (all but its checkpoint) and
//! creates a new `kubelet.sock`; plugins are expected to notice and register again. Every
//! second the plugin checks that its socket is still there (serving it again if not) and
//! that `kubelet.sock` is the one it registered with, and registers when either changed.
//!
//! It also registers again at once when the kubelet ends its `ListAndWatch` stream: the
//! kubelet has dropped the registration. That is how a rolling update's new process keeps
//! its resources on kubelets before 1.37. There, the kubelet keeps one client per resource
//! name; when the old process exits, the end of the old client's stream disconnects the
//! newest client, the new process's. From 1.37 on the kubelet keeps a client per socket and
//! promotes the remaining one, so with sockets of their own (a per-process socket name) the
//! hand-over has no gap at all.

use crate::plugin::{DevicePlugin, Service};
use kubelet_proto::deviceplugin::v1beta1 as api;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often the sockets are checked.
const CHECK: Duration = Duration::from_secs(1);
/// How long one registration call may take.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`ServedPlugin::shutdown`] waits for the kubelet to receive the empty list.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

/// Where a plugin lives and what it offers.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// The kubelet's device-plugin directory (`/var/lib/kubelet/device-plugins`): the
    /// kubelet's `kubelet.sock` is there, and the plugin's socket goes there.
    pub dir: PathBuf,
    /// The extended resource, e.g. `example.com/camera`.
    pub resource_name: String,
    /// The plugin's socket file name in `dir`.
    pub socket_name: String,
}

/// Errors of starting a plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("device plugin socket {path}: {cause}")]
    Socket {
        path: PathBuf,
        cause: std::io::Error,
    },
}

/// Errors of one registration attempt.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    #[error("cannot reach the kubelet at {path}: {cause}")]
    Connect {
        path: PathBuf,
        cause: tonic::transport::Error,
    },
    #[error("the kubelet refused the registration: {0}")]
    Refused(tonic::Status),
    #[error("the kubelet did not answer the registration within {0:?}")]
    TimedOut(Duration),
}

/// A served plugin. Dropping it stops serving at once and removes its socket;
/// [`shutdown`](Self::shutdown) first tells the kubelet the resource has no devices left.
pub struct ServedPlugin {
    resource_name: String,
    socket: PathBuf,
    closing: watch::Sender<bool>,
    registrations: watch::Receiver<u64>,
    keeper: tokio::task::JoinHandle<()>,
}

impl ServedPlugin {
    /// Serves `plugin` on `<dir>/<socket_name>` and keeps it registered for `resource_name`.
    pub fn start<P: DevicePlugin>(config: &PluginConfig, plugin: Arc<P>) -> Result<Self, Error> {
        let socket = config.dir.join(&config.socket_name);
        let (closing, _) = watch::channel(false);
        let service = Service {
            plugin,
            closing: closing.clone(),
            dropped: Arc::default(),
        };
        let server = serve(&socket, service.clone_service())?;
        let (registered, registrations) = watch::channel(0);
        let keeper = tokio::spawn(keep_registered(config.clone(), service, server, registered));
        tracing::info!(resource = %config.resource_name, socket = %socket.display(), "serving device plugin");
        Ok(ServedPlugin {
            resource_name: config.resource_name.clone(),
            socket,
            closing,
            registrations,
            keeper,
        })
    }

    /// The extended resource this plugin serves.
    pub fn resource_name(&self) -> &str {
        &self.resource_name
    }

    /// The plugin's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// How many times the kubelet accepted the registration (once per kubelet start).
    pub fn registrations(&self) -> watch::Receiver<u64> {
        self.registrations.clone()
    }

    /// Stops the plugin the way a removed resource should go: every `ListAndWatch` stream
    /// gets an empty device list (the node's capacity of the resource drops to 0 at once,
    /// instead of the last list staying allocatable for the kubelet's grace period), then
    /// the streams end and the socket goes.
    pub async fn shutdown(self) {
        self.closing.send_replace(true);
        let _ = tokio::time::timeout(SHUTDOWN_WAIT, self.closing.closed()).await;
    }
}

impl Drop for ServedPlugin {
    fn drop(&mut self) {
        // The keeper owns the server task and aborts it when dropped.
        self.keeper.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl<P> Service<P> {
    fn clone_service(&self) -> Service<P> {
        Service {
            plugin: self.plugin.clone(),
            closing: self.closing.clone(),
            dropped: self.dropped.clone(),
        }
    }
}

/// Aborts the task when dropped.
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn serve<P: DevicePlugin>(socket: &Path, service: Service<P>) -> Result<Task, Error> {
    let router = tonic::transport::Server::builder()
        .add_service(api::device_plugin_server::DevicePluginServer::new(service));
    let served = node_io::authority::serve(
        socket,
        node_io::authority::OWNER_ONLY,
        router,
        "device plugin server",
    );
    let server = served.map_err(|cause| Error::Socket {
        path: socket.to_path_buf(),
        cause,
    })?;
    Ok(Task(server))
}

/// The identity of a socket file (its inode), to notice one being replaced.
fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

async fn keep_registered<P: DevicePlugin>(
    config: PluginConfig,
    service: Service<P>,
    server: Task,
    registrations: watch::Sender<u64>,
) {
    let mut server = Some(server);
    let socket = config.dir.join(&config.socket_name);
    let kubelet_socket = config.dir.join(api::KUBELET_SOCKET);
    let options = api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: service.plugin.offers_preferred_allocation(),
    };
    // The inodes of our socket and of kubelet.sock at the last successful registration.
    let mut registered_with: Option<(u64, u64)> = None;
    let mut failing = false;
    let mut interval = tokio::time::interval(CHECK);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = service.dropped.notified() => if registered_with.take().is_some() {
                tracing::info!(resource = %config.resource_name, "the kubelet ended the device list stream; registering again");
            },
        }
        if inode(&socket).is_none() {
            tracing::info!(resource = %config.resource_name, "device plugin socket gone (kubelet restarted?); serving it again");
            match serve(&socket, service.clone_service()) {
                Ok(fresh) => drop(server.replace(fresh)),
                Err(error) => {
                    tracing::warn!(%error, "cannot serve the device plugin again; retrying");
                    continue;
                }
            }
        }
        let (Some(ours), Some(kubelet)) = (inode(&socket), inode(&kubelet_socket)) else {
            continue; // the kubelet is not up yet
        };
        if registered_with == Some((ours, kubelet)) {
            continue;
        }
        match register(&kubelet_socket, &config, options).await {
            Ok(()) => {
                tracing::info!(resource = %config.resource_name, "registered with the kubelet");
                registered_with = Some((ours, kubelet));
                failing = false;
                registrations.send_modify(|n| *n += 1);
            }
            Err(error) if !failing => {
                tracing::warn!(resource = %config.resource_name, %error, "registering with the kubelet failed; retrying every second");
                failing = true;
            }
            Err(_) => {}
        }
    }
}

async fn register(
    kubelet_socket: &Path,
    config: &PluginConfig,
    options: api::DevicePluginOptions,
) -> Result<(), RegisterError> {
    let call = async {
        let channel = node_io::authority::connect(kubelet_socket)
            .await
            .map_err(|cause| RegisterError::Connect {
                path: kubelet_socket.to_path_buf(),
                cause,
            })?;
        api::registration_client::RegistrationClient::new(channel)
            .register(api::RegisterRequest {
                version: api::VERSION.to_string(),
                endpoint: config.socket_name.clone(),
                resource_name: config.resource_name.clone(),
                options: Some(options),
            })
            .await
            .map_err(RegisterError::Refused)?;
        Ok(())
    };
    tokio::time::timeout(REGISTER_TIMEOUT, call)
        .await
        .unwrap_or(Err(RegisterError::TimedOut(REGISTER_TIMEOUT)))
}
