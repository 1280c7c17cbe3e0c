//! Making the objects of one BrokerTemplate what it wants, whatever their kinds: each
//! server-side applied under the controller's field manager unless the object already carries
//! the digest of what would be applied, and every object of the template's UID label that is
//! no longer wanted deleted.

use crate::render::{DIGEST_ANNOTATION, Rendered, TEMPLATE_UID_LABEL};
use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

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
}

impl Applier {
    pub fn new(client: kube::Client, field_manager: &str) -> Self {
        Applier {
            client,
            field_manager: field_manager.to_string(),
            resources: Mutex::default(),
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
    /// but is not in it, in the kinds of `desired` and in `previous_kinds`.
    pub async fn converge(
        &self,
        namespace: &str,
        uid: &str,
        desired: &[Rendered],
        previous_kinds: &[String],
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
                .converge_kind(namespace, uid, &api_version, &kind, &wanted, &mut out)
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
        api_version: &str,
        kind: &str,
        wanted: &[&Rendered],
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
        let listed = api
            .list_metadata(&ListParams::default().labels(&format!("{TEMPLATE_UID_LABEL}={uid}")))
            .await;
        let live: BTreeMap<String, Option<String>> = match listed {
            Ok(list) => list
                .items
                .into_iter()
                .map(|o| {
                    let digest = o
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(DIGEST_ANNOTATION).cloned());
                    (o.metadata.name.unwrap_or_default(), digest)
                })
                .collect(),
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
        let params = PatchParams::apply(&self.field_manager).force();
        let stale: Vec<&Rendered> = wanted
            .iter()
            .copied()
            .filter(|object| {
                live.get(&object.name)
                    .is_none_or(|d| d.as_deref() != Some(object.digest()))
            })
            .collect();
        out.managed += wanted.len() - stale.len();
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
        let unwanted = live.keys().filter(|n| !wanted_names.contains(n.as_str()));
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
        let mut left = !wanted.is_empty();
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
}
