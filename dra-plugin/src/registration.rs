//! The plugin-registration socket: how the kubelet's plugin watcher finds a DRA driver.
//!
//! The watcher notices `<registry dir>/<name>.sock`, calls `GetInfo` (type `DRAPlugin`, the
//! driver name, the service socket, the gRPC versions served) and reports back through
//! `NotifyRegistrationStatus`.

use kubelet_proto::pluginregistration as api;
use std::path::{Path, PathBuf};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// What the driver tells the kubelet about itself.
#[derive(Clone, Debug)]
pub struct PluginInfo {
    /// The DRA driver name (a DNS subdomain, as in ResourceSlices).
    pub driver_name: String,
    /// Absolute path of the socket serving `DRAPlugin` (and the health service).
    pub endpoint: PathBuf,
    /// gRPC services served there, e.g. `v1.DRAPlugin`, `v1beta1.DRAPlugin`.
    pub supported_versions: Vec<String>,
}

/// The registration socket's file name: `<driver>-reg.sock`, or with a pod's UID
/// `<driver>-<pod UID>-reg.sock`, as upstream's helper names them, so that two plugin pods
/// of one driver (a rolling update) register side by side. The kubelet accepts both since
/// Kubernetes 1.33.
pub fn socket_name(driver: &str, pod_uid: Option<&str>) -> String {
    match pod_uid {
        Some(uid) => format!("{driver}-{uid}-reg.sock"),
        None => format!("{driver}-reg.sock"),
    }
}

/// The registration as the kubelet last reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistrationStatus {
    /// No report from the kubelet yet.
    Pending,
    /// The kubelet accepted the plugin.
    Registered,
    /// The kubelet refused it; its error.
    Rejected(String),
}

/// Errors of serving the registration socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The registration socket could not be bound (or a stale one not replaced).
    #[error("registration socket {path}: {cause}")]
    Socket {
        /// The socket file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
}

/// A served registration socket. Dropping it stops serving and removes the socket file.
#[derive(Debug)]
pub struct Registration {
    socket: PathBuf,
    status: watch::Receiver<RegistrationStatus>,
    server: tokio::task::JoinHandle<()>,
}

impl Registration {
    /// Serves `GetInfo` / `NotifyRegistrationStatus` on `<registry_dir>/<driver>-reg.sock`,
    /// replacing a stale socket file from an earlier run.
    pub fn serve(registry_dir: &Path, info: PluginInfo) -> Result<Self, Error> {
        let socket = registry_dir.join(socket_name(&info.driver_name, None));
        Self::serve_at(socket, info)
    }

    /// [`serve`](Self::serve) on `socket`, e.g. one per pod during a rolling update
    /// ([`socket_name`]).
    pub fn serve_at(socket: PathBuf, info: PluginInfo) -> Result<Self, Error> {
        let socket_error = |cause| Error::Socket {
            path: socket.clone(),
            cause,
        };
        let (tx, status) = watch::channel(RegistrationStatus::Pending);
        let service =
            api::registration_server::RegistrationServer::new(Registrar { info, status: tx });
        let router = tonic::transport::Server::builder().add_service(service);
        let server = crate::authority::serve(
            &socket,
            crate::authority::OWNER_ONLY,
            router,
            "registration server",
        )
        .map_err(socket_error)?;
        Ok(Registration {
            socket,
            status,
            server,
        })
    }

    /// The socket file the kubelet's plugin watcher sees.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The last status the kubelet reported.
    pub fn status(&self) -> RegistrationStatus {
        self.status.borrow().clone()
    }

    /// Changes of the status, e.g. to wait for `Registered`.
    pub fn watch(&self) -> watch::Receiver<RegistrationStatus> {
        self.status.clone()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.server.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct Registrar {
    info: PluginInfo,
    status: watch::Sender<RegistrationStatus>,
}

#[tonic::async_trait]
impl api::registration_server::Registration for Registrar {
    async fn get_info(
        &self,
        _: Request<api::InfoRequest>,
    ) -> Result<Response<api::PluginInfo>, Status> {
        Ok(Response::new(api::PluginInfo {
            r#type: api::DRA_PLUGIN_TYPE.to_string(),
            name: self.info.driver_name.clone(),
            endpoint: self.info.endpoint.display().to_string(),
            supported_versions: self.info.supported_versions.clone(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<api::RegistrationStatus>,
    ) -> Result<Response<api::RegistrationStatusResponse>, Status> {
        let report = request.into_inner();
        let status = if report.plugin_registered {
            tracing::info!(driver = %self.info.driver_name, "registered with the kubelet");
            RegistrationStatus::Registered
        } else {
            tracing::warn!(driver = %self.info.driver_name, error = %report.error, "the kubelet refused the registration");
            RegistrationStatus::Rejected(report.error)
        };
        self.status.send_replace(status);
        Ok(Response::new(api::RegistrationStatusResponse {}))
    }
}
