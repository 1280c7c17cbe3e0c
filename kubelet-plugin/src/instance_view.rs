//! The node's view of its Instances (of one path, in one namespace): what a watch of those
//! labelled with its node's name says, what its own writes returned, and those written before
//! nodes labelled theirs that it adopted. The Instance writer plans from it; on the legacy
//! path the device plugins are fed from it too, so a namespace has one watch per node.

use akri_api::v0::Instance;
use akri_api::v1::{instance_node_label, instance_source_selector};
use akri_legacy_device_plugin::plugins::InstanceFeed;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The Instances (of one source, in one namespace) whose `nodes` name this node, as the API
/// server has them: what a watch of this node's Instances said ([`instance_node_label`]), and
/// what this node's own writes returned (so the next pass does not wait for their events).
#[derive(Default)]
pub(crate) struct Mine {
    /// `None` until the watch's first list is complete (a pass then lists for itself).
    pub instances: Option<BTreeMap<String, Instance>>,
    /// The watch's list in progress.
    listing: BTreeMap<String, Instance>,
    /// Instances naming this node that were written before nodes labelled theirs: no watch of
    /// the label sees them. Read once (`None` until then), each left here until this node
    /// writes it (with its label) or deletes it.
    pub adopted: Option<BTreeMap<String, Instance>>,
    /// The legacy device plugins of the node, fed every change (the legacy path's writers):
    /// the one view of a namespace's Instances on the node, with its namespace.
    feed: Option<(String, InstanceFeed)>,
}

impl Mine {
    pub(crate) fn new(feed: Option<(String, InstanceFeed)>) -> Self {
        Mine {
            feed,
            ..Mine::default()
        }
    }

    /// Takes a watch event, and feeds the device plugins what is stored then.
    pub(crate) fn note(&mut self, node: &str, event: watcher::Event<Instance>) {
        self.take(node, event);
        self.fed();
    }

    /// What the device plugins are fed: the watched Instances and the adopted ones, once the
    /// watch listed.
    pub(crate) fn fed(&self) {
        let (Some((namespace, feed)), Some(instances)) = (&self.feed, &self.instances) else {
            return;
        };
        let adopted = self.adopted.iter().flatten();
        let all = (adopted.chain(instances)).map(|(_, i)| i.clone());
        feed.replace(namespace, all);
    }

    fn take(&mut self, node: &str, event: watcher::Event<Instance>) {
        match event {
            watcher::Event::Init => self.listing.clear(),
            watcher::Event::InitApply(instance) => {
                if names(&instance, node) {
                    let name = instance.metadata.name.clone().unwrap_or_default();
                    self.listing.insert(name, instance);
                }
            }
            watcher::Event::InitDone => {
                self.instances = Some(std::mem::take(&mut self.listing));
            }
            watcher::Event::Apply(instance) => self.keep(node, instance),
            // An Instance that no longer names this node leaves the watch of its label too.
            watcher::Event::Delete(instance) => {
                if let Some(name) = &instance.metadata.name {
                    self.remove(name);
                }
            }
        }
    }

    /// `instance` as it is stored now (from an event or a write's response).
    pub(crate) fn stored(&mut self, node: &str, instance: Instance) {
        self.keep(node, instance);
        self.fed();
    }

    fn keep(&mut self, node: &str, instance: Instance) {
        let Some(name) = instance.metadata.name.clone() else {
            return;
        };
        if let Some(adopted) = &mut self.adopted {
            adopted.remove(&name);
        }
        let Some(mine) = &mut self.instances else {
            return;
        };
        match names(&instance, node) {
            true => mine.insert(name, instance),
            false => mine.remove(&name),
        };
    }

    /// `name` was deleted by this node.
    pub(crate) fn deleted(&mut self, name: &str) {
        self.remove(name);
        self.fed();
    }

    fn remove(&mut self, name: &str) {
        for held in [&mut self.instances, &mut self.adopted]
            .into_iter()
            .flatten()
        {
            held.remove(name);
        }
    }
}

/// Whether `instance` names `node` in its `nodes`.
pub(crate) fn names(instance: &Instance, node: &str) -> bool {
    instance.spec.nodes.iter().any(|n| n == node)
}

/// The label selector of `node`'s Instances of path `source`: by its node label; a node whose
/// name is too long for one watches the path's Instances of the namespace.
pub(crate) fn mine_selector(source: &str, node: &str) -> String {
    let path = instance_source_selector(source);
    match instance_node_label(node) {
        Some(label) => format!("{path},{label}"),
        None => path,
    }
}

/// Keeps `mine` as the watch of `api`'s Instances labelled `selector` says.
pub(crate) async fn watch_mine(
    api: Api<Instance>,
    selector: String,
    node: String,
    mine: Arc<Mutex<Mine>>,
) {
    // The watcher retries failures itself, with backoff, and resumes where it was.
    let events = watcher(api, watcher::Config::default().labels(&selector)).default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        if let Ok(event) = event {
            mine.lock().expect("not poisoned").note(&node, event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance_plan::tests::instance;

    fn named(name: &str, nodes: &[&str]) -> Instance {
        let mut i = instance(nodes, None);
        i.metadata.name = Some(name.into());
        i
    }

    fn names(mine: &Mine) -> Vec<String> {
        mine.instances
            .iter()
            .flatten()
            .map(|(n, _)| n.clone())
            .collect()
    }

    #[test]
    fn the_watch_keeps_exactly_the_instances_that_name_this_node() {
        use watcher::Event;
        let mut mine = Mine::default();
        mine.note("a", Event::Init);
        mine.note("a", Event::InitApply(named("x", &["a", "b"])));
        mine.note("a", Event::InitApply(named("y", &["b"])));
        assert!(mine.instances.is_none(), "not complete before the list is");
        mine.note("a", Event::InitDone);
        assert_eq!(names(&mine), ["x"], "another node's Instance is not kept");
        mine.note("a", Event::Apply(named("y", &["b", "a"])));
        mine.note("a", Event::Apply(named("x", &["b"])));
        assert_eq!(names(&mine), ["y"], "joined y, left x");
        mine.note("a", Event::Delete(named("y", &["b", "a"])));
        assert!(names(&mine).is_empty());
        // A new list (the watch lost its place) replaces everything once complete.
        mine.stored("a", named("z", &["a"]));
        mine.note("a", Event::Init);
        mine.note("a", Event::InitApply(named("w", &["a"])));
        assert_eq!(
            names(&mine),
            ["z"],
            "the old state serves until the list is complete"
        );
        mine.note("a", Event::InitDone);
        assert_eq!(names(&mine), ["w"]);
        mine.deleted("w");
        assert!(names(&mine).is_empty());
    }
}
