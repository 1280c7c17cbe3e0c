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

/// The longest path a Unix socket may have (`sun_path` holds 108 bytes with the NUL).
const UNIX_PATH_MAX: usize = 107;

/// The registration socket's file name in `registry_dir`: `<driver>-reg.sock`, or with a pod's
/// UID one per pod, so that two plugin pods of one driver (a rolling update) register side by
/// side (the kubelet accepts both since Kubernetes 1.33): `<driver>-<hash of the UID>-reg.sock`,
/// or `dra-<hash of both>-reg.sock` where that path is too long for a socket. These are the
/// shorter two of upstream's helper's names; its first, with the whole UID (36 bytes), is left
/// out because the kubelet dials the socket under its own root directory, whose path can be
/// longer than the plugin's view of it (a root bind-mounted into the pod from elsewhere).
pub fn socket_name(registry_dir: &Path, driver: &str, pod_uid: Option<&str>) -> String {
    let Some(uid) = pod_uid else {
        return format!("{driver}-reg.sock");
    };
    let candidates = [
        format!("{driver}-{}-reg.sock", pod_tag(uid)),
        format!(
            "dra-{}-reg.sock",
            short_hash(&format!("{driver}\0{uid}"), 16)
        ),
    ];
    fitting(registry_dir, candidates)
}

/// The tag a pod's sockets carry in a rolling update (11 characters, URL-safe base64 of its
/// UID's hash): the middle of `<driver>-<tag>-reg.sock`, for other sockets of the same pod
/// to carry too, so that one can tell which process serves which.
pub fn pod_tag(pod_uid: &str) -> String {
    short_hash(pod_uid, 8)
}

/// The first of `candidates` whose path in `dir` a socket can have (else the last).
pub(crate) fn fitting<const N: usize>(dir: &Path, candidates: [String; N]) -> String {
    let fits = |name: &String| dir.join(name).as_os_str().len() <= UNIX_PATH_MAX;
    let last = candidates[N - 1].clone();
    candidates.into_iter().find(fits).unwrap_or(last)
}

/// URL-safe base64 of the first `bytes` bytes of `text`'s SHA-256, unpadded.
pub(crate) fn short_hash(text: &str, bytes: usize) -> String {
    use base64::Engine;
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..bytes])
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
    /// Serves `GetInfo` / `NotifyRegistrationStatus` on `socket` (`<registry_dir>/<driver>-reg.sock`,
    /// or one per pod during a rolling update: [`socket_name`]), replacing a stale socket file
    /// from an earlier run.
    pub(crate) fn serve_at(socket: PathBuf, info: PluginInfo) -> Result<Self, Error> {
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

    /// The last status the kubelet reported.
    pub(crate) fn status(&self) -> RegistrationStatus {
        self.status.borrow().clone()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_registration_socket_is_named_as_upstream_names_it_and_always_fits() {
        let uid = "44e3ae2a-6939-4847-af3e-77b34f3157a0";
        let kubelet = Path::new("/var/lib/kubelet/plugins_registry");
        // base64url of the UID's SHA-256's first 8 bytes, as upstream's second name.
        let name = socket_name(kubelet, "debugecho.akri.sh", Some(uid));
        assert_eq!(
            name,
            format!("debugecho.akri.sh-{}-reg.sock", short_hash(uid, 8))
        );
        assert_eq!(short_hash(uid, 8).len(), 11);
        assert_eq!(
            socket_name(kubelet, "debugecho.akri.sh", None),
            "debugecho.akri.sh-reg.sock"
        );
        // The real test node's kubelet sees the registry deeper than the pod does; with the
        // whole UID the path had 110 bytes there, which no socket can have (its dial failed
        // with "invalid argument").
        let deeper = Path::new("/tmp/akri-node-17341-0-rzCmYQ/kubelet/plugins_registry");
        assert!(
            deeper.join(&name).as_os_str().len() <= UNIX_PATH_MAX,
            "{name}"
        );
        let long_driver = "a-very-long-driver-name-of-some-vendor.devices.example.com";
        let name = socket_name(deeper, long_driver, Some(uid));
        assert!(name.starts_with("dra-"), "{name}");
        assert!(
            deeper.join(&name).as_os_str().len() <= UNIX_PATH_MAX,
            "{name}"
        );
        assert_ne!(name, socket_name(deeper, long_driver, Some("another-pod")));
    }
}
