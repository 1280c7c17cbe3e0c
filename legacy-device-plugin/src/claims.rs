//! Writing slot claims to `Instance.deviceUsage` with optimistic concurrency.
//!
//! Each Instance gets one JSON patch: a `test` per slot that it still has the value the
//! claim was computed from, then a `replace` per slot. The API server applies a JSON patch to
//! the object it is about to store, and re-applies it (tests included) when a concurrent
//! write got there first, so a slot changes only from the value its writer saw: two nodes can
//! never both take it, and only one writer's claim wins (the loser gets 422 and a fresh view).
//! Writes are per slot, not per object, so nodes claiming different slots of one Instance do
//! not conflict at all.

use crate::slots::SlotClaim;
use akri_api::v0::{DeviceUsage, Instance, slot_patch};
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeMap;

/// Errors of writing claims.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// A slot no longer had the value the claim was computed from (someone else claimed or
    /// freed it), or the Instance is gone.
    #[error("Instance {instance} changed under the claim: {message}")]
    Conflict { instance: String, message: String },
    #[error("writing Instance {instance}: {cause}")]
    Api {
        instance: String,
        cause: kube::Error,
    },
}

impl ClaimError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, ClaimError::Conflict { .. })
    }
}

/// One slot's change: slot, value now, value wanted.
type Change<'a> = (&'a str, &'a DeviceUsage, &'a DeviceUsage);

/// Writes the claims of one allocation, all or nothing: when an Instance refuses, the
/// Instances already written are set back. Returns the Instances as written.
pub async fn write(api: &Api<Instance>, claims: &[SlotClaim]) -> Result<Vec<Instance>, ClaimError> {
    let mut by_instance: BTreeMap<&str, Vec<Change>> = BTreeMap::new();
    for claim in claims.iter().filter(|c| c.writes()) {
        by_instance
            .entry(&claim.instance)
            .or_default()
            .push((&claim.slot, &claim.from, &claim.to));
    }
    let mut written: Vec<(&str, &Vec<Change>)> = Vec::new();
    let mut instances = Vec::new();
    for (instance, changes) in &by_instance {
        match patch(api, instance, changes.iter().copied()).await {
            Ok(updated) => {
                written.push((instance, changes));
                instances.push(updated);
            }
            Err(error) => {
                for (instance, changes) in written {
                    let back = changes.iter().map(|(slot, from, to)| (*slot, *to, *from));
                    if let Err(undo) = patch(api, instance, back).await {
                        // The reclaimer frees the slot later: no container holds it.
                        tracing::warn!(%instance, error = %undo, "cannot undo a partial claim");
                    }
                }
                return Err(error);
            }
        }
    }
    Ok(instances)
}

/// Frees `slot` of `instance` if it still is `held`.
pub async fn release(
    api: &Api<Instance>,
    instance: &str,
    slot: &str,
    held: &DeviceUsage,
) -> Result<Instance, ClaimError> {
    patch(api, instance, [(slot, held, &DeviceUsage::Free)]).await
}

async fn patch<'a>(
    api: &Api<Instance>,
    instance: &str,
    changes: impl IntoIterator<Item = (&'a str, &'a DeviceUsage, &'a DeviceUsage)>,
) -> Result<Instance, ClaimError> {
    let patch: json_patch::Patch = serde_json::from_value(slot_patch(changes))
        .expect("test and replace operations are valid JSON patch");
    match api
        .patch(instance, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(updated) => Ok(updated),
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 404 => {
            Err(ClaimError::Conflict {
                instance: instance.to_string(),
                message: status.message,
            })
        }
        Err(cause) => Err(ClaimError::Api {
            instance: instance.to_string(),
            cause,
        }),
    }
}
