//! The device plugins of one node: an Instance-level plugin per Instance the node sees and a
//! Configuration-level plugin per v0 Configuration, all advertising from one view of the
//! Instances, so that a claim by any of them (or by another node) reaches every plugin's
//! `ListAndWatch` at once (seed 003's IL/CL notifications, without a notification graph).

use crate::claims::{self, ClaimError};
use crate::slots::{self, InstanceSlots, SlotClaim};
use akri_api::v0::Instance;
use device_plugin::plugin::Device;
use device_plugin::{DevicePlugin, PluginConfig, ServedPlugin};
use kube::api::Api;
use kubelet_proto::deviceplugin::v1beta1 as api;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tonic::Status;

/// The prefix of every resource the plugins serve: `akri.sh/<instance>`, `akri.sh/<config>`.
pub const RESOURCE_PREFIX: &str = "akri.sh/";

/// The annotation prefix Akri puts on containers per slot (`akri.agent.slot-<slot>`), with
/// the slot (IL) or `C:<vdev>:<slot>` (CL) as value.
pub const SLOT_ANNOTATION_PREFIX: &str = "akri.agent.slot-";

/// How long a slot this node just allocated is safe from reclamation whatever the grace, unless
/// the pod-resources API lists it in use first: the kubelet records an allocation only after
/// `Allocate` returns, so for a moment the slot is in no container the API lists.
const CLAIM_SETTLE: Duration = Duration::from_secs(2);

/// How many times a Configuration-level allocation is computed again after losing a slot to
/// a concurrent claim.
const CLAIM_ATTEMPTS: usize = 3;

/// What a container gets for one Instance: the device's environment, mounts and device nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceEdits {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<api::Mount>,
    pub devices: Vec<api::DeviceSpec>,
}

/// One v0 Configuration on this node: what its plugins serve.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigurationDevices {
    pub namespace: String,
    pub name: String,
    pub unique_devices: bool,
    /// The Instances this node sees, with what a container allocated one of them gets.
    pub instances: BTreeMap<String, DeviceEdits>,
}

/// Where the plugins live and how they clean up.
#[derive(Clone, Debug)]
pub struct LegacyConfig {
    pub node: String,
    /// The kubelet's device-plugin directory.
    pub device_plugin_dir: PathBuf,
    /// The kubelet's pod-resources socket; `None`: slots are never reclaimed.
    pub pod_resources_socket: Option<PathBuf>,
    /// How long a slot held with no container behind it stays held: a container being
    /// re-created must not lose it. Akri waits 5 minutes.
    pub reclaim_grace: Duration,
    /// How often slots are checked.
    pub reclaim_interval: Duration,
    /// Added to every socket name (`akri.sh_<name>-<tag>.sock`): during a rolling update two
    /// processes of one node serve the same resources, each under sockets of its own.
    pub socket_tag: Option<String>,
}

/// Allocation counters, for `/metrics` and the benchmark.
#[derive(Debug, Default)]
pub struct Counters {
    pub allocations: AtomicU64,
    pub failed_allocations: AtomicU64,
    /// Slots taken with a write to their Instance (an allocation reusing a slot this node
    /// holds writes nothing).
    pub claims: AtomicU64,
    /// Claims that lost a slot to a concurrent writer (a JSON-patch test that failed).
    pub conflicts: AtomicU64,
    pub reclaimed: AtomicU64,
}

/// The node's plugins. Dropping it stops them.
pub struct LegacyPlugins {
    shared: Arc<Shared>,
    served: BTreeMap<String, (Arc<AkriPlugin>, ServedPlugin)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    reclaiming: bool,
}

impl Drop for LegacyPlugins {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        // The plugins point back at `shared`.
        self.shared.plugins.lock().expect("plugins").clear();
    }
}

struct Shared {
    client: kube::Client,
    config: LegacyConfig,
    /// The legacy Instances that name this node, by namespace and name, as last seen: fed by
    /// the node agent's view of them ([`InstanceFeed`]) and by this node's own claims.
    instances: Mutex<BTreeMap<(String, String), Instance>>,
    /// Bumped on every change of `instances`.
    changed: watch::Sender<u64>,
    /// The served plugins, which advertise anew on every change.
    plugins: Mutex<Vec<Arc<AkriPlugin>>>,
    /// One allocation at a time on this node: each computes from the state the previous left.
    allocating: tokio::sync::Mutex<()>,
    /// When this node last claimed each slot (namespace, instance, slot).
    claimed: Mutex<BTreeMap<(String, String, String), Instant>>,
    counters: Arc<Counters>,
}

impl LegacyPlugins {
    /// Starts reclaiming slots; serves no plugin until [`sync`](Self::sync), and knows the
    /// Instances it is fed ([`feed`](Self::feed)).
    pub fn start(client: kube::Client, config: LegacyConfig) -> Self {
        let mut plugins = Self::standing_by(client, config);
        plugins.lead();
        plugins
    }

    /// Like [`start`](Self::start), but reclaims no slot until [`lead`](Self::lead): a
    /// process standing by beside the node's leading one during a rolling update serves the
    /// plugins (its `Allocate` claims slots like any other node's, by tested patches) and
    /// leaves the node's held slots to the leader.
    pub fn standing_by(client: kube::Client, config: LegacyConfig) -> Self {
        let shared = Arc::new(Shared {
            client,
            config,
            instances: Mutex::default(),
            changed: watch::channel(0).0,
            plugins: Mutex::default(),
            claimed: Mutex::default(),
            allocating: tokio::sync::Mutex::new(()),
            counters: Arc::default(),
        });
        let tasks = vec![tokio::spawn(advertise(shared.clone()))];
        LegacyPlugins {
            shared,
            served: BTreeMap::new(),
            tasks,
            reclaiming: false,
        }
    }

    /// Starts reclaiming the slots this node holds with no container behind them (once), and
    /// sends every plugin's device list again. The kubelet keeps one device list per
    /// resource, the last any process of the node sent: the one that led until now may have
    /// sent its own view last, and it is gone.
    pub fn lead(&mut self) {
        if !self.reclaiming && self.shared.config.pod_resources_socket.is_some() {
            self.tasks.push(tokio::spawn(reclaim(self.shared.clone())));
        }
        self.reclaiming = true;
        for (plugin, _) in self.served.values() {
            plugin.devices.send_modify(|_| {});
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.shared.counters.clone()
    }

    /// Where the node's Instances reach the plugins: the node agent watches the Instances
    /// that name its node (one watch per namespace, shared with its Instance writer) and
    /// feeds each namespace's here. The plugins read no other node's Instances.
    pub fn feed(&self) -> InstanceFeed {
        InstanceFeed(self.shared.clone())
    }

    /// Every legacy Instance that names this node as last seen, `(namespace, name)` per
    /// configuration name: what still holds a configuration's devices on this node.
    pub fn instances_by_configuration(&self) -> BTreeMap<String, Vec<(String, String)>> {
        let mut by_configuration: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for (key, instance) in self.shared.instances.lock().expect("instances").iter() {
            (by_configuration.entry(instance.spec.configuration_name.clone()))
                .or_default()
                .push(key.clone());
        }
        by_configuration
    }

    /// Whether the kubelet has taken every served plugin's registration.
    pub fn all_registered(&self) -> bool {
        (self.served.values()).all(|(_, served)| *served.registrations().borrow() > 0)
    }

    /// The resources served now.
    pub fn resources(&self) -> Vec<String> {
        self.served.keys().cloned().collect()
    }

    /// Serves the plugins of `configurations` and stops the others (telling the kubelet
    /// their resources have no devices left).
    pub async fn sync(&mut self, configurations: &[ConfigurationDevices]) {
        let mut wanted: BTreeMap<String, Arc<AkriPlugin>> = BTreeMap::new();
        for config in configurations {
            let cl = format!("{RESOURCE_PREFIX}{}", config.name);
            if wanted.contains_key(&cl) {
                tracing::warn!(configuration = %config.name, namespace = %config.namespace, "another namespace's Configuration of the same name serves {cl}; not served");
                continue;
            }
            let members: BTreeSet<String> = config.instances.keys().cloned().collect();
            let edits = Arc::new(config.instances.clone());
            wanted.insert(
                cl,
                AkriPlugin::new(
                    &self.shared,
                    config,
                    Level::Configuration {
                        unique: config.unique_devices,
                        members: members.clone(),
                    },
                    edits.clone(),
                ),
            );
            for instance in members {
                wanted.insert(
                    format!("{RESOURCE_PREFIX}{instance}"),
                    AkriPlugin::new(
                        &self.shared,
                        config,
                        Level::Instance(instance),
                        edits.clone(),
                    ),
                );
            }
        }
        let gone: Vec<String> = self
            .served
            .keys()
            .filter(|r| !wanted.contains_key(*r))
            .cloned()
            .collect();
        for resource in gone {
            if let Some((_, served)) = self.served.remove(&resource) {
                tracing::info!(%resource, "device plugin stopped");
                served.shutdown().await;
            }
        }
        for (resource, plugin) in wanted {
            if let Some((running, _)) = self.served.get(&resource) {
                if running.same_as(&plugin) {
                    continue;
                }
                // Same resource, new members or devices: swap the plugin's view, keep serving.
                running.replace_with(&plugin);
                continue;
            }
            let socket_name = socket_name(&resource, self.shared.config.socket_tag.as_deref());
            let config = PluginConfig {
                dir: self.shared.config.device_plugin_dir.clone(),
                resource_name: resource.clone(),
                socket_name,
            };
            match ServedPlugin::start(&config, plugin.clone()) {
                Ok(served) => {
                    self.served.insert(resource, (plugin, served));
                }
                Err(error) => tracing::error!(%resource, %error, "cannot serve the device plugin"),
            }
        }
        *self.shared.plugins.lock().expect("plugins") =
            self.served.values().map(|(p, _)| p.clone()).collect();
        self.shared.bump();
    }
}

/// The socket of `resource`'s plugin: `akri.sh_<name>.sock`, or `akri.sh_<name>-<tag>.sock`.
fn socket_name(resource: &str, tag: Option<&str>) -> String {
    let base = resource.replace('/', "_");
    match tag {
        Some(tag) => format!("{base}-{tag}.sock"),
        None => format!("{base}.sock"),
    }
}

/// Pushes every change of the Instances to every plugin's `ListAndWatch`.
async fn advertise(shared: Arc<Shared>) {
    let mut changed = shared.changed.subscribe();
    while changed.changed().await.is_ok() {
        let plugins = shared.plugins.lock().expect("plugins").clone();
        for plugin in plugins {
            plugin.refresh();
        }
    }
}

/// Which plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Level {
    Instance(String),
    Configuration {
        unique: bool,
        members: BTreeSet<String>,
    },
}

/// One Instance- or Configuration-level plugin.
struct AkriPlugin {
    shared: Arc<Shared>,
    namespace: String,
    configuration: String,
    view: Mutex<(Level, Arc<BTreeMap<String, DeviceEdits>>)>,
    devices: watch::Sender<Vec<Device>>,
}

impl AkriPlugin {
    fn new(
        shared: &Arc<Shared>,
        config: &ConfigurationDevices,
        level: Level,
        edits: Arc<BTreeMap<String, DeviceEdits>>,
    ) -> Arc<Self> {
        let plugin = Arc::new(AkriPlugin {
            shared: shared.clone(),
            namespace: config.namespace.clone(),
            configuration: config.name.clone(),
            view: Mutex::new((level, edits)),
            devices: watch::channel(Vec::new()).0,
        });
        plugin.refresh();
        plugin
    }

    fn same_as(&self, other: &AkriPlugin) -> bool {
        let (a, b) = (
            self.view.lock().expect("view"),
            other.view.lock().expect("view"),
        );
        a.0 == b.0 && a.1 == b.1
    }

    fn replace_with(&self, other: &AkriPlugin) {
        let fresh = other.view.lock().expect("view").clone();
        *self.view.lock().expect("view") = fresh;
        self.refresh();
    }

    fn level(&self) -> Level {
        self.view.lock().expect("view").0.clone()
    }

    /// This plugin's Instances as they are now (those it serves that exist).
    fn instances(&self) -> Vec<InstanceSlots> {
        let names: Vec<String> = match self.level() {
            Level::Instance(name) => vec![name],
            Level::Configuration { members, .. } => members.into_iter().collect(),
        };
        let known = self.shared.instances.lock().expect("instances");
        names
            .iter()
            .filter_map(|name| {
                let instance = known.get(&(self.namespace.clone(), name.clone()))?;
                (instance.spec.configuration_name == self.configuration)
                    .then(|| InstanceSlots::new(name, &instance.spec))
            })
            .collect()
    }

    fn refresh(&self) {
        let node = &self.shared.config.node;
        let instances = self.instances();
        let devices = match self.level() {
            Level::Instance(_) => instances
                .first()
                .map(|i| slots::instance_devices(i, node))
                .unwrap_or_default(),
            Level::Configuration { unique, .. } => {
                slots::configuration_devices(&instances, node, unique)
            }
        };
        self.devices.send_if_modified(|current| {
            let changed = *current != devices;
            if changed {
                *current = devices;
            }
            changed
        });
    }

    fn api(&self) -> Api<Instance> {
        Api::namespaced(self.shared.client.clone(), &self.namespace)
    }

    /// The container response for one request's claims.
    fn response(&self, claims: &[SlotClaim]) -> api::ContainerAllocateResponse {
        let edits = self.view.lock().expect("view").1.clone();
        let mut response = api::ContainerAllocateResponse::default();
        for claim in claims {
            if let Some(edit) = edits.get(&claim.instance) {
                // Plain names (the last Instance wins when a container has several) and, as
                // Akri does, names suffixed with the Instance's id, which never collide.
                let suffix = claim
                    .instance
                    .rsplit('-')
                    .next()
                    .unwrap_or_default()
                    .to_ascii_uppercase();
                for (key, value) in &edit.envs {
                    response.envs.insert(key.clone(), value.clone());
                    response
                        .envs
                        .insert(format!("{key}_{suffix}"), value.clone());
                }
                response.mounts.extend(edit.mounts.iter().cloned());
                response.devices.extend(edit.devices.iter().cloned());
            }
            let value = match claim.to.vdev() {
                Some(vdev) => format!("C:{vdev}:{}", claim.slot),
                None => claim.slot.clone(),
            };
            response
                .annotations
                .insert(format!("{SLOT_ANNOTATION_PREFIX}{}", claim.slot), value);
        }
        response
    }

    /// Reads the Instances again after a refused claim, so every plugin advertises what is
    /// true now rather than what the watch will say later.
    async fn reread(&self, instances: &[String]) {
        let api = self.api();
        for name in instances {
            match api.get_opt(name).await {
                Ok(Some(instance)) => self.shared.store(instance),
                Ok(None) => self.shared.forget(&self.namespace, name),
                Err(error) => {
                    tracing::warn!(instance = %name, %error, "cannot read the Instance again")
                }
            }
        }
    }

    /// Marks slots this node claims as settling from now (`true`: the reclaim leaves them
    /// alone for [`CLAIM_SETTLE`]), or forgets them (a claim that was not written).
    fn settling(&self, keys: &[(String, String, String)], settling: bool) {
        let now = Instant::now();
        let mut claimed = self.shared.claimed.lock().expect("claimed");
        claimed.retain(|_, at| now.duration_since(*at) < CLAIM_SETTLE);
        for key in keys {
            match settling {
                true => claimed.insert(key.clone(), now),
                false => claimed.remove(key),
            };
        }
    }

    async fn try_allocate(
        &self,
        requests: &[Vec<String>],
    ) -> Result<Vec<api::ContainerAllocateResponse>, Status> {
        let node = self.shared.config.node.clone();
        let attempts = match self.level() {
            Level::Configuration { unique: true, .. } => CLAIM_ATTEMPTS,
            _ => 1,
        };
        for attempt in 1..=attempts {
            let instances = self.instances();
            let decided = match self.level() {
                Level::Instance(name) => {
                    let Some(instance) = instances.first() else {
                        return Err(Status::unavailable(format!(
                            "Instance {name} is not known on this node"
                        )));
                    };
                    requests
                        .iter()
                        .map(|ids| slots::allocate_instance(instance, &node, ids))
                        .collect::<Result<Vec<_>, _>>()
                }
                Level::Configuration { unique, .. } => {
                    slots::allocate_configuration(&instances, &node, unique, requests)
                }
            };
            let per_container = decided.map_err(|e| Status::failed_precondition(e.to_string()))?;
            let all: Vec<SlotClaim> = per_container.iter().flatten().cloned().collect();
            let keys: Vec<(String, String, String)> = (all.iter())
                .map(|c| (self.namespace.clone(), c.instance.clone(), c.slot.clone()))
                .collect();
            // Settling from before the write: the Instance's watch event can reach the view
            // before the write's answer does, and a slot held with no container yet (the
            // kubelet records it after Allocate returns) must not be reclaimed meanwhile.
            self.settling(&keys, true);
            match claims::write(&self.api(), &all).await {
                Ok(written) => {
                    self.settling(&keys, true);
                    let writes = all.iter().filter(|c| c.writes()).count();
                    self.shared
                        .counters
                        .claims
                        .fetch_add(writes as u64, Ordering::Relaxed);
                    for instance in written {
                        self.shared.store(instance);
                    }
                    return Ok(per_container.iter().map(|c| self.response(c)).collect());
                }
                Err(error) => {
                    self.settling(&keys, false);
                    let touched: BTreeSet<String> =
                        all.iter().map(|c| c.instance.clone()).collect();
                    self.reread(&touched.into_iter().collect::<Vec<_>>()).await;
                    if error.is_conflict() {
                        self.shared
                            .counters
                            .conflicts
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    if !error.is_conflict() || attempt == attempts {
                        return Err(claim_status(error));
                    }
                }
            }
        }
        unreachable!("the last attempt returns")
    }
}

fn claim_status(error: ClaimError) -> Status {
    match error {
        ClaimError::Conflict { .. } => Status::aborted(format!(
            "{error}; the slot was taken by another claim, the plugins advertise what is left"
        )),
        ClaimError::Api { .. } => Status::unavailable(error.to_string()),
    }
}

#[tonic::async_trait]
impl DevicePlugin for AkriPlugin {
    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.subscribe()
    }

    fn offers_preferred_allocation(&self) -> bool {
        true
    }

    async fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Result<Vec<String>, Status> {
        let node = &self.shared.config.node;
        let instances = self.instances();
        Ok(match self.level() {
            Level::Instance(_) => match instances.first() {
                Some(instance) => {
                    slots::prefer_instance(instance, node, available, must_include, size)
                }
                None => must_include.to_vec(),
            },
            Level::Configuration { unique, .. } => {
                slots::prefer_configuration(&instances, node, unique, available, must_include, size)
            }
        })
    }

    async fn allocate(
        &self,
        requests: &[Vec<String>],
    ) -> Result<Vec<api::ContainerAllocateResponse>, Status> {
        let _one_at_a_time = self.shared.allocating.lock().await;
        let counters = &self.shared.counters;
        let result = self.try_allocate(requests).await;
        match &result {
            Ok(_) => counters.allocations.fetch_add(1, Ordering::Relaxed),
            Err(status) => {
                tracing::info!(configuration = %self.configuration, ?requests, error = %status.message(), "allocation refused");
                // A refused id may be one the kubelet should no longer see: advertise anew.
                self.refresh();
                counters.failed_allocations.fetch_add(1, Ordering::Relaxed)
            }
        };
        result
    }
}

impl Shared {
    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Keeps `instance` unless the view already has a newer version of it.
    fn store(&self, instance: Instance) {
        let key = (
            instance.metadata.namespace.clone().unwrap_or_default(),
            instance.metadata.name.clone().unwrap_or_default(),
        );
        let mut instances = self.instances.lock().expect("instances");
        if instances
            .get(&key)
            .is_some_and(|known| newer(known, &instance))
        {
            return;
        }
        instances.insert(key, instance);
        drop(instances);
        self.bump();
    }

    fn forget(&self, namespace: &str, name: &str) {
        let removed = self
            .instances
            .lock()
            .expect("instances")
            .remove(&(namespace.to_string(), name.to_string()));
        if removed.is_some() {
            self.bump();
        }
    }
}

/// Feeds the plugins the Instances that name their node ([`LegacyPlugins::feed`]).
#[derive(Clone)]
pub struct InstanceFeed(Arc<Shared>);

impl InstanceFeed {
    /// `namespace`'s Instances that name this node are `instances` now: the others of it are
    /// forgotten; one this node's own claim stored in a newer version is kept as it is.
    pub fn replace(&self, namespace: &str, instances: impl IntoIterator<Item = Instance>) {
        let shared = &self.0;
        let mut known = shared.instances.lock().expect("instances");
        let mut fed = BTreeMap::new();
        for instance in instances {
            let key = (
                namespace.to_string(),
                instance.metadata.name.clone().unwrap_or_default(),
            );
            let kept = known.get(&key).filter(|current| newer(current, &instance));
            fed.insert(key, kept.cloned().unwrap_or(instance));
        }
        let version = |i: &Instance| i.metadata.resource_version.clone();
        let current = (known.iter()).filter(|((ns, _), _)| ns == namespace);
        let unchanged = current.clone().count() == fed.len() && { current }
            .all(|(key, i)| fed.get(key).map(version) == Some(version(i)));
        if unchanged {
            return;
        }
        known.retain(|(ns, _), _| ns != namespace);
        known.extend(fed);
        drop(known);
        shared.bump();
    }
}

/// Whether `a` is a newer version of an Instance than `b` (by resourceVersion, where both
/// have one that is a number, as the API server's are).
fn newer(a: &Instance, b: &Instance) -> bool {
    let version = |i: &Instance| {
        i.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (version(a), version(b)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

/// Frees slots this node holds with no container behind them, once they stayed so for the
/// grace period. Only its own: the chart's admission policy refuses a node freeing another
/// node's slot, and the slots of nodes that are gone (deleted, or NotReady past the
/// node-lost grace) are the driver-controller's to free (`legacy_slots.rs` there).
async fn reclaim(shared: Arc<Shared>) {
    let socket = shared
        .config
        .pod_resources_socket
        .clone()
        .expect("reclaim runs with a pod-resources socket");
    let node = shared.config.node.clone();
    // Slot (namespace, instance, slot) -> since when it looked unused.
    let mut unused: BTreeMap<(String, String, String), Instant> = BTreeMap::new();
    let mut failing = false;
    let mut interval = tokio::time::interval(shared.config.reclaim_interval);
    loop {
        interval.tick().await;
        let listed = Instant::now();
        // Without an answer nothing is freed: an unreachable kubelet is not an empty node.
        let in_use = match device_plugin::pod_resources::devices_in_use(&socket).await {
            Ok(in_use) => {
                failing = false;
                in_use
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, "cannot list the kubelet's pod resources; no slot is reclaimed until it answers");
                }
                failing = true;
                continue;
            }
        };
        let snapshot: Vec<Instance> = shared
            .instances
            .lock()
            .expect("instances")
            .values()
            .cloned()
            .collect();
        let mut seen = BTreeSet::new();
        let now = Instant::now();
        for instance in snapshot {
            let namespace = instance.metadata.namespace.clone().unwrap_or_default();
            let name = instance.metadata.name.clone().unwrap_or_default();
            for (slot, usage) in instance.spec.slot_usages() {
                let Ok(usage) = usage else { continue };
                let Some(holder) = usage.node() else { continue };
                if holder != node {
                    continue;
                }
                let (resource, id) = match usage.vdev() {
                    Some(vdev) => (&instance.spec.configuration_name, vdev),
                    None => (&name, slot),
                };
                let unused_now = !in_use
                    .get(&format!("{RESOURCE_PREFIX}{resource}"))
                    .is_some_and(|ids| ids.contains(id));
                let key = (namespace.clone(), name.clone(), slot.to_string());
                let settling = {
                    let mut claimed = shared.claimed.lock().expect("claimed");
                    // Listed in use after it was allocated: the kubelet recorded it, so it
                    // is freed as soon as its container goes.
                    if !unused_now && claimed.get(&key).is_some_and(|at| *at < listed) {
                        claimed.remove(&key);
                    }
                    claimed
                        .get(&key)
                        .is_some_and(|at| now.duration_since(*at) < CLAIM_SETTLE)
                };
                if !unused_now || settling {
                    continue;
                }
                seen.insert(key.clone());
                let since = *unused.entry(key.clone()).or_insert(now);
                if now.duration_since(since) < shared.config.reclaim_grace {
                    continue;
                }
                let api = Api::<Instance>::namespaced(shared.client.clone(), &namespace);
                match claims::release(&api, &name, slot, &usage).await {
                    Ok(updated) => {
                        tracing::info!(instance = %name, %slot, holder = %usage, "slot freed: no container holds it");
                        shared.counters.reclaimed.fetch_add(1, Ordering::Relaxed);
                        shared.store(updated);
                    }
                    Err(error) if error.is_conflict() => {}
                    Err(error) => {
                        tracing::warn!(instance = %name, %slot, %error, "cannot free the slot")
                    }
                }
                unused.remove(&key);
            }
        }
        unused.retain(|key, _| seen.contains(key));
    }
}

#[cfg(test)]
mod tests {
    use super::socket_name;

    #[test]
    fn a_tagged_socket_name_differs_per_process_and_keeps_the_resource() {
        assert_eq!(socket_name("akri.sh/cams", None), "akri.sh_cams.sock");
        assert_eq!(
            socket_name("akri.sh/cams", Some("Ab3_x9Qz")),
            "akri.sh_cams-Ab3_x9Qz.sock"
        );
    }
}
