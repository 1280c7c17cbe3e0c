//! Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.
//!
//! A candidate takes the Lease when it is free or when its record has not changed for a whole
//! lease duration, measured on the candidate's own clock (so clock skew between replicas does
//! not matter) from when it first saw that record. Every write goes through the Lease's
//! resourceVersion, so two candidates never both win, and every holder identity is unique to
//! its process, so two processes given the same name never both think they hold it.
//!
//! The leader renews every retry period. A renewal that fails is retried until the renew
//! deadline, counted from the *start* of the last successful renewal (the record a standby
//! saw was written after that instant); then leadership is lost and the leader stops acting.
//! The renew deadline is shorter than the lease duration, so the old leader has stopped before
//! any standby may take over. Every call to the API server is bounded by a timeout, so a
//! stalled connection cannot hold the leader past its deadline.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("lease {namespace}/{name}: {cause}")]
    Api {
        namespace: String,
        name: String,
        cause: kube::Error,
    },
    #[error("lease {namespace}/{name}: the API server did not answer within {after:?}")]
    Timeout {
        namespace: String,
        name: String,
        after: Duration,
    },
    #[error(
        "leader election needs lease duration ({lease:?}) > renew deadline ({renew:?}) > retry period ({retry:?})"
    )]
    Timing {
        lease: Duration,
        renew: Duration,
        retry: Duration,
    },
}

/// Where the Lease is and how long it lasts.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// The holder identity this process writes: the replica's name and a random suffix of
    /// this process (see [`unique_identity`]).
    pub identity: String,
    /// How long a Lease nobody renews stays taken.
    pub lease_duration: Duration,
    /// How long the leader retries a failing renewal before it stops acting; shorter than
    /// the lease duration, so that it has stopped before a standby may take over.
    pub renew_deadline: Duration,
    /// How often the leader renews, and candidates retry.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry. `replica` names the
    /// replica (the pod name); the identity in the Lease gets a per-process suffix.
    pub fn new(namespace: &str, name: &str, replica: &str) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: unique_identity(replica),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The ordering client-go insists on: lease duration > renew deadline > retry period.
    pub fn validate(&self) -> Result<(), Error> {
        if self.lease_duration > self.renew_deadline && self.renew_deadline > self.retry_period {
            Ok(())
        } else {
            Err(Error::Timing {
                lease: self.lease_duration,
                renew: self.renew_deadline,
                retry: self.retry_period,
            })
        }
    }
}

/// `<replica>_<16 hex digits>`, random per call (as client-go's `hostname_uuid`): two
/// processes started with the same replica name are two holders.
pub fn unique_identity(replica: &str) -> String {
    // The standard library's hasher keys are random per process (and per call).
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{replica}_{:016x}", hasher.finish())
}

/// The replica name when none is given: the host name (the pod name in a pod).
pub fn default_replica_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "akri-replica".into())
}

/// Held leadership. Dropping it stops renewing (the Lease then expires); [`release`] hands
/// it over at once.
///
/// [`release`]: Leadership::release
pub struct Leadership {
    lost: watch::Receiver<bool>,
    renew: tokio::task::JoinHandle<()>,
    elector: Elector,
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.renew.abort();
    }
}

impl Leadership {
    /// Resolves when leadership is lost (the Lease could not be renewed, or was taken).
    pub async fn lost(&mut self) {
        while !*self.lost.borrow() {
            if self.lost.changed().await.is_err() {
                return;
            }
        }
    }

    /// Gives the Lease up so that a standby replica takes over without waiting for expiry.
    pub async fn release(self) {
        self.renew.abort();
        let limit = self.elector.config.renew_deadline;
        match tokio::time::timeout(limit, self.elector.release()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "releasing the leader lease failed; it will expire")
            }
            Err(_) => tracing::warn!(
                ?limit,
                "releasing the leader lease timed out; it will expire"
            ),
        }
    }
}

/// Waits until this replica holds the Lease. `on_attempt` is told after each attempt (as
/// candidate, then as leader) whether the API server answered in time (for readiness).
pub async fn acquire(
    client: kube::Client,
    config: LeaseConfig,
    on_attempt: impl Fn(bool) + Send + Sync + 'static,
) -> Leadership {
    let mut elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        config,
        observed: None,
    };
    // When the attempt that won started: the renew deadline counts from there.
    let mut acquired_at;
    loop {
        acquired_at = Instant::now();
        let limit = acquired_at + elector.config.renew_deadline;
        match elector.attempt(limit).await {
            Ok(true) => {
                on_attempt(true);
                break;
            }
            Ok(false) => on_attempt(true),
            Err(error) => {
                on_attempt(false);
                tracing::warn!(%error, "leader election attempt failed");
            }
        }
        tokio::time::sleep(elector.config.retry_period).await;
    }
    tracing::info!(identity = %elector.config.identity, lease = %elector.config.name, "became leader");
    let (lost_tx, lost) = watch::channel(false);
    let mut renewer = elector.clone();
    let renew = tokio::spawn(async move {
        let mut last_renewed = acquired_at;
        loop {
            tokio::time::sleep(renewer.config.retry_period).await;
            // A standby may take over a lease duration after it saw our last record, which
            // was written after `last_renewed`: give up well before that.
            let deadline = last_renewed + renewer.config.renew_deadline;
            let started = Instant::now();
            match renewer.attempt(deadline).await {
                Ok(true) => {
                    on_attempt(true);
                    last_renewed = started;
                }
                Ok(false) => {
                    on_attempt(true);
                    tracing::error!("another replica holds the leader lease");
                    break;
                }
                Err(error) => {
                    on_attempt(false);
                    tracing::warn!(%error, "renewing the leader lease failed");
                }
            }
            if Instant::now() >= last_renewed + renewer.config.renew_deadline {
                tracing::error!(
                    renew_deadline = ?renewer.config.renew_deadline,
                    "could not renew the leader lease within the renew deadline"
                );
                break;
            }
        }
        let _ = lost_tx.send(true);
    });
    Leadership {
        lost,
        renew,
        elector,
    }
}

#[derive(Clone)]
struct Elector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The other holder's record as last seen, and when it was first seen so.
    observed: Option<(LeaseSpec, Instant)>,
}

impl Elector {
    fn error(&self, source: kube::Error) -> Error {
        Error::Api {
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            cause: source,
        }
    }

    /// One [`try_acquire_or_renew`](Self::try_acquire_or_renew), given up at `deadline`.
    async fn attempt(&mut self, deadline: Instant) -> Result<bool, Error> {
        let after = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout_at(deadline.into(), self.try_acquire_or_renew()).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
                after,
            }),
        }
    }

    async fn read(&self) -> Result<Option<Lease>, Error> {
        self.api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.error(e))
    }

    /// Takes or renews the Lease; `false` when another replica holds it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, Error> {
        let now = MicroTime(Timestamp::now());
        let me = self.config.identity.clone();
        let duration = self.config.lease_duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.read().await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(self.error(e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == me;
        if !mine && !holder.is_empty() {
            // Someone else's: taken only once its record stood still for a lease duration.
            let expiry =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(duration).max(1) as u64);
            match &self.observed {
                Some((seen, since)) if *seen == spec => {
                    if since.elapsed() < expiry {
                        return Ok(false);
                    }
                }
                _ => {
                    self.observed = Some((spec, Instant::now()));
                    return Ok(false);
                }
            }
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(me),
            lease_duration_seconds: Some(duration),
            acquire_time: if mine {
                spec.acquire_time
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..spec
        });
        // `replace` carries the resourceVersion we read: a concurrent writer makes it fail.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.observed = None;
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(self.error(e)),
        }
    }

    async fn release(&self) -> Result<(), Error> {
        let Some(mut lease) = self.read().await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(e) => Err(self.error(e)),
        }
    }
}

/// The leader-election flags of every replicated binary (one set of names and defaults).
#[derive(Clone, Debug, clap::Args)]
pub struct LeaseArgs {
    /// Namespace of the leader-election Lease (usually the controller's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "akri")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease (default: the binary's name).
    #[arg(long)]
    pub lease_name: Option<String>,
    /// This replica's name (the pod name; the host name when not given). The identity in the
    /// Lease is this name and a random suffix of the process.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Seconds an unrenewed Lease stays taken: how long a standby waits for a dead leader.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds the leader retries a failing renewal before it stops acting (less than the
    /// lease duration).
    #[arg(long, default_value_t = 10)]
    pub lease_renew_deadline_seconds: u64,
    /// Seconds between renewals (and attempts by standbys).
    #[arg(long, default_value_t = 2)]
    pub lease_retry_seconds: u64,
}

impl LeaseArgs {
    /// The Lease these flags describe; `default_name` when `--lease-name` is not given.
    pub fn config(&self, default_name: &str) -> LeaseConfig {
        let replica = self.identity.clone().unwrap_or_else(default_replica_name);
        let name = self.lease_name.as_deref().unwrap_or(default_name);
        let mut lease = LeaseConfig::new(&self.lease_namespace, name, &replica);
        lease.lease_duration = Duration::from_secs(self.lease_duration_seconds);
        lease.renew_deadline = Duration::from_secs(self.lease_renew_deadline_seconds);
        lease.retry_period = Duration::from_secs(self.lease_retry_seconds);
        lease
    }
}

/// Why a replica stopped leading.
#[derive(Debug, thiserror::Error)]
pub enum LeadError {
    #[error("lost the leader lease; stopping so that only one replica acts")]
    Lost,
    #[error(transparent)]
    Lease(#[from] Error),
}

/// Waits to hold the Lease, then runs `work` until it ends or leadership is lost (then
/// `work` is dropped at once: nothing of it runs after this returns). `readiness` follows
/// whether the last election call reached the API server; `on_leading` is told when this
/// replica starts and stops leading. `stop` (the process being asked to stop, see
/// [`stop_signal`]) ends waiting or working with `Ok(None)`. A replica whose work ended or
/// was stopped hands the Lease over, so a standby (or the next pod of a rolling update) takes
/// over at once instead of after the Lease's expiry.
pub async fn lead<T>(
    client: kube::Client,
    lease: LeaseConfig,
    readiness: crate::http::Readiness,
    on_leading: impl Fn(bool),
    work: impl std::future::Future<Output = T>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Option<T>, LeadError> {
    lease.validate()?;
    let mut stop = std::pin::pin!(stop);
    let acquired = acquire(client, lease, move |reached| {
        if reached {
            readiness.ready();
        } else {
            readiness
                .not_ready("the last leader-election call did not reach the API server in time");
        }
    });
    let mut leadership = tokio::select! {
        leadership = acquired => leadership,
        () = &mut stop => return Ok(None),
    };
    on_leading(true);
    let result = tokio::select! {
        result = work => Ok(Some(result)),
        () = &mut stop => Ok(None),
        _ = leadership.lost() => Err(LeadError::Lost),
    };
    on_leading(false);
    if result.is_ok() {
        leadership.release().await;
    }
    result
}

/// Completes when the process is asked to stop (SIGTERM or Ctrl-C), for [`lead`]'s `stop`;
/// never when the signals cannot be watched (the default action then still ends the process).
pub async fn stop_signal() {
    if let Err(error) = crate::stopped().await {
        tracing::warn!(%error, "cannot watch for SIGTERM; the Lease will expire instead of being handed over");
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_unique_per_call_and_keep_the_replica_name() {
        let (a, b) = (unique_identity("pod-a"), unique_identity("pod-a"));
        assert_ne!(a, b);
        assert!(
            a.starts_with("pod-a_") && a.len() == "pod-a_".len() + 16,
            "{a}"
        );
    }

    #[test]
    fn timing_must_let_the_leader_stop_before_its_lease_expires() {
        let mut config = LeaseConfig::new("ns", "lease", "pod");
        assert!(config.validate().is_ok());
        config.renew_deadline = config.lease_duration;
        assert!(config.validate().is_err());
        config.renew_deadline = config.retry_period;
        assert!(config.validate().is_err());
    }
}
