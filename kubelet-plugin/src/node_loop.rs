//! The node agent's one loop. In: the configurations (a watch of v1 DiscoveryConfigurations
//! when the DRA sink runs, of v0 Configurations when the legacy sink does), the discovery
//! handlers (un)registering, the streams' reports, changes of the Secrets and ConfigMaps that
//! discovery properties name, the DRA sink's own wake-ups and a resync (`AgentConfig::resync`,
//! 30 s by default; and every 10 s, without a pass, the DRA sink vouches for its devices'
//! health). Out:
//! [`NodeDiscovery`] brought in line with the configurations, then each sink's writes, once
//! its start-up gate is open. A pass reads nothing from the API server that the watches do
//! not already keep (the library's slice publisher, the Instance writers and the property
//! sources keep what is stored).

use crate::agent::Leader;
use crate::discovery::Handlers;
use crate::dra_sink::DraSink;
use crate::legacy::LegacySink;
use crate::metrics::Metrics;
use crate::node_discovery::{NodeDiscovery, Sink, Wanted};
use crate::same_name;
use crate::streams::StreamEvent;
use akri_api::v0::Configuration;
use akri_api::v1::DiscoveryConfiguration;
use akri_runtime::http::Readiness;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
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
}

/// How a standby agent takes the lead once the one leading the node exits: waits for its lock,
/// then serves the registration socket and the rest of [`Leader`].
pub(crate) type Takeover = BoxFuture<'static, Result<Leader, crate::agent::Error>>;

/// How long a stopping agent keeps answering the kubelet's calls under way after it withdrew
/// its registrations.
const STOP_DRAIN: Duration = Duration::from_secs(1);

/// What a configuration watch said, as far as the loop cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WatchEvent {
    Changed,
    /// The first list is complete.
    Listed,
    Failed,
}

/// A store of every `K` kept by a watch, and the watch's events; with `enabled` false, an
/// empty store and no events.
fn watch_all<K>(client: &kube::Client, enabled: bool) -> (Store<K>, BoxStream<'static, WatchEvent>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = kube::runtime::reflector::store();
    if !enabled {
        return (store, futures::stream::pending().boxed());
    }
    // A change of what the node reads (spec: the generation; a deletion; labels and
    // annotations, e.g. `akri.sh/migrated-from`) triggers a pass over the store; a
    // status-only write (the driver-controller's counts, another node's discoveryErrors
    // entry) does not, or every node would pass once per status write of every node. The end
    // of a list tells the start-up gate that the store is complete (and catches what a watch
    // gap missed).
    let mut seen: BTreeMap<String, Read> = BTreeMap::new();
    let events = kube::runtime::reflector(
        writer,
        watcher(Api::<K>::all(client.clone()), watcher::Config::default()).default_backoff(),
    )
    .filter_map(move |event| {
        let event = match event {
            Ok(watcher::Event::InitDone) => Some(WatchEvent::Listed),
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                let read = Read::of(&o);
                let uid = o.uid().unwrap_or_default();
                (seen.insert(uid, read.clone()) != Some(read)).then_some(WatchEvent::Changed)
            }
            Ok(watcher::Event::Delete(o)) => {
                seen.remove(&o.uid().unwrap_or_default());
                Some(WatchEvent::Changed)
            }
            Ok(watcher::Event::Init) => None,
            Err(_) => Some(WatchEvent::Failed),
        };
        std::future::ready(event)
    });
    (store, events.boxed())
}

/// What the loop reads of a configuration's metadata, beside its spec (its generation).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Read {
    generation: Option<i64>,
    deleted: bool,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

impl Read {
    fn of(object: &impl Resource) -> Read {
        let meta = object.meta();
        Read {
            generation: meta.generation,
            deleted: meta.deletion_timestamp.is_some(),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
        }
    }
}

impl NodeLoop {
    pub async fn run(
        mut self,
        mut handlers: watch::Receiver<Handlers>,
        mut events: mpsc::Receiver<StreamEvent>,
        takeover: Option<Takeover>,
        mut stop: tokio::sync::oneshot::Receiver<()>,
    ) {
        let mut takeover = takeover.unwrap_or_else(|| Box::pin(std::future::pending()));
        let (v1, mut v1_changes) =
            watch_all::<DiscoveryConfiguration>(&self.client, self.dra.is_some());
        let (v0, mut v0_changes) = watch_all::<Configuration>(&self.client, self.legacy.is_some());
        let property_changes = self.discovery.property_changes();
        let mut resync = tokio::time::interval(self.resync);
        // The DRA sink vouches for its devices' health this often, without a pass.
        let mut vouch = tokio::time::interval(dra_plugin::health::RESEND_INTERVAL);
        // Standing by, a pass every second notices the kubelet taking this pod's plugins.
        let mut standing_by = tokio::time::interval(Duration::from_secs(1));
        let startup_deadline = tokio::time::sleep(self.startup_wait);
        tokio::pin!(startup_deadline);
        // A finished sleep is ready again at once: poll it only until it has fired.
        let mut waited = false;
        let mut failing = BTreeSet::new();
        loop {
            tokio::select! {
                // A failing watch retries by itself, with backoff; a pass now would only fail
                // its writes too (the resync retries them), so the outage costs no work.
                Some(event) = v1_changes.next() => if !self.on_watch(Sink::Dra, event, &mut failing) {
                    continue;
                },
                Some(event) = v0_changes.next() => if !self.on_watch(Sink::Legacy, event, &mut failing) {
                    continue;
                },
                _ = &mut startup_deadline, if !waited => waited = true,
                () = property_changes.notified() => {}
                changed = handlers.changed() => if changed.is_err() { return },
                Some(event) = events.recv() => {
                    self.on_stream_event(event);
                    // Take every report already waiting before publishing.
                    while let Ok(event) = events.try_recv() {
                        self.on_stream_event(event);
                    }
                }
                _ = resync.tick() => if let Some(dra) = &mut self.dra { dra.resync() },
                _ = &mut stop => {
                    // A clean stop: the kubelet is told first, and calls under way (it may
                    // have sent one just before) are answered; then everything goes, the
                    // node's lock last.
                    if let Some(dra) = &mut self.dra {
                        dra.deregister();
                        tokio::time::sleep(STOP_DRAIN).await;
                    }
                    return;
                }
                led = &mut takeover, if self.leader.is_none() => match led {
                    Ok(leader) => {
                        tracing::info!("the kubelet-plugin that led this node exited; leading now");
                        self.leader = Some(leader);
                        if let Some(legacy) = &mut self.legacy {
                            legacy.lead();
                        }
                    }
                    Err(error) => {
                        tracing::error!(%error, "taking the lead failed; exiting");
                        return;
                    }
                },
                _ = vouch.tick() => {
                    if let Some(dra) = &mut self.dra {
                        dra.vouch(self.discovery.answering(Sink::Dra));
                    }
                    continue;
                }
                _ = standing_by.tick(), if self.leader.is_none() => {}
                needed = wake(self.dra.as_mut()) => if !needed {
                    continue;
                },
            }
            self.metrics.passed();
            let mut wanted: Vec<Wanted> =
                (v1.state().iter().filter_map(|c| Wanted::of_v1(c))).collect();
            let leading = self.leader.is_some();
            let (served_v0, held) = match &self.legacy {
                Some(legacy) => {
                    let served = same_name::served_v0(&v0.state(), &legacy.namespaces, &wanted);
                    if served.refused != self.refused_v0 {
                        for (config, why) in &served.refused {
                            tracing::warn!(configuration = %config, %why, "v0 Configuration not served");
                        }
                        self.refused_v0 = served.refused;
                    }
                    let v0_names: Vec<(String, String)> = (served.configs.iter())
                        .filter_map(|c| {
                            Some((c.metadata.namespace.clone()?, c.metadata.name.clone()?))
                        })
                        .collect();
                    let instances = legacy.instances_by_configuration();
                    let held =
                        same_name::held_back(&wanted, &v0_names, &legacy.namespaces, &instances);
                    (served.configs, held)
                }
                None => Default::default(),
            };
            wanted.extend(served_v0.iter().filter_map(|c| Wanted::of_v0(c)));
            wanted.retain(|w| w.sink != Sink::Dra || !held.contains_key(&w.name));
            let registered = handlers.borrow().clone();
            for (sink, group) in self.discovery.sync(&wanted, &registered).await {
                self.changed(sink, group);
            }
            self.discovery.errors.held_back = held;
            let mut starting = false;
            let mut waiting_for_kubelet = false;
            let mut problem = None;
            if let Some(dra) = &mut self.dra {
                dra.serve(&registered).await;
                dra.vouch(self.discovery.answering(Sink::Dra));
                if !leading {
                    // Standing by: the kubelet may call these drivers already; the leading
                    // agent writes everything else.
                    problem = dra.registration_problem();
                    waiting_for_kubelet = !dra.all_registered();
                } else if self.discovery.open(Sink::Dra, &wanted, &registered) {
                    // Keep what the previous process published until discovery has answered.
                    problem = dra.registration_problem();
                    dra.publish().await;
                } else {
                    starting = true;
                }
                if leading {
                    // After the publish, so that an Instance it could not write shows now.
                    let errors = &mut self.discovery.errors;
                    errors.instances = dra.refused_instances().clone();
                    errors.report(&self.client, &self.node_name).await;
                    self.metrics.set_discovery_errors(errors.failing());
                }
            }
            if let Some(legacy) = &mut self.legacy {
                if !self.discovery.open(Sink::Legacy, &wanted, &registered) {
                    starting = true;
                } else {
                    let devices = self.discovery.devices(Sink::Legacy);
                    if leading {
                        legacy.release_akri_finalizers(&v0.state()).await;
                        legacy.publish(&served_v0, &devices).await;
                    } else {
                        legacy.serve(&served_v0, &devices).await;
                        waiting_for_kubelet |= !legacy.all_registered();
                    }
                }
            }
            match problem {
                _ if starting => self
                    .readiness
                    .not_ready("starting: waiting for the discovery handlers to report"),
                None if waiting_for_kubelet => self
                    .readiness
                    .not_ready("standing by: waiting for the kubelet to take this pod's plugins"),
                Some(problem) => self.readiness.not_ready(problem),
                None if failing.is_empty() => self.readiness.ready(),
                None => {}
            }
        }
    }

    /// Takes a watch event of `sink`'s configurations; returns whether a pass should follow.
    fn on_watch(&mut self, sink: Sink, event: WatchEvent, failing: &mut BTreeSet<Sink>) -> bool {
        match event {
            WatchEvent::Failed => {
                failing.insert(sink);
                self.readiness.not_ready(match sink {
                    Sink::Dra => "cannot watch DiscoveryConfigurations (the API server is unreachable or refuses)",
                    Sink::Legacy => "cannot watch Configurations (the API server is unreachable or refuses)",
                });
                return false;
            }
            WatchEvent::Listed => self.discovery.listed(sink),
            WatchEvent::Changed => {}
        }
        failing.remove(&sink);
        true
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

/// The DRA sink's next wake-up, or never; whether a pass should follow.
async fn wake(dra: Option<&mut DraSink>) -> bool {
    match dra {
        Some(dra) => dra.wake().await,
        None => std::future::pending().await,
    }
}
