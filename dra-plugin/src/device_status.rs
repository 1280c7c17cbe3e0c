//! `ResourceClaim.status.devices`: what a driver tells workloads and operators about the
//! devices it prepared for a claim.
//!
//! Written with server-side apply under a field manager of the driver's own (its name), so a
//! claim holding devices of several drivers keeps every driver's entries: each apply owns, and
//! changes, only the entries of its manager. A read-modify-write update of the whole list, as
//! some drivers do, loses the entry another driver wrote in between. The claim's UID is part
//! of the applied object, so a claim that was deleted and re-created under the same name is
//! not written into (the API server refuses the UID as immutable).
//!
//! Kubernetes 1.36 (`DRAResourceClaimGranularStatusAuthorization`) also authorizes each
//! driver's entries: the writer needs `associated-node:patch` (its pod is on the claim's node)
//! or `arbitrary-node:patch` on `resourceclaims/driver` with the driver's name, besides
//! `patch` on `resourceclaims/status`.

use crate::background::{BackgroundError, Errors};
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One prepared device's entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    /// The pool of the device, as in the claim's allocation.
    pub pool: String,
    /// The device's name within its pool.
    pub device: String,
    /// The allocation's share ID, for a device allocated with consumable capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Driver-specific data (any JSON object) for workloads and operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// The device's conditions: among them the binding conditions the scheduler waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Errors of writing a claim's device status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed the apply (a claim that is gone or was replaced is
    /// not an error).
    #[error("applying status.devices of claim {namespace}/{name} for driver {driver}: {cause}")]
    Apply {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The driver whose entries were written (also the field manager).
        driver: String,
        /// The API server's error.
        cause: kube::Error,
    },
}

/// The claim `namespace/name` (UID `uid`).
#[derive(Clone, Copy, Debug)]
pub struct Claim<'a> {
    /// The claim's namespace.
    pub namespace: &'a str,
    /// The claim's name.
    pub name: &'a str,
    /// The claim's UID, so that a re-created claim of the same name is not written into.
    pub uid: &'a str,
}

/// Makes `devices` the entries of `driver` in the claim's `status.devices` (an empty slice
/// removes them). A claim that is gone, or was replaced (another UID), is left alone: its
/// status is not this driver's to write any more.
pub async fn apply(
    client: &kube::Client,
    claim: Claim<'_>,
    driver: &str,
    devices: &[DeviceStatus],
) -> Result<(), Error> {
    apply_as(client, claim, driver, driver, devices).await
}

/// [`apply`] under another field manager than the driver's name: a second writer of the
/// driver's entries (e.g. `<driver>/binding`, setting binding conditions) owns only the fields
/// it applies, so neither writer's apply takes the other's fields away.
pub async fn apply_as(
    client: &kube::Client,
    claim: Claim<'_>,
    driver: &str,
    manager: &str,
    devices: &[DeviceStatus],
) -> Result<(), Error> {
    let entries: Vec<serde_json::Value> = devices
        .iter()
        .map(|d| {
            let mut entry = serde_json::json!({
                "driver": driver,
                "pool": d.pool,
                "device": d.device,
            });
            if let Some(share_id) = &d.share_id {
                entry["shareID"] = share_id.clone().into();
            }
            if let Some(data) = &d.data {
                entry["data"] = data.clone();
            }
            if !d.conditions.is_empty() {
                entry["conditions"] =
                    serde_json::to_value(&d.conditions).expect("conditions serialize");
            }
            entry
        })
        .collect();
    let patch = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": claim.name, "namespace": claim.namespace, "uid": claim.uid },
        "status": { "devices": entries },
    });
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), claim.namespace);
    // Forced: the entries of this driver are this driver's, whoever touched them last.
    let params = PatchParams::apply(manager).force();
    match claims
        .patch_status(claim.name, &params, &Patch::Apply(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Gone (404), or replaced: the applied UID is then refused as a change of an
        // immutable field (422 on `metadata.uid`). Nothing of ours to keep either way.
        Err(kube::Error::Api(status)) if status.code == 404 || uid_refused(&status) => Ok(()),
        Err(cause) => Err(Error::Apply {
            namespace: claim.namespace.to_string(),
            name: claim.name.to_string(),
            driver: driver.to_string(),
            cause,
        }),
    }
}

fn uid_refused(status: &kube::core::Status) -> bool {
    status.code == 422
        && status
            .details
            .as_ref()
            .is_some_and(|d| d.causes.iter().any(|c| c.field == "metadata.uid"))
}

/// How long one apply may take before it is given up and retried.
const APPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest wait between retries of a failing apply.
const MAX_BACKOFF: std::time::Duration = std::time::Duration::from_secs(30);
/// How many applies run at once.
const CONCURRENT_APPLIES: usize = 8;
/// How long the writer gathers what is asked before applying it.
pub const BATCH_WINDOW: std::time::Duration = std::time::Duration::from_millis(200);

/// Writes claims' device status off the kubelet's path: [`write`](Writer::write) returns at
/// once, and a task of its own applies what was asked after [`BATCH_WINDOW`], only the latest
/// per claim and only if it differs from what it last wrote there (a claim prepared and
/// unprepared within the window costs no write at all), retrying a failure with backoff (1 s
/// doubling to 30 s) until the claim takes it or is gone. A prepare then waits for no API call
/// of its own, and an outage loses no status. The writer keeps its queue in memory only: a
/// restart loses none because the service records each claim's status in its checkpoint
/// ([`DraService::device_status`](crate::service::DraService::device_status)) and asks the
/// next process's writer for all of it. The task ends when the last clone of the writer is
/// dropped and nothing is left to write.
#[derive(Clone, Debug)]
pub struct Writer {
    requests: tokio::sync::mpsc::UnboundedSender<Ask>,
}

impl Writer {
    /// Starts the writer of `driver`'s entries (also its field manager); a failed write is
    /// logged.
    pub fn start(client: kube::Client, driver: &str) -> Writer {
        Writer::reporting(client, driver, Errors::logged_only())
    }

    /// [`start`](Self::start), a failed write also reported to the driver's hook.
    pub(crate) fn reporting(client: kube::Client, driver: &str, errors: Errors) -> Writer {
        let (requests, received) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(write_all(
            client,
            driver.to_string(),
            received,
            Queue::default(),
            errors,
        ));
        Writer { requests }
    }

    /// Makes `devices` the driver's entries of `claim`'s status, soon.
    pub fn write(&self, claim: &crate::ClaimRef, devices: Vec<DeviceStatus>) {
        // The task only ends once every sender is gone.
        let _ = self.requests.send((claim.clone(), devices, Origin::Asked));
    }

    /// [`write`](Self::write) for a status recorded by an earlier process, which may have
    /// written it: should the claim be unprepared before this one is applied, its entries are
    /// still removed.
    pub(crate) fn rewrite_recorded(&self, claim: &crate::ClaimRef, devices: Vec<DeviceStatus>) {
        let _ = self
            .requests
            .send((claim.clone(), devices, Origin::Recorded));
    }
}

/// Where a status the writer is given comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// Asked by this process: nobody wrote it before.
    Asked,
    /// Recorded by an earlier process, which may have written it.
    Recorded,
}

type Ask = (crate::ClaimRef, Vec<DeviceStatus>, Origin);
type Pending = BTreeMap<String, (crate::ClaimRef, Vec<DeviceStatus>)>;

/// The writer task's state.
#[derive(Default)]
struct Queue {
    /// Asked and not yet tried, by claim UID (the latest ask per claim).
    pending: Pending,
    /// What it last wrote into each claim.
    written: BTreeMap<String, Vec<DeviceStatus>>,
    /// The claims this process asked a status for. A claim neither written nor asked may
    /// hold entries an earlier process wrote (also one whose recorded status is queued), so
    /// an empty status for it is written.
    asked: BTreeSet<String>,
}

impl Queue {
    /// Queues `devices` for `claim` (replacing what was queued).
    fn take(&mut self, claim: crate::ClaimRef, devices: Vec<DeviceStatus>, origin: Origin) {
        if !devices.is_empty() && origin == Origin::Asked {
            self.asked.insert(claim.uid.clone());
        }
        self.pending.insert(claim.uid.clone(), (claim, devices));
    }

    /// The pending statuses that need an apply; the others are done with.
    fn batch(&mut self) -> Vec<(crate::ClaimRef, Vec<DeviceStatus>)> {
        let mut batch = Vec::new();
        for (uid, (claim, devices)) in std::mem::take(&mut self.pending) {
            let ours = match devices.is_empty() {
                true => self.asked.remove(&uid),
                false => true,
            };
            let needed = match self.written.get(&uid) {
                Some(before) => *before != devices,
                // Prepared and unprepared before its status was written: nothing to undo.
                None => !devices.is_empty() || !ours,
            };
            if needed {
                batch.push((claim, devices));
            }
        }
        batch
    }

    /// `devices` is now what `claim` holds of this driver.
    fn applied(&mut self, claim: crate::ClaimRef, devices: Vec<DeviceStatus>) {
        match devices.is_empty() {
            true => self.written.remove(&claim.uid),
            false => self.written.insert(claim.uid, devices),
        };
    }
}

/// The writer's task: what is asked, by claim UID, applied until it sticks.
async fn write_all(
    client: kube::Client,
    driver: String,
    mut received: tokio::sync::mpsc::UnboundedReceiver<Ask>,
    mut queue: Queue,
    errors: Errors,
) {
    use futures::StreamExt;
    let mut backoff = std::time::Duration::from_secs(1);
    let mut open = true;
    loop {
        if queue.pending.is_empty() {
            match received.recv().await {
                Some((claim, devices, origin)) => queue.take(claim, devices, origin),
                None => return,
            };
            tokio::time::sleep(BATCH_WINDOW).await;
        }
        while let Ok((claim, devices, origin)) = received.try_recv() {
            queue.take(claim, devices, origin);
        }
        let batch = queue.batch();
        let results: Vec<_> = futures::stream::iter(batch)
            .map(|(claim, devices)| {
                let (client, driver, errors) = (&client, driver.as_str(), &errors);
                async move {
                    let target = Claim {
                        namespace: &claim.namespace,
                        name: &claim.name,
                        uid: &claim.uid,
                    };
                    let apply = apply(client, target, driver, &devices);
                    let error = match tokio::time::timeout(APPLY_TIMEOUT, apply).await {
                        Ok(Ok(())) => return Ok((claim, devices)),
                        Ok(Err(error)) => error.to_string(),
                        Err(_) => format!("no answer within {APPLY_TIMEOUT:?}"),
                    };
                    tracing::warn!(%claim, driver, %error, "could not write the claim's device status; retrying");
                    let claim_ref = claim.clone();
                    errors.report(BackgroundError::DeviceStatus { claim: claim_ref, error });
                    Err((claim, devices))
                }
            })
            .buffer_unordered(CONCURRENT_APPLIES)
            .collect()
            .await;
        let mut failed = Vec::new();
        for result in results {
            match result {
                Ok((claim, devices)) => queue.applied(claim, devices),
                Err(failure) => failed.push(failure),
            }
        }
        if failed.is_empty() {
            backoff = std::time::Duration::from_secs(1);
            continue;
        }
        // Retried after the backoff, unless asked something newer for the claim meanwhile.
        for (claim, devices) in failed {
            queue
                .pending
                .entry(claim.uid.clone())
                .or_insert((claim, devices));
        }
        let sleep = tokio::time::sleep(backoff);
        tokio::pin!(sleep);
        while open {
            tokio::select! {
                _ = &mut sleep => break,
                request = received.recv() => match request {
                    Some((claim, devices, origin)) => queue.take(claim, devices, origin),
                    None => open = false,
                },
            }
        }
        if !open {
            sleep.await;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::{DeviceStatus, Origin, Queue};

    fn claim(uid: &str) -> crate::ClaimRef {
        crate::ClaimRef {
            namespace: "ns".into(),
            name: uid.into(),
            uid: uid.into(),
        }
    }

    fn status() -> Vec<DeviceStatus> {
        vec![DeviceStatus {
            pool: "pool".into(),
            device: "dev".into(),
            ..DeviceStatus::default()
        }]
    }

    /// A claim's uid, whether it is prepared (has entries), and who asks.
    type Ask = (&'static str, bool, Origin);
    /// A claim's uid and whether its entries are written (or removed).
    type Applied = (&'static str, bool);

    /// What a batch applies after the asks, as (uid, whether entries are written).
    fn batch_after(asks: &[Ask]) -> Vec<(String, bool)> {
        let mut queue = Queue::default();
        for &(uid, prepared, origin) in asks {
            let devices = if prepared { status() } else { Vec::new() };
            queue.take(claim(uid), devices, origin);
        }
        (queue.batch().into_iter())
            .map(|(claim, devices)| (claim.uid, !devices.is_empty()))
            .collect()
    }

    #[test]
    fn a_batch_writes_what_is_needed_and_skips_what_was_undone_unwritten() {
        use Origin::{Asked, Recorded};
        let cases: [(&str, &[Ask], &[Applied]); 5] = [
            ("prepared: written", &[("a", true, Asked)], &[("a", true)]),
            (
                "prepared and unprepared in one window: nothing to undo",
                &[("a", true, Asked), ("a", false, Asked)],
                &[],
            ),
            (
                "unprepared, never asked here: an earlier process may have written it",
                &[("a", false, Asked)],
                &[("a", false)],
            ),
            (
                "recorded by an earlier process: written again",
                &[("a", true, Recorded)],
                &[("a", true)],
            ),
            (
                "recorded, then unprepared in the first window: its entries removed",
                &[("a", true, Recorded), ("a", false, Asked)],
                &[("a", false)],
            ),
        ];
        for (name, asks, expected) in cases {
            let expected: Vec<(String, bool)> = (expected.iter())
                .map(|&(u, w)| (u.to_string(), w))
                .collect();
            assert_eq!(batch_after(asks), expected, "{name}");
        }
    }
}
