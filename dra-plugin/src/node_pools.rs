//! The pools of one driver on one node, kept as the driver last asked: every slice of the
//! driver on the node belongs to a wanted pool, and each wanted pool holds exactly its devices.
//!
//! [`NodePools::publish`] writes what differs now. A background task watches the driver's
//! slices on the node and, after each burst of changes, does the same again: a slice edited or
//! deleted behind the plugin's back (the kubelet's DRA manager deletes a node's slices when it
//! restarts) is written again as a new generation, and a pool nobody wants any more (one a
//! previous process published, say) is deleted. Each pass reads what is stored with one LIST
//! (a consistent read) and remembers the resourceVersion of every slice it leaves, so the
//! events of its own writes (each slice as the pass left it, or gone because it deleted it)
//! cost nothing: no list, no pass. While that watch runs, a publish of exactly what the last
//! pass published, which left the slices as they still are, reads and writes nothing: a
//! driver may publish on every resync at no cost to the API server.

use crate::background::{BackgroundError, Errors};
use crate::slices::{Error, PoolScope, Published, SlicePublisher};
use k8s_openapi::api::resource::v1::{Device, ResourceSlice};
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use std::collections::BTreeMap;
use std::sync::{Arc, Weak};

/// The pools of one driver on one node. See the module docs.
pub struct NodePools {
    api: Api<ResourceSlice>,
    client: kube::Client,
    driver: String,
    node: String,
    node_uid: String,
    field_manager: String,
    /// One pass at a time (the driver's and the repairs'), so they never race to new
    /// generations.
    state: tokio::sync::Mutex<State>,
    /// Whether the repair watch runs: only then does an unchanged publish trust `State::left`.
    repairing: std::sync::atomic::AtomicBool,
    /// What the repair watch has looked at so far.
    repairs: tokio::sync::watch::Sender<Repairs>,
}

/// What the slice repair has looked at since the plugin started ([`NodePools::repairs`]):
/// bursts of events on the node's slices of this driver, and how many of them were only the
/// plugin's own writes (nothing read, nothing written). The others were someone else's edit
/// or deletion (a restarting kubelet deletes them all), or the watch's list: the pools were
/// read again and repaired where they differ. A driver may count them (a metric of how often
/// its slices are changed behind its back).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Repairs {
    /// Bursts of events judged (a burst ends after half a second without an event), the
    /// repair done where one was needed.
    pub bursts: u64,
    /// Of those, the ones that were all the plugin's own writes.
    pub own: u64,
}

#[derive(Default)]
struct State {
    /// One per pool ever written: each remembers its last generation.
    publishers: BTreeMap<String, SlicePublisher>,
    /// What the driver last asked for, by pool, as JSON: only a repair reads it back, and a
    /// `Device` with its maps takes kilobytes as a struct (JSON, a tenth). `None` before the
    /// driver's first publish (nothing is touched).
    wanted: Option<BTreeMap<String, Box<str>>>,
    /// The node's slices of this driver as the last pass left them: name to resourceVersion.
    /// `None` before the first pass and after a failed one.
    left: Option<BTreeMap<String, String>>,
    /// What the last pass did per wanted pool, its generation being what is current.
    last: BTreeMap<String, Published>,
}

/// How long the repair waits after a slice event for more of them: a publish of several
/// slices, or the kubelet deleting them all, is one burst.
const REPAIR_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

impl NodePools {
    pub(crate) fn new(
        client: kube::Client,
        driver: &str,
        node: &str,
        node_uid: &str,
        field_manager: &str,
    ) -> Self {
        NodePools {
            api: Api::all(client.clone()),
            client,
            driver: driver.to_string(),
            node: node.to_string(),
            node_uid: node_uid.to_string(),
            field_manager: field_manager.to_string(),
            state: tokio::sync::Mutex::default(),
            repairing: false.into(),
            repairs: tokio::sync::watch::Sender::default(),
        }
    }

    /// What the repair watch has looked at so far, changing after each burst it judged
    /// (never, unless [`Builder::repair_slices`](crate::Builder::repair_slices) is on).
    pub fn repairs(&self) -> tokio::sync::watch::Receiver<Repairs> {
        self.repairs.subscribe()
    }

    /// Makes the node's pools of this driver exactly `pools` (pool name to devices): each
    /// pool that differs gets a new generation, pools not named are deleted, nothing is
    /// written for what is already so. What each named pool's publish did, by pool.
    pub async fn publish(
        &self,
        pools: BTreeMap<String, Vec<Device>>,
    ) -> Result<BTreeMap<String, Published>, Error> {
        let mut state = self.state.lock().await;
        let wanted: BTreeMap<String, Box<str>> = pools
            .iter()
            .map(|(pool, devices)| (pool.clone(), crate::slices::to_json(devices)))
            .collect();
        let repairing = self.repairing.load(std::sync::atomic::Ordering::Relaxed);
        if repairing && state.left.is_some() && state.wanted.as_ref() == Some(&wanted) {
            // As the last pass left it, or the repair watch has seen otherwise and repairs.
            return Ok((state.last.iter())
                .map(|(pool, last)| {
                    let generation = last.generation;
                    (
                        pool.clone(),
                        Published {
                            generation,
                            ..Published::default()
                        },
                    )
                })
                .collect());
        }
        state.wanted = Some(wanted);
        self.sync(&mut state, &pools).await
    }

    /// The stored slices of one of the node's pools of this driver.
    pub async fn stored(&self, pool: &str) -> Result<Vec<ResourceSlice>, Error> {
        let mut stored = self.list().await?;
        Ok(stored.remove(pool).unwrap_or_default())
    }

    /// Every stored slice of this driver on this node, by pool.
    async fn list(&self) -> Result<BTreeMap<String, Vec<ResourceSlice>>, Error> {
        let fields = format!("spec.driver={},spec.nodeName={}", self.driver, self.node);
        let listed = self
            .api
            .list(&ListParams::default().fields(&fields))
            .await
            .map_err(|source| Error::List {
                pool: format!("(every pool of {} on {})", self.driver, self.node),
                cause: source,
            })?;
        let mut by_pool: BTreeMap<String, Vec<ResourceSlice>> = BTreeMap::new();
        for slice in listed.items {
            by_pool
                .entry(slice.spec.pool.name.clone())
                .or_default()
                .push(slice);
        }
        Ok(by_pool)
    }

    /// Makes the stored pools `wanted`.
    async fn sync(
        &self,
        state: &mut State,
        wanted: &BTreeMap<String, Vec<Device>>,
    ) -> Result<BTreeMap<String, Published>, Error> {
        state.left = None;
        let mut stored = self.list().await?;
        let mut left: BTreeMap<String, String> = (stored.values().flatten())
            .filter_map(|s| {
                Some((
                    s.metadata.name.clone()?,
                    s.metadata.resource_version.clone()?,
                ))
            })
            .collect();
        // The wanted pools, then what is left: no pool the driver wants, so gone.
        let unwanted: Vec<String> = (stored.keys())
            .filter(|pool| !wanted.contains_key(*pool))
            .cloned()
            .collect();
        let passes = (wanted
            .iter()
            .map(|(pool, devices)| (pool, devices.as_slice())))
        .chain(unwanted.iter().map(|pool| (pool, &[][..])));
        let mut published = BTreeMap::new();
        for (pool, devices) in passes {
            let existing = stored.remove(pool).unwrap_or_default();
            let outcome = self
                .publisher(state, pool)
                .publish_tracked(devices, &existing)
                .await?;
            left.extend(outcome.written);
            for name in outcome.deleted {
                left.remove(&name);
            }
            if wanted.contains_key(pool) {
                published.insert(pool.clone(), outcome.published);
            }
        }
        state.left = Some(left);
        state.last = published.clone();
        Ok(published)
    }

    fn publisher<'a>(&self, state: &'a mut State, pool: &str) -> &'a SlicePublisher {
        state.publishers.entry(pool.to_string()).or_insert_with(|| {
            SlicePublisher::new(
                self.client.clone(),
                &self.driver,
                pool,
                PoolScope::Node {
                    name: self.node.clone(),
                    uid: self.node_uid.clone(),
                },
                &self.field_manager,
            )
        })
    }

    /// Watches this driver's slices on this node and syncs after each burst of changes, until
    /// the pools are dropped.
    pub(crate) fn spawn_repair(
        pools: &Arc<NodePools>,
        errors: Errors,
    ) -> tokio::task::JoinHandle<()> {
        let fields = format!("spec.driver={},spec.nodeName={}", pools.driver, pools.node);
        let api = Api::<PartialObjectMeta<ResourceSlice>>::all(pools.client.clone());
        (pools.repairing).store(true, std::sync::atomic::Ordering::Relaxed);
        tokio::spawn(repair(api, fields, Arc::downgrade(pools), errors))
    }
}

async fn repair(
    api: Api<PartialObjectMeta<ResourceSlice>>,
    fields: String,
    pools: Weak<NodePools>,
    errors: Errors,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    // Only that something changed matters: metadata, not the devices (less to decode and to
    // keep; the pass lists what it needs).
    let events = watcher(api, watcher::Config::default().fields(&fields)).default_backoff();
    futures::pin_mut!(events);
    let mut seen = Seen::default();
    while let Some(event) = events.next().await {
        // The watcher retries failures with backoff, listing again: nothing to do here.
        let Ok(event) = event else { continue };
        seen.note(event);
        // The rest of the burst.
        while let Ok(Some(event)) = tokio::time::timeout(REPAIR_SETTLE, events.next()).await {
            if let Ok(event) = event {
                seen.note(event);
            }
        }
        let Some(pools) = pools.upgrade() else {
            return;
        };
        let mut state = pools.state.lock().await;
        let own = seen.take_all_left_by(state.left.as_ref());
        if !own {
            repair_burst(&pools, &mut state, &errors).await;
        }
        drop(state);
        pools.repairs.send_modify(|repairs| {
            repairs.bursts += 1;
            repairs.own += u64::from(own);
        });
    }
}

/// Makes the stored pools what the driver last asked for (nothing before it asked).
async fn repair_burst(pools: &NodePools, state: &mut State, errors: &Errors) {
    let Some(wanted) = state.wanted.as_ref().map(|wanted| {
        wanted
            .iter()
            .map(|(pool, devices)| {
                (
                    pool.clone(),
                    serde_json::from_str(devices).unwrap_or_default(),
                )
            })
            .collect::<BTreeMap<String, Vec<Device>>>()
    }) else {
        return;
    };
    match pools.sync(state, &wanted).await {
        Ok(published) => {
            for (pool, done) in published {
                if done.written + done.deleted > 0 {
                    tracing::info!(%pool, generation = done.generation, written = done.written, deleted = done.deleted, "repaired the pool's slices");
                }
            }
        }
        Err(error) => {
            tracing::warn!(%error, "repairing the node's slices failed; retrying on the next change");
            errors.report(BackgroundError::SliceRepair(error.to_string()));
        }
    }
}

/// The repair watch's events since it last looked: what each slice became.
#[derive(Default)]
struct Seen {
    /// Slice name to its resourceVersion now, `None` once deleted.
    slices: BTreeMap<String, Option<String>>,
    /// The watch listed everything again after its first list: a slice deleted meanwhile
    /// sent no event.
    relisted: bool,
    listed_once: bool,
}

impl Seen {
    fn note(&mut self, event: kube::runtime::watcher::Event<PartialObjectMeta<ResourceSlice>>) {
        use kube::runtime::watcher::Event;
        let (object, version) = match event {
            Event::Apply(object) | Event::InitApply(object) => {
                let version = object.metadata.resource_version.clone();
                (object, version)
            }
            Event::Delete(object) => (object, None),
            Event::Init => {
                self.relisted |= self.listed_once;
                return;
            }
            Event::InitDone => {
                self.listed_once = true;
                return;
            }
        };
        if let Some(name) = object.metadata.name {
            self.slices.insert(name, version);
        }
    }

    /// Whether every slice seen is as the last pass left it (`left`): all that pass's own
    /// doing. Forgets what it has seen either way.
    fn take_all_left_by(&mut self, left: Option<&BTreeMap<String, String>>) -> bool {
        let seen = std::mem::take(&mut self.slices);
        let relisted = std::mem::take(&mut self.relisted);
        let Some(left) = left else { return false };
        !relisted && (seen.iter()).all(|(name, version)| left.get(name) == version.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use kube::core::PartialObjectMetaExt;
    use kube::runtime::watcher::Event;

    fn slice(name: &str, version: &str) -> PartialObjectMeta<ResourceSlice> {
        ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        }
        .into_response_partial()
    }

    #[test]
    fn only_events_of_slices_as_the_last_pass_left_them_are_its_own() {
        let left = BTreeMap::from([("s0".to_string(), "7".to_string())]);
        let mut seen = Seen::default();
        // The first list, the pass's write of s0 and its deletion of s1.
        for event in [
            Event::Init,
            Event::InitApply(slice("s0", "5")),
            Event::InitApply(slice("s1", "5")),
            Event::InitDone,
            Event::Apply(slice("s0", "7")),
            Event::Delete(slice("s1", "6")),
        ] {
            seen.note(event);
        }
        assert!(seen.take_all_left_by(Some(&left)));
        // Before any pass, everything is worth a look.
        seen.note(Event::Apply(slice("s0", "7")));
        assert!(!seen.take_all_left_by(None));
        // Someone else's edit, or deletion, of a slice the pass left.
        seen.note(Event::Apply(slice("s0", "8")));
        assert!(!seen.take_all_left_by(Some(&left)));
        seen.note(Event::Delete(slice("s0", "8")));
        assert!(!seen.take_all_left_by(Some(&left)));
        // A new list after the first: a deletion meanwhile sent no event.
        for event in [
            Event::Init,
            Event::InitApply(slice("s0", "7")),
            Event::InitDone,
        ] {
            seen.note(event);
        }
        assert!(!seen.take_all_left_by(Some(&left)));
        // And what was seen is forgotten once looked at.
        assert!(seen.take_all_left_by(Some(&left)));
    }
}
