//! The one entry point: [`Plugin::builder`] starts everything a DRA kubelet plugin is made of
//! (registration with the kubelet, the `v1` and `v1beta1` DRA services, the health stream,
//! the checkpoint) and returns a [`Plugin`] that also publishes the node's devices.
//!
//! ```no_run
//! # use dra_plugin::{Plugin, Driver, Claim, ClaimRef, Prepared, PreparedClaim};
//! # struct MyDriver;
//! # impl Driver for MyDriver {
//! #     type Error = std::io::Error;
//! #     async fn prepare(&self, _: &Claim) -> Result<Prepared, std::io::Error> { todo!() }
//! #     async fn unprepare(&self, _: &ClaimRef, _: Option<&PreparedClaim>) -> Result<(), std::io::Error> { Ok(()) }
//! # }
//! # async fn run(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let plugin = Plugin::builder("gpu.example.com", "node-1")
//!     .start(client, MyDriver)
//!     .await?;
//! plugin.publish(vec![/* the node's devices */]).await?;
//! # Ok(()) }
//! ```

use crate::claim::ClaimSource;
use crate::health::HealthReporter;
use crate::metadata::MetadataWriter;
use crate::node_pools::NodePools;
use crate::plugin::{KubeletPlugin, PluginConfig};
use crate::registration::RegistrationStatus;
use crate::service::{DraService, Driver, DriverOnNode};
use crate::slices::Published;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::Device;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The kubelet's root directory (its `--root-dir`), unless told otherwise.
pub const KUBELET_DIR: &str = "/var/lib/kubelet";
/// Where the kubelet looks for plugins, unless told otherwise.
pub const KUBELET_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The container runtime's CDI directory, unless told otherwise.
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// Where plugins keep their sockets, one directory per driver, unless told otherwise.
pub const KUBELET_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

/// Errors of starting a plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint could not be opened.
    #[error("driver {driver}: {cause}")]
    Service {
        /// The driver.
        driver: String,
        /// Why.
        cause: crate::service::Error,
    },
    /// The sockets could not be served or registered.
    #[error("driver {driver}: {cause}")]
    Serve {
        /// The driver.
        driver: String,
        /// Why.
        cause: crate::plugin::Error,
    },
    /// Device metadata was asked for in versions that lack the latest, or the driver name is
    /// no CDI vendor name.
    #[error("driver {driver}: {cause}")]
    Metadata {
        /// The driver.
        driver: String,
        /// Why.
        cause: crate::metadata::Error,
    },
    /// The Node object (whose UID owns the node's slices) could not be read.
    #[error("reading node {node}: {cause}")]
    Node {
        /// This node.
        node: String,
        /// Why.
        cause: kube::Error,
    },
}

/// Settings of a plugin; every one but the names has a default. See [`Plugin::builder`].
#[must_use]
pub struct Builder {
    driver: String,
    node: String,
    kubelet_dir: PathBuf,
    registry_dir: Option<PathBuf>,
    plugin_dir: Option<PathBuf>,
    checkpoint: Option<PathBuf>,
    node_uid: Option<String>,
    field_manager: Option<String>,
    claims: Option<Arc<dyn ClaimSource>>,
    repair: bool,
    health: bool,
    pod_uid: Option<String>,
    metadata: Option<Vec<crate::metadata::Version>>,
    cdi_dir: PathBuf,
}

impl Builder {
    /// The kubelet's root directory, its `--root-dir` (default [`KUBELET_DIR`]; k0s and
    /// MicroK8s, for example, move it): the registry and plugin directories are under it
    /// unless set themselves.
    pub fn kubelet_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.kubelet_dir = dir.into();
        self
    }

    /// The kubelet's plugin registry directory (default `<kubelet dir>/plugins_registry`,
    /// [`KUBELET_REGISTRY_DIR`]).
    pub fn registry_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.registry_dir = Some(dir.into());
        self
    }

    /// This driver's own directory, for its service socket and by default its checkpoint
    /// (default `<kubelet dir>/plugins/<driver>`, under [`KUBELET_PLUGINS_DIR`]). The kubelet
    /// must see it at the same path: mount it from the host.
    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_dir = Some(dir.into());
        self
    }

    /// Where the prepared claims are recorded (default `<plugin dir>/checkpoint.json`). It
    /// must survive restarts of the plugin, and should survive reboots: the kubelet prepares
    /// every claim again after one, and expects the same CDI ids.
    pub fn checkpoint(mut self, path: impl Into<PathBuf>) -> Self {
        self.checkpoint = Some(path.into());
        self
    }

    /// The Node's UID, which owns the node's slices (they go away with the Node). Without
    /// it, [`start`](Self::start) reads the Node once.
    pub fn node_uid(mut self, uid: impl Into<String>) -> Self {
        self.node_uid = Some(uid.into());
        self
    }

    /// The server-side apply field manager of the slices (default: the driver name).
    pub fn field_manager(mut self, manager: impl Into<String>) -> Self {
        self.field_manager = Some(manager.into());
        self
    }

    /// Where claims are read from (default: the client given to [`start`](Self::start)).
    pub fn claim_source(mut self, source: impl ClaimSource) -> Self {
        self.claims = Some(Arc::new(source));
        self
    }

    /// Whether the plugin watches its node's slices and publishes again whenever one is
    /// changed or deleted behind its back (default: yes). The kubelet's DRA manager deletes a
    /// node's slices when it restarts. Turn it off only when the driver watches and
    /// republishes itself.
    pub fn repair_slices(mut self, repair: bool) -> Self {
        self.repair = repair;
        self
    }

    /// Rolling updates: this plugin runs in the pod of UID `pod_uid` (the downward API's
    /// `metadata.uid`), and another pod of the driver may run beside it on the node while one
    /// replaces the other (a DaemonSet with `maxSurge: 1`). Its sockets are named after the
    /// pod, so the kubelet (1.33 and later) takes both, and the two share the checkpoint,
    /// each call locking `<plugin dir>/serialize.lock` (`DraService::shared`). Without it,
    /// the plugin is alone on its node.
    pub fn rolling_update(mut self, pod_uid: impl Into<String>) -> Self {
        self.pod_uid = Some(pod_uid.into()).filter(|uid| !uid.is_empty());
        self
    }

    /// Whether the driver reports device health (default: yes). Off, the plugin neither
    /// serves nor advertises `DRAResourceHealth`, the kubelet opens no health stream and
    /// pods show no health for its devices; [`Plugin::health`] then reaches nobody.
    pub fn health(mut self, enabled: bool) -> Self {
        self.health = enabled;
        self
    }

    /// Device metadata ([`crate::metadata`], KEP-5304): for every claim it prepares the plugin
    /// writes a file per request that the claim's containers read at the standard path, in
    /// each of `versions` (the latest, [`Version::LATEST`](crate::metadata::Version::LATEST),
    /// must be one), with what the driver's [`Prepared::metadata`](crate::Prepared::metadata)
    /// says of each device. Off by default, as in upstream's helper.
    pub fn device_metadata(
        mut self,
        versions: impl IntoIterator<Item = crate::metadata::Version>,
    ) -> Self {
        self.metadata = Some(versions.into_iter().collect());
        self
    }

    /// The container runtime's CDI directory, where the device metadata's CDI specs go
    /// (default [`DEFAULT_CDI_DIR`]).
    pub fn cdi_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cdi_dir = dir.into();
        self
    }

    /// The registry directory and the plugin directory, defaults applied.
    fn dirs(&self) -> (PathBuf, PathBuf) {
        let registry = (self.registry_dir.clone())
            .unwrap_or_else(|| self.kubelet_dir.join("plugins_registry"));
        let plugin = (self.plugin_dir.clone())
            .unwrap_or_else(|| self.kubelet_dir.join("plugins").join(&self.driver));
        (registry, plugin)
    }

    /// Opens the checkpoint, serves the DRA services and health on
    /// `<plugin dir>/dra.sock`, registers with the kubelet (again whenever a restarted
    /// kubelet forgets it), and readies the node's pools (`NodePools`).
    pub async fn start<D: Driver>(
        self,
        client: kube::Client,
        driver: D,
    ) -> Result<Plugin<D>, Error> {
        let (registry_dir, plugin_dir) = self.dirs();
        let checkpoint = self
            .checkpoint
            .unwrap_or_else(|| plugin_dir.join("checkpoint.json"));
        let node_uid = match self.node_uid {
            Some(uid) => uid,
            None => {
                let node = kube::Api::<Node>::all(client.clone())
                    .get(&self.node)
                    .await
                    .map_err(|cause| Error::Node {
                        node: self.node.clone(),
                        cause,
                    })?;
                node.metadata.uid.unwrap_or_default()
            }
        };
        let on = DriverOnNode {
            driver: self.driver.clone(),
            node: self.node.clone(),
        };
        let service_error = |cause| Error::Service {
            driver: self.driver.clone(),
            cause,
        };
        let service = match self.claims {
            Some(claims) => DraService::new(driver, claims, on, &checkpoint),
            None => DraService::new(driver, client.clone(), on, &checkpoint),
        }
        .map_err(service_error)?;
        let service = match &self.pod_uid {
            Some(_) => service.shared(plugin_dir.join("serialize.lock")),
            None => service,
        };
        let service = match self.metadata {
            Some(versions) => service.device_metadata(
                MetadataWriter::new(&self.driver, &plugin_dir, &self.cdi_dir, versions).map_err(
                    |cause| Error::Metadata {
                        driver: self.driver.clone(),
                        cause,
                    },
                )?,
            ),
            None => service,
        };
        // The driver's entries in its claims' status, under its name as field manager.
        let errors = service.errors();
        let service = service.device_status(crate::device_status::Writer::reporting(
            client.clone(),
            &self.driver,
            errors,
        ));
        let health = HealthReporter::default();
        let config = PluginConfig {
            driver_name: self.driver.clone(),
            registry_dir,
            plugin_dir,
            pod_uid: self.pod_uid,
        };
        let served = KubeletPlugin::start(&config, &service, self.health.then_some(&health))
            .map_err(|cause| Error::Serve {
                driver: self.driver.clone(),
                cause,
            })?;
        let pools = Arc::new(NodePools::new(
            client,
            &self.driver,
            &self.node,
            &node_uid,
            self.field_manager.as_deref().unwrap_or(&self.driver),
        ));
        let repair = (self.repair).then(|| NodePools::spawn_repair(&pools, service.errors()));
        Ok(Plugin {
            service,
            health,
            pools,
            served,
            repair,
            node: self.node,
        })
    }
}

/// A running plugin. Dropping it stops serving and removes its sockets; what it published
/// stays (the node's devices are still there while the plugin restarts).
pub struct Plugin<D> {
    service: DraService<D>,
    health: HealthReporter,
    pools: Arc<NodePools>,
    served: KubeletPlugin,
    repair: Option<tokio::task::JoinHandle<()>>,
    node: String,
}

impl<D> Drop for Plugin<D> {
    fn drop(&mut self) {
        if let Some(repair) = &self.repair {
            repair.abort();
        }
    }
}

impl Plugin<()> {
    /// Settings for the plugin of DRA driver `driver` on node `node`.
    pub fn builder(driver: impl Into<String>, node: impl Into<String>) -> Builder {
        Builder {
            driver: driver.into(),
            node: node.into(),
            kubelet_dir: PathBuf::from(KUBELET_DIR),
            registry_dir: None,
            plugin_dir: None,
            checkpoint: None,
            node_uid: None,
            field_manager: None,
            claims: None,
            repair: true,
            health: true,
            pod_uid: None,
            metadata: None,
            cdi_dir: PathBuf::from(DEFAULT_CDI_DIR),
        }
    }
}

impl<D: Driver> Plugin<D> {
    /// Makes the node's pool (named after the node) hold exactly `devices`, and the node has
    /// no other pool of this driver: a new generation when anything changed, nothing written
    /// when nothing did. Call it whenever the devices change. Slices changed or deleted behind
    /// the plugin's back are repaired by themselves (see [`Builder::repair_slices`]). The
    /// devices are taken, not copied: a thousand of them with a few attributes each take
    /// megabytes as structs.
    pub async fn publish(&self, devices: Vec<Device>) -> Result<Published, crate::slices::Error> {
        let pools = BTreeMap::from([(self.node.clone(), devices)]);
        let mut published = self.pools.publish(pools).await?;
        Ok(published.remove(&self.node).unwrap_or_default())
    }

    /// Like [`publish`](Self::publish), for a driver with several pools on the node (pool
    /// name to devices): pools not named are deleted.
    pub async fn publish_pools(
        &self,
        pools: BTreeMap<String, Vec<Device>>,
    ) -> Result<BTreeMap<String, Published>, crate::slices::Error> {
        self.pools.publish(pools).await
    }

    /// The node's pools of this driver, e.g. to read what is
    /// `stored`.
    pub fn pools(&self) -> &NodePools {
        &self.pools
    }

    /// The health the kubelet hears: set a device unhealthy and pods holding it learn so.
    pub fn health(&self) -> &HealthReporter {
        &self.health
    }

    /// The DRA service: what is prepared, and the driver.
    pub fn service(&self) -> &DraService<D> {
        &self.service
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        self.service.driver()
    }

    /// The registration status the kubelet last reported.
    pub fn registration_status(&self) -> RegistrationStatus {
        self.served.registration_status()
    }

    /// Withdraws the registration with the kubelet and keeps serving the calls under way
    /// (see [`KubeletPlugin::deregister`]); drop the plugin a moment later to stop.
    pub fn deregister(&mut self) {
        self.served.deregister();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_dir_moves_the_default_directories_and_explicit_ones_win() {
        let dirs = |b: Builder| b.dirs();
        let builder = || Plugin::builder("gadget.example.com", "n1");
        assert_eq!(
            dirs(builder()),
            (
                PathBuf::from(KUBELET_REGISTRY_DIR),
                std::path::Path::new(KUBELET_PLUGINS_DIR).join("gadget.example.com")
            )
        );
        assert_eq!(
            dirs(builder().kubelet_dir("/var/lib/k0s/kubelet")),
            (
                PathBuf::from("/var/lib/k0s/kubelet/plugins_registry"),
                PathBuf::from("/var/lib/k0s/kubelet/plugins/gadget.example.com")
            )
        );
        assert_eq!(
            dirs(
                builder()
                    .plugin_dir("/p")
                    .kubelet_dir("/k")
                    .registry_dir("/r")
            ),
            (PathBuf::from("/r"), PathBuf::from("/p"))
        );
    }
}
