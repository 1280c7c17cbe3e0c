//! A running kubelet plugin: the driver's service socket (DRA v1 + v1beta1 + health) and its
//! registration, kept registered across kubelet restarts.

use crate::background::{BackgroundError, Errors};
use crate::health::HealthReporter;
use crate::registration::{self, PluginInfo, Registration, RegistrationStatus};
use crate::service::{DraService, Driver};
use kubelet_proto::dra::{health, v1, v1beta1};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where a plugin lives on the node.
#[derive(Clone, Debug)]
pub struct PluginConfig {
    /// DRA driver name.
    pub driver_name: String,
    /// The kubelet's plugin registry directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// This driver's own directory for its service socket (`/var/lib/kubelet/plugins/<driver>`).
    pub plugin_dir: PathBuf,
    /// The plugin pod's UID during a rolling update: the sockets are then named after it
    /// (`dra-<uid>.sock`, [`registration::socket_name`]), so two pods serve side by side.
    pub pod_uid: Option<String>,
}

impl PluginConfig {
    /// The service socket: `dra.sock`, or per pod `dra-<pod UID>.sock` (a hash of the UID
    /// where the path would be too long for a socket).
    pub(crate) fn socket(&self) -> PathBuf {
        let name = match &self.pod_uid {
            Some(uid) => registration::fitting(
                &self.plugin_dir,
                [
                    format!("dra-{uid}.sock"),
                    format!("dra-{}.sock", registration::short_hash(uid, 8)),
                ],
            ),
            None => "dra.sock".to_string(),
        };
        self.plugin_dir.join(name)
    }

    /// The registration socket ([`registration::socket_name`]).
    pub(crate) fn registration_socket(&self) -> PathBuf {
        (self.registry_dir).join(registration::socket_name(
            &self.registry_dir,
            &self.driver_name,
            self.pod_uid.as_deref(),
        ))
    }
}

/// Errors of starting a plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The service socket could not be bound, or the registry directory not created.
    #[error("service socket {path}: {cause}")]
    Socket {
        /// The service socket, or the registry directory.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The registration socket could not be served.
    #[error(transparent)]
    Registration(#[from] registration::Error),
}

/// How often the registration socket is checked: a kubelet restart may wipe the registry
/// directory, and the kubelet only finds plugins whose socket appears there.
const REGISTRATION_CHECK: Duration = Duration::from_secs(1);

/// A served plugin. Dropping it stops serving and removes its sockets.
pub struct KubeletPlugin {
    socket: PathBuf,
    registration: Arc<Mutex<Option<Registration>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KubeletPlugin {
    /// Serves `service` and `health` (unless `None`: the driver reports no health) on
    /// `PluginConfig::socket` and registers with the kubelet.
    pub fn start<D: Driver>(
        config: &PluginConfig,
        service: &DraService<D>,
        health: Option<&HealthReporter>,
    ) -> Result<Self, Error> {
        let socket = config.socket();
        let socket_error = |cause| Error::Socket {
            path: socket.clone(),
            cause,
        };
        let router = tonic::transport::Server::builder()
            .add_service(service.v1())
            .add_service(service.v1beta1())
            .add_optional_service(health.map(HealthReporter::service))
            .add_optional_service(health.map(HealthReporter::service_v1alpha1));
        let server =
            crate::authority::serve(&socket, crate::authority::OWNER_ONLY, router, "DRA service")
                .map_err(socket_error)?;

        let info = PluginInfo {
            driver_name: config.driver_name.clone(),
            endpoint: socket.clone(),
            supported_versions: [v1::SUPPORTED_VERSION, v1beta1::SUPPORTED_VERSION]
                .into_iter()
                .chain(health.iter().flat_map(|_| {
                    [
                        health::v1::SUPPORTED_VERSION,
                        health::v1alpha1::SUPPORTED_VERSION,
                    ]
                }))
                .map(String::from)
                .collect(),
        };
        std::fs::create_dir_all(&config.registry_dir).map_err(|cause| Error::Socket {
            path: config.registry_dir.clone(),
            cause,
        })?;
        let registration = Registration::serve_at(config.registration_socket(), info.clone())?;
        let registration = Arc::new(Mutex::new(Some(registration)));
        let keeper = tokio::spawn(keep_registered(
            config.registration_socket(),
            info,
            registration.clone(),
            service.errors(),
        ));
        tracing::info!(driver = %config.driver_name, socket = %socket.display(), "serving DRA plugin");
        Ok(KubeletPlugin {
            socket,
            registration,
            tasks: vec![server, keeper],
        })
    }

    /// Withdraws the registration (its socket goes, and is not made again): the kubelet
    /// stops sending calls here while the service keeps answering those under way. The first
    /// step of a clean stop, above all with another plugin of the driver beside this one.
    pub fn deregister(&mut self) {
        if let Some(keeper) = self.tasks.get(1) {
            keeper.abort();
        }
        self.registration.lock().expect("registration lock").take();
    }

    /// The registration status the kubelet last reported.
    pub fn registration_status(&self) -> RegistrationStatus {
        self.registration
            .lock()
            .expect("registration lock")
            .as_ref()
            .map_or(RegistrationStatus::Pending, Registration::status)
    }
}

impl Drop for KubeletPlugin {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Recreates the registration socket whenever it disappears (a restarted kubelet recreates
/// its registry directory), so the plugin registers again without being restarted itself.
async fn keep_registered(
    socket: PathBuf,
    info: PluginInfo,
    registration: Arc<Mutex<Option<Registration>>>,
    errors: Errors,
) {
    let registry_dir = socket.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut interval = tokio::time::interval(REGISTRATION_CHECK);
    loop {
        interval.tick().await;
        if socket.exists() {
            continue;
        }
        tracing::info!(driver = %info.driver_name, "registration socket gone (kubelet restarted?); registering again");
        // Drop the old server first: its Drop removes the socket path the new one binds.
        registration.lock().expect("registration lock").take();
        if let Err(error) = std::fs::create_dir_all(&registry_dir) {
            tracing::warn!(%error, dir = %registry_dir.display(), "cannot create the registry directory");
            let error = format!("cannot create {}: {error}", registry_dir.display());
            errors.report(BackgroundError::Registration(error));
            continue;
        }
        match Registration::serve_at(socket.clone(), info.clone()) {
            Ok(fresh) => *registration.lock().expect("registration lock") = Some(fresh),
            Err(error) => {
                tracing::warn!(%error, "registering again failed; retrying");
                errors.report(BackgroundError::Registration(error.to_string()));
            }
        }
    }
}
