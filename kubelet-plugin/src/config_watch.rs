//! The configuration watches of the node loop: v0 Configurations as they are (nothing writes
//! their status), DiscoveryConfigurations through the driver-controller's mirrors of their
//! specs ([`akri_api::v1::spec_mirror`]), so that a node hears of no status write.

use akri_api::v1::spec_mirror::{MIRRORED_MARKER, SPEC_MIRROR_LABEL};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::fmt::Debug;

/// What a configuration watch said, as far as the loop cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatchEvent {
    Changed,
    /// The first list is complete.
    Listed,
    Failed,
}

/// A store of every `K` kept by a watch, and the watch's events; with `enabled` false, an
/// empty store and no events.
pub(crate) fn watch_all<K>(
    client: &kube::Client,
    enabled: bool,
) -> (Store<K>, BoxStream<'static, WatchEvent>)
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

/// A store of the DiscoveryConfigurations' mirrors in `namespace` (and the marker) and the
/// watch's events; with `enabled` false, an empty store and no events. The configurations
/// count as listed only once the marker is there: before, the driver-controller has not
/// mirrored them all (a node upgraded before it keeps what it serves).
pub(crate) fn watch_mirrors(
    client: &kube::Client,
    namespace: &str,
    enabled: bool,
) -> (Store<ConfigMap>, BoxStream<'static, WatchEvent>) {
    let (store, writer) = kube::runtime::reflector::store();
    if !enabled {
        return (store, futures::stream::pending().boxed());
    }
    let reader = store.clone();
    let marked = move || (reader.state().iter()).any(|cm| cm.name_any() == MIRRORED_MARKER);
    let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().labels(SPEC_MIRROR_LABEL);
    let events = kube::runtime::reflector(writer, watcher(api, config).default_backoff())
        .filter_map(move |event| {
            let event = match event {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Ok(watcher::Event::InitDone) if marked() => Some(WatchEvent::Listed),
                Ok(watcher::Event::Apply(cm)) if cm.name_any() == MIRRORED_MARKER => {
                    Some(WatchEvent::Listed)
                }
                Ok(_) => Some(WatchEvent::Changed),
                Err(_) => Some(WatchEvent::Failed),
            };
            std::future::ready(event)
        });
    (store, events.boxed())
}
