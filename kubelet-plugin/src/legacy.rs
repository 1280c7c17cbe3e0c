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
//! ([`crate::instances`]), and the finalizer it left on each Configuration for this node is
//! released ([`LegacySink::release_akri_finalizers`]).

use crate::device_plan::{
    DevicePlan, DevicePluginState, InstancePath, InstancesPlan, InstancesState, NodeState,
};
use crate::instance_plan::Grace;
use crate::instances::InstanceWriter;
use crate::node_devices::NodeDevices;
use crate::node_discovery::Sink;
use crate::sink::{Applied, ApplyPlan, Observed, Pass, Standing};
use akri_api::v0::Configuration;
use akri_legacy_device_plugin::plugins::{Counters, LegacyConfig, LegacyPlugins};
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
    /// The namespaces whose v0 Configurations are served; those elsewhere are ignored
    /// ([`crate::same_name`]).
    pub namespaces: BTreeSet<String>,
    /// The `brokerProperties` names handed to containers; the others are left out (and
    /// logged). A Configuration's environment reaches the pods of every namespace that asks
    /// for `akri.sh/<name>`, so its names are the administrator's to allow.
    pub broker_property_names: BTreeSet<String>,
}

/// The legacy sink: the device plugins over the v0 Configurations' devices, and their
/// Instances (per namespace).
pub struct LegacySink {
    /// The namespaces whose v0 Configurations are served.
    pub namespaces: BTreeSet<String>,
    /// The `brokerProperties` names handed to containers.
    broker_property_names: BTreeSet<String>,
    /// Per Configuration (`namespace/name`), the `brokerProperties` names left out, as
    /// last logged.
    refused_broker_properties: BTreeMap<String, Vec<String>>,
    client: kube::Client,
    node: String,
    instance_grace: Grace,
    max_instances: usize,
    plugins: LegacyPlugins,
    writers: BTreeMap<String, InstanceWriter>,
    /// Per namespace, the Configurations that exist there (this pass's; their Instances'
    /// plan reads them).
    live: BTreeMap<String, BTreeSet<String>>,
    /// The `(uid, resourceVersion)` of each Configuration whose Akri finalizer this node tried
    /// to release: a refused patch is not sent again until the object changes.
    released: BTreeSet<(String, String)>,
}

impl LegacySink {
    /// Starts the device plugins' machinery, standing by until [`lead`](Self::lead);
    /// `counters` is set to theirs for the agent's callers. With `socket_tag` (a rolling
    /// update's per-pod tag) the plugins' sockets are this process's own.
    pub fn start(
        client: kube::Client,
        node: &str,
        options: &LegacyOptions,
        instance_grace: Grace,
        socket_tag: Option<String>,
        counters: &std::sync::OnceLock<Arc<Counters>>,
    ) -> Self {
        let plugins = LegacyPlugins::standing_by(
            client.clone(),
            LegacyConfig {
                node: node.to_string(),
                device_plugin_dir: options.device_plugin_dir.clone(),
                pod_resources_socket: options.pod_resources_socket.clone(),
                reclaim_grace: options.reclaim_grace,
                reclaim_interval: options.reclaim_interval,
                socket_tag,
            },
        );
        let _ = counters.set(plugins.counters());
        // A writer per namespace from the start, standing by too: its watch of the node's
        // Instances there is what the device plugins serve from.
        let writers = (options.namespaces.iter())
            .map(|ns| {
                let writer = InstanceWriter::legacy(
                    client.clone(),
                    ns,
                    node,
                    instance_grace,
                    plugins.feed(),
                );
                (ns.clone(), writer)
            })
            .collect();
        LegacySink {
            namespaces: options.namespaces.clone(),
            broker_property_names: options.broker_property_names.clone(),
            refused_broker_properties: BTreeMap::new(),
            client,
            node: node.to_string(),
            instance_grace,
            max_instances: crate::instance_plan::MAX_INSTANCES_PER_CONFIGURATION,
            plugins,
            writers,
            live: BTreeMap::new(),
            released: BTreeSet::new(),
        }
    }

    /// Keeps at most `max` Instances of one configuration on this node.
    pub fn limit(mut self, max: usize) -> Self {
        self.max_instances = max;
        let writers = std::mem::take(&mut self.writers);
        self.writers = (writers.into_iter())
            .map(|(ns, writer)| (ns, writer.limit(max)))
            .collect();
        self
    }

    /// Every legacy Instance that names this node, `(namespace, name)` per configuration name.
    pub fn instances_by_configuration(&self) -> BTreeMap<String, Vec<(String, String)>> {
        self.plugins.instances_by_configuration()
    }

    /// Takes the node's lead: from now on [`publish`](Self::publish) writes, and slots held
    /// with no container behind them are reclaimed.
    pub fn lead(&mut self) {
        self.plugins.lead();
    }

    /// Whether the kubelet has taken every served plugin's registration.
    fn all_registered(&self) -> bool {
        self.plugins.all_registered()
    }

    /// Reads what the plan of its writes needs: per namespace served (those of the served
    /// Configurations and those it wrote before) the devices and, leading, the stored
    /// Instances and which Configurations exist.
    async fn observe_instances<'s>(
        &'s mut self,
        configs: &[Arc<Configuration>],
        devices: &NodeDevices,
        state: &mut NodeState<'s>,
    ) {
        let namespaces: BTreeSet<String> = (configs.iter())
            .filter_map(|c| c.metadata.namespace.clone())
            .chain(self.writers.keys().cloned())
            .collect();
        self.live = (namespaces.iter())
            .map(|namespace| {
                let live = (configs.iter())
                    .filter(|c| c.metadata.namespace.as_deref() == Some(namespace.as_str()))
                    .filter_map(|c| c.metadata.name.clone())
                    .collect();
                (namespace.clone(), live)
            })
            .collect();
        let mut stored = BTreeMap::new();
        for namespace in namespaces {
            let writer = self.writers.entry(namespace.clone()).or_insert_with(|| {
                let (client, grace) = (self.client.clone(), self.instance_grace);
                InstanceWriter::legacy(client, &namespace, &self.node, grace, self.plugins.feed())
                    .limit(self.max_instances)
            });
            match writer.stored().await {
                Ok(instances) => {
                    stored.insert(namespace, instances);
                }
                Err(error) => {
                    tracing::warn!(%namespace, %error, "reading legacy Instances failed; retrying on the next change or resync");
                }
            }
        }
        for (namespace, writer) in self.writers.iter_mut() {
            let Some(stored) = stored.remove(namespace) else {
                continue;
            };
            let (writer, vanished) = writer.planner(self.live.get(namespace));
            state.instances.push(InstancesState {
                path: InstancePath::Legacy(namespace.clone()),
                writer,
                seen: devices.seen(namespace),
                stored,
                vanished,
            });
        }
    }

    /// Writes a namespace's Instances as planned; returns whether a device was renamed
    /// because another node's has its name.
    async fn apply_instances(
        &mut self,
        namespace: &str,
        planned: InstancesPlan,
        devices: &NodeDevices,
    ) -> bool {
        let Some(writer) = self.writers.get_mut(namespace) else {
            return false;
        };
        // A refused Instance is logged by the writer (a v0 Configuration has no status); the
        // others are written all the same.
        let contested = match writer.apply(planned.plan, &planned.stored).await {
            Ok(synced) => synced.contested,
            Err(error) => {
                tracing::warn!(%namespace, %error, "writing legacy Instances failed; retrying on the next change or resync");
                return false;
            }
        };
        let renamed = (devices.seen(namespace).iter())
            .filter(|(d, _, _)| contested.contains(&d.instance))
            .filter(|(d, _, _)| devices.avoid(namespace, &d.configuration, &d.instance))
            .count();
        if renamed > 0 {
            tracing::warn!(%namespace, renamed, "another node's devices have these Instance names; renamed");
        }
        renamed > 0
    }
}

impl LegacySink {
    /// Logs, when they change, each served Configuration's `brokerProperties` that
    /// [`served_devices`] leaves out.
    fn log_unlisted_broker_properties(&mut self, configs: &[Arc<Configuration>]) {
        let refused: BTreeMap<String, Vec<String>> = (configs.iter())
            .filter_map(|c| {
                let names: Vec<String> = (c.spec.broker_properties.keys())
                    .filter(|n| !self.broker_property_names.contains(*n))
                    .cloned()
                    .collect();
                let key = format!(
                    "{}/{}",
                    c.metadata.namespace.as_ref()?,
                    c.metadata.name.as_ref()?
                );
                (!names.is_empty()).then_some((key, names))
            })
            .collect();
        for (config, names) in &refused {
            if self.refused_broker_properties.get(config) != Some(names) {
                tracing::warn!(configuration = %config, ?names, "brokerProperties not handed to containers: not in legacyDevicePlugin.brokerPropertyNames (--legacy-broker-property-names)");
            }
        }
        self.refused_broker_properties = refused;
    }

    /// Removes this node's name from each Configuration's finalizers: Akri's agent puts it
    /// there to clean up before a Configuration goes, and with that agent gone nothing else
    /// would remove it, so a deleted Configuration would stay Terminating (and a v1
    /// configuration of its name held back, [`crate::same_name`]) for ever. This agent needs
    /// no finalizer: it drops a deleted Configuration's device plugins when the watch says so,
    /// and its Instances go only once their slots are free. The chart's admission policy lets
    /// a node remove its own name and change nothing else. `configs` are the v0
    /// Configurations carrying it, served or not
    /// ([`crate::node_plan::NodePlan::akri_finalizers`]): one this node does not serve has
    /// nothing of it on the node to clean up either.
    async fn release_akri_finalizers(&mut self, configs: &[Arc<Configuration>]) {
        let api = |ns: &str| kube::Api::<Configuration>::namespaced(self.client.clone(), ns);
        for config in configs {
            let Some(patch) = finalizer_release(config, &self.node) else {
                continue;
            };
            let meta = &config.metadata;
            let (Some(ns), Some(name)) = (&meta.namespace, &meta.name) else {
                continue;
            };
            let seen = (
                meta.uid.clone().unwrap_or_default(),
                meta.resource_version.clone().unwrap_or_default(),
            );
            if !self.released.insert(seen) {
                continue;
            }
            let params = kube::api::PatchParams::default();
            let patch = kube::api::Patch::<()>::Json(patch);
            match crate::api_call(api(ns).patch(name, &params, &patch)).await {
                Ok(_) => {
                    tracing::info!(namespace = %ns, configuration = %name, "released the finalizer Akri's agent left for this node")
                }
                // Changed meanwhile: the watch brings the new version, and the next pass tries it.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => {}
                Err(error) => {
                    tracing::warn!(namespace = %ns, configuration = %name, %error, "could not release the finalizer Akri's agent left for this node")
                }
            }
        }
        // Forget versions that are no longer current.
        let current: BTreeSet<(String, String)> = (configs.iter())
            .map(|c| {
                (
                    c.metadata.uid.clone().unwrap_or_default(),
                    c.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        self.released.retain(|seen| current.contains(seen));
    }
}

impl ApplyPlan for LegacySink {
    /// Once discovery has answered: the device plugins' inputs and, leading, the Instances'.
    async fn observe<'s>(&'s mut self, pass: &mut Pass<'_>, state: &mut NodeState<'s>) -> Observed {
        if !(pass.discovery).open(Sink::Legacy, &pass.plan.wanted, pass.handlers) {
            return Observed::Stands(Standing::Starting);
        }
        let devices = pass.discovery.devices(Sink::Legacy);
        let served = pass.plan.served_v0.clone();
        self.log_unlisted_broker_properties(&served);
        let broker_property_names = self.broker_property_names.clone();
        if pass.leading {
            self.observe_instances(&served, &devices, state).await;
        }
        let namespaces = (served.iter())
            .filter_map(|c| c.metadata.namespace.clone())
            .map(|ns| {
                let inputs = (devices.configurations(&ns), devices.seen(&ns));
                (ns, inputs)
            })
            .collect();
        state.device_plugins = Some(DevicePluginState {
            served,
            namespaces,
            broker_property_names,
        });
        Observed::Apply
    }

    /// Leading: releases Akri's finalizers and writes the Instances, then serves the device
    /// plugins over them (after a rename, on the next round, with the new names); standing
    /// by, only serves.
    async fn apply(&mut self, pass: &mut Pass<'_>, plan: &mut DevicePlan) -> Applied {
        let devices = pass.discovery.devices(Sink::Legacy);
        let mut again = false;
        if pass.leading {
            self.release_akri_finalizers(&pass.plan.akri_finalizers)
                .await;
            let namespaces: Vec<String> = self.writers.keys().cloned().collect();
            for namespace in namespaces {
                let path = InstancePath::Legacy(namespace.clone());
                if let Some(planned) = plan.take_instances(&path) {
                    again |= self.apply_instances(&namespace, planned, &devices).await;
                }
            }
        }
        if again {
            return Standing::Serving.into();
        }
        if let Some(served) = plan.device_plugins.take() {
            self.plugins.sync(&served).await;
        }
        match pass.leading || self.all_registered() {
            true => Standing::Serving.into(),
            false => Standing::WaitingForKubelet.into(),
        }
    }
}

/// The JSON patch that removes `node` from a Configuration's finalizers, testing the
/// resourceVersion it was computed from; `None` when the node's name is not there.
fn finalizer_release(config: &Configuration, node: &str) -> Option<json_patch::Patch> {
    let removal = crate::instances::finalizer_removal(&config.metadata, node)?;
    let patch = serde_json::json!([
        { "op": "test", "path": "/metadata/resourceVersion", "value": config.metadata.resource_version },
        removal,
    ]);
    Some(serde_json::from_value(patch).expect("valid JSON patch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configuration(finalizers: &[&str]) -> Configuration {
        let mut config: Configuration = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "cams", "namespace": "edge", "resourceVersion": "7" },
            "spec": { "discoveryHandler": { "name": "debugEcho" } },
        }))
        .unwrap();
        config.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        config
    }

    #[test]
    fn only_this_nodes_finalizer_is_released_at_the_version_it_was_read() {
        let patch = finalizer_release(
            &configuration(&["node-b", "node-a", "example.com/keep"]),
            "node-a",
        )
        .expect("node-a's finalizer is there");
        assert_eq!(
            serde_json::to_value(patch).unwrap(),
            serde_json::json!([
                { "op": "test", "path": "/metadata/resourceVersion", "value": "7" },
                { "op": "replace", "path": "/metadata/finalizers", "value": ["node-b", "example.com/keep"] },
            ])
        );
        assert!(finalizer_release(&configuration(&["node-b"]), "node-a").is_none());
        assert!(finalizer_release(&configuration(&[]), "node-a").is_none());
    }
}
