//! The node agent's one loop: event -> state -> plan -> apply -> readiness.
//!
//! - Events: the configurations (a watch of v1 DiscoveryConfigurations when the DRA sink
//!   runs, of v0 Configurations when the legacy sink does; status-only writes are not
//!   events), the discovery handlers (un)registering, the streams' reports, changes of the
//!   Secrets and ConfigMaps that discovery properties name, the DRA sink's own wake-ups and a
//!   resync (`AgentConfig::resync`, 30 s by default; and every 10 s, without a pass, the DRA
//!   sink vouches for its devices' health).
//! - State: the stores those watches keep and the devices discovery reported
//!   ([`NodeDiscovery`]).
//! - Plan, pure, in two parts: [`NodePlan`] (what to discover; discovery is brought in line
//!   with it), then, from each sink's part of the state ([`ApplyPlan::observe`]: its stored
//!   Instances, its pools' prepared claims) and the devices discovered, [`DevicePlan`] (the
//!   slices, health, Instances and device-plugin lists the node wants).
//! - Apply: each sink its part of that plan ([`ApplyPlan::apply`]), once its start-up gate is
//!   open (a second round at once when a write renamed devices); then this node's
//!   `status.discoveryErrors` entries ([`crate::device_plan::status_entries`], planned last
//!   so that a refused Instance shows at once).
//! - Readiness: from the sinks' standings ([`sink::readiness`]).
//!
//! A pass reads nothing from the API server that the watches do not already keep (the
//! library's slice publisher, the Instance writers and the property sources keep what is
//! stored).

use crate::config_watch::{WatchEvent, watch_all, watch_mirrors};
use crate::device_plan::{DevicePlan, NodeState};
use crate::discovery::Handlers;
use crate::dra_sink::DraSink;
use crate::handler_lease::HandlerLease;
use crate::leader::{Leader, Takeover};
use crate::legacy::LegacySink;
use crate::metrics::Metrics;
use crate::node_discovery::{NodeDiscovery, Sink};
use crate::node_plan::{Known, NodePlan};
use crate::sink::{self, Applied, ApplyPlan, Observed, Pass, Standing};
use crate::streams::StreamEvent;
use akri_api::v0::Configuration;
use akri_api::v1::{DiscoveryConfiguration, spec_mirror};
use akri_runtime::http::Readiness;
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::Store;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The agent's state, owned by its one task.
pub(crate) struct NodeLoop {
    pub client: kube::Client,
    pub node_name: String,
    pub discovery: NodeDiscovery,
    pub dra: Option<DraSink>,
    /// The v0 Configurations' device plugins: served standing by too, written for once this
    /// agent leads.
    pub legacy: Option<LegacySink>,
    /// What the node's leading agent runs; `None` while standing by ([`Takeover`]).
    pub leader: Option<Leader>,
    pub startup_wait: Duration,
    pub metrics: Metrics,
    pub readiness: Readiness,
    /// Why v0 Configurations are not served, as last said in the log.
    pub refused_v0: BTreeMap<String, String>,
    /// How often a pass runs without a change.
    pub resync: Duration,
    /// Where the driver-controller mirrors the DiscoveryConfigurations (the Instances').
    pub mirror_namespace: String,
    /// This node's handlers, told to the driver-controller (with the DRA path).
    pub handler_lease: Option<HandlerLease>,
}

/// How long a stopping agent keeps answering the kubelet's calls under way after it withdrew
/// its registrations.
const STOP_DRAIN: Duration = Duration::from_secs(1);

/// What the loop waits on: the configuration stores and their watches, the handlers, the
/// streams' reports, its timers, the takeover and the stop.
pub(crate) struct Inputs {
    /// The DiscoveryConfigurations' mirrors.
    v1: Store<ConfigMap>,
    v1_changes: BoxStream<'static, WatchEvent>,
    v0: Store<Configuration>,
    v0_changes: BoxStream<'static, WatchEvent>,
    handlers: watch::Receiver<Handlers>,
    events: mpsc::Receiver<StreamEvent>,
    property_changes: std::sync::Arc<tokio::sync::Notify>,
    resync: tokio::time::Interval,
    /// The DRA sink vouches for its devices' health this often, without a pass.
    vouch: tokio::time::Interval,
    /// Standing by, a pass every second notices the kubelet taking this pod's plugins.
    standing_by: tokio::time::Interval,
    startup_deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// A finished sleep is ready again at once: poll it only until it has fired.
    waited: bool,
    /// The sinks whose configuration watch fails now.
    failing: BTreeSet<Sink>,
    takeover: Takeover,
    stop: tokio::sync::oneshot::Receiver<()>,
}

/// What a pass plans from: the stores and the handlers as they are now.
struct State {
    v1: Vec<std::sync::Arc<DiscoveryConfiguration>>,
    v0: Vec<std::sync::Arc<Configuration>>,
    handlers: Handlers,
    /// Whether a configuration watch fails now.
    watch_failing: bool,
}

/// The DiscoveryConfigurations the mirrors in `store` hold; none before the marker (the start-up
/// gate is closed then). A mirror that does not decode is logged and left out.
fn mirrored(store: &Store<ConfigMap>) -> Vec<std::sync::Arc<DiscoveryConfiguration>> {
    let mirrors = store.state();
    let Some((configs, broken)) = spec_mirror::configurations(mirrors.iter().map(|m| m.as_ref()))
    else {
        return Vec::new();
    };
    for why in broken {
        tracing::warn!(%why, "a DiscoveryConfiguration's mirror does not decode; left out");
    }
    configs.into_iter().map(std::sync::Arc::new).collect()
}

impl Inputs {
    fn state(&self) -> State {
        State {
            v1: mirrored(&self.v1),
            v0: self.v0.state(),
            handlers: self.handlers.borrow().clone(),
            watch_failing: !self.failing.is_empty(),
        }
    }
}

/// What woke the loop.
enum Wake {
    /// Something the plan or the sinks depend on changed (or the resync).
    Pass,
    /// Handled without a pass.
    Quiet,
    /// A clean stop (SIGTERM).
    Stop,
    /// At once: the lead could not be taken, or the handlers' registry is gone.
    Exit,
}

impl NodeLoop {
    /// The loop: event -> state -> plan -> apply -> readiness, until stopped.
    pub async fn run(
        mut self,
        handlers: watch::Receiver<Handlers>,
        events: mpsc::Receiver<StreamEvent>,
        takeover: Option<Takeover>,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        let (v1, v1_changes) =
            watch_mirrors(&self.client, &self.mirror_namespace, self.dra.is_some());
        let (v0, v0_changes) = watch_all::<Configuration>(&self.client, self.legacy.is_some());
        let mut inputs = Inputs {
            v1,
            v1_changes,
            v0,
            v0_changes,
            handlers,
            events,
            property_changes: self.discovery.property_changes(),
            resync: tokio::time::interval(self.resync),
            vouch: tokio::time::interval(dra_plugin::health::RESEND_INTERVAL),
            standing_by: tokio::time::interval(Duration::from_secs(1)),
            startup_deadline: Box::pin(tokio::time::sleep(self.startup_wait)),
            waited: false,
            failing: BTreeSet::new(),
            takeover: takeover.unwrap_or_else(|| Box::pin(std::future::pending())),
            stop,
        };
        loop {
            match self.next(&mut inputs).await {
                Wake::Pass => self.pass(inputs.state()).await,
                Wake::Quiet => {}
                Wake::Stop => return self.stop().await,
                Wake::Exit => return,
            }
        }
    }

    /// Waits for the next input and takes it into the state.
    async fn next(&mut self, inputs: &mut Inputs) -> Wake {
        tokio::select! {
            // A failing watch retries by itself, with backoff; a pass now would only fail
            // its writes too (the resync retries them), so the outage costs no work.
            Some(event) = inputs.v1_changes.next() => self.on_watch(Sink::Dra, event, &mut inputs.failing),
            Some(event) = inputs.v0_changes.next() => self.on_watch(Sink::Legacy, event, &mut inputs.failing),
            _ = &mut inputs.startup_deadline, if !inputs.waited => {
                inputs.waited = true;
                Wake::Pass
            }
            () = inputs.property_changes.notified() => Wake::Pass,
            changed = inputs.handlers.changed() => match changed {
                Ok(()) => Wake::Pass,
                Err(_) => Wake::Exit,
            },
            Some(event) = inputs.events.recv() => {
                self.on_stream_event(event);
                // Take every report already waiting before publishing.
                while let Ok(event) = inputs.events.try_recv() {
                    self.on_stream_event(event);
                }
                Wake::Pass
            }
            _ = inputs.resync.tick() => {
                if let Some(dra) = &mut self.dra {
                    dra.resync();
                }
                Wake::Pass
            }
            _ = &mut inputs.stop => Wake::Stop,
            led = &mut inputs.takeover, if self.leader.is_none() => self.take_lead(led),
            _ = inputs.vouch.tick() => {
                if let Some(dra) = &mut self.dra {
                    dra.vouch(self.discovery.answering(Sink::Dra));
                }
                Wake::Quiet
            }
            _ = inputs.standing_by.tick(), if self.leader.is_none() => Wake::Pass,
            needed = wake(self.dra.as_mut()) => match needed {
                true => Wake::Pass,
                false => Wake::Quiet,
            },
        }
    }

    /// One pass: the plan from the stores, discovery brought in line with it, each sink's
    /// part applied, this node's status entries written, readiness said.
    async fn pass(&mut self, state: State) {
        self.metrics.passed();
        let plan = self.plan(&state);
        let handlers = state.handlers;
        for (sink, group) in self.discovery.sync(&plan.wanted, &handlers).await {
            self.changed(sink, group);
        }
        self.discovery.errors.held_back = plan.held_back.clone();
        let leading = self.leader.is_some();
        let mut standings = Vec::new();
        // A second round only after a write renamed devices: they are written under their new
        // names at once (a new name is checked against the others' on that round's writes).
        for _ in 0..2 {
            let mut pass = Pass {
                plan: &plan,
                handlers: &handlers,
                discovery: &mut self.discovery,
                leading,
            };
            let (applied, again) = apply(self.dra.as_mut(), self.legacy.as_mut(), &mut pass).await;
            standings = applied;
            if !again {
                break;
            }
        }
        if let (true, Some(dra)) = (leading, &self.dra) {
            // Planned last, so that an Instance the API server refused on this pass shows now.
            let errors = &mut self.discovery.errors;
            errors.instances = dra.refused_instances().clone();
            errors.report(&self.client, &self.node_name).await;
            self.metrics.set_discovery_errors(errors.failing());
        }
        // Once the handlers have reported (no sink starting), so that a node's restart never
        // says for a moment that it has none.
        if let (true, Some(lease)) = (leading, &mut self.handler_lease)
            && !standings.contains(&Standing::Starting)
        {
            lease.sync(&handlers).await;
        }
        match sink::readiness(&standings, state.watch_failing) {
            Some(Ok(())) => self.readiness.ready(),
            Some(Err(why)) => self.readiness.not_ready(why),
            None => {}
        }
    }

    /// The plan from the stores; a change of which v0 Configurations are refused is logged.
    fn plan(&mut self, state: &State) -> NodePlan {
        let legacy_instances = (self.legacy.as_ref())
            .map(LegacySink::instances_by_configuration)
            .unwrap_or_default();
        let plan = NodePlan::of(&Known {
            node: &self.node_name,
            v1: &state.v1,
            v0: &state.v0,
            legacy_namespaces: self.legacy.as_ref().map(|l| &l.namespaces),
            legacy_instances: &legacy_instances,
        });
        if plan.refused_v0 != self.refused_v0 {
            for (config, why) in &plan.refused_v0 {
                tracing::warn!(configuration = %config, %why, "v0 Configuration not served");
            }
            self.refused_v0 = plan.refused_v0.clone();
        }
        plan
    }

    /// A clean stop: the kubelet is told first, and calls under way (it may have sent one just
    /// before) are answered; then everything goes, the node's lock last.
    async fn stop(mut self) {
        if let Some(dra) = &mut self.dra {
            dra.deregister();
            tokio::time::sleep(STOP_DRAIN).await;
        }
    }

    /// The takeover finished: this agent leads the node from now on, or exits.
    fn take_lead(&mut self, led: Result<Leader, crate::leader::Error>) -> Wake {
        match led {
            Ok(leader) => {
                tracing::info!("the kubelet-plugin that led this node exited; leading now");
                self.leader = Some(leader);
                if let Some(legacy) = &mut self.legacy {
                    legacy.lead();
                }
                Wake::Pass
            }
            Err(error) => {
                tracing::error!(%error, "taking the lead failed; exiting");
                Wake::Exit
            }
        }
    }

    /// Takes a watch event of `sink`'s configurations.
    fn on_watch(&mut self, sink: Sink, event: WatchEvent, failing: &mut BTreeSet<Sink>) -> Wake {
        match event {
            WatchEvent::Failed => {
                failing.insert(sink);
                self.readiness.not_ready(match sink {
                    Sink::Dra => "cannot watch DiscoveryConfigurations (the API server is unreachable or refuses)",
                    Sink::Legacy => "cannot watch Configurations (the API server is unreachable or refuses)",
                });
                return Wake::Quiet;
            }
            WatchEvent::Listed => self.discovery.listed(sink),
            WatchEvent::Changed => {}
        }
        failing.remove(&sink);
        Wake::Pass
    }

    fn on_stream_event(&mut self, event: StreamEvent) {
        if let Some((sink, group)) = self.discovery.on_event(event) {
            self.changed(sink, group);
        }
    }

    /// A group of `sink` changed. The legacy sink looks at every namespace on every pass.
    fn changed(&mut self, sink: Sink, group: String) {
        if let (Sink::Dra, Some(dra)) = (sink, &mut self.dra) {
            dra.changed(group);
        }
    }
}

/// One round of a pass's sinks: each reads its part of the state, the plan of the node's
/// writes is made from all of it ([`DevicePlan::of`]), and each applies its part. Returns
/// the sinks' standings, and whether a write renamed devices.
async fn apply(
    mut dra: Option<&mut DraSink>,
    mut legacy: Option<&mut LegacySink>,
    pass: &mut Pass<'_>,
) -> (Vec<Standing>, bool) {
    let mut state = NodeState::default();
    let mut observed = Vec::new();
    if let Some(dra) = dra.as_deref_mut() {
        observed.push(dra.observe(pass, &mut state).await);
    }
    if let Some(legacy) = legacy.as_deref_mut() {
        observed.push(legacy.observe(pass, &mut state).await);
    }
    let mut plan = DevicePlan::of(
        state,
        k8s_openapi::jiff::Timestamp::now(),
        std::time::Instant::now(),
    );
    let mut observed = observed.into_iter();
    let mut applied = Vec::new();
    if let Some(dra) = dra {
        applied.push(apply_one(dra, observed.next(), pass, &mut plan).await);
    }
    if let Some(legacy) = legacy {
        applied.push(apply_one(legacy, observed.next(), pass, &mut plan).await);
    }
    let again = applied.iter().any(|a| a.again);
    (applied.into_iter().map(|a| a.standing).collect(), again)
}

/// A sink's part of a round: applied if it observed, or where it stands.
async fn apply_one(
    sink: &mut impl ApplyPlan,
    observed: Option<Observed>,
    pass: &mut Pass<'_>,
    plan: &mut DevicePlan,
) -> Applied {
    match observed {
        Some(Observed::Stands(standing)) => standing.into(),
        _ => sink.apply(pass, plan).await,
    }
}

/// The DRA sink's next wake-up, or never; whether a pass should follow.
async fn wake(dra: Option<&mut DraSink>) -> bool {
    match dra {
        Some(dra) => dra.wake().await,
        None => std::future::pending().await,
    }
}
