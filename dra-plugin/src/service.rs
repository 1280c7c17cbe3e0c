//! The DRA gRPC service the kubelet calls: NodePrepareResources / NodeUnprepareResources, in
//! both `v1` and `v1beta1`, over one [`Driver`].
//!
//! The library owns what every driver must get right, so the driver only says how to prepare
//! one claim:
//! - each claim is answered on its own: one bad claim never fails the others;
//! - preparing a claim that is already prepared answers from the checkpoint, without calling
//!   the driver again, so the CDI ids stay the same (the kubelet retries after restarts);
//! - a claim is written to the checkpoint before the kubelet hears it is prepared, and removed
//!   only after the driver undid it, so a plugin killed at any point still unprepares it;
//! - unpreparing a claim nobody prepared succeeds (the kubelet calls it for claims of pods
//!   that never started).

use crate::checkpoint::{Checkpoint, PreparedClaim, PreparedClaims, PreparedDevice};
use akri_proto::dra::{v1, v1beta1};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

/// A claim as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What a DRA driver does for one claim on this node.
#[tonic::async_trait]
pub trait Driver: Send + Sync + 'static {
    /// Prepares a claim that is not prepared yet: checks its allocation, writes what the
    /// container runtime needs (CDI specs) and says which devices, with which CDI ids, the
    /// containers get. An error fails this claim only; say what is wrong in words an operator
    /// understands, the kubelet shows it in the pod's events.
    async fn prepare(&self, claim: &ClaimRef) -> Result<PreparedClaim, String>;

    /// Undoes [`prepare`](Self::prepare). `prepared` is `None` when the checkpoint does not
    /// know the claim (never prepared, or the plugin died between writing files and
    /// recording them): clean up whatever a prepare could have left, by naming convention.
    async fn unprepare(
        &self,
        claim: &ClaimRef,
        prepared: Option<&PreparedClaim>,
    ) -> Result<(), String>;
}

/// Errors of setting the service up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::Error),
}

/// The kubelet-facing service of one driver: serve [`v1`](Self::v1) and
/// [`v1beta1`](Self::v1beta1) on the driver's socket.
pub struct DraService<D> {
    driver: Arc<D>,
    state: Arc<Mutex<State>>,
}

impl<D> Clone for DraService<D> {
    fn clone(&self) -> Self {
        DraService {
            driver: self.driver.clone(),
            state: self.state.clone(),
        }
    }
}

struct State {
    checkpoint: Checkpoint,
    claims: PreparedClaims,
}

impl<D: Driver> DraService<D> {
    /// Opens (or creates) the checkpoint at `checkpoint_path`. A corrupted checkpoint is an
    /// error: the plugin must not start and forget what it prepared.
    pub fn new(driver: D, checkpoint_path: &Path) -> Result<Self, Error> {
        let (checkpoint, claims) = Checkpoint::open(checkpoint_path)?;
        Ok(DraService {
            driver: Arc::new(driver),
            state: Arc::new(Mutex::new(State { checkpoint, claims })),
        })
    }

    /// The driver this service calls.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// Claims currently prepared on this node, by UID.
    pub async fn prepared(&self) -> PreparedClaims {
        self.state.lock().await.claims.clone()
    }

    /// Prepares claims concurrently; the answer per claim UID.
    pub async fn prepare_claims(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, String>> {
        let tasks = claims.into_iter().map(|claim| async move {
            let uid = claim.uid.clone();
            (uid, self.prepare_claim(claim).await)
        });
        futures::future::join_all(tasks).await.into_iter().collect()
    }

    async fn prepare_claim(&self, claim: ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        if claim.uid.is_empty() || claim.namespace.is_empty() || claim.name.is_empty() {
            return Err(format!("claim {claim:?} lacks a namespace, name or UID"));
        }
        if let Some(prepared) = self.state.lock().await.claims.get(&claim.uid) {
            return Ok(prepared.devices.clone());
        }
        let prepared = self.driver.prepare(&claim).await?;
        let devices = prepared.devices.clone();
        let mut state = self.state.lock().await;
        state.claims.insert(claim.uid.clone(), prepared);
        if let Err(error) = state.checkpoint.store(&state.claims) {
            // Not recorded means not prepared: undo, so nothing leaks.
            let prepared = state.claims.remove(&claim.uid);
            drop(state);
            let _ = self.driver.unprepare(&claim, prepared.as_ref()).await;
            return Err(format!("recording the prepared claim failed: {error}"));
        }
        tracing::info!(claim = %claim.name, namespace = %claim.namespace, uid = %claim.uid, devices = devices.len(), "prepared");
        Ok(devices)
    }

    /// Unprepares claims concurrently; the answer per claim UID.
    pub async fn unprepare_claims(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<(), String>> {
        let tasks = claims.into_iter().map(|claim| async move {
            let uid = claim.uid.clone();
            (uid, self.unprepare_claim(claim).await)
        });
        futures::future::join_all(tasks).await.into_iter().collect()
    }

    async fn unprepare_claim(&self, claim: ClaimRef) -> Result<(), String> {
        let prepared = self.state.lock().await.claims.get(&claim.uid).cloned();
        self.driver.unprepare(&claim, prepared.as_ref()).await?;
        if prepared.is_some() {
            let mut state = self.state.lock().await;
            state.claims.remove(&claim.uid);
            state
                .checkpoint
                .store(&state.claims)
                .map_err(|e| format!("recording the unprepared claim failed: {e}"))?;
            tracing::info!(claim = %claim.name, namespace = %claim.namespace, uid = %claim.uid, "unprepared");
        }
        Ok(())
    }

    /// The `v1.DRAPlugin` gRPC service.
    pub fn v1(&self) -> v1::dra_plugin_server::DraPluginServer<V1<D>> {
        v1::dra_plugin_server::DraPluginServer::new(V1(self.clone()))
    }

    /// The `v1beta1.DRAPlugin` gRPC service (kubelets before 1.34).
    pub fn v1beta1(&self) -> v1beta1::dra_plugin_server::DraPluginServer<V1beta1<D>> {
        v1beta1::dra_plugin_server::DraPluginServer::new(V1beta1(self.clone()))
    }
}

fn claim_ref(namespace: String, name: String, uid: String) -> ClaimRef {
    ClaimRef {
        namespace,
        name,
        uid,
    }
}

impl From<PreparedDevice> for v1::Device {
    fn from(d: PreparedDevice) -> Self {
        v1::Device {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
            share_id: d.share_id,
        }
    }
}

/// `v1beta1` predates consumable capacity: the same device without `share_id`.
impl From<PreparedDevice> for v1beta1::Device {
    fn from(d: PreparedDevice) -> Self {
        v1beta1::Device {
            request_names: d.request_names,
            pool_name: d.pool_name,
            device_name: d.device_name,
            cdi_device_ids: d.cdi_device_ids,
        }
    }
}

/// [`DraService`] as `v1.DRAPlugin`.
pub struct V1<D>(DraService<D>);

/// [`DraService`] as `v1beta1.DRAPlugin`.
pub struct V1beta1<D>(DraService<D>);

/// The two gRPC versions have the same messages in different packages: one implementation.
macro_rules! dra_plugin_version {
    ($wrapper:ident, $api:ident) => {
        #[tonic::async_trait]
        impl<D: Driver> $api::dra_plugin_server::DraPlugin for $wrapper<D> {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| claim_ref(c.namespace, c.name, c.uid))
                    .collect();
                let claims = self
                    .0
                    .prepare_claims(claims)
                    .await
                    .into_iter()
                    .map(|(uid, result)| {
                        let answer = match result {
                            Ok(devices) => $api::NodePrepareResourceResponse {
                                devices: devices.into_iter().map(Into::into).collect(),
                                error: String::new(),
                            },
                            Err(error) => $api::NodePrepareResourceResponse {
                                devices: vec![],
                                error,
                            },
                        };
                        (uid, answer)
                    })
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| claim_ref(c.namespace, c.name, c.uid))
                    .collect();
                let claims = self
                    .0
                    .unprepare_claims(claims)
                    .await
                    .into_iter()
                    .map(|(uid, result)| {
                        (
                            uid,
                            $api::NodeUnprepareResourceResponse {
                                error: result.err().unwrap_or_default(),
                            },
                        )
                    })
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

dra_plugin_version!(V1, v1);
dra_plugin_version!(V1beta1, v1beta1);
