//! The DRA sink of the node's discovery: per discovery handler one served DRA driver (the
//! kubelet plugin), this node's pool of its devices, their health, and their Instances.

use crate::device_health::{Health, vouch};
use crate::discovery::Handlers;
use crate::driver::AkriDriver;
use crate::instances::InstanceWriter;
use crate::kubelet_registration::KubeletRegistration;
use crate::metrics::{Metrics, Timed};
use crate::node_devices::NodeDevices;
use crate::node_discovery::Sink;
use crate::sink::{ApplyPlan, Pass, Standing};
use dra_plugin::cdi::CdiRoot;
use dra_plugin::metadata::Version;
use dra_plugin::registration::RegistrationStatus;
use dra_plugin::vanished::VanishedDevices;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Why a discovery handler's DRA driver cannot be served (logged; the others are served).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CDI directory: {0}")]
    Cdi(dra_plugin::cdi::Error),
    #[error("kubelet plugin: {0}")]
    Plugin(dra_plugin::builder::Error),
}

/// What the sink is configured with (from [`crate::agent::AgentConfig`]).
#[derive(Clone, Debug)]
pub struct DraOptions {
    pub node_name: String,
    pub node_uid: String,
    pub instance_namespace: String,
    pub registry_dir: PathBuf,
    pub plugins_dir: PathBuf,
    pub cdi_dir: PathBuf,
    pub device_metadata: bool,
    pub state_dir: PathBuf,
    pub instance_grace: crate::instance_plan::Grace,
    /// The most Instances the node keeps of one configuration.
    pub max_instances_per_configuration: usize,
    pub vanished_grace: Duration,
    /// Whether the API server keeps device taints.
    pub device_taints: bool,
    pub kubelet_registration_timeout: Duration,
    /// This pod's UID, for rolling updates ([`crate::agent::AgentConfig::pod_uid`]).
    pub pod_uid: Option<String>,
}

/// One served DRA driver (one discovery handler).
struct ServedDriver {
    plugin: dra_plugin::Plugin<Timed<AkriDriver>>,
    /// Devices kept (tainted) while prepared claims hold them after they vanished.
    vanished: VanishedDevices,
    /// Whether `vanished` has read what a previous process published.
    seeded: bool,
    /// Health: every device name published since it started, and which of them are gone now.
    health: Health,
    /// When it started serving: a kubelet should take it soon after.
    served_at: Instant,
}

impl ServedDriver {
    /// Whether a change of its prepared claims can change what it publishes: only a release of
    /// a vanished device does (so a prepare or an unprepare of a present device costs no pass).
    fn waits_on_claims(&self) -> bool {
        self.vanished.any_vanished() || !self.health.gone.is_empty()
    }
}

pub struct DraSink {
    client: kube::Client,
    options: DraOptions,
    devices: NodeDevices,
    metrics: Metrics,
    drivers: BTreeMap<String, ServedDriver>,
    instances: InstanceWriter,
    /// Configurations one of whose Instances the API server refused on the last write, with
    /// why (shown in their `status.discoveryErrors`).
    refused_instances: BTreeMap<String, String>,
    registration: KubeletRegistration,
    next_registration_check: Option<Instant>,
    /// When some vanished device's taint moves on.
    next_taint_change: Option<Instant>,
    /// Drivers to publish on the next pass.
    dirty: BTreeSet<String>,
    /// The configurations whose handler answers: their devices' health is vouched for.
    answering: BTreeSet<String>,
    claims_tx: mpsc::UnboundedSender<String>,
    claims_rx: mpsc::UnboundedReceiver<String>,
}

impl DraSink {
    pub fn new(
        client: kube::Client,
        options: DraOptions,
        devices: NodeDevices,
        metrics: Metrics,
    ) -> Self {
        let instances = InstanceWriter::new(
            client.clone(),
            &options.instance_namespace,
            &options.node_name,
            options.instance_grace,
        )
        .limit(options.max_instances_per_configuration);
        let (claims_tx, claims_rx) = mpsc::unbounded_channel();
        DraSink {
            registration: KubeletRegistration::new(options.kubelet_registration_timeout),
            client,
            options,
            devices,
            metrics,
            drivers: BTreeMap::new(),
            instances,
            refused_instances: BTreeMap::new(),
            next_registration_check: None,
            next_taint_change: None,
            dirty: BTreeSet::new(),
            answering: BTreeSet::new(),
            claims_tx,
            claims_rx,
        }
    }

    /// Configurations one of whose Instances the API server refused on the last write, with
    /// why.
    pub fn refused_instances(&self) -> &BTreeMap<String, String> {
        &self.refused_instances
    }

    /// The devices it publishes (what prepare looks devices up in).
    pub fn devices(&self) -> &NodeDevices {
        &self.devices
    }

    /// Vouches for the health of every served device whose configuration's handler answers
    /// (`answering`), and of the vanished ones it keeps: the kubelet turns the others Unknown.
    /// Called at least every [`dra_plugin::health::RESEND_INTERVAL`].
    pub fn vouch(&mut self, answering: BTreeSet<String>) {
        self.answering = answering;
        for (driver, served) in &self.drivers {
            let local = self.devices.local_dra_devices(driver);
            let health = served.plugin.health();
            vouch(
                health,
                &served.health.gone,
                &self.options.node_name,
                &local,
                &self.answering,
            );
        }
    }

    /// Withdraws every served driver's registration with the kubelet; the drivers keep
    /// answering the calls under way (the first step of a clean stop).
    pub fn deregister(&mut self) {
        for served in self.drivers.values_mut() {
            served.plugin.deregister();
        }
    }

    /// Publishes `driver` on the next pass.
    pub fn changed(&mut self, driver: String) {
        self.dirty.insert(driver);
    }

    /// Publishes every driver on the next pass.
    pub fn resync(&mut self) {
        self.dirty.extend(self.drivers.keys().cloned());
    }

    /// Waits for what the sink itself reacts to: a driver's prepared claims changing while it
    /// keeps a vanished device, a taint moving on, the time to see whether a kubelet took a
    /// driver. Returns whether a pass should follow: claims changing on a driver without
    /// vanished devices (every prepare and unprepare) need none.
    pub async fn wake(&mut self) -> bool {
        tokio::select! {
            Some(driver) = self.claims_rx.recv() => {
                let waits = self.drivers.get(&driver).is_some_and(ServedDriver::waits_on_claims);
                if waits {
                    self.dirty.insert(driver);
                }
                waits
            }
            _ = sleep_until_some(self.next_registration_check) => {
                self.next_registration_check = None;
                true
            }
            _ = sleep_until_some(self.next_taint_change) => {
                self.next_taint_change = None;
                self.resync();
                true
            }
        }
    }

    /// Serves a kubelet plugin per registered handler (before the start-up gate opens too:
    /// the kubelet may prepare claims of the devices published before).
    async fn serve(&mut self, handlers: &Handlers) {
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
                        self.claims_tx.clone(),
                    ));
                    self.drivers.insert(driver.clone(), served);
                    self.dirty.insert(driver);
                }
                Err(error) => tracing::error!(%driver, %error, "cannot serve the DRA driver"),
            }
        }
    }

    /// Why the node is not ready, if a kubelet refused a driver or took none in time.
    fn registration_problem(&mut self) -> Option<String> {
        let registration = self.registration.check(
            self.drivers.iter().map(|(driver, served)| {
                let status = served.plugin.registration_status();
                (driver.as_str(), status, served.served_at)
            }),
            Instant::now(),
            &self.options.registry_dir,
        );
        self.next_registration_check = registration.next_check;
        registration.problem
    }

    /// Whether the kubelet took every served driver. If not, looks again within a second (a
    /// standby agent is ready only then: the pod it replaces may go once it is).
    fn all_registered(&mut self) -> bool {
        let all = (self.drivers.values())
            .all(|served| served.plugin.registration_status() == RegistrationStatus::Registered);
        if !all {
            let soon = Instant::now() + Duration::from_secs(1);
            self.next_registration_check =
                Some(self.next_registration_check.map_or(soon, |t| t.min(soon)));
        }
        all
    }

    /// Publishes the changed drivers' pools and health, and the Instances.
    async fn publish(&mut self) {
        // A device renamed because another node's has its name is published under its new
        // name at once (a second round at most: a new name is checked against the others').
        for _ in 0..2 {
            if self.dirty.is_empty() {
                break;
            }
            for driver in std::mem::take(&mut self.dirty) {
                self.publish_driver(&driver).await;
            }
            self.sync_instances().await;
        }
        if self.instances.pending() {
            self.resync();
        }
    }

    async fn serve_driver(&self, handler: &str, driver: &str) -> Result<ServedDriver, Error> {
        let options = &self.options;
        let cdi =
            CdiRoot::new(&options.cdi_dir, akri_devices::DRIVER_DOMAIN).map_err(Error::Cdi)?;
        let akri_driver = AkriDriver {
            driver: driver.to_string(),
            cdi_class: handler.to_ascii_lowercase(),
            cdi,
            devices: self.devices.clone(),
        };
        let checkpoint = options.state_dir.join(format!("{driver}-checkpoint.json"));
        let timed = Timed {
            inner: akri_driver,
            driver: driver.to_string(),
            metrics: self.metrics.clone(),
        };
        let builder = dra_plugin::Plugin::builder(driver, &options.node_name);
        let builder = match &options.pod_uid {
            Some(uid) => builder.rolling_update(uid),
            None => builder,
        };
        // Both versions, newest first: a reader written for 1.36 (v1alpha1) finds its own.
        let builder = match options.device_metadata {
            true => builder.device_metadata([Version::V1beta1, Version::V1alpha1]),
            false => builder,
        };
        let plugin = builder
            .registry_dir(&options.registry_dir)
            .plugin_dir(options.plugins_dir.join(driver))
            .checkpoint(checkpoint)
            .cdi_dir(&options.cdi_dir)
            .node_uid(&options.node_uid)
            .field_manager(akri_devices::node_field_manager(&options.node_name))
            // Slices changed or deleted behind its back (the kubelet's DRA manager deletes a
            // node's slices when it restarts) are written again as last published; a
            // vanished device's taint moves on at its own time (`next_taint_change`).
            .start(self.client.clone(), timed)
            .await
            .map_err(Error::Plugin)?;
        if let Some(set_aside) = plugin.service().set_aside() {
            let note = format!(
                "The prepared-claims checkpoint of {driver} was unusable ({}); it was moved to {} and the plugin started without it. Claims are prepared again as the kubelet asks.",
                set_aside.reason,
                set_aside.moved_to.display()
            );
            self.warn("CheckpointSetAside", note);
        }
        Ok(ServedDriver {
            plugin,
            vanished: VanishedDevices::new(
                akri_devices::NOT_DISCOVERED_TAINT,
                options.vanished_grace,
                options.device_taints,
            ),
            seeded: false,
            health: Health::default(),
            served_at: Instant::now(),
        })
    }

    fn warn(&self, reason: &'static str, note: String) {
        tokio::spawn(crate::node_events::warn(
            self.client.clone(),
            self.options.node_name.clone(),
            self.options.node_uid.clone(),
            reason,
            note,
        ));
    }

    /// Publishes a driver's node-local pool and its devices' health.
    async fn publish_driver(&mut self, driver: &str) {
        let local = self.devices.local_dra_devices(driver);
        let pool = self.options.node_name.clone();
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
        let now = k8s_openapi::jiff::Timestamp::now();
        let plan = served.vanished.plan(reported, &held, now);
        if let Some(at) = plan.next_change {
            let at = Instant::now() + now.duration_until(at).unsigned_abs();
            self.next_taint_change = Some(self.next_taint_change.map_or(at, |t| t.min(at)));
        }
        for device in &plan.newly_vanished {
            let (client, options) = (&self.client, &self.options);
            crate::vanished::announce(
                client,
                &options.node_name,
                &options.node_uid,
                driver,
                device,
                options.device_taints,
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

        let now: BTreeSet<String> = local.iter().map(|(d, _)| d.name.clone()).collect();
        for name in served.health.update(now, &held) {
            served.plugin.health().remove(&pool, &name);
        }
        vouch(
            served.plugin.health(),
            &served.health.gone,
            &pool,
            &local,
            &self.answering,
        );
    }

    /// Writes the Instances of every driver's devices on this node. A device whose name
    /// another node's unshared device has is renamed, and its driver published again.
    async fn sync_instances(&mut self) {
        let (mut known, mut drivers) = (Vec::new(), Vec::new());
        for driver in self.drivers.keys() {
            let seen = self.devices.seen(driver);
            drivers.extend(std::iter::repeat_n(driver.clone(), seen.len()));
            known.extend(seen);
        }
        let synced = match self.instances.sync(&known, None).await {
            Ok(synced) => synced,
            Err(error) => {
                tracing::warn!(%error, "writing Instances failed; retrying on the next change or resync");
                return;
            }
        };
        self.refused_instances = synced.refused;
        for name in synced.contested {
            let Some(at) = known.iter().position(|(d, _, _)| d.instance == name) else {
                continue;
            };
            let (device, driver) = (&known[at].0, &drivers[at]);
            if self.devices.avoid(driver, &device.configuration, &name) {
                tracing::warn!(%driver, configuration = %device.configuration, device = %device.device.id, instance = %name, "another node's device has this Instance name; renamed");
                self.dirty.insert(driver.clone());
            }
        }
    }
}

impl ApplyPlan for DraSink {
    /// Serves a driver per registered handler and vouches for its devices' health. Standing
    /// by, that is all (the kubelet may call these drivers already; the leading agent writes
    /// the rest). Leading, once discovery has answered, publishes what changed; until then
    /// what the previous process published stays.
    async fn apply(&mut self, pass: &mut Pass<'_>) -> Standing {
        self.serve(pass.handlers).await;
        self.vouch(pass.discovery.answering(Sink::Dra));
        if !pass.leading {
            let problem = self.registration_problem();
            let registered = self.all_registered();
            return match problem {
                Some(problem) => Standing::Problem(problem),
                None if !registered => Standing::WaitingForKubelet,
                None => Standing::Serving,
            };
        }
        if !(pass.discovery).open(Sink::Dra, &pass.plan.wanted, pass.handlers) {
            return Standing::Starting;
        }
        let problem = self.registration_problem();
        self.publish().await;
        problem.map_or(Standing::Serving, Standing::Problem)
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
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
