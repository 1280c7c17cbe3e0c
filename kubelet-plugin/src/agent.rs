//! The node agent: discovery in, DRA out.
//!
//! One loop owns the node's state and reacts to: DiscoveryConfigurations changing (a watch),
//! discovery handlers (un)registering, handlers reporting devices, a driver's prepared claims
//! changing, the time a vanished device's taint moves on or a kubelet should have taken a
//! driver, and a resync every 30 s. Per configuration whose handler is registered it runs one
//! discovery stream; per handler (one DRA driver) it serves the kubelet plugin and publishes
//! this node's pool, health and Instances whenever that driver's devices change. A pass reads
//! nothing from the API server that its watches do not already keep (the library's slice
//! publisher and [`InstanceWriter`] keep what is stored), except the Secrets and ConfigMaps of
//! discovery properties.

use crate::discovery::debug_echo::{DebugEcho, DebugEchoConfig};
use crate::discovery::{DiscoveryEvent, RegisteredHandler, Registry};
use crate::discovery_errors::DiscoveryErrors;
use crate::driver::AkriDriver;
use crate::embedded::Embedded;
use crate::instances::InstanceWriter;
use crate::kubelet_registration::KubeletRegistration;
use crate::legacy::{LegacyContext, LegacyOptions};
use crate::metrics::{Metrics, Timed};
use crate::node_devices::{ConfigDevices, NodeDevices};
use crate::startup::StartupGate;
use crate::state_dir::StateDir;
use crate::streams::{StreamEvent, StreamSpec, Streams};
use akri_api::v1::DiscoveryConfiguration;
use akri_discovery_handler::Served;
use akri_legacy_device_plugin::plugins::Counters;
use akri_runtime::http::Readiness;
use dra_plugin::cdi::CdiRoot;
use dra_plugin::vanished::VanishedDevices;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Where the agent keeps and finds things on the node.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub node_name: String,
    /// Namespace the Instances are written to.
    pub instance_namespace: String,
    /// The kubelet's plugin registry directory.
    pub registry_dir: PathBuf,
    /// Parent of each driver's socket directory (the kubelet's `plugins/`).
    pub plugins_dir: PathBuf,
    /// Where CDI specs are written (the container runtime's CDI spec directory).
    pub cdi_dir: PathBuf,
    /// Checkpoints and the handler registrations.
    pub state_dir: PathBuf,
    /// Akri's discovery-handler registration socket.
    pub discovery_socket: PathBuf,
    /// Run the embedded debugEcho handler.
    pub debug_echo: Option<DebugEchoConfig>,
    /// Discovery handlers to serve in this process ([`crate::embedded`]), each on
    /// `<discovery socket's directory>/<name>.sock`.
    pub embedded_handlers: Vec<Embedded>,
    /// Whether the API server keeps consumable capacity; `None` asks it at start (a dry-run
    /// probe). Decides, with each configuration's `uniqueDevices`, how capacity > 1 is
    /// modelled ([`akri_devices::Sharing::for_configuration`]).
    pub consumable_capacity: Option<bool>,
    /// How long an Instance outlives its device's disappearance from this node.
    pub instance_grace: Duration,
    /// How long a device that vanished while a claim holds it stays `NoSchedule`-tainted
    /// before the taint turns `NoExecute` ([`dra_plugin::vanished`]).
    pub vanished_grace: Duration,
    /// Whether the API server keeps device taints; `None` asks it at start (a dry-run probe).
    pub device_taints: Option<bool>,
    /// How long a (re)started agent leaves the node's slices and Instances as they are while
    /// it waits for every configuration's discovery to answer ([`StartupGate`]).
    pub startup_wait: Duration,
    /// Namespaces whose Secrets and ConfigMaps discovery properties may name; `None`: any.
    pub property_namespaces: Option<BTreeSet<String>>,
    /// Also serve `akri.sh/v0` Configurations as device plugins ([`crate::legacy`]).
    pub legacy: Option<LegacyOptions>,
    /// How long a served DRA driver may wait for a kubelet to take it before the agent is
    /// not ready with the reason ([`crate::kubelet_registration`]).
    pub kubelet_registration_timeout: Duration,
}

impl AgentConfig {
    /// An agent of `node_name` that keeps everything under `dir` (kubelet directories, CDI
    /// specs, state, the registration socket) and runs the embedded debugEcho handler, its
    /// availability file `dir/availability.txt` polled every 100 ms: the agent embedded in a
    /// test or a benchmark. Instances go as soon as their device does, start-up waits at most
    /// 10 s, the capacity model and device taints are asked of the API server, a vanished held
    /// device turns `NoExecute` after 5 minutes, legacy mode is off. Point the
    /// kubelet directories at a kubelet with [`AgentConfig::kubelet_dirs`].
    pub fn embedded(node_name: &str, instance_namespace: &str, dir: &Path) -> Self {
        let mut echo = DebugEchoConfig::new(dir.join("debug-echo.sock"));
        echo.availability_file = dir.join("availability.txt");
        echo.poll_interval = Duration::from_millis(100);
        AgentConfig {
            node_name: node_name.to_string(),
            instance_namespace: instance_namespace.to_string(),
            registry_dir: dir.join("registry"),
            plugins_dir: dir.join("plugins"),
            cdi_dir: dir.join("cdi"),
            state_dir: dir.join("state"),
            discovery_socket: dir.join("handlers/agent-registration.sock"),
            debug_echo: Some(echo),
            embedded_handlers: Vec::new(),
            consumable_capacity: None,
            instance_grace: Duration::ZERO,
            vanished_grace: Duration::from_secs(300),
            device_taints: None,
            startup_wait: Duration::from_secs(10),
            property_namespaces: None,
            legacy: None,
            kubelet_registration_timeout: Duration::from_secs(60),
        }
    }

    /// Uses a kubelet's plugin registry, plugins and CDI directories.
    pub fn kubelet_dirs(mut self, registry: PathBuf, plugins: PathBuf, cdi: PathBuf) -> Self {
        self.registry_dir = registry;
        self.plugins_dir = plugins;
        self.cdi_dir = cdi;
        self
    }

    /// The embedded debugEcho handler's settings, for tests to adjust.
    pub fn debug_echo_mut(&mut self) -> &mut DebugEchoConfig {
        self.debug_echo
            .get_or_insert_with(|| DebugEchoConfig::new(self.state_dir.join("debug-echo.sock")))
    }
}

/// Errors that stop the agent from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("discovery registry: {0}")]
    Registry(#[from] crate::discovery::registry::Error),
    #[error(transparent)]
    StateDir(#[from] crate::state_dir::Error),
    #[error("embedded debugEcho: {0}")]
    DebugEcho(#[from] crate::discovery::debug_echo::Error),
    #[error(transparent)]
    Embedded(#[from] crate::embedded::Error),
    #[error("reading node {node}: {source}")]
    Node {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("asking the API server what it supports: {0}")]
    ApiSupport(#[from] dra_plugin::api_support::Error),
    #[error("CDI directory: {0}")]
    Cdi(#[from] dra_plugin::cdi::Error),
    #[error("kubelet plugin: {0}")]
    Plugin(#[from] dra_plugin::builder::Error),
}

/// A running agent; dropping it stops everything it serves.
pub struct Agent {
    task: tokio::task::JoinHandle<()>,
    legacy: Option<tokio::task::JoinHandle<()>>,
    devices: NodeDevices,
    metrics: Metrics,
    readiness: Readiness,
    _state_dir: StateDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(legacy) = &self.legacy {
            legacy.abort();
        }
    }
}

impl Agent {
    /// The legacy path's allocation counters, once its plugins run.
    pub fn legacy_counters(&self) -> Option<Arc<Counters>> {
        self.metrics.legacy_counters().get().cloned()
    }

    /// The devices this node currently sees.
    pub fn devices(&self) -> &NodeDevices {
        &self.devices
    }

    /// What `/metrics` serves.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Ready once the start-up gate has opened (discovery answered, or its wait ran out),
    /// while the configurations can be watched.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }
}

/// One served DRA driver (one discovery handler).
struct ServedDriver {
    plugin: dra_plugin::Plugin<Timed<AkriDriver>>,
    /// Devices kept (tainted) while prepared claims hold them after they vanished.
    vanished: VanishedDevices,
    /// Whether `vanished` has read what a previous process published.
    seeded: bool,
    /// Every device name this driver published on this node since it started.
    ever_published: BTreeSet<String>,
    /// When it started serving: a kubelet should take it soon after.
    served_at: tokio::time::Instant,
}

/// Starts the agent.
pub async fn start(client: kube::Client, config: AgentConfig) -> Result<Agent, Error> {
    // Before anything on the node is touched: one agent per state directory, out of the
    // handlers' reach.
    let state_dir = StateDir::open(&config.state_dir, config.discovery_socket.parent()).await?;
    let registry = Registry::serve(
        &config.discovery_socket,
        &config.state_dir.join("discovery-handlers.json"),
    )?;
    let debug_echo = match &config.debug_echo {
        Some(echo) => {
            let handler = DebugEcho::serve(echo.clone())?;
            handler.register(registry.socket()).await?;
            Some(handler)
        }
        None => None,
    };
    let mut embedded = Vec::new();
    for handler in &config.embedded_handlers {
        embedded.push(handler.start(registry.socket(), &config.state_dir).await?);
    }
    let node = crate::api_call(Api::<Node>::all(client.clone()).get(&config.node_name))
        .await
        .map_err(|source| Error::Node {
            node: config.node_name.clone(),
            source,
        })?;
    let node_uid = node.metadata.uid.unwrap_or_default();
    let consumable_capacity = match config.consumable_capacity {
        Some(known) => known,
        None => dra_plugin::api_support::consumable_capacity(&client).await?,
    };
    tracing::info!(consumable_capacity, "device sharing model");
    let device_taints = match config.device_taints {
        Some(known) => known,
        None => dra_plugin::api_support::device_taints(&client).await?,
    };
    tracing::info!(
        device_taints,
        "vanished held devices are kept tainted (or, without device taints, dropped)"
    );
    let devices = NodeDevices::with_names_file(
        &config.node_name,
        consumable_capacity,
        &config.state_dir.join("instance-names.json"),
    );
    let (metrics, readiness) = (Metrics::default(), Readiness::default());
    let state = AgentState {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
        client: client.clone(),
        config: config.clone(),
        node_uid,
        device_taints,
        next_taint_change: None,
        registration: KubeletRegistration::new(config.kubelet_registration_timeout),
        next_registration_check: None,
        devices: devices.clone(),
        drivers: BTreeMap::new(),
        streams: Streams::default(),
        instances: InstanceWriter::new(
            client,
            &config.instance_namespace,
            &config.node_name,
            config.instance_grace,
        ),
        errors: DiscoveryErrors::default(),
        refused: BTreeSet::new(),
        startup: StartupGate::new(config.startup_wait),
    };
    let legacy = config.legacy.clone().map(|options| {
        tokio::spawn(crate::legacy::run(LegacyContext {
            client: state.client.clone(),
            node: config.node_name.clone(),
            options,
            handlers: registry.subscribe(),
            names_file: config.state_dir.join("legacy-instance-names.json"),
            instance_grace: config.instance_grace,
            startup_wait: config.startup_wait,
            property_namespaces: config.property_namespaces.clone(),
            counters: metrics.legacy_counters().clone(),
        }))
    });
    let task = tokio::spawn(state.run(registry, (debug_echo, embedded)));
    Ok(Agent {
        task,
        legacy,
        devices,
        metrics,
        readiness,
        _state_dir: state_dir,
    })
}

struct AgentState {
    client: kube::Client,
    config: AgentConfig,
    node_uid: String,
    /// Whether the API server keeps device taints.
    device_taints: bool,
    /// When some vanished device's taint turns `NoExecute`.
    next_taint_change: Option<tokio::time::Instant>,
    /// Whether a kubelet took each served driver, and when to look again.
    registration: KubeletRegistration,
    next_registration_check: Option<tokio::time::Instant>,
    devices: NodeDevices,
    drivers: BTreeMap<String, ServedDriver>,
    streams: Streams,
    instances: InstanceWriter,
    errors: DiscoveryErrors,
    /// Configurations not run because of their names (each said once).
    refused: BTreeSet<String>,
    startup: StartupGate,
    metrics: Metrics,
    readiness: Readiness,
}

/// What a watch of the agent said, as far as the loop cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WatchEvent {
    Changed,
    /// The first list is complete.
    Listed,
    Failed,
}

impl AgentState {
    async fn run(mut self, registry: Registry, _embedded: (Option<DebugEcho>, Vec<Served>)) {
        let mut handlers = registry.subscribe();
        let configs_api = Api::<DiscoveryConfiguration>::all(self.client.clone());
        let (store, writer) = kube::runtime::reflector::store();
        let mut config_changes = Box::pin(
            // Every watch event, deletions included, triggers a pass over the store; the end
            // of the first list tells the start-up gate that the store is complete.
            kube::runtime::reflector(
                writer,
                watcher(configs_api, watcher::Config::default()).default_backoff(),
            )
            .map(|event| match event {
                Ok(watcher::Event::InitDone) => WatchEvent::Listed,
                Ok(_) => WatchEvent::Changed,
                Err(_) => WatchEvent::Failed,
            }),
        );
        let (events_tx, mut events) = mpsc::channel::<StreamEvent>(64);
        // Drivers whose prepared claims changed: a vanished device may have lost its last holder.
        let (claims_tx, mut claims_changed) = mpsc::unbounded_channel::<String>();
        let mut resync = tokio::time::interval(Duration::from_secs(30));
        let mut dirty: BTreeSet<String> = BTreeSet::new();
        let startup_deadline = tokio::time::sleep(self.startup.remaining());
        tokio::pin!(startup_deadline);
        // A finished sleep is ready again at once: poll it only until it has fired.
        let mut waited = false;
        let mut watch_failing = false;
        loop {
            tokio::select! {
                // A failing watch retries by itself, with backoff; a pass now would only fail
                // its writes too (the resync retries them), so the outage costs no work.
                event = config_changes.next() => match event {
                    Some(WatchEvent::Listed) => {
                        watch_failing = false;
                        self.startup.configs_listed();
                    }
                    Some(WatchEvent::Failed) => {
                        watch_failing = true;
                        self.readiness.not_ready(
                            "cannot watch DiscoveryConfigurations (the API server is unreachable or refuses)",
                        );
                        continue;
                    }
                    _ => watch_failing = false,
                },
                _ = &mut startup_deadline, if !self.startup.is_open() && !waited => waited = true,
                changed = handlers.changed() => if changed.is_err() { return },
                Some(event) = events.recv() => {
                    if let Some(driver) = self.on_stream_event(event) {
                        dirty.insert(driver);
                    }
                    // Take every event already waiting before publishing.
                    while let Ok(event) = events.try_recv() {
                        if let Some(driver) = self.on_stream_event(event) {
                            dirty.insert(driver);
                        }
                    }
                }
                _ = resync.tick() => dirty.extend(self.drivers.keys().cloned()),
                Some(driver) = claims_changed.recv() => {
                    dirty.insert(driver);
                }
                _ = sleep_until_some(self.next_registration_check) => {
                    self.next_registration_check = None;
                }
                _ = sleep_until_some(self.next_taint_change) => {
                    self.next_taint_change = None;
                    dirty.extend(self.drivers.keys().cloned());
                }
            }
            let configs: Vec<DiscoveryConfiguration> =
                store.state().iter().map(|c| (**c).clone()).collect();
            let registered = handlers.borrow().clone();
            dirty.extend(self.sync_streams(&configs, &registered, &events_tx).await);
            dirty.extend(self.sync_drivers(&registered, &claims_tx).await);
            self.errors
                .report(&self.client, &self.config.node_name)
                .await;
            self.metrics.set_discovery_errors(self.errors.failing());
            let keys = configs.iter().filter_map(|c| {
                let name = c.metadata.name.as_deref()?;
                Some((name, name, c.spec.discovery_handler.name.as_str()))
            });
            if !self.startup.open(keys, &registered) {
                // Keep what the previous process published until discovery has answered.
                self.readiness
                    .not_ready("starting: waiting for the discovery handlers to report");
                continue;
            }
            let registration = self.registration.check(
                self.drivers.iter().map(|(driver, served)| {
                    let status = served.plugin.registration_status();
                    (driver.as_str(), status, served.served_at)
                }),
                tokio::time::Instant::now(),
                &self.config.registry_dir,
            );
            self.next_registration_check = registration.next_check;
            match registration.problem {
                Some(problem) => self.readiness.not_ready(problem),
                None if !watch_failing => self.readiness.ready(),
                None => {}
            }
            if !dirty.is_empty() {
                for driver in std::mem::take(&mut dirty) {
                    self.publish(&driver).await;
                }
                self.sync_instances().await;
            }
            if self.instances.pending() {
                dirty.extend(self.drivers.keys().cloned());
            }
        }
    }

    /// Applies one stream event to the node's devices; returns the driver that changed.
    fn on_stream_event(&mut self, event: StreamEvent) -> Option<String> {
        let driver = akri_devices::driver_name(&event.handler.name);
        match event.event {
            DiscoveryEvent::Devices(devices) => {
                self.errors.discovery.remove(&event.configuration);
                self.startup.answered(&event.configuration);
                let changed = self.devices.set(
                    &driver,
                    ConfigDevices {
                        configuration: event.configuration,
                        capacity: event.capacity,
                        unique_devices: event.unique_devices,
                        shared: event.handler.shared,
                        devices,
                    },
                );
                changed.then_some(driver)
            }
            DiscoveryEvent::Error(error) => {
                // The stream reconnects by itself; the devices stay as last reported.
                tracing::warn!(configuration = %event.configuration, handler = %event.handler.name, %error, "discovery failed");
                self.errors.discovery.insert(
                    event.configuration,
                    format!("handler {}: {error}", event.handler.name),
                );
                None
            }
        }
    }

    /// Starts a stream per configuration whose handler is registered, restarts streams whose
    /// input changed, stops the others. Returns drivers whose devices were dropped.
    async fn sync_streams(
        &mut self,
        configs: &[DiscoveryConfiguration],
        handlers: &BTreeMap<String, RegisteredHandler>,
        events: &mpsc::Sender<StreamEvent>,
    ) -> Vec<String> {
        let mut wanted = BTreeSet::new();
        for config in configs {
            let Some(name) = config.metadata.name.clone() else {
                continue;
            };
            let spec = &config.spec;
            let Some(handler) = handlers.get(&spec.discovery_handler.name) else {
                continue;
            };
            // A name stored before the CRD refused it would name devices the API server
            // refuses, failing the node pool that every configuration of the handler shares.
            // Its status cannot say so (the CRD's rules refuse any write to the object now),
            // so a Warning Event on the node does, once per process.
            if let Err(why) = akri_devices::validate_configuration_name(&name) {
                if self.refused.insert(name.clone()) {
                    tracing::warn!(configuration = %name, %why, "configuration not run");
                    tokio::spawn(crate::node_events::warn(
                        self.client.clone(),
                        self.config.node_name.clone(),
                        self.node_uid.clone(),
                        "ConfigurationNotRun",
                        format!(
                            "DiscoveryConfiguration {name} is not run on this node: {why}; recreate it under a valid name"
                        ),
                    ));
                }
                continue;
            }
            let properties = match crate::properties::resolve(
                &self.client,
                &spec.discovery_handler.discovery_properties,
                self.config.property_namespaces.as_ref(),
            )
            .await
            {
                Ok(properties) => {
                    self.errors.properties.remove(&name);
                    properties
                }
                Err(error) if error.is_transient() && self.streams.contains(&name) => {
                    // An outage or a refusal is not a change: discovery goes on with the
                    // values it has (other edits of the configuration still apply), and the
                    // status says why they may be stale.
                    tracing::warn!(configuration = %name, %error, "reading discovery properties failed; discovery goes on with the last values read");
                    self.errors
                        .properties
                        .insert(name.clone(), error.to_string());
                    self.streams.properties(&name).cloned().unwrap_or_default()
                }
                Err(error) => {
                    tracing::warn!(configuration = %name, %error, "discovery not started");
                    self.errors
                        .properties
                        .insert(name.clone(), error.to_string());
                    continue;
                }
            };
            wanted.insert(name.clone());
            let spec = StreamSpec {
                handler: handler.clone(),
                details: spec.discovery_handler.discovery_details.clone(),
                properties,
                capacity: spec.capacity,
                unique_devices: spec.unique_devices,
            };
            if self.streams.ensure(&name, spec, events) {
                tracing::info!(configuration = %name, handler = %handler.name, "discovery started");
            }
        }
        let mut changed = Vec::new();
        for name in self.streams.stop_others(&wanted) {
            self.errors.discovery.remove(&name);
            if !configs
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some(name.as_str()))
            {
                self.errors.properties.remove(&name);
            }
            for driver in self.drivers.keys() {
                if self.devices.remove(driver, &name) {
                    changed.push(driver.clone());
                }
            }
            tracing::info!(configuration = %name, "discovery stopped");
        }
        changed
    }

    /// Serves a kubelet plugin per registered handler. Returns drivers newly served.
    async fn sync_drivers(
        &mut self,
        handlers: &BTreeMap<String, RegisteredHandler>,
        claims_changed: &mpsc::UnboundedSender<String>,
    ) -> Vec<String> {
        let mut started = Vec::new();
        for handler in handlers.values() {
            let driver = akri_devices::driver_name(&handler.name);
            if self.drivers.contains_key(&driver) {
                continue;
            }
            match self.serve_driver(&handler.name, &driver).await {
                Ok(served) => {
                    tokio::spawn(forward_claim_changes(
                        served.plugin.service().prepared_changes(),
                        driver.clone(),
                        claims_changed.clone(),
                    ));
                    self.drivers.insert(driver.clone(), served);
                    started.push(driver);
                }
                Err(error) => tracing::error!(%driver, %error, "cannot serve the DRA driver"),
            }
        }
        started
    }

    async fn serve_driver(&self, handler: &str, driver: &str) -> Result<ServedDriver, Error> {
        let cdi = CdiRoot::new(&self.config.cdi_dir, akri_devices::DRIVER_DOMAIN)?;
        let akri_driver = AkriDriver {
            driver: driver.to_string(),
            cdi_class: handler.to_ascii_lowercase(),
            client: self.client.clone(),
            cdi,
            devices: self.devices.clone(),
        };
        let checkpoint = self
            .config
            .state_dir
            .join(format!("{driver}-checkpoint.json"));
        let timed = Timed {
            inner: akri_driver,
            driver: driver.to_string(),
            metrics: self.metrics.clone(),
        };
        let plugin = dra_plugin::Plugin::builder(driver, &self.config.node_name)
            .registry_dir(&self.config.registry_dir)
            .plugin_dir(self.config.plugins_dir.join(driver))
            .checkpoint(checkpoint)
            .node_uid(&self.node_uid)
            .field_manager(akri_devices::node_field_manager(&self.config.node_name))
            // Slices changed or deleted behind its back (the kubelet's DRA manager deletes a
            // node's slices when it restarts) are written again as last published; a
            // vanished device's taint moves on at its own time (`next_taint_change`).
            .start(self.client.clone(), timed)
            .await?;
        if let Some(set_aside) = plugin.service().set_aside() {
            let note = format!(
                "The prepared-claims checkpoint of {driver} was unusable ({}); it was moved to {} and the plugin started without it. Claims are prepared again as the kubelet asks.",
                set_aside.reason,
                set_aside.moved_to.display()
            );
            tokio::spawn(crate::node_events::warn(
                self.client.clone(),
                self.config.node_name.clone(),
                self.node_uid.clone(),
                "CheckpointSetAside",
                note,
            ));
        }
        Ok(ServedDriver {
            plugin,
            vanished: VanishedDevices::new(
                akri_devices::NOT_DISCOVERED_TAINT,
                self.config.vanished_grace,
                self.device_taints,
            ),
            seeded: false,
            ever_published: BTreeSet::new(),
            served_at: tokio::time::Instant::now(),
        })
    }

    /// Publishes a driver's node-local pool and its devices' health.
    async fn publish(&mut self, driver: &str) {
        let local = self.devices.local_dra_devices(driver);
        let pool = self.config.node_name.clone();
        let Some(served) = self.drivers.get_mut(driver) else {
            return;
        };
        let reported: Vec<_> = local.iter().map(|(d, _)| d.clone()).collect();
        if !served.seeded {
            // What a previous process published: its vanished devices and their graces.
            match tokio::time::timeout(crate::API_CALL_TIMEOUT, served.plugin.pools().stored(&pool))
                .await
            {
                Ok(Ok(stored)) => {
                    served
                        .vanished
                        .seed(dra_plugin::slices::current_devices(&stored));
                    served.seeded = true;
                }
                _ => {
                    tracing::warn!(%driver, "reading the published pool failed; retrying on the next change or resync");
                    return;
                }
            }
        }
        let held = crate::vanished::held_devices(&served.plugin.service().prepared().await, &pool);
        let plan = served
            .vanished
            .plan(reported, &held, k8s_openapi::jiff::Timestamp::now());
        if let Some(at) = plan.next_change {
            let wait = k8s_openapi::jiff::Timestamp::now()
                .duration_until(at)
                .unsigned_abs();
            let at = tokio::time::Instant::now() + wait;
            self.next_taint_change = Some(self.next_taint_change.map_or(at, |t| t.min(at)));
        }
        for device in &plan.newly_vanished {
            crate::vanished::announce(
                &self.client,
                &self.config.node_name,
                &self.node_uid,
                driver,
                device,
                self.device_taints,
            );
        }
        let devices = plan.devices.len();
        let published =
            tokio::time::timeout(crate::API_CALL_TIMEOUT, served.plugin.publish(plan.devices))
                .await
                .unwrap_or_else(|_| Err(dra_plugin::slices::Error::TimedOut));
        match published {
            Ok(published) => {
                self.metrics.set_devices_published(driver, devices);
                if published.written + published.deleted > 0 {
                    tracing::info!(%driver, devices, generation = published.generation, "published node pool");
                }
            }
            Err(error) => {
                tracing::warn!(%driver, %error, "publishing the node pool failed; retrying on the next change or resync")
            }
        }

        // Health: published devices are healthy; a device published before and gone now is
        // unhealthy (pods that still hold it learn it from the kubelet) until it returns.
        let now: BTreeSet<String> = local.iter().map(|(d, _)| d.name.clone()).collect();
        // Gone from the health map once nothing holds them: nobody asks about them any more.
        let forget: Vec<String> = served
            .ever_published
            .iter()
            .filter(|name| !now.contains(*name) && !held.contains(*name))
            .cloned()
            .collect();
        for name in &forget {
            served.plugin.health().remove(&pool, name);
            served.ever_published.remove(name);
        }
        for name in &now {
            served.plugin.health().set(&pool, name, true, "");
        }
        for gone in served.ever_published.difference(&now) {
            served.plugin.health().set(
                &pool,
                gone,
                false,
                "its discovery handler no longer reports it",
            );
        }
        served.ever_published.extend(now);
    }

    /// Writes the Instances of every driver's devices on this node.
    async fn sync_instances(&mut self) {
        let mut known = Vec::new();
        for driver in self.drivers.keys() {
            let configs = self.devices.configurations(driver);
            for device in self.devices.known(driver) {
                let config = configs
                    .iter()
                    .find(|c| c.configuration == device.configuration);
                let (capacity, shared) = config.map_or((1, false), |c| (c.capacity, c.shared));
                known.push((device, capacity, shared));
            }
        }
        if let Err(error) = self.instances.sync(&known).await {
            tracing::warn!(%error, "writing Instances failed; retrying on the next change or resync");
        }
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sends `driver` on `to` after each change of its prepared claims, until either side goes.
async fn forward_claim_changes(
    mut changes: tokio::sync::watch::Receiver<()>,
    driver: String,
    to: mpsc::UnboundedSender<String>,
) {
    while changes.changed().await.is_ok() {
        if to.send(driver.clone()).is_err() {
            return;
        }
    }
}
