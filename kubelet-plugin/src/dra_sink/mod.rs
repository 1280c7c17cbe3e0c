//! The DRA sink of the node's discovery: per discovery handler one served DRA driver (the
//! kubelet plugin), this node's pool of its devices, their health, and their Instances.

mod served;

pub use served::Error;
use served::ServedDriver;

use crate::device_health::{self, tell};
use crate::device_plan::{
    DevicePlan, InstancePath, InstancesPlan, InstancesState, NodeState, PoolPlan, PoolState,
};
use crate::instances::InstanceWriter;
use crate::kubelet_registration::KubeletRegistration;
use crate::metrics::Metrics;
use crate::node_devices::NodeDevices;
use crate::node_discovery::Sink;
use crate::sink::{Applied, ApplyPlan, Observed, Pass, Standing};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

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
    /// Why the node is not ready, as found at this pass's start (a kubelet refused a
    /// driver, or took none in time).
    problem: Option<String>,
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
            problem: None,
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
            let plan = device_health::plan(&local, &self.answering, &served.health.gone);
            tell(served.plugin.health(), &self.options.node_name, &plan);
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
                self.metrics.claims_woke(waits);
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

    /// Reads what the pools of the changed drivers are planned from: what a previous process
    /// published (once per driver, for its vanished devices and their graces) and the devices
    /// the prepared claims hold, by driver. A driver whose pool cannot be read is left for the
    /// next change or resync.
    async fn read_pools(&mut self) -> BTreeMap<String, BTreeSet<String>> {
        let pool = self.options.node_name.clone();
        let mut held = BTreeMap::new();
        for driver in std::mem::take(&mut self.dirty) {
            let Some(served) = self.drivers.get_mut(&driver) else {
                continue;
            };
            if !served.seeded {
                let stored = served.plugin.pools().stored(&pool);
                match tokio::time::timeout(crate::API_CALL_TIMEOUT, stored).await {
                    Ok(Ok(stored)) => {
                        let devices = dra_plugin::slices::current_devices(&stored);
                        served.vanished.seed(devices);
                        served.seeded = true;
                    }
                    _ => {
                        tracing::warn!(%driver, "reading the published pool failed; retrying on the next change or resync");
                        continue;
                    }
                }
            }
            let prepared = served.plugin.service().prepared().await;
            held.insert(driver, crate::vanished::held_devices(&prepared, &pool));
        }
        held
    }

    /// Publishes a driver's pool as planned and tells the kubelet its devices' health.
    async fn apply_pool(&mut self, pool: PoolPlan) {
        let driver = pool.driver.as_str();
        let Some(served) = self.drivers.get(driver) else {
            return;
        };
        let plan = pool.slices;
        if let Some(at) = plan.next_change {
            let now = k8s_openapi::jiff::Timestamp::now();
            let at = Instant::now() + now.duration_until(at).unsigned_abs();
            self.next_taint_change = Some(self.next_taint_change.map_or(at, |t| t.min(at)));
        }
        let options = &self.options;
        for device in &plan.newly_vanished {
            crate::vanished::announce(
                &self.client,
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
        tell(served.plugin.health(), &options.node_name, &pool.health);
    }

    /// Writes the Instances as planned. A device whose name another node's unshared device
    /// has is renamed, and its driver published again; returns whether one was.
    async fn apply_instances(&mut self, planned: InstancesPlan) -> bool {
        let synced = match self.instances.apply(planned.plan, &planned.stored).await {
            Ok(synced) => synced,
            Err(error) => {
                tracing::warn!(%error, "writing Instances failed; retrying on the next change or resync");
                return false;
            }
        };
        self.refused_instances = synced.refused;
        let mut renamed = false;
        for name in synced.contested {
            for driver in self.drivers.keys() {
                let seen = self.devices.seen(driver);
                let Some((device, _, _)) = seen.iter().find(|(d, _, _)| d.instance == name) else {
                    continue;
                };
                if self.devices.avoid(driver, &device.configuration, &name) {
                    tracing::warn!(%driver, configuration = %device.configuration, device = %device.device.id, instance = %name, "another node's device has this Instance name; renamed");
                    self.dirty.insert(driver.clone());
                    renamed = true;
                }
            }
        }
        renamed
    }
}

impl ApplyPlan for DraSink {
    /// Serves a driver per registered handler and vouches for its devices' health. Standing
    /// by, that is all (the kubelet may call these drivers already; the leading agent writes
    /// the rest). Leading, once discovery has answered, reads the pools of the drivers whose
    /// devices changed and the stored Instances; until then what the previous process
    /// published stays.
    async fn observe<'s>(&'s mut self, pass: &mut Pass<'_>, state: &mut NodeState<'s>) -> Observed {
        self.serve(pass.handlers).await;
        self.vouch(pass.discovery.answering(Sink::Dra));
        if !pass.leading {
            let problem = self.registration_problem();
            let registered = self.all_registered();
            return Observed::Stands(match problem {
                Some(problem) => Standing::Problem(problem),
                None if !registered => Standing::WaitingForKubelet,
                None => Standing::Serving,
            });
        }
        if !(pass.discovery).open(Sink::Dra, &pass.plan.wanted, pass.handlers) {
            return Observed::Stands(Standing::Starting);
        }
        self.problem = self.registration_problem();
        let mut held = self.read_pools().await;
        let stored = match self.instances.stored().await {
            Ok(stored) => Some(stored),
            Err(error) => {
                tracing::warn!(%error, "reading this node's Instances failed; retrying on the next change or resync");
                None
            }
        };
        let devices = &self.devices;
        let seen: Vec<_> = (self.drivers.keys())
            .flat_map(|driver| devices.seen(driver))
            .collect();
        for (driver, served) in self.drivers.iter_mut() {
            let Some(held) = held.remove(driver) else {
                continue;
            };
            state.pools.push(PoolState {
                local: devices.local_dra_devices(driver),
                driver: driver.clone(),
                held,
                answering: self.answering.clone(),
                vanished: &mut served.vanished,
                health: &mut served.health,
            });
        }
        if let Some(stored) = stored {
            let (writer, vanished) = self.instances.planner(None);
            state.instances.push(InstancesState {
                path: InstancePath::Dra,
                writer,
                seen,
                stored,
                vanished,
            });
        }
        Observed::Apply
    }

    /// Publishes the planned pools and health, then writes the Instances.
    async fn apply(&mut self, _: &mut Pass<'_>, plan: &mut DevicePlan) -> Applied {
        for pool in std::mem::take(&mut plan.pools) {
            self.apply_pool(pool).await;
        }
        let again = match plan.take_instances(&InstancePath::Dra) {
            Some(planned) => self.apply_instances(planned).await,
            None => false,
        };
        // An Instance waiting for its grace: the resync publishes everything again.
        if self.instances.pending() {
            self.resync();
        }
        Applied {
            standing: self
                .problem
                .clone()
                .map_or(Standing::Serving, Standing::Problem),
            again,
        }
    }
}

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
