//! Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.
//!
//! A candidate takes the Lease when it is free or when its record has not changed for a whole
//! lease duration, measured on the candidate's own clock (so clock skew between replicas does
//! not matter). Every write goes through the Lease's resourceVersion, so two candidates never
//! both win. The leader renews it; when it cannot renew within the lease duration it has
//! lost, and must stop acting, because another replica may already have taken over.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("lease {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Where the Lease is and how long it lasts.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica (e.g. the pod name).
    pub identity: String,
    /// How long a Lease nobody renews stays taken.
    pub lease_duration: Duration,
    /// How often the leader renews, and candidates retry.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults scaled down for a single small controller: 15 s lease, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
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
        if let Err(error) = self.elector.release().await {
            tracing::warn!(%error, "releasing the leader lease failed; it will expire");
        }
    }
}

/// Waits until this replica holds the Lease. `on_attempt` is told after each attempt whether
/// the API server answered (for readiness).
pub async fn acquire(
    client: kube::Client,
    config: LeaseConfig,
    on_attempt: impl Fn(bool) + Send + 'static,
) -> Leadership {
    let mut elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        config,
        observed: None,
    };
    loop {
        match elector.try_acquire_or_renew().await {
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
        let mut last_renewed = Instant::now();
        loop {
            tokio::time::sleep(renewer.config.retry_period).await;
            match renewer.try_acquire_or_renew().await {
                Ok(true) => last_renewed = Instant::now(),
                Ok(false) => {
                    tracing::error!("another replica holds the leader lease");
                    break;
                }
                Err(error) => tracing::warn!(%error, "renewing the leader lease failed"),
            }
            // Not renewed for a lease duration: another replica may hold it by now.
            if last_renewed.elapsed() >= renewer.config.lease_duration {
                tracing::error!("could not renew the leader lease in time");
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
            source,
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
