//! Making the objects of one BrokerTemplate what it wants, whatever their kinds: each
//! server-side applied under the controller's field manager unless the object already carries
//! the digest of what would be applied, and every object of the template's UID label that is
//! no longer wanted deleted.
//!
//! Only what the template made is ever written: an object of a wanted name that lacks the
//! template's UID label was made by someone else and is left alone (the status says it is in
//! the way). Only a definite change deletes: the objects of an Instance that could not be
//! rendered this time (a property missing, the DeviceClass not there yet) are kept, as are the
//! global ones while one of them could not be. A broker Pod that failed or was evicted is
//! replaced, after a backoff that doubles per replacement.

use crate::render::{DIGEST_ANNOTATION, INSTANCE_ANNOTATION, Rendered, TEMPLATE_UID_LABEL};
use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Writes to the API server one template's convergence has in flight at once.
const WRITES_IN_FLIGHT: usize = 16;

/// What one convergence did.
#[derive(Debug, Default, PartialEq)]
pub struct Outcome {
    /// Wanted objects that exist as wanted now.
    pub managed: usize,
    /// Objects written (created or changed) and deleted by this pass.
    pub applied: usize,
    pub deleted: usize,
    /// Kinds (`<kind>.<apiVersion>`) that hold objects of the template, to look in for
    /// leftovers next time even when the template no longer has them.
    pub kinds: Vec<String>,
    /// Objects the API server refused, with its message.
    pub refused: Vec<(String, String)>,
    /// Instances with a refused object.
    pub refused_instances: BTreeSet<String>,
    /// Something will be right only after another pass (an object being replaced).
    pub retry_soon: bool,
    /// A failed Pod waits for its backoff: look again by then.
    pub retry_after: Option<Duration>,
    /// Jobs that finished, as `<name> <digest>`: not run again while the template renders
    /// them the same, though their TTL (or anyone) deleted them.
    pub finished_jobs: BTreeSet<String>,
}

/// What a pass keeps though it does not want it now: the objects of Instances whose objects
/// could not all be rendered, and the global objects while one of them could not be.
#[derive(Clone, Copy, Debug)]
pub struct Kept<'a> {
    pub instances: &'a BTreeSet<String>,
    pub globals: bool,
    /// The Jobs known to have finished: [`Outcome::finished_jobs`] of the pass before (kept in
    /// the status) and those the watch saw finish since ([`finished_job`]).
    pub finished_jobs: &'a BTreeSet<String>,
}

/// An object of the template as listed.
struct Live {
    digest: Option<String>,
    instance: Option<String>,
    /// A Pod that failed (evicted pods too): it runs no more, and is replaced.
    failed: bool,
}

/// How a finished Job is remembered: `<name> <digest>`.
fn job_key(object: &Rendered) -> String {
    format!("{} {}", object.name, object.digest())
}

/// The template UID and key ([`job_key`]) of a Job of a template that finished (its last
/// state as a watch saw it, deleted or not).
pub fn finished_job(job: &k8s_openapi::api::batch::v1::Job) -> Option<(String, String)> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    let finished = conditions
        .iter()
        .any(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True");
    let meta = &job.metadata;
    let uid = meta.labels.as_ref()?.get(TEMPLATE_UID_LABEL)?;
    let digest = meta.annotations.as_ref()?.get(DIGEST_ANNOTATION)?;
    let name = meta.name.as_ref()?;
    finished.then(|| (uid.clone(), format!("{name} {digest}")))
}

/// The first wait before a failed Pod is replaced again; it doubles per replacement.
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
/// The longest wait between replacements of a Pod that keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long after its `replaced`-th replacement a failed Pod waits for the next one.
fn backoff(replaced: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(replaced.saturating_sub(1)))
        .min(MAX_BACKOFF)
}

/// The key a kind is remembered by in the status: `<kind>.<apiVersion>` (`Deployment.apps/v1`).
fn kind_key(api_version: &str, kind: &str) -> String {
    format!("{kind}.{api_version}")
}

fn parse_kind_key(key: &str) -> Option<(String, String)> {
    let (kind, api_version) = key.split_once('.')?;
    Some((api_version.to_string(), kind.to_string()))
}

/// Kinds whose pod template the API server keeps immutable: an object of them whose change is
/// refused as invalid is deleted and made again, instead of staying out of date.
fn replaced_when_immutable(kind: &str) -> bool {
    matches!(kind, "Pod" | "Job")
}

fn message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

pub struct Applier {
    client: kube::Client,
    field_manager: String,
    /// Kinds resolved through discovery, by (apiVersion, kind).
    resources: Mutex<HashMap<(String, String), ApiResource>>,
    /// Failed Pods replaced, by (namespace, name): how often in a row, and when last.
    replaced: Mutex<HashMap<(String, String), (u32, Instant)>>,
}

impl Applier {
    pub fn new(client: kube::Client, field_manager: &str) -> Self {
        Applier {
            client,
            field_manager: field_manager.to_string(),
            resources: Mutex::default(),
            replaced: Mutex::default(),
        }
    }

    async fn resource(&self, api_version: &str, kind: &str) -> Result<ApiResource, String> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(found) = self.resources.lock().expect("resources").get(&key) {
            return Ok(found.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (resource, _) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|e| {
                format!(
                    "the API server does not serve {kind} in {api_version}: {}",
                    message(&e)
                )
            })?;
        self.resources
            .lock()
            .expect("resources")
            .insert(key, resource.clone());
        Ok(resource)
    }

    /// Applies `desired` in `namespace` and deletes what carries the template's `uid` label
    /// but is neither in it nor `kept`, in the kinds of `desired` and in `previous_kinds`.
    pub async fn converge(
        &self,
        namespace: &str,
        uid: &str,
        desired: &[Rendered],
        previous_kinds: &[String],
        kept: Kept<'_>,
    ) -> Outcome {
        let mut out = Outcome::default();
        let mut by_kind: BTreeMap<(String, String), Vec<&Rendered>> = BTreeMap::new();
        for object in desired {
            by_kind
                .entry((object.api_version.clone(), object.kind.clone()))
                .or_default()
                .push(object);
        }
        for key in previous_kinds {
            if let Some(kind) = parse_kind_key(key) {
                by_kind.entry(kind).or_default();
            }
        }
        for ((api_version, kind), wanted) in by_kind {
            let keep_kind = self
                .converge_kind(
                    namespace,
                    uid,
                    (&api_version, &kind),
                    &wanted,
                    kept,
                    &mut out,
                )
                .await;
            if keep_kind {
                out.kinds.push(kind_key(&api_version, &kind));
            }
        }
        out
    }

    /// Returns whether the kind still holds (or may hold) objects of the template.
    async fn converge_kind(
        &self,
        namespace: &str,
        uid: &str,
        (api_version, kind): (&str, &str),
        wanted: &[&Rendered],
        kept: Kept<'_>,
        out: &mut Outcome,
    ) -> bool {
        let refuse = |out: &mut Outcome, object: &Rendered, message: String| {
            out.refused.push((object.describe(), message));
            if let Some(instance) = &object.instance {
                out.refused_instances.insert(instance.clone());
            }
        };
        let resource = match self.resource(api_version, kind).await {
            Ok(resource) => resource,
            Err(error) => {
                for object in wanted {
                    refuse(out, object, error.clone());
                }
                // A kind that went away from the API server holds nothing we can delete.
                return false;
            }
        };
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &resource);
        let live = match self.list(&api, uid, kind).await {
            Ok(live) => live,
            Err(error) => {
                for object in wanted {
                    refuse(
                        out,
                        object,
                        format!("cannot list {kind}: {}", message(&error)),
                    );
                }
                out.retry_soon = true;
                return true;
            }
        };
        let mut applying = self
            .replace_failed(&api, namespace, kind, wanted, &live, out)
            .await;
        if kind == "Job" {
            // A finished Job (the watch saw it finish: [`finished_job`]) is done: one its TTL
            // removed is not run again.
            applying.retain(|job| {
                let key = job_key(job);
                let finished = kept.finished_jobs.contains(&key);
                if finished {
                    out.finished_jobs.insert(key);
                }
                !finished || live.contains_key(&job.name)
            });
        }
        let params = PatchParams::apply(&self.field_manager).force();
        let stale: Vec<&Rendered> = applying
            .iter()
            .copied()
            .filter(|object| {
                live.get(&object.name)
                    .is_none_or(|o| o.digest.as_deref() != Some(object.digest()))
            })
            .collect();
        out.managed += applying.len() - stale.len();
        // New to the template: made only where nothing of that name is (a forced apply would
        // take someone else's object over, and a later pass delete it).
        let mut fresh = Vec::new();
        for object in stale {
            if live.contains_key(&object.name) {
                fresh.push(object);
                continue;
            }
            match api.get_metadata_opt(&object.name).await {
                Ok(None) => fresh.push(object),
                Ok(Some(_)) => {
                    refuse(
                        out,
                        object,
                        format!(
                            "a {kind} of that name exists that this template did not make; it is left alone (rename one of them)"
                        ),
                    );
                }
                Err(error) => {
                    refuse(out, object, message(&error));
                    out.retry_soon = true;
                }
            }
        }
        let stale = fresh;
        // Independent objects, written a few at a time: a burst of new Instances is applied
        // in a fraction of the time one request after another takes.
        let mut writes = Vec::new();
        for object in stale {
            let (api, params) = (api.clone(), params.clone());
            writes.push(async move {
                let result = api
                    .patch(&object.name, &params, &Patch::Apply(&object.object))
                    .await
                    .map(|_| ());
                (object, result)
            });
        }
        let results: Vec<(&Rendered, Result<(), kube::Error>)> = futures::stream::iter(writes)
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        for (object, result) in results {
            match result {
                Ok(()) => {
                    out.applied += 1;
                    out.managed += 1;
                }
                Err(kube::Error::Api(status))
                    if status.code == 422
                        && live.contains_key(&object.name)
                        && replaced_when_immutable(kind) =>
                {
                    tracing::info!(kind, name = %object.name, "replacing: the change is not allowed in place");
                    match api.delete(&object.name, &DeleteParams::background()).await {
                        Ok(_) => out.deleted += 1,
                        Err(error) => refuse(out, object, message(&error)),
                    }
                    out.retry_soon = true;
                }
                Err(error) => refuse(out, object, message(&error)),
            }
        }
        let wanted_names: BTreeSet<&str> = wanted.iter().map(|o| o.name.as_str()).collect();
        let (unwanted, held): (Vec<(&String, &Live)>, Vec<_>) = live
            .iter()
            .filter(|(name, _)| !wanted_names.contains(name.as_str()))
            .partition(|(_, object)| match &object.instance {
                Some(instance) => !kept.instances.contains(instance),
                None => !kept.globals,
            });
        let unwanted = unwanted.into_iter().map(|(name, _)| name);
        let mut deletes = Vec::new();
        for name in unwanted {
            let api = api.clone();
            deletes.push(async move {
                let result = api.delete(name, &DeleteParams::background()).await;
                (name, result.map(|_| ()))
            });
        }
        let results: Vec<(&String, Result<(), kube::Error>)> = futures::stream::iter(deletes)
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        let mut left = !wanted.is_empty() || !held.is_empty();
        for (name, result) in results {
            match result {
                Ok(()) => out.deleted += 1,
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::warn!(kind, %name, error = %message(&error), "cannot delete a broker object no longer wanted");
                    out.retry_soon = true;
                    left = true;
                }
            }
        }
        left
    }

    /// The template's objects of one kind: each with its digest and Instance, and whether a
    /// Pod failed (which takes the whole Pods: the phase is status).
    async fn list(
        &self,
        api: &Api<DynamicObject>,
        uid: &str,
        kind: &str,
    ) -> Result<BTreeMap<String, Live>, kube::Error> {
        let params = ListParams::default().labels(&format!("{TEMPLATE_UID_LABEL}={uid}"));
        let annotation = |meta: &kube::api::ObjectMeta, key: &str| {
            meta.annotations.as_ref().and_then(|a| a.get(key).cloned())
        };
        let live = |meta: kube::api::ObjectMeta, failed: bool| {
            let entry = Live {
                digest: annotation(&meta, DIGEST_ANNOTATION),
                instance: annotation(&meta, INSTANCE_ANNOTATION),
                failed,
            };
            (meta.name.unwrap_or_default(), entry)
        };
        Ok(if kind == "Pod" {
            api.list(&params)
                .await?
                .items
                .into_iter()
                .map(|o| {
                    let failed = o.data["status"]["phase"] == "Failed";
                    live(o.metadata, failed)
                })
                .collect()
        } else {
            api.list_metadata(&params)
                .await?
                .items
                .into_iter()
                .map(|o| live(o.metadata, false))
                .collect()
        })
    }

    /// Deletes the wanted Pods that failed, once their backoff is over (they are made again
    /// on the next pass), and returns what is wanted of the kind now: not the failed ones.
    async fn replace_failed<'r>(
        &self,
        api: &Api<DynamicObject>,
        namespace: &str,
        kind: &str,
        wanted: &[&'r Rendered],
        live: &BTreeMap<String, Live>,
        out: &mut Outcome,
    ) -> Vec<&'r Rendered> {
        let mut replaced = self.replaced.lock().expect("replaced").clone();
        let mut kept = Vec::new();
        for object in wanted.iter().copied() {
            let key = (namespace.to_string(), object.name.clone());
            let failed = kind == "Pod" && live.get(&object.name).is_some_and(|o| o.failed);
            if !failed {
                // Running (or not made yet): a later failure starts the backoff over, unless
                // it is the replacement of one that failed just now.
                if live.contains_key(&object.name)
                    && replaced
                        .get(&key)
                        .is_some_and(|(n, at)| at.elapsed() > backoff(*n))
                {
                    replaced.remove(&key);
                }
                kept.push(object);
                continue;
            }
            let (count, at) = replaced.get(&key).copied().unwrap_or((0, Instant::now()));
            let wait = if count == 0 {
                Duration::ZERO
            } else {
                backoff(count).saturating_sub(at.elapsed())
            };
            if !wait.is_zero() {
                out.retry_after = Some(out.retry_after.map_or(wait, |w| w.min(wait)));
                continue;
            }
            tracing::info!(pod = %object.name, replaced = count, "replacing a broker Pod that failed");
            match api.delete(&object.name, &DeleteParams::background()).await {
                Ok(_) => {
                    out.deleted += 1;
                    replaced.insert(key, (count + 1, Instant::now()));
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::warn!(pod = %object.name, error = %message(&error), "cannot delete a failed broker Pod");
                }
            }
            out.retry_soon = true;
        }
        *self.replaced.lock().expect("replaced") = replaced;
        kept
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_that_keeps_failing_waits_twice_as_long_each_time_up_to_five_minutes() {
        let waits: Vec<u64> = (1..=7).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
