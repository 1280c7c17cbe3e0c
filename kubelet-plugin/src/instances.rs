//! Instances: one per discovered device, written with server-side apply under a field manager
//! per node, so that nodes sharing a device each own their own entry of `nodes` and never
//! overwrite each other. The DRA path leaves `deviceUsage` empty; the legacy path has its
//! slots, which the node that creates them adds once (`""`, free) and the device plugins
//! claim ([`akri_legacy_device_plugin::claims`]); applies never touch them.
//!
//! What is stored comes from a watch ([`crate::instance_view`]), not a read per pass: a node at rest makes no
//! requests for its Instances beyond that watch, however many Instances the cluster has.

use crate::instance_plan::{self, Departure, Grace, Seen, Step};
use crate::instance_view::{Mine, mine_selector, names, watch_mine};
use akri_api::v0::Instance;
use akri_api::v1::{
    INSTANCE_NODES_LABELLED, INSTANCE_SOURCE_CONFIGURATION,
    INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, instance_source_selector,
};
use akri_legacy_device_plugin::plugins::InstanceFeed;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Writes this node's Instances.
pub struct InstanceWriter {
    api: Api<Instance>,
    node: String,
    field_manager: String,
    grace: Grace,
    /// The most Instances this node keeps of one configuration ([`Step::Limited`]).
    max_per_configuration: usize,
    /// [`INSTANCE_SOURCE_LABEL`]'s value: which path the Instances belong to.
    source: &'static str,
    /// Whether the Instances have `deviceUsage` slots (the legacy path).
    slots: bool,
    /// Instances this node stopped seeing, and since when: removed after `grace`, so a
    /// flapping device does not churn Instances (and brokers).
    vanished: BTreeMap<String, Instant>,
    /// The stored Instances that name this node, kept by a watch.
    mine: Arc<Mutex<Mine>>,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for InstanceWriter {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl InstanceWriter {
    /// The writer of the DRA path. Starts watching the namespace's Instances of that path.
    pub fn new(client: kube::Client, namespace: &str, node: &str, grace: Grace) -> Self {
        Self::of_source(
            client,
            namespace,
            node,
            grace,
            INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
            None,
        )
    }

    /// The writer of the legacy path: Instances of v0 Configurations in `namespace` (theirs),
    /// with `deviceUsage` slots. Its watch of them is the node's one view of the namespace's
    /// Instances: the device plugins are fed from it (`feed`).
    pub fn legacy(
        client: kube::Client,
        namespace: &str,
        node: &str,
        grace: Grace,
        feed: InstanceFeed,
    ) -> Self {
        Self::of_source(
            client,
            namespace,
            node,
            grace,
            INSTANCE_SOURCE_CONFIGURATION,
            Some((namespace.to_string(), feed)),
        )
    }

    fn of_source(
        client: kube::Client,
        namespace: &str,
        node: &str,
        grace: Grace,
        source: &'static str,
        feed: Option<(String, InstanceFeed)>,
    ) -> Self {
        let api = Api::namespaced(client, namespace);
        let mine = Arc::new(Mutex::new(Mine::new(feed)));
        let watch = tokio::spawn(watch_mine(
            api.clone(),
            mine_selector(source, node),
            node.to_string(),
            mine.clone(),
        ));
        InstanceWriter {
            api,
            node: node.to_string(),
            field_manager: akri_devices::node_field_manager(node),
            grace,
            max_per_configuration: instance_plan::MAX_INSTANCES_PER_CONFIGURATION,
            source,
            slots: source == INSTANCE_SOURCE_CONFIGURATION,
            vanished: BTreeMap::new(),
            mine,
            watch,
        }
    }

    /// Keeps at most `max` Instances of one configuration on this node (default
    /// [`instance_plan::MAX_INSTANCES_PER_CONFIGURATION`]).
    pub fn limit(mut self, max: usize) -> Self {
        self.max_per_configuration = max;
        self
    }

    /// The stored Instances that name this node: from the watch, or (before its first list is
    /// complete) read now; with those written before nodes labelled theirs (read once).
    async fn stored_mine(&self) -> Result<BTreeMap<String, Instance>, kube::Error> {
        if self.mine.lock().expect("not poisoned").adopted.is_none() {
            let unlabelled = format!(
                "{},!{INSTANCE_NODES_LABELLED}",
                instance_source_selector(self.source)
            );
            let adopted = self.list(&unlabelled).await?;
            if !adopted.is_empty() {
                tracing::info!(
                    count = adopted.len(),
                    "adopted Instances written before nodes labelled theirs"
                );
            }
            let mut mine = self.mine.lock().expect("not poisoned");
            mine.adopted = Some(adopted);
            mine.fed();
        }
        let watched = self.mine.lock().expect("not poisoned").instances.clone();
        let mut all = match watched {
            Some(watched) => watched,
            None => self.list(&mine_selector(self.source, &self.node)).await?,
        };
        let mine = self.mine.lock().expect("not poisoned");
        for (name, instance) in mine.adopted.iter().flatten() {
            all.entry(name.clone()).or_insert_with(|| instance.clone());
        }
        Ok(all)
    }

    /// The Instances labelled as `selector` says that name this node, read now.
    async fn list(&self, selector: &str) -> Result<BTreeMap<String, Instance>, kube::Error> {
        let listed =
            crate::api_call(self.api.list(&ListParams::default().labels(selector))).await?;
        Ok(listed
            .items
            .into_iter()
            .filter(|i| names(i, &self.node))
            .map(|i| (i.metadata.name.clone().unwrap_or_default(), i))
            .collect())
    }

    /// Remembers what a write of this node returned.
    fn wrote(&self, instance: &Instance) {
        (self.mine.lock().expect("not poisoned")).stored(&self.node, instance.clone());
    }

    /// The stored Instances that name this node (from the watch), what a plan of this
    /// writer's writes starts from: an Instance that already says what this node would apply
    /// is not written again, so a node at rest makes no writes.
    pub async fn stored(&self) -> Result<BTreeMap<String, Instance>, kube::Error> {
        self.stored_mine().await
    }

    /// How this writer writes, for [`crate::device_plan`], and its memory: the Instances this
    /// node stopped seeing, and since when. `live`, where known, are the configurations that
    /// exist: Instances of others depart at once.
    pub fn planner<'a>(
        &'a mut self,
        live: Option<&'a BTreeSet<String>>,
    ) -> (instance_plan::Writer<'a>, &'a mut BTreeMap<String, Instant>) {
        let writer = instance_plan::Writer {
            node: &self.node,
            source: self.source,
            grace: self.grace,
            live,
            max_per_configuration: self.max_per_configuration,
        };
        (writer, &mut self.vanished)
    }

    /// Applies `plan` (made from `stored`): the Instances of the devices this node sees (with
    /// this node in `nodes`), and this node taken out of those it no longer sees once their
    /// grace passed; the last node deletes the Instance.
    ///
    /// An Instance the API server refuses (say, a property too large for a request) is
    /// reported in [`Synced::refused`] and the other writes go on; only an error that is not
    /// the API server's answer (it cannot be reached) ends the apply.
    pub async fn apply(
        &mut self,
        plan: instance_plan::Plan,
        stored: &BTreeMap<String, Instance>,
    ) -> Result<Synced, kube::Error> {
        let mut synced = Synced::default();
        for step in plan.steps {
            self.take_step(step, &mut synced).await?;
        }
        for departure in plan.departures {
            let (name, result) = self.depart(departure).await;
            if let (Err(error), Some(instance)) = (result, stored.get(&name)) {
                Refusals(&mut synced.refused).note(instance, error)?;
            }
        }
        Ok(synced)
    }

    /// Plans from what is stored and applies: [`stored`](Self::stored), the plan of the
    /// devices `known`, [`apply`](Self::apply).
    pub async fn sync(
        &mut self,
        known: &[Seen],
        live: Option<&BTreeSet<String>>,
    ) -> Result<Synced, kube::Error> {
        let stored = self.stored().await?;
        let (writer, vanished) = self.planner(live);
        let plan = writer.plan(known, &stored, vanished, Instant::now());
        self.apply(plan, &stored).await
    }

    /// Takes one step of a plan, noting in `synced` what it found; an error that is not the
    /// API server's answer is returned.
    async fn take_step(&mut self, step: Step, synced: &mut Synced) -> Result<(), kube::Error> {
        let params = PatchParams::apply(&self.field_manager).force();
        let unforced = PatchParams::apply(&self.field_manager);
        let contested = &mut synced.contested;
        let mut refused = Refusals(&mut synced.refused);
        let current = match step {
            Step::Unchanged(current) => current,
            Step::Limited {
                configuration,
                kept,
            } => {
                let why = format!(
                    "this node keeps {kept} Instances of the configuration, the most it keeps of one; devices new to it are left out until some go (a handler reporting new device ids on every scan?)"
                );
                if refused.0.insert(configuration.clone(), why).is_none() {
                    tracing::warn!(%configuration, kept, "Instance limit reached; new devices left out");
                }
                return Ok(());
            }
            Step::Apply {
                instance,
                unforced: first,
            } => {
                let name = instance.metadata.name.clone().unwrap_or_default();
                let params = if first { &unforced } else { &params };
                let patch = Patch::Apply(&instance);
                match crate::api_call(self.api.patch(&name, params, &patch)).await {
                    Ok(applied) => {
                        self.wrote(&applied);
                        applied
                    }
                    Err(kube::Error::Api(status)) if first && status.code == 409 => {
                        contested.push(name);
                        return Ok(());
                    }
                    // The admission policy refuses a node's entry in another node's unshared
                    // Instance (the chart's): read whose it is.
                    Err(kube::Error::Api(status)) if first && status.code == 403 => {
                        let stored = crate::api_call(self.api.get_opt(&name)).await?;
                        if stored.is_some_and(|i| !i.spec.shared && !names(&i, &self.node)) {
                            contested.push(name);
                            return Ok(());
                        }
                        return refused.note(&instance, kube::Error::Api(status));
                    }
                    Err(error) => return refused.note(&instance, error),
                }
            }
        };
        let name = current.metadata.name.clone().unwrap_or_default();
        // Both wrote it before either saw the other's, or no admission policy stopped this
        // node joining another's: the first in `nodes` keeps it.
        if !current.spec.shared && current.spec.nodes.first().is_some_and(|n| *n != self.node) {
            return match self.give_up(&name, &params).await {
                Ok(()) => {
                    contested.push(name);
                    Ok(())
                }
                Err(error) => refused.note(&current, error),
            };
        }
        if self.slots
            && let Err(error) = self.complete(&current).await
        {
            refused.note(&current, error)?;
        }
        Ok(())
    }

    /// Deletes an Instance no node sees any more, or takes this node out of one.
    async fn depart(&mut self, departure: Departure) -> (String, Result<(), kube::Error>) {
        match departure {
            Departure::Delete(name) => {
                let params = DeleteParams::default();
                let deleted = self.api.delete(&name, &params);
                let result = match crate::api_call(deleted).await {
                    Ok(_) => {
                        tracing::info!(instance = %name, "deleted Instance: no node sees it");
                        Ok(())
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                };
                if result.is_ok() {
                    self.mine.lock().expect("not poisoned").deleted(&name);
                }
                (name, result)
            }
            Departure::Leave(name) => {
                let params = PatchParams::apply(&self.field_manager).force();
                let result = self.give_up(&name, &params).await;
                (name, result)
            }
        }
    }

    /// Gives up this node's entry of `nodes` (and its other fields) by applying nothing.
    async fn give_up(&self, name: &str, params: &PatchParams) -> Result<(), kube::Error> {
        let empty = serde_json::json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance", "metadata": { "name": name },
        });
        let left: Instance =
            crate::api_call(self.api.patch(name, params, &Patch::Apply(&empty))).await?;
        self.wrote(&left);
        Ok(())
    }

    /// Completes a legacy Instance: adds the slots `<instance>-<i>` (i < capacity) it lacks,
    /// free, and releases what Akri's agent left on an Instance it wrote: this node's
    /// finalizer (no Akri agent will remove it) and the owner reference to its Configuration
    /// (through which garbage collection would delete it, held slots and all, with the
    /// Configuration; this path deletes an Instance only once its slots are free). The patch
    /// tests the resourceVersion it was computed from, so it can never overwrite a claim
    /// written meanwhile; on such a conflict the Instance is read again and the patch retried.
    async fn complete(&self, instance: &Instance) -> Result<(), kube::Error> {
        let name = instance.metadata.name.clone().unwrap_or_default();
        let mut instance = instance.clone();
        for _ in 0..5 {
            let ops = completion(&instance, &name, &self.node);
            if ops.is_empty() {
                return Ok(());
            }
            let mut patch = vec![serde_json::json!({
                "op": "test", "path": "/metadata/resourceVersion",
                "value": instance.metadata.resource_version,
            })];
            patch.extend(ops);
            let patch: json_patch::Patch =
                serde_json::from_value(serde_json::Value::Array(patch)).expect("valid JSON patch");
            let params = PatchParams::default();
            match crate::api_call(self.api.patch(&name, &params, &Patch::<()>::Json(patch))).await {
                Ok(patched) => {
                    self.wrote(&patched);
                    return Ok(());
                }
                Err(kube::Error::Api(status)) if status.code == 422 || status.code == 409 => {
                    instance = crate::api_call(self.api.get(&name)).await?;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Whether some Instance is waiting for its grace period (the caller should sync again).
    pub fn pending(&self) -> bool {
        !self.vanished.is_empty()
    }
}

/// What a [`InstanceWriter::sync`] found besides what it wrote.
#[derive(Debug, Default)]
pub struct Synced {
    /// Unshared devices whose Instance name another node's Instance has: the caller renames
    /// them.
    pub contested: Vec<String>,
    /// Configurations one of whose Instances the API server refused this time, with why.
    pub refused: BTreeMap<String, String>,
}

/// Collects the API server's refusals of single Instances; any other error is passed on.
struct Refusals<'a>(&'a mut BTreeMap<String, String>);

impl Refusals<'_> {
    fn note(&mut self, instance: &Instance, error: kube::Error) -> Result<(), kube::Error> {
        let kube::Error::Api(status) = error else {
            return Err(error);
        };
        let name = instance.metadata.name.as_deref().unwrap_or_default();
        let configuration = &instance.spec.configuration_name;
        tracing::warn!(instance = %name, %configuration, code = status.code, message = %status.message, "the API server refused an Instance; writing the others");
        self.0.insert(
            configuration.clone(),
            format!(
                "the API server refused Instance {name} ({}): {}",
                status.code, status.message
            ),
        );
        Ok(())
    }
}

/// The JSON patch operation that removes `node` from an object's finalizers (where Akri's
/// agent left the node's name), if it is there.
pub(crate) fn finalizer_removal(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    node: &str,
) -> Option<serde_json::Value> {
    let finalizers = metadata.finalizers.as_deref().unwrap_or_default();
    if !finalizers.iter().any(|f| f == node) {
        return None;
    }
    let kept: Vec<&String> = finalizers.iter().filter(|f| *f != node).collect();
    Some(serde_json::json!({ "op": "replace", "path": "/metadata/finalizers", "value": kept }))
}

/// The JSON patch operations that complete a legacy Instance ([`InstanceWriter::complete`]):
/// its missing slots added free, `node`'s finalizer and owner references to a v0
/// Configuration (what Akri's agent left) removed.
fn completion(instance: &Instance, name: &str, node: &str) -> Vec<serde_json::Value> {
    let mut ops: Vec<serde_json::Value> = (0..instance.spec.capacity)
        .map(|i| akri_devices::slot_device_name(name, i as i32))
        .filter(|slot| !instance.spec.device_usage.contains_key(slot))
        .map(|slot| {
            serde_json::json!({ "op": "add", "path": format!("/spec/deviceUsage/{slot}"), "value": "" })
        })
        .collect();
    let metadata = &instance.metadata;
    ops.extend(finalizer_removal(metadata, node));
    let owners = metadata.owner_references.clone().unwrap_or_default();
    let by_configuration = |o: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference| {
        o.kind == "Configuration" && o.api_version.starts_with("akri.sh/")
    };
    if owners.iter().any(|o| by_configuration(&o)) {
        let kept: Vec<_> = owners.iter().filter(|o| !by_configuration(o)).collect();
        ops.push(serde_json::json!({ "op": "replace", "path": "/metadata/ownerReferences", "value": kept }));
    }
    ops
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

    #[test]
    fn an_instance_akri_left_is_completed_and_released() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owner = |api_version: &str, kind: &str| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "x".into(),
            uid: "u".into(),
            ..OwnerReference::default()
        };
        let mut akris = named("cam-abcdef", &["a"]);
        akris.spec.capacity = 2;
        akris.spec.device_usage = [("cam-abcdef-1".to_string(), "a".to_string())].into();
        akris.metadata.finalizers = Some(vec!["a".into(), "example.com/keep".into()]);
        akris.metadata.owner_references = Some(vec![
            owner("akri.sh/v0", "Configuration"),
            owner("apps/v1", "Deployment"),
        ]);
        let ops = completion(&akris, "cam-abcdef", "a");
        assert_eq!(
            ops,
            [
                serde_json::json!({ "op": "add", "path": "/spec/deviceUsage/cam-abcdef-0", "value": "" }),
                serde_json::json!({ "op": "replace", "path": "/metadata/finalizers", "value": ["example.com/keep"] }),
                serde_json::json!({ "op": "replace", "path": "/metadata/ownerReferences", "value": [
                    { "apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": "u" }
                ] }),
            ]
        );
        // Another node's finalizer is that node's to release; a complete Instance of ours
        // needs nothing.
        assert_eq!(completion(&akris, "cam-abcdef", "b").len(), 3 - 1);
        let mut ours = named("cam-abcdef", &["a"]);
        ours.spec.capacity = 1;
        ours.spec.device_usage = [("cam-abcdef-0".to_string(), String::new())].into();
        assert!(completion(&ours, "cam-abcdef", "a").is_empty());
    }
}
