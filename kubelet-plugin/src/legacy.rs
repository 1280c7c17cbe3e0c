//! The legacy sink of the node's discovery: `akri.sh/v0` Configurations served as device
//! plugins.
//!
//! The same discovery ([`crate::node_discovery`]) and Instance writing as the DRA sink, with
//! Instances in each Configuration's namespace, labelled as the legacy path's and with
//! `deviceUsage` slots; [`akri_legacy_device_plugin`] turns them into Instance- and
//! Configuration-level device plugins. A cluster can move one configuration at a time: the
//! v1 and v0 paths run side by side and never see each other's Instances, and a v1
//! configuration named as a v0 one waits for it and its Instances to go
//! ([`crate::same_name`]). Instances Akri's agent wrote are taken over as they are
//! ([`crate::instances`]).

use crate::discovery::DiscoveredDevice;
use crate::instance_plan::Grace;
use crate::instances::InstanceWriter;
use crate::node_devices::{KnownDevice, NodeDevices};
use akri_api::v0::Configuration;
use akri_legacy_device_plugin::plugins::{
    ConfigurationDevices, Counters, DeviceEdits, LegacyConfig, LegacyPlugins,
};
use kubelet_proto::deviceplugin::v1beta1 as api;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// How long a node stays NotReady before the slots it holds are freed by the others.
    pub node_lost_grace: Duration,
}

/// The legacy sink: the device plugins over the v0 Configurations' devices, and their
/// Instances (per namespace).
pub struct LegacySink {
    client: kube::Client,
    node: String,
    instance_grace: Grace,
    plugins: LegacyPlugins,
    writers: BTreeMap<String, InstanceWriter>,
}

impl LegacySink {
    /// Starts the device plugins' machinery; `counters` is set to theirs for the agent's
    /// callers.
    pub fn start(
        client: kube::Client,
        node: &str,
        options: &LegacyOptions,
        instance_grace: Grace,
        counters: &std::sync::OnceLock<Arc<Counters>>,
    ) -> Self {
        let plugins = LegacyPlugins::start(
            client.clone(),
            LegacyConfig {
                node: node.to_string(),
                device_plugin_dir: options.device_plugin_dir.clone(),
                pod_resources_socket: options.pod_resources_socket.clone(),
                reclaim_grace: options.reclaim_grace,
                reclaim_interval: options.reclaim_interval,
                node_lost_grace: options.node_lost_grace,
            },
        );
        let _ = counters.set(plugins.counters());
        LegacySink {
            client,
            node: node.to_string(),
            instance_grace,
            plugins,
            writers: BTreeMap::new(),
        }
    }

    /// Every legacy Instance, `(namespace, name)` per configuration name.
    pub fn instances_by_configuration(&self) -> BTreeMap<String, Vec<(String, String)>> {
        self.plugins.instances_by_configuration()
    }

    /// Writes the Instances of every namespace's devices, then serves the plugins over them.
    pub async fn publish(&mut self, configs: &[Arc<Configuration>], devices: &NodeDevices) {
        let namespaces: BTreeSet<String> = configs
            .iter()
            .filter_map(|c| c.metadata.namespace.clone())
            .chain(self.writers.keys().cloned())
            .collect();
        let mut served = Vec::new();
        for namespace in namespaces {
            let writer = self.writers.entry(namespace.clone()).or_insert_with(|| {
                let (client, grace) = (self.client.clone(), self.instance_grace);
                InstanceWriter::legacy(client, &namespace, &self.node, grace)
            });
            // A device renamed because another node's has its name is written under its new
            // name at once (a second round at most).
            let live: BTreeSet<String> = (configs.iter())
                .filter(|c| c.metadata.namespace.as_deref() == Some(namespace.as_str()))
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            let mut known = known(devices, &namespace);
            for _ in 0..2 {
                let contested = match writer.sync(&known, Some(&live)).await {
                    Ok(contested) => contested,
                    Err(error) => {
                        tracing::warn!(%namespace, %error, "writing legacy Instances failed; retrying on the next change or resync");
                        break;
                    }
                };
                let renamed = (known.iter())
                    .filter(|(d, _, _)| contested.contains(&d.instance))
                    .filter(|(d, _, _)| devices.avoid(&namespace, &d.configuration, &d.instance))
                    .count();
                if renamed == 0 {
                    break;
                }
                tracing::warn!(%namespace, renamed, "another node's devices have these Instance names; renamed");
                known = self::known(devices, &namespace);
            }
            served.extend(served_devices(configs, devices, &namespace, &known));
        }
        self.plugins.sync(&served).await;
    }
}

/// A namespace's devices with their configuration's capacity and sharing.
fn known(devices: &NodeDevices, namespace: &str) -> Vec<(KnownDevice, i32, bool)> {
    let configs = devices.configurations(namespace);
    (devices.known(namespace).into_iter())
        .filter_map(|device| {
            let config = configs
                .iter()
                .find(|c| c.configuration == device.configuration)?;
            Some((device, config.capacity, config.shared))
        })
        .collect()
}

/// What the device plugins serve for a namespace's configurations: each one's Instances and
/// what a container allocated one gets.
fn served_devices(
    configs: &[Arc<Configuration>],
    devices: &NodeDevices,
    namespace: &str,
    known: &[(KnownDevice, i32, bool)],
) -> Vec<ConfigurationDevices> {
    let mut served = Vec::new();
    for config in devices.configurations(namespace) {
        let broker_properties = configs
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace)
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
            namespace: namespace.to_string(),
            name: config.configuration.clone(),
            unique_devices: config.unique_devices,
            instances,
        });
    }
    served
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
