//! The node's discovery, for both of its sinks: one stream per configuration whose handler is
//! registered (a v1 DiscoveryConfiguration for DRA, a v0 Configuration for the legacy device
//! plugins), started, restarted and stopped here, its properties resolved here, and the
//! devices the streams report kept here, per sink and group. The sinks ([`crate::dra_sink`],
//! [`crate::legacy`]) only read what is kept.

use crate::discovery::{Access, DiscoveryEvent, Handlers, HostDev};
use crate::discovery_errors::DiscoveryErrors;
use crate::node_devices::{ConfigDevices, NodeDevices};
use crate::properties::PropertySources;
use crate::startup::StartupGate;
use crate::streams::{StreamEvent, StreamSpec, Streams};
use akri_api::v1::{ContainerAccess, DiscoveryConfiguration, DiscoveryProperty};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::sync::mpsc;

/// Where a configuration's devices go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sink {
    /// A v1 DiscoveryConfiguration: DRA slices and Instances.
    Dra,
    /// A v0 Configuration: device plugins and slot Instances.
    Legacy,
}

/// A configuration this node may discover for, as either API version says it.
#[derive(Clone, Debug, PartialEq)]
pub struct Wanted {
    /// The stream's key: a v1 configuration's name, a v0 one's `<namespace>/<name>`.
    pub key: String,
    pub sink: Sink,
    /// Where its devices are kept in the sink's [`NodeDevices`]: its handler's DRA driver
    /// (v1), its namespace (v0; a v0 name is unique only there, and so are its Instances').
    pub group: String,
    pub name: String,
    pub handler: String,
    pub details: String,
    pub properties: Vec<DiscoveryProperty>,
    pub capacity: i32,
    pub unique_devices: bool,
    /// What its devices may bring into containers (the configuration's own word; `None`:
    /// the handler kind's, [`NodeDiscovery::handler_access`]).
    pub container_access: Option<ContainerAccess>,
    /// A v1 configuration's `akri.sh/migrated-from`: the `<namespace>/<name>` of the v0
    /// Configuration it was made of ([`crate::same_name`]).
    pub migrated_from: Option<String>,
}

impl Wanted {
    pub fn of_v1(config: &DiscoveryConfiguration) -> Option<Wanted> {
        let name = config.metadata.name.clone()?;
        let handler = &config.spec.discovery_handler;
        Some(Wanted {
            key: name.clone(),
            sink: Sink::Dra,
            group: akri_devices::driver_name(&handler.name),
            name,
            handler: handler.name.clone(),
            details: handler.discovery_details.clone(),
            properties: handler.discovery_properties.clone(),
            capacity: config.spec.capacity,
            unique_devices: config.spec.unique_devices,
            container_access: config.spec.container_access.clone(),
            migrated_from: (config.metadata.annotations.as_ref())
                .and_then(|a| a.get(akri_api::v1::MIGRATED_FROM_ANNOTATION))
                .cloned(),
        })
    }

    pub fn of_v0(config: &akri_api::v0::Configuration) -> Option<Wanted> {
        let namespace = config.metadata.namespace.clone()?;
        let name = config.metadata.name.clone()?;
        let handler = &config.spec.discovery_handler;
        Some(Wanted {
            key: format!("{namespace}/{name}"),
            sink: Sink::Legacy,
            group: namespace,
            name,
            handler: handler.name.clone(),
            details: handler.discovery_details.clone(),
            properties: (handler.discovery_properties.iter().flatten())
                .map(Into::into)
                .collect(),
            capacity: i32::try_from(config.spec.capacity).unwrap_or(i32::MAX),
            unique_devices: config.spec.unique_devices(),
            // A v0 Configuration says nothing of it: its handler kind's.
            container_access: None,
            migrated_from: None,
        })
    }
}

/// A group of a sink whose devices changed.
pub type Changed = (Sink, String);

/// The devices `access` lets into containers, as it lets them (canonical paths, permissions
/// written out), and why the others are refused (the first few named): a refused device is
/// left out, its configuration's other devices are kept.
fn admitted(
    devices: Vec<crate::discovery::DiscoveredDevice>,
    access: &Access,
    dev: &HostDev,
) -> (Vec<crate::discovery::DiscoveredDevice>, Option<String>) {
    const NAMED: usize = 3;
    let mut refused = Vec::new();
    let devices = (devices.iter())
        .filter_map(|device| match access.admit(device, dev) {
            Ok(admitted) => Some(admitted),
            Err(why) => {
                refused.push(format!("device {} refused: {why}", device.id));
                None
            }
        })
        .collect();
    let why = (!refused.is_empty()).then(|| {
        let mut why = refused
            .iter()
            .take(NAMED)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if refused.len() > NAMED {
            why.push_str(&format!("; and {} more", refused.len() - NAMED));
        }
        why + " (the configuration's containerAccess, or its handler's default, does not allow it)"
    });
    (devices, why)
}

/// How long a restarted agent keeps a configuration's devices as an earlier process last
/// heard them ([`NodeDevices::carrying_reports`]) while its handler has not reported again:
/// long enough for a slow handler (OPC UA servers behind connect timeouts, cameras that
/// answer late), short enough that a handler gone for good takes its devices with it.
pub const CARRY_REPORTS_FOR: Duration = Duration::from_secs(300);

/// The node's discovery: its streams, the devices they reported, why some fail.
pub struct NodeDiscovery {
    client: kube::Client,
    node: String,
    node_uid: String,
    sources: PropertySources,
    streams: Streams,
    /// What each running stream was started for.
    running: BTreeMap<String, Wanted>,
    devices: BTreeMap<Sink, NodeDevices>,
    gates: BTreeMap<Sink, StartupGate>,
    /// Why v1 configurations fail here (their `status.discoveryErrors`; v0 has no such field).
    pub errors: DiscoveryErrors,
    /// Configurations not run because of their names (each said once).
    refused: BTreeSet<String>,
    /// The running streams whose handler answers: it sent a valid list and has not failed
    /// since. Their devices' health is vouched for; the others' decays in the kubelet.
    answering: BTreeSet<String>,
    events: mpsc::Sender<StreamEvent>,
    /// When this process started: carried devices go [`CARRY_REPORTS_FOR`] after.
    started: tokio::time::Instant,
    /// What the devices of each handler kind may bring into containers where a configuration
    /// does not say (the operator's word over the built-in defaults of [`Access::of`]).
    handler_access: BTreeMap<String, ContainerAccess>,
    /// Where this process sees the host's `/dev/`, to resolve the device nodes handlers
    /// report.
    host_dev: HostDev,
}

impl NodeDiscovery {
    /// Discovery for the sinks of `devices`, each held back at start-up for at most
    /// `startup_wait`; the streams report on `events`.
    pub fn new(
        client: kube::Client,
        (node, node_uid): (&str, &str),
        devices: BTreeMap<Sink, NodeDevices>,
        startup_wait: Duration,
        property_namespaces: Option<BTreeSet<String>>,
        events: mpsc::Sender<StreamEvent>,
    ) -> Self {
        let gates = (devices.keys())
            .map(|sink| (*sink, StartupGate::new(startup_wait)))
            .collect();
        NodeDiscovery {
            node: node.to_string(),
            node_uid: node_uid.to_string(),
            sources: PropertySources::new(client.clone(), property_namespaces),
            client,
            streams: Streams::default(),
            running: BTreeMap::new(),
            devices,
            gates,
            errors: DiscoveryErrors::default(),
            refused: BTreeSet::new(),
            answering: BTreeSet::new(),
            events,
            started: tokio::time::Instant::now(),
            handler_access: BTreeMap::new(),
            host_dev: HostDev::new("/dev"),
        }
    }

    /// What each handler kind's devices may bring into containers where their configuration
    /// does not say; a kind not named keeps its built-in default ([`Access::of`]).
    pub fn handler_access(mut self, access: BTreeMap<String, ContainerAccess>) -> Self {
        self.handler_access = access;
        self
    }

    /// The Secrets (by name) discovery properties may read; `None`: any
    /// ([`PropertySources::allowed_secrets`]).
    pub fn property_secrets(mut self, names: Option<BTreeSet<String>>) -> Self {
        self.sources.allowed_secrets(names);
        self
    }

    /// Where this process sees the host's `/dev/` (default `/dev`).
    pub fn host_dev(mut self, dev: HostDev) -> Self {
        self.host_dev = dev;
        self
    }

    /// Notified when an object that discovery properties reference changes.
    pub fn property_changes(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.sources.changes()
    }

    /// The devices a sink's configurations reported (empty for a sink this node does not run).
    pub fn devices(&self, sink: Sink) -> NodeDevices {
        self.devices.get(&sink).cloned().unwrap_or_default()
    }

    /// The names of `sink`'s configurations whose handler answers (see `answering`).
    pub fn answering(&self, sink: Sink) -> BTreeSet<String> {
        (self.answering.iter())
            .filter_map(|key| self.running.get(key))
            .filter(|wanted| wanted.sink == sink)
            .map(|wanted| wanted.name.clone())
            .collect()
    }

    /// A sink's configurations are all listed: its start-up gate may open.
    pub fn listed(&mut self, sink: Sink) {
        if let Some(gate) = self.gates.get_mut(&sink) {
            gate.configs_listed();
        }
    }

    /// Whether `sink` may write (see [`StartupGate`]).
    pub fn open(&mut self, sink: Sink, wanted: &[Wanted], handlers: &Handlers) -> bool {
        let Some(gate) = self.gates.get_mut(&sink) else {
            return false;
        };
        let keys = (wanted.iter())
            .filter(|w| w.sink == sink)
            .map(|w| (w.key.as_str(), w.name.as_str(), w.handler.as_str()));
        gate.open(keys, handlers)
    }

    /// Takes a stream's report into the devices; returns the group that changed.
    pub fn on_event(&mut self, event: StreamEvent) -> Option<Changed> {
        // A report still queued from a stream stopped since is not news.
        let wanted = self.running.get(&event.configuration)?;
        let (sink, group, name) = (wanted.sink, wanted.group.clone(), wanted.name.clone());
        match event.event {
            DiscoveryEvent::Devices(devices) => {
                let configured = (wanted.container_access.as_ref())
                    .or_else(|| self.handler_access.get(&wanted.handler));
                let access = Access::of(configured, &wanted.handler).with_listed(&wanted.details);
                let (devices, refused) = admitted(devices, &access, &self.host_dev);
                if sink == Sink::Dra {
                    match refused {
                        Some(why) => {
                            let message = format!("handler {}: {why}", event.handler.name);
                            self.errors.discovery.insert(name.clone(), message)
                        }
                        None => self.errors.discovery.remove(&name),
                    };
                } else if let Some(why) = refused {
                    tracing::warn!(configuration = %event.configuration, handler = %event.handler.name, %why, "devices refused");
                }
                if let Some(gate) = self.gates.get_mut(&sink) {
                    gate.answered(&event.configuration);
                }
                self.answering.insert(event.configuration.clone());
                let changed = self.devices.get(&sink)?.set(
                    &group,
                    ConfigDevices {
                        configuration: name,
                        capacity: event.capacity,
                        unique_devices: event.unique_devices,
                        shared: event.handler.shared,
                        devices,
                    },
                );
                changed.then_some((sink, group))
            }
            DiscoveryEvent::Error(error) => {
                // The stream reconnects by itself; the devices stay as last reported, but
                // nobody vouches for their health until it answers again.
                self.answering.remove(&event.configuration);
                tracing::warn!(configuration = %event.configuration, handler = %event.handler.name, %error, "discovery failed");
                if sink == Sink::Dra {
                    let message = format!("handler {}: {error}", event.handler.name);
                    self.errors.discovery.insert(name, message);
                }
                None
            }
        }
    }

    /// Runs a stream per wanted configuration whose handler is registered (restarting those
    /// whose input changed), stops the others. Returns the groups whose devices went.
    pub async fn sync(&mut self, wanted: &[Wanted], handlers: &Handlers) -> BTreeSet<Changed> {
        let mut run = BTreeSet::new();
        let mut changed = BTreeSet::new();
        for config in wanted {
            let Some(handler) = handlers.get(&config.handler) else {
                continue;
            };
            if !self.accepts_name(config) {
                continue;
            }
            let Some(properties) = self.properties(config).await else {
                continue;
            };
            run.insert(config.key.clone());
            let spec = StreamSpec {
                handler: handler.clone(),
                details: config.details.clone(),
                properties,
                capacity: config.capacity,
                unique_devices: config.unique_devices,
            };
            if self.streams.ensure(&config.key, spec, &self.events) {
                tracing::info!(configuration = %config.key, handler = %handler.name, sink = ?config.sink, "discovery started");
            }
            // Its handler changed: the devices move to the new one's group with its reports.
            if let Some(before) = self.running.insert(config.key.clone(), config.clone())
                && before.group != config.group
            {
                changed.extend(self.forget(&before));
            }
        }
        for key in self.streams.stop_others(&run) {
            self.answering.remove(&key);
            let Some(before) = self.running.remove(&key) else {
                continue;
            };
            if before.sink == Sink::Dra {
                self.errors.discovery.remove(&before.name);
                if !wanted.iter().any(|w| w.key == key) {
                    self.errors.properties.remove(&before.name);
                }
            }
            changed.extend(self.forget(&before));
            tracing::info!(configuration = %key, sink = ?before.sink, "discovery stopped");
        }
        self.sources
            .retain(wanted.iter().flat_map(|w| &w.properties));
        changed.extend(self.drop_carried(wanted));
        changed
    }

    /// Drops the devices carried over from an earlier process ([`NodeDevices::carried`]) of
    /// configurations no longer wanted (once the sink's configurations are listed) and, after
    /// [`CARRY_REPORTS_FOR`], of those whose handler never reported again.
    fn drop_carried(&mut self, wanted: &[Wanted]) -> BTreeSet<Changed> {
        let expired = self.started.elapsed() >= CARRY_REPORTS_FOR;
        let mut changed = BTreeSet::new();
        for (sink, devices) in &self.devices {
            let listed = self.gates.get(sink).is_some_and(StartupGate::listed);
            for (group, name) in devices.carried() {
                let still_wanted =
                    (wanted.iter()).any(|w| w.sink == *sink && w.group == group && w.name == name);
                if !(expired || (listed && !still_wanted)) {
                    continue;
                }
                if devices.remove(&group, &name) {
                    tracing::info!(configuration = %name, sink = ?sink, still_wanted, "dropped the devices an earlier process last heard of: their handler did not report again");
                    changed.insert((*sink, group));
                }
            }
        }
        changed
    }

    /// Drops what `config`'s stream reported.
    fn forget(&mut self, config: &Wanted) -> Option<Changed> {
        let devices = self.devices.get(&config.sink)?;
        devices
            .remove(&config.group, &config.name)
            .then(|| (config.sink, config.group.clone()))
    }

    /// Whether `config`'s name can name devices. A name stored before the CRD refused it would
    /// name devices the API server refuses, failing the node pool that every configuration of
    /// the handler shares. Its status cannot say so (the CRD's rules refuse any write to the
    /// object now), so a Warning Event on the node does, once per process.
    fn accepts_name(&mut self, config: &Wanted) -> bool {
        let Err(why) = akri_devices::validate_configuration_name(&config.name) else {
            return true;
        };
        if self.refused.insert(config.key.clone()) {
            tracing::warn!(configuration = %config.key, %why, "configuration not run");
            let kind = match config.sink {
                Sink::Dra => "DiscoveryConfiguration",
                Sink::Legacy => "Configuration",
            };
            tokio::spawn(crate::node_events::warn(
                self.client.clone(),
                self.node.clone(),
                self.node_uid.clone(),
                "ConfigurationNotRun",
                format!(
                    "{kind} {} is not run on this node: {why}; recreate it under a valid name",
                    config.key
                ),
            ));
        }
        false
    }

    /// The resolved properties `config`'s stream runs with; `None`: it does not run.
    async fn properties(&mut self, config: &Wanted) -> Option<BTreeMap<String, Vec<u8>>> {
        // A v0 Configuration is namespaced: its properties read its own namespace only.
        let own = (config.sink == Sink::Legacy).then_some(config.group.as_str());
        let resolved = self.sources.resolve(&config.properties, own).await;
        let note = |errors: &mut DiscoveryErrors, error: Option<String>| {
            if config.sink == Sink::Dra {
                match error {
                    Some(error) => errors.properties.insert(config.name.clone(), error),
                    None => errors.properties.remove(&config.name),
                };
            }
        };
        match resolved {
            Ok(properties) => {
                note(&mut self.errors, None);
                Some(properties)
            }
            Err(error) if error.is_transient() && self.streams.contains(&config.key) => {
                // An outage or a refusal is not a change: discovery goes on with the values
                // it has (other edits of the configuration still apply), and the status says
                // why they may be stale.
                tracing::warn!(configuration = %config.key, %error, "reading discovery properties failed; discovery goes on with the last values read");
                note(&mut self.errors, Some(error.to_string()));
                self.streams.properties(&config.key).cloned()
            }
            Err(error) => {
                tracing::warn!(configuration = %config.key, %error, "discovery not started");
                note(&mut self.errors, Some(error.to_string()));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{DiscoveredDevice, Endpoint, RegisteredHandler};

    fn client() -> kube::Client {
        // Never called: these configurations reference no Secret or ConfigMap.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    fn handler(name: &str) -> RegisteredHandler {
        RegisteredHandler {
            name: name.to_string(),
            endpoint: Endpoint::Uds(format!("/nonexistent/{name}.sock").into()),
            shared: false,
        }
    }

    fn wanted(key: &str, sink: Sink, handler: &str) -> Wanted {
        let (group, name) = match key.split_once('/') {
            Some((namespace, name)) => (namespace.to_string(), name.to_string()),
            None => (akri_devices::driver_name(handler), key.to_string()),
        };
        Wanted {
            key: key.to_string(),
            sink,
            group,
            name,
            handler: handler.to_string(),
            details: String::new(),
            properties: Vec::new(),
            capacity: 1,
            unique_devices: true,
            container_access: None,
            migrated_from: None,
        }
    }

    fn report(key: &str, handler: &str, ids: &[&str]) -> StreamEvent {
        let devices = ids
            .iter()
            .map(|id| DiscoveredDevice {
                id: id.to_string(),
                ..DiscoveredDevice::default()
            })
            .collect();
        StreamEvent {
            configuration: key.to_string(),
            handler: self::handler(handler),
            capacity: 1,
            unique_devices: true,
            event: DiscoveryEvent::Devices(devices),
        }
    }

    fn discovery(sinks: &[Sink]) -> (NodeDiscovery, mpsc::Receiver<StreamEvent>) {
        let (tx, rx) = mpsc::channel(8);
        let devices = sinks
            .iter()
            .map(|sink| (*sink, NodeDevices::new("node-a", false)))
            .collect();
        let uid = ("node-a", "uid");
        let wait = Duration::from_secs(60);
        let discovery = NodeDiscovery::new(client(), uid, devices, wait, None, tx);
        (discovery, rx)
    }

    fn handlers(names: &[&str]) -> Handlers {
        names.iter().map(|n| (n.to_string(), handler(n))).collect()
    }

    #[tokio::test]
    async fn both_sinks_are_fed_by_one_discovery_grouped_by_driver_and_namespace() {
        let (mut discovery, _rx) = discovery(&[Sink::Dra, Sink::Legacy]);
        let wanted = [
            wanted("cams", Sink::Dra, "onvif"),
            wanted("team-a/cams", Sink::Legacy, "onvif"),
            wanted("no-handler", Sink::Dra, "udev"),
        ];
        assert!(
            discovery
                .sync(&wanted, &handlers(&["onvif"]))
                .await
                .is_empty()
        );
        assert_eq!(
            discovery.on_event(report("cams", "onvif", &["a"])),
            Some((Sink::Dra, "onvif.akri.sh".to_string()))
        );
        assert_eq!(
            discovery.on_event(report("team-a/cams", "onvif", &["a", "b"])),
            Some((Sink::Legacy, "team-a".to_string()))
        );
        // The same report again changes nothing.
        assert_eq!(discovery.on_event(report("cams", "onvif", &["a"])), None);
        assert_eq!(discovery.devices(Sink::Dra).known("onvif.akri.sh").len(), 1);
        assert_eq!(discovery.devices(Sink::Legacy).known("team-a").len(), 2);
        // Unregistered handler: no stream, so its reports are not taken.
        assert_eq!(
            discovery.on_event(report("no-handler", "udev", &["x"])),
            None
        );
    }

    #[tokio::test]
    async fn a_stopped_configuration_loses_its_devices_and_late_reports() {
        let (mut discovery, _rx) = discovery(&[Sink::Dra, Sink::Legacy]);
        let both = [
            wanted("cams", Sink::Dra, "onvif"),
            wanted("team-a/cams", Sink::Legacy, "onvif"),
        ];
        discovery.sync(&both, &handlers(&["onvif"])).await;
        discovery.on_event(report("cams", "onvif", &["a"]));
        discovery.on_event(report("team-a/cams", "onvif", &["a"]));

        let changed = discovery.sync(&both[1..], &handlers(&["onvif"])).await;
        assert_eq!(
            changed,
            BTreeSet::from([(Sink::Dra, "onvif.akri.sh".to_string())])
        );
        assert!(
            discovery
                .devices(Sink::Dra)
                .known("onvif.akri.sh")
                .is_empty()
        );
        assert_eq!(discovery.devices(Sink::Legacy).known("team-a").len(), 1);
        // A report the stopped stream queued before it stopped brings nothing back.
        assert_eq!(discovery.on_event(report("cams", "onvif", &["a"])), None);
        assert!(
            discovery
                .devices(Sink::Dra)
                .known("onvif.akri.sh")
                .is_empty()
        );

        // The handler going away stops the rest.
        let changed = discovery.sync(&both[1..], &handlers(&[])).await;
        assert_eq!(
            changed,
            BTreeSet::from([(Sink::Legacy, "team-a".to_string())])
        );
    }

    #[tokio::test]
    async fn a_configuration_moved_to_another_handler_leaves_the_old_driver() {
        let (mut discovery, _rx) = discovery(&[Sink::Dra]);
        let registered = handlers(&["onvif", "udev"]);
        discovery
            .sync(&[wanted("cams", Sink::Dra, "onvif")], &registered)
            .await;
        discovery.on_event(report("cams", "onvif", &["a"]));
        let changed = discovery
            .sync(&[wanted("cams", Sink::Dra, "udev")], &registered)
            .await;
        assert_eq!(
            changed,
            BTreeSet::from([(Sink::Dra, "onvif.akri.sh".to_string())])
        );
        assert!(
            discovery
                .devices(Sink::Dra)
                .known("onvif.akri.sh")
                .is_empty()
        );
        assert_eq!(
            discovery.on_event(report("cams", "udev", &["a"])),
            Some((Sink::Dra, "udev.akri.sh".to_string()))
        );
    }

    #[tokio::test]
    async fn a_badly_named_configuration_is_not_run_and_not_waited_for() {
        let (mut discovery, _rx) = discovery(&[Sink::Dra]);
        let bad = [wanted("Not_A_Name", Sink::Dra, "onvif")];
        let registered = handlers(&["onvif"]);
        discovery.sync(&bad, &registered).await;
        assert_eq!(
            discovery.on_event(report("Not_A_Name", "onvif", &["a"])),
            None
        );
        discovery.listed(Sink::Dra);
        assert!(discovery.open(Sink::Dra, &bad, &registered));
    }

    #[tokio::test]
    async fn each_sink_waits_for_its_own_configurations() {
        let (mut discovery, _rx) = discovery(&[Sink::Dra, Sink::Legacy]);
        let (dra, legacy) = (
            wanted("cams", Sink::Dra, "onvif"),
            wanted("team-a/cams", Sink::Legacy, "onvif"),
        );
        let wanted = [dra, legacy];
        let registered = handlers(&["onvif"]);
        discovery.sync(&wanted, &registered).await;
        discovery.listed(Sink::Dra);
        discovery.listed(Sink::Legacy);
        discovery.on_event(report("team-a/cams", "onvif", &["a"]));
        assert!(discovery.open(Sink::Legacy, &wanted, &registered));
        assert!(
            !discovery.open(Sink::Dra, &wanted, &registered),
            "DRA still waits"
        );
        discovery.on_event(report("cams", "onvif", &["a"]));
        assert!(discovery.open(Sink::Dra, &wanted, &registered));
    }

    /// A restarted agent keeps the devices its handlers last reported (the file an earlier
    /// process left) past the start-up wait, for a handler that is slow to report; they go
    /// with their configuration, or once [`CARRY_REPORTS_FOR`] passed without a report.
    #[tokio::test(start_paused = true)]
    async fn devices_an_earlier_process_heard_of_stay_until_their_handler_reports_or_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("reports.json");
        // A (re)started discovery, and the receiver of its streams' reports.
        let restarted = || {
            let (tx, rx) = mpsc::channel(8);
            let devices = BTreeMap::from([(
                Sink::Dra,
                NodeDevices::new("node-a", false).carrying_reports(&file),
            )]);
            let wait = Duration::from_secs(30);
            let discovery =
                NodeDiscovery::new(client(), ("node-a", "uid"), devices, wait, None, tx);
            (discovery, rx)
        };
        let (slow, gone, late) = (
            wanted("slow", Sink::Dra, "opcua"),
            wanted("gone", Sink::Dra, "opcua"),
            wanted("late", Sink::Dra, "opcua"),
        );
        let driver = "opcua.akri.sh";
        {
            let (mut before, _reports) = restarted();
            let all = [slow.clone(), gone.clone(), late.clone()];
            before.sync(&all, &handlers(&["opcua"])).await;
            for key in ["slow", "gone", "late"] {
                before.on_event(report(key, "opcua", &["server-0"]));
            }
        }

        // Restarted: `gone` was deleted meanwhile; the handler is slow to report.
        let (mut discovery, _reports) = restarted();
        let known = |d: &NodeDiscovery| -> BTreeSet<String> {
            d.devices(Sink::Dra)
                .known(driver)
                .into_iter()
                .map(|k| k.configuration)
                .collect()
        };
        assert_eq!(
            known(&discovery).len(),
            3,
            "all three as they were, before any listing"
        );
        let wanted = [slow.clone(), late.clone()];
        let registered = handlers(&["opcua"]);
        assert!(
            discovery.sync(&wanted, &registered).await.is_empty(),
            "nothing known to be gone yet"
        );
        discovery.listed(Sink::Dra);
        let changed = discovery.sync(&wanted, &registered).await;
        assert_eq!(changed, BTreeSet::from([(Sink::Dra, driver.to_string())]));
        assert_eq!(
            known(&discovery),
            BTreeSet::from(["late".into(), "slow".into()])
        );
        // Past the start-up wait the gate opens with the slow handler's devices still there.
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(discovery.open(Sink::Dra, &wanted, &registered));
        assert!(discovery.sync(&wanted, &registered).await.is_empty());
        assert_eq!(known(&discovery).len(), 2);
        // `slow` reports (what it reports is what counts); `late` never does.
        discovery.on_event(report("slow", "opcua", &["server-0", "server-1"]));
        tokio::time::advance(CARRY_REPORTS_FOR).await;
        let changed = discovery.sync(&wanted, &registered).await;
        assert_eq!(changed, BTreeSet::from([(Sink::Dra, driver.to_string())]));
        assert_eq!(known(&discovery), BTreeSet::from(["slow".into()]));
        assert_eq!(discovery.devices(Sink::Dra).known(driver).len(), 2);
    }

    /// A device outside what its configuration lets into containers is left out, with the
    /// reason in the configuration's status; its other devices, and other configurations,
    /// are kept.
    #[tokio::test]
    async fn a_device_bringing_more_than_allowed_is_refused_and_the_others_kept() {
        let (mut discovery, _rx) = discovery(&[Sink::Dra]);
        let wanted = [
            wanted("cams", Sink::Dra, "onvif"),
            wanted("usb", Sink::Dra, "udev"),
        ];
        discovery.sync(&wanted, &handlers(&["onvif", "udev"])).await;
        let mut bad = report("cams", "onvif", &["good", "rooted"]);
        if let DiscoveryEvent::Devices(devices) = &mut bad.event {
            devices[1].mounts.push(crate::discovery::Mount {
                container_path: "/host".into(),
                host_path: "/".into(),
                read_only: false,
            });
        }
        discovery.on_event(bad);
        discovery.on_event(report("usb", "udev", &["cam0"]));
        let kept = |driver: &str| -> Vec<String> {
            let known = discovery.devices(Sink::Dra).known(driver);
            known.into_iter().map(|k| k.device.id).collect()
        };
        assert_eq!(kept("onvif.akri.sh"), ["good"]);
        assert_eq!(kept("udev.akri.sh"), ["cam0"]);
        let why = &discovery.errors.discovery["cams"];
        assert!(
            why.starts_with(
                "handler onvif: device rooted refused: mount of / is not under an allowed prefix"
            ),
            "{why}"
        );
        assert!(!discovery.errors.discovery.contains_key("usb"));
        // Reported without it: the refusal goes from the status.
        discovery.on_event(report("cams", "onvif", &["good"]));
        assert!(!discovery.errors.discovery.contains_key("cams"));
    }

    #[test]
    fn v0_and_v1_configurations_are_wanted_alike() {
        let v1: DiscoveryConfiguration = serde_json::from_value(serde_json::json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": "cams" },
            "spec": { "discoveryHandler": { "name": "onvif", "discoveryDetails": "x" }, "capacity": 2 },
        }))
        .unwrap();
        let v0: akri_api::v0::Configuration = serde_json::from_value(serde_json::json!({
            "apiVersion": "akri.sh/v0", "kind": "Configuration",
            "metadata": { "name": "cams", "namespace": "team-a" },
            "spec": { "discoveryHandler": { "name": "onvif", "discoveryDetails": "x" }, "capacity": 2 },
        }))
        .unwrap();
        let (v1, v0) = (Wanted::of_v1(&v1).unwrap(), Wanted::of_v0(&v0).unwrap());
        assert_eq!(
            (v1.key.as_str(), v1.group.as_str()),
            ("cams", "onvif.akri.sh")
        );
        assert_eq!(
            (v0.key.as_str(), v0.group.as_str()),
            ("team-a/cams", "team-a")
        );
        for w in [&v1, &v0] {
            assert_eq!((w.name.as_str(), w.handler.as_str()), ("cams", "onvif"));
            assert_eq!((w.details.as_str(), w.capacity), ("x", 2));
        }
    }
}
