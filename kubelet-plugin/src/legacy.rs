//! The legacy path of the node agent: `akri.sh/v0` Configurations served as device plugins.
//!
//! The same discovery (handlers, streams, properties) and Instance writing as the DRA path,
//! with Instances in each Configuration's namespace, labelled as the legacy path's and with
//! `deviceUsage` slots; [`akri_legacy_device_plugin`] turns them into Instance- and
//! Configuration-level device plugins. A cluster can move one configuration at a time: the
//! v1 and v0 paths run side by side and never see each other's Instances.

use crate::discovery::{DiscoveredDevice, DiscoveryEvent, Handlers};
use crate::instances::InstanceWriter;
use crate::node_devices::{ConfigDevices, NodeDevices};
use crate::startup::StartupGate;
use crate::streams::{StreamEvent, StreamSpec, Streams};
use akri_api::v0::Configuration;
use akri_legacy_device_plugin::plugins::{
    ConfigurationDevices, Counters, DeviceEdits, LegacyConfig, LegacyPlugins,
};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kubelet_proto::deviceplugin::v1beta1 as api;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The legacy path's settings.
#[derive(Clone, Debug)]
pub struct LegacyOptions {
    /// The kubelet's device-plugin directory (`/var/lib/kubelet/device-plugins`).
    pub device_plugin_dir: PathBuf,
    /// The kubelet's pod-resources socket; `None`: held slots are never reclaimed.
    pub pod_resources_socket: Option<PathBuf>,
    /// How long a slot with no container behind it stays held.
    pub reclaim_grace: Duration,
    /// How often held slots are checked.
    pub reclaim_interval: Duration,
}

/// What the legacy loop needs from the agent.
pub struct LegacyContext {
    pub client: kube::Client,
    pub node: String,
    pub options: LegacyOptions,
    pub handlers: watch::Receiver<Handlers>,
    pub names_file: PathBuf,
    pub instance_grace: Duration,
    pub startup_wait: Duration,
    pub property_namespaces: Option<BTreeSet<String>>,
    /// Set once the plugins run, for the agent's callers.
    pub counters: Arc<std::sync::OnceLock<Arc<Counters>>>,
}

/// The stream key of a v0 Configuration: `<namespace>/<name>`.
fn key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// Runs the legacy path until the task is aborted.
pub async fn run(mut cx: LegacyContext) {
    let mut plugins = LegacyPlugins::start(
        cx.client.clone(),
        LegacyConfig {
            node: cx.node.clone(),
            device_plugin_dir: cx.options.device_plugin_dir.clone(),
            pod_resources_socket: cx.options.pod_resources_socket.clone(),
            reclaim_grace: cx.options.reclaim_grace,
            reclaim_interval: cx.options.reclaim_interval,
        },
    );
    let _ = cx.counters.set(plugins.counters());
    // Grouped by namespace (where `NodeDevices` groups the DRA path's by driver): a v0
    // Configuration's name is unique in its namespace, and so are its Instances' names.
    let devices = NodeDevices::with_names_file(&cx.node, false, &cx.names_file);
    let (store, writer) = kube::runtime::reflector::store();
    let mut config_changes = Box::pin(
        kube::runtime::reflector(
            writer,
            watcher(
                Api::<Configuration>::all(cx.client.clone()),
                watcher::Config::default(),
            )
            .default_backoff(),
        )
        .map(|event| matches!(event, Ok(watcher::Event::InitDone))),
    );
    let (events_tx, mut events) = mpsc::channel::<StreamEvent>(64);
    let mut streams = Streams::default();
    let mut writers: BTreeMap<String, InstanceWriter> = BTreeMap::new();
    let mut startup = StartupGate::new(cx.startup_wait);
    let startup_deadline = tokio::time::sleep(startup.remaining());
    tokio::pin!(startup_deadline);
    let mut waited = false;
    let mut refused = BTreeSet::new();
    let mut resync = tokio::time::interval(Duration::from_secs(30));
    loop {
        tokio::select! {
            event = config_changes.next() => match event {
                Some(true) => startup.configs_listed(),
                Some(false) => {}
                None => return,
            },
            changed = cx.handlers.changed() => if changed.is_err() { return },
            Some(event) = events.recv() => {
                on_stream_event(&devices, &mut startup, event);
                while let Ok(event) = events.try_recv() {
                    on_stream_event(&devices, &mut startup, event);
                }
            }
            _ = &mut startup_deadline, if !startup.is_open() && !waited => waited = true,
            _ = resync.tick() => {}
        }
        let configs: Vec<Arc<Configuration>> = store.state();
        let registered = cx.handlers.borrow().clone();

        // Discovery: a stream per configuration whose handler is registered.
        let mut wanted = BTreeSet::new();
        for config in &configs {
            let (Some(namespace), Some(name)) = (
                config.metadata.namespace.as_deref(),
                config.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let Some(handler) = registered.get(&config.spec.discovery_handler.name) else {
                continue;
            };
            if let Err(why) = akri_devices::validate_configuration_name(name) {
                if refused.insert(key(namespace, name)) {
                    tracing::warn!(configuration = %name, %namespace, %why, "Configuration not run");
                }
                continue;
            }
            let key = key(namespace, name);
            let properties: Vec<akri_api::v1::DiscoveryProperty> = config
                .spec
                .discovery_handler
                .discovery_properties
                .iter()
                .flatten()
                .map(Into::into)
                .collect();
            let properties = match crate::properties::resolve(
                &cx.client,
                &properties,
                cx.property_namespaces.as_ref(),
            )
            .await
            {
                Ok(properties) => properties,
                Err(error) if error.is_transient() && streams.contains(&key) => {
                    tracing::warn!(configuration = %name, %namespace, %error, "reading discovery properties failed; discovery goes on with the last values read");
                    streams.properties(&key).cloned().unwrap_or_default()
                }
                Err(error) => {
                    tracing::warn!(configuration = %name, %namespace, %error, "discovery not started");
                    continue;
                }
            };
            wanted.insert(key.clone());
            let spec = StreamSpec {
                handler: handler.clone(),
                details: config.spec.discovery_handler.discovery_details.clone(),
                properties,
                capacity: i32::try_from(config.spec.capacity).unwrap_or(i32::MAX),
                unique_devices: config.spec.unique_devices(),
            };
            if streams.ensure(&key, spec, &events_tx) {
                tracing::info!(configuration = %name, %namespace, handler = %handler.name, "discovery started (device plugins)");
            }
        }
        for stopped in streams.stop_others(&wanted) {
            if let Some((namespace, name)) = stopped.split_once('/') {
                devices.remove(namespace, name);
                tracing::info!(configuration = %name, %namespace, "discovery stopped (device plugins)");
            }
        }

        // Nothing is written before discovery answered once (see `StartupGate`).
        let keys: Vec<(String, &str, &str)> = configs
            .iter()
            .filter_map(|c| {
                Some((
                    key(
                        c.metadata.namespace.as_deref()?,
                        c.metadata.name.as_deref()?,
                    ),
                    c.metadata.name.as_deref()?,
                    c.spec.discovery_handler.name.as_str(),
                ))
            })
            .collect();
        let gate = keys.iter().map(|(k, n, h)| (k.as_str(), *n, *h));
        if !startup.open(gate, &registered) {
            continue;
        }

        // Instances, per namespace; then the plugins over them.
        let namespaces: BTreeSet<String> = configs
            .iter()
            .filter_map(|c| c.metadata.namespace.clone())
            .chain(writers.keys().cloned())
            .collect();
        let mut served = Vec::new();
        for namespace in namespaces {
            let known: Vec<_> = devices
                .known(&namespace)
                .into_iter()
                .filter_map(|device| {
                    let config = devices
                        .configurations(&namespace)
                        .into_iter()
                        .find(|c| c.configuration == device.configuration)?;
                    Some((device, config.capacity, config.shared))
                })
                .collect();
            let writer = writers.entry(namespace.clone()).or_insert_with(|| {
                InstanceWriter::legacy(cx.client.clone(), &namespace, &cx.node, cx.instance_grace)
            });
            if let Err(error) = writer.sync(&known).await {
                tracing::warn!(%namespace, %error, "writing legacy Instances failed; retrying on the next change or resync");
            }
            for config in devices.configurations(&namespace) {
                let broker_properties = configs
                    .iter()
                    .find(|c| {
                        c.metadata.namespace.as_deref() == Some(&namespace)
                            && c.metadata.name.as_deref() == Some(&config.configuration)
                    })
                    .map(|c| c.spec.broker_properties.clone())
                    .unwrap_or_default();
                let instances = known
                    .iter()
                    .filter(|(d, _, _)| d.configuration == config.configuration)
                    .map(|(d, _, _)| (d.instance.clone(), edits(&broker_properties, &d.device)))
                    .collect();
                served.push(ConfigurationDevices {
                    namespace: namespace.clone(),
                    name: config.configuration.clone(),
                    unique_devices: config.unique_devices,
                    instances,
                });
            }
        }
        plugins.sync(&served).await;
    }
}

fn on_stream_event(devices: &NodeDevices, startup: &mut StartupGate, event: StreamEvent) {
    let Some((namespace, name)) = event.configuration.split_once('/') else {
        return;
    };
    match event.event {
        DiscoveryEvent::Devices(found) => {
            startup.answered(&event.configuration);
            devices.set(
                namespace,
                ConfigDevices {
                    configuration: name.to_string(),
                    capacity: event.capacity,
                    unique_devices: event.unique_devices,
                    shared: event.handler.shared,
                    devices: found,
                },
            );
        }
        DiscoveryEvent::Error(error) => {
            tracing::warn!(configuration = %name, %namespace, handler = %event.handler.name, %error, "discovery failed");
        }
    }
}

/// What a container allocated a device gets: the Configuration's `brokerProperties` and the
/// device's properties as environment (the device's win, as in its Instance), its mounts and
/// device nodes.
fn edits(broker_properties: &BTreeMap<String, String>, device: &DiscoveredDevice) -> DeviceEdits {
    let mut envs = broker_properties.clone();
    envs.extend(device.properties.clone());
    DeviceEdits {
        envs,
        mounts: device
            .mounts
            .iter()
            .map(|m| api::Mount {
                container_path: m.container_path.clone(),
                host_path: m.host_path.clone(),
                read_only: m.read_only,
            })
            .collect(),
        devices: device
            .device_specs
            .iter()
            .map(|d| api::DeviceSpec {
                container_path: d.container_path.clone(),
                host_path: d.host_path.clone(),
                permissions: d.permissions.clone(),
            })
            .collect(),
    }
}
