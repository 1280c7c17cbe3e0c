//! The DRA gRPC service the kubelet calls: NodePrepareResources / NodeUnprepareResources, in
//! both `v1` and `v1beta1`, over one [`Driver`].
//!
//! The library owns what every driver must get right, so the driver only says how to prepare
//! one claim:
//! - each claim is answered on its own: one bad claim never fails the others, and a claim
//!   named twice in one call is done once (or refused, if the two names disagree);
//! - preparing a claim that is already prepared answers from the checkpoint, without calling
//!   the driver again, so the CDI ids stay the same (the kubelet retries after restarts); its
//!   CDI specs are rewritten from the checkpoint if they are missing or changed (a reboot
//!   empties the CDI directory, and the kubelet then prepares every claim again);
//! - claims are written to the checkpoint before the kubelet hears they are prepared (one
//!   store per call, however many claims it has), and removed only after the driver undid them,
//!   so a plugin killed at any point still unprepares them;
//! - prepare and unprepare of one claim never overlap, even from concurrent calls;
//! - at most [`MAX_CONCURRENT_CLAIMS`] claims of a call are with the driver at once;
//! - unpreparing a claim nobody prepared succeeds (the kubelet calls it for claims of pods
//!   that never started);
//! - the claim is read from the API server and checked before the driver sees it
//!   ([`crate::claim`]): the driver gets only a claim that is allocated to this node, with
//!   the kubelet's UID, and only its own results.

use crate::checkpoint::{Checkpoint, PreparedClaim, PreparedClaims, PreparedDevice, SetAside};
pub use crate::claim::{Claim, ClaimError, ClaimRef, ClaimSource};
use crate::metadata::MetadataWriter;
use futures::StreamExt;
use kubelet_proto::dra::{v1, v1beta1};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tonic::{Request, Response, Status};

/// How many claims of one call the driver works on at once: a kubelet may send thousands.
pub const MAX_CONCURRENT_CLAIMS: usize = 32;

/// What a DRA driver does for one claim on this node. Implement it with plain `async fn`s (no
/// macro): the futures they return must be `Send`, as the claims of a call are worked on
/// concurrently on the runtime's threads.
pub trait Driver: Send + Sync + 'static {
    /// What goes wrong in [`prepare`](Self::prepare) and [`unprepare`](Self::unprepare). Its
    /// text is what the kubelet shows in the pod's events: say what is wrong in words an
    /// operator understands.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Prepares a claim that is not prepared yet: writes what the container runtime needs
    /// (CDI specs) and says which CDI ids the containers get for each of the claim's results
    /// and which spec files it wrote; the library records the rest. The claim was read and
    /// checked by the library ([`Claim`]). An error fails this claim only.
    fn prepare(
        &self,
        claim: &Claim,
    ) -> impl Future<Output = Result<crate::claim::Prepared, Self::Error>> + Send;

    /// Undoes [`prepare`](Self::prepare). `prepared` is `None` when the checkpoint does not
    /// know the claim (never prepared, or the plugin died between writing files and
    /// recording them): clean up whatever a prepare could have left, by naming convention.
    /// The claim may no longer exist in the API server: this is never read from it.
    fn unprepare(
        &self,
        claim: &ClaimRef,
        prepared: Option<&PreparedClaim>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// An error of the plugin's background work, which no kubelet call returns
    /// ([`BackgroundError`](crate::BackgroundError)). The library has logged it and retries;
    /// a driver that wants to count it, report it or stop does that here (what upstream's Go
    /// helper calls `HandleError`). Called on the runtime's threads: return quickly. By
    /// default nothing more is done.
    fn background_error(&self, error: &crate::BackgroundError) {
        let _ = error;
    }
}

/// Errors of setting the service up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The checkpoint exists but cannot be read at all (a corrupt one is set aside instead).
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::Error),
}

/// Why one claim of a call was not prepared or unprepared: the text the kubelet gets.
#[derive(Debug, thiserror::Error)]
pub enum ClaimFailure {
    /// The claim lacks a namespace, name or UID.
    #[error("claim {0:?} lacks a namespace, name or UID")]
    Incomplete(ClaimRef),
    /// One UID named twice in one call, with different names: which one would be meant?
    #[error("claim UID {} is named twice in one call, as {first} and {second}: nothing done", first.uid)]
    NamedTwice {
        /// One name.
        first: ClaimRef,
        /// The other.
        second: Box<ClaimRef>,
    },
    /// The claim as read from the API server is not one to prepare here.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The driver refused or failed.
    #[error("{0}")]
    Driver(Box<dyn std::error::Error + Send + Sync>),
    /// The driver's answer did not have one list of CDI ids per allocated device.
    #[error("the driver answered {answered} lists of CDI ids for the claim's {results} devices")]
    Answer {
        /// The claim's results of this driver.
        results: usize,
        /// The lists of CDI ids the driver gave.
        answered: usize,
    },
    /// A CDI spec the driver wrote, or the checkpoint recorded, could not be read or rewritten.
    #[error("{what} the CDI spec {}: {cause}", path.display())]
    Spec {
        /// `reading back`, `reading`, `rewriting`.
        what: &'static str,
        /// The spec file.
        path: std::path::PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// The claim's device metadata could not be written or removed.
    #[error(transparent)]
    Metadata(crate::metadata::Error),
    /// The checkpoint shared with another process of the driver could not be locked or read
    /// (`DraService::shared`): nothing was done.
    #[error("the shared checkpoint: {0}")]
    Shared(Arc<SharedError>),
    /// Storing the checkpoint failed: the claim is not prepared (or still prepared).
    #[error("recording the {what} claim failed: {cause}")]
    Record {
        /// `prepared` or `unprepared`.
        what: &'static str,
        /// Why.
        cause: Arc<crate::checkpoint::Error>,
    },
}

/// Why the shared checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    /// Its lock file could not be opened or locked.
    #[error("locking {}: {cause}", path.display())]
    Lock {
        /// The lock file.
        path: std::path::PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// What the other process stored could not be read.
    #[error(transparent)]
    Read(#[from] crate::checkpoint::Error),
}

impl ClaimFailure {
    fn driver(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        ClaimFailure::Driver(Box::new(error))
    }
}

/// Who the service prepares claims for: the driver's name (only its results are prepared)
/// and the node it runs on (only claims allocated here are prepared).
#[derive(Clone, Debug)]
pub struct DriverOnNode {
    /// The DRA driver name.
    pub driver: String,
    /// This node's name.
    pub node: String,
}

/// The kubelet-facing service of one driver: serve [`v1`](Self::v1) and
/// `v1beta1` on the driver's socket.
pub struct DraService<D> {
    driver: Arc<D>,
    claims: Arc<dyn ClaimSource>,
    on: Arc<DriverOnNode>,
    state: Arc<Mutex<State>>,
    claim_locks: Arc<ClaimLocks>,
    set_aside: Option<Arc<SetAside>>,
    /// Ticks after each recorded change of the prepared claims.
    changed: Arc<tokio::sync::watch::Sender<()>>,
    /// The lock file of a checkpoint shared with another process ([`Self::shared`]).
    shared: Option<Arc<std::path::PathBuf>>,
    /// Writes each prepared claim's device metadata ([`Self::device_metadata`]).
    metadata: Option<Arc<MetadataWriter>>,
    /// Writes the claims' `status.devices` ([`Self::device_status`]).
    status: Option<crate::device_status::Writer>,
}

impl<D> Clone for DraService<D> {
    fn clone(&self) -> Self {
        DraService {
            driver: self.driver.clone(),
            claims: self.claims.clone(),
            on: self.on.clone(),
            state: self.state.clone(),
            claim_locks: self.claim_locks.clone(),
            set_aside: self.set_aside.clone(),
            changed: self.changed.clone(),
            shared: self.shared.clone(),
            metadata: self.metadata.clone(),
            status: self.status.clone(),
        }
    }
}

struct State {
    checkpoint: Checkpoint,
    claims: PreparedClaims,
}

/// What preparing one claim came to.
enum Outcome {
    /// Recorded before: answered from the checkpoint (specs healed if needed).
    Recorded(Vec<PreparedDevice>),
    /// Prepared by the driver now: to be recorded before anyone hears of it.
    Fresh(PreparedClaim),
}

impl<D: Driver> DraService<D> {
    /// The driver's hook for background errors.
    pub(crate) fn errors(&self) -> crate::background::Errors {
        crate::background::Errors::of(&self.driver)
    }

    /// The service of `driver`, reading claims from `source` (a [`kube::Client`]), with its
    /// checkpoint at `checkpoint_path`, which it opens or creates. A checkpoint that is
    /// corrupt is set aside (`Checkpoint::open_or_set_aside`; see
    /// [`set_aside`](Self::set_aside)); one that cannot be read at all is an error.
    ///
    /// [`Plugin::builder`](crate::Plugin::builder) does this and the
    /// rest; this is for serving the service some other way.
    pub fn new(
        driver: D,
        source: impl ClaimSource,
        on: DriverOnNode,
        checkpoint_path: &Path,
    ) -> Result<Self, Error> {
        let (checkpoint, claims, set_aside) = Checkpoint::open_or_set_aside(checkpoint_path)?;
        if let Some(set_aside) = &set_aside {
            tracing::error!(
                checkpoint = %checkpoint_path.display(),
                moved_to = %set_aside.moved_to.display(),
                reason = %set_aside.reason,
                "the checkpoint was unusable and has been set aside; starting without recorded claims"
            );
        }
        Ok(DraService {
            driver: Arc::new(driver),
            claims: Arc::new(source),
            on: Arc::new(on),
            state: Arc::new(Mutex::new(State { checkpoint, claims })),
            claim_locks: Arc::default(),
            set_aside: set_aside.map(Arc::new),
            changed: Arc::new(tokio::sync::watch::channel(()).0),
            shared: None,
            metadata: None,
            status: None,
        })
    }

    /// Shares the checkpoint with another process of the same driver on this node: the other
    /// plugin pod during a rolling update, which the kubelet may call as well (it may prepare
    /// a claim through one and unprepare it through the other). Each call then holds an
    /// exclusive lock on the file `lock` (created if missing) across both processes, and reads
    /// what the other stored before it acts, as upstream's helper serializes calls with
    /// `flock` in that case.
    pub(crate) fn shared(mut self, lock: std::path::PathBuf) -> Self {
        self.shared = Some(Arc::new(lock));
        self
    }

    /// Writes device metadata for every claim it prepares ([`crate::metadata`]): a file per
    /// request that the claim's containers read, from what the driver's
    /// [`Prepared::metadata`](crate::Prepared::metadata) says of each device.
    pub fn device_metadata(mut self, writer: MetadataWriter) -> Self {
        self.metadata = Some(Arc::new(writer));
        self
    }

    /// Writes the `status.devices` entries the driver gives with each claim it prepares
    /// ([`Prepared::status`](crate::Prepared::status)) through `writer`, and removes them when
    /// the claim is unprepared. What the checkpoint holds is asked of the writer at once: a
    /// status the process before had no time to apply is applied now, and one it applied is
    /// applied again unchanged, which changes nothing on the API server.
    ///
    /// # Panics
    ///
    /// If a call is being served: set it up before serving, as the builder does (asked later,
    /// a recorded status could overtake the unprepare that removed it).
    pub fn device_status(mut self, writer: crate::device_status::Writer) -> Self {
        {
            let state = self
                .state
                .try_lock()
                .expect("nothing else holds a new service's state");
            for claim in state.claims.values().filter(|c| !c.status.is_empty()) {
                let reference = claim_ref(
                    claim.namespace.clone(),
                    claim.name.clone(),
                    claim.uid.clone(),
                );
                writer.rewrite_recorded(&reference, claim.status.clone());
            }
        }
        self.status = Some(writer);
        self
    }

    /// With a shared checkpoint: takes its lock and reads it into memory. The lock is held
    /// until the returned file is dropped.
    async fn share(&self) -> Result<Option<std::fs::File>, Arc<SharedError>> {
        let Some(lock) = self.shared.clone() else {
            return Ok(None);
        };
        let path = self.state.lock().await.checkpoint.path().to_path_buf();
        let taken = tokio::task::spawn_blocking(move || {
            let locked = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&*lock)
                .and_then(|file| file.lock().map(|()| file));
            let file = locked.map_err(|cause| SharedError::Lock {
                path: lock.to_path_buf(),
                cause,
            })?;
            let (_, claims) = Checkpoint::open(path)?;
            Ok::<_, SharedError>((file, claims))
        })
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
        let (file, claims) = taken.map_err(Arc::new)?;
        self.state.lock().await.claims = claims;
        Ok(Some(file))
    }

    /// Changes after every recorded prepare or unprepare, once [`prepared`](Self::prepared)
    /// shows it: e.g. for a driver that keeps a vanished device published while a claim
    /// holds it ([`crate::vanished`]).
    pub fn prepared_changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// The corrupt checkpoint [`new`](Self::new) set aside, if it did: tell the operator.
    pub fn set_aside(&self) -> Option<&SetAside> {
        self.set_aside.as_deref()
    }

    /// The driver this service calls.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// Claims currently prepared on this node, by UID.
    pub async fn prepared(&self) -> PreparedClaims {
        let mut state = self.state.lock().await;
        if self.shared.is_some() {
            // The other process may have changed it; it stores atomically, so a read without
            // the lock sees one whole version.
            match Checkpoint::open(state.checkpoint.path()) {
                Ok((_, claims)) => state.claims = claims,
                Err(error) => tracing::warn!(%error, "reading the shared checkpoint failed"),
            }
        }
        state.claims.clone()
    }

    /// Prepares claims, at most [`MAX_CONCURRENT_CLAIMS`] at once; the answer per claim UID.
    #[tracing::instrument(name = "prepare_claims", skip_all, fields(driver = %self.on.driver, claims = claims.len()))]
    pub async fn prepare_claims(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, ClaimFailure>> {
        let _shared = match self.share().await {
            Ok(lock) => lock,
            Err(error) => return refuse_all(claims, &error),
        };
        let (refused, results, _locks) = self
            .each_claim(claims, |claim| async move {
                let result = self.prepare_claim(&claim).await;
                (claim, result)
            })
            .await;
        let mut answers: HashMap<_, _> = refused.into_iter().map(|(u, e)| (u, Err(e))).collect();

        let mut fresh = Vec::new();
        for (claim, result) in results {
            match result {
                Ok(Outcome::Recorded(devices)) => {
                    answers.insert(claim.uid, Ok(devices));
                }
                Ok(Outcome::Fresh(prepared)) => fresh.push((claim, prepared)),
                Err(error) => {
                    answers.insert(claim.uid, Err(error));
                }
            }
        }
        if fresh.is_empty() {
            return answers;
        }
        let mut state = self.state.lock().await;
        let previous: Vec<Option<PreparedClaim>> = fresh
            .iter()
            .map(|(claim, prepared)| state.claims.insert(claim.uid.clone(), prepared.clone()))
            .collect();
        let stored = store(&state.checkpoint, &state.claims).await;
        if stored.is_ok() {
            self.changed.send_replace(());
        }
        if let Err(error) = stored {
            // Not recorded means not prepared: memory goes back to what the disk has, and the
            // driver undoes, so nothing leaks.
            for ((claim, _), previous) in fresh.iter().zip(previous) {
                match previous {
                    Some(previous) => state.claims.insert(claim.uid.clone(), previous),
                    None => state.claims.remove(&claim.uid),
                };
            }
            drop(state);
            let error = Arc::new(error);
            for (claim, prepared) in fresh {
                let _ = self.driver.unprepare(&claim, Some(&prepared)).await;
                answers.insert(
                    claim.uid,
                    Err(ClaimFailure::Record {
                        what: "prepared",
                        cause: error.clone(),
                    }),
                );
            }
            return answers;
        }
        drop(state);
        for (claim, prepared) in fresh {
            // Recorded first: if this process dies before the writer applies it, the next
            // process finds it in the checkpoint.
            if let Some(writer) = &self.status
                && !prepared.status.is_empty()
            {
                writer.write(&claim, prepared.status);
            }
            tracing::info!(claim = %claim.name, namespace = %claim.namespace, uid = %claim.uid, devices = prepared.devices.len(), "prepared");
            answers.insert(claim.uid, Ok(prepared.devices));
        }
        answers
    }

    /// The common part of a call: each claim once ([`distinct`]; the refused ones with why),
    /// `work` on each under the claims' locks, at most [`MAX_CONCURRENT_CLAIMS`] at once. The
    /// locks come back with the results: hold them until the checkpoint is stored.
    async fn each_claim<T, F: Future<Output = (ClaimRef, T)>>(
        &self,
        claims: Vec<ClaimRef>,
        work: impl Fn(ClaimRef) -> F,
    ) -> (
        Vec<(String, ClaimFailure)>,
        Vec<(ClaimRef, T)>,
        Vec<OwnedMutexGuard<()>>,
    ) {
        let (claims, refused) = distinct(claims);
        let locks = self
            .claim_locks
            .lock(claims.iter().map(|c| c.uid.as_str()))
            .await;
        let results = futures::stream::iter(claims)
            .map(work)
            .buffer_unordered(MAX_CONCURRENT_CLAIMS)
            .collect()
            .await;
        (refused, results, locks)
    }

    #[tracing::instrument(name = "prepare_claim", skip_all, fields(claim = %claim, uid = %claim.uid))]
    async fn prepare_claim(&self, claim: &ClaimRef) -> Result<Outcome, ClaimFailure> {
        let recorded = self.state.lock().await.claims.get(&claim.uid).cloned();
        if let Some(recorded) = recorded {
            if heal_specs(&recorded)? {
                return Ok(Outcome::Recorded(recorded.devices));
            }
            // Recorded without spec content (an older checkpoint) and a spec is gone: only
            // the driver can write it again.
            tracing::info!(claim = %claim.name, namespace = %claim.namespace, uid = %claim.uid, "CDI spec missing; preparing again");
        }
        let mut checked = crate::claim::read_and_check(
            self.claims.as_ref(),
            claim,
            &self.on.driver,
            &self.on.node,
        )
        .await?;
        if let Some(writer) = &self.metadata {
            checked.metadata_mounts = writer.mounts(&checked);
        }
        let mut answer = (self.driver.prepare(&checked).await).map_err(ClaimFailure::driver)?;
        let metadata = std::mem::take(&mut answer.metadata);
        let mut prepared = match checked.record(answer) {
            Ok(prepared) => prepared,
            Err((results, answered)) => {
                // Its files are not known for sure: cleaned up by the driver's convention.
                let _ = self.driver.unprepare(claim, None).await;
                return Err(ClaimFailure::Answer { results, answered });
            }
        };
        if let Some(writer) = &self.metadata
            && let Err(error) = writer.write(&checked, &metadata, &mut prepared)
        {
            let _ = writer.remove(claim, Some(&prepared));
            let _ = self.driver.unprepare(claim, Some(&prepared)).await;
            return Err(ClaimFailure::Metadata(error));
        }
        for path in &prepared.cdi_spec_files {
            match std::fs::read_to_string(path) {
                Ok(content) => {
                    prepared.cdi_spec_contents.insert(path.clone(), content);
                }
                Err(cause) => {
                    let _ = self.driver.unprepare(claim, Some(&prepared)).await;
                    return Err(ClaimFailure::Spec {
                        what: "reading back",
                        path: path.clone(),
                        cause,
                    });
                }
            }
        }
        Ok(Outcome::Fresh(prepared))
    }

    /// Unprepares claims, at most [`MAX_CONCURRENT_CLAIMS`] at once; the answer per claim UID.
    #[tracing::instrument(name = "unprepare_claims", skip_all, fields(driver = %self.on.driver, claims = claims.len()))]
    pub async fn unprepare_claims(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<(), ClaimFailure>> {
        let _shared = match self.share().await {
            Ok(lock) => lock,
            Err(error) => return refuse_all(claims, &error),
        };
        let (refused, results, _locks) = self
            .each_claim(claims, |claim| async move {
                let prepared = self.state.lock().await.claims.get(&claim.uid).cloned();
                let result = self.driver.unprepare(&claim, prepared.as_ref()).await;
                let result = result.map_err(ClaimFailure::driver).and_then(|()| {
                    match (&self.metadata, &prepared) {
                        (Some(writer), prepared) => writer.remove(&claim, prepared.as_ref()),
                        (None, Some(prepared)) => crate::metadata::remove_recorded(prepared),
                        (None, None) => Ok(()),
                    }
                    .map_err(ClaimFailure::Metadata)
                });
                let result = result.map(|()| prepared.is_some());
                (claim, result)
            })
            .await;
        let mut answers: HashMap<_, _> = refused.into_iter().map(|(u, e)| (u, Err(e))).collect();

        let mut undone = Vec::new();
        for (claim, result) in results {
            match result {
                Ok(true) => undone.push(claim),
                Ok(false) => {
                    answers.insert(claim.uid, Ok(()));
                }
                Err(error) => {
                    answers.insert(claim.uid, Err(error));
                }
            }
        }
        if undone.is_empty() {
            return answers;
        }
        let mut state = self.state.lock().await;
        let removed: Vec<PreparedClaim> = undone
            .iter()
            .filter_map(|claim| state.claims.remove(&claim.uid))
            .collect();
        let removed_status: Vec<String> = (removed.iter())
            .filter(|claim| !claim.status.is_empty())
            .map(|claim| claim.uid.clone())
            .collect();
        let stored = store(&state.checkpoint, &state.claims)
            .await
            .map_err(Arc::new);
        if stored.is_ok() {
            self.changed.send_replace(());
        }
        if stored.is_err() {
            // The disk still has them: so must memory, or the kubelet's retry would find
            // nothing to record and a restart would bring them back.
            for claim in removed {
                state.claims.insert(claim.uid.clone(), claim);
            }
        }
        drop(state);
        if let (Ok(()), Some(writer)) = (&stored, &self.status) {
            // Unprepare waits for no API server either (the kubelet unprepares through
            // outages), and the claim is usually being deallocated, which drops them anyway.
            for claim in removed_status
                .iter()
                .filter_map(|uid| undone.iter().find(|c| &c.uid == uid))
            {
                writer.write(claim, Vec::new());
            }
        }
        for claim in undone {
            if stored.is_ok() {
                tracing::info!(claim = %claim.name, namespace = %claim.namespace, uid = %claim.uid, "unprepared");
            }
            let answer = stored.clone().map_err(|cause| ClaimFailure::Record {
                what: "unprepared",
                cause,
            });
            answers.insert(claim.uid, answer);
        }
        answers
    }

    /// The `v1.DRAPlugin` gRPC service.
    pub fn v1(&self) -> v1::dra_plugin_server::DraPluginServer<V1<D>> {
        v1::dra_plugin_server::DraPluginServer::new(V1(self.clone()))
    }

    /// The `v1beta1.DRAPlugin` gRPC service (kubelets before 1.34).
    pub(crate) fn v1beta1(&self) -> v1beta1::dra_plugin_server::DraPluginServer<V1beta1<D>> {
        v1beta1::dra_plugin_server::DraPluginServer::new(V1beta1(self.clone()))
    }
}

/// The claims of one call, each UID once, and the UIDs refused: a claim without a namespace,
/// name or UID, or one UID named twice with different names (which one would be meant?).
fn distinct(claims: Vec<ClaimRef>) -> (Vec<ClaimRef>, Vec<(String, ClaimFailure)>) {
    let mut by_uid: BTreeMap<String, Vec<ClaimRef>> = BTreeMap::new();
    for claim in claims {
        by_uid.entry(claim.uid.clone()).or_default().push(claim);
    }
    let mut distinct = Vec::new();
    let mut refused = Vec::new();
    for (uid, mut named) in by_uid {
        let claim = named.swap_remove(0);
        if uid.is_empty() || claim.namespace.is_empty() || claim.name.is_empty() {
            refused.push((uid, ClaimFailure::Incomplete(claim)));
        } else if let Some(other) = named.iter().find(|other| **other != claim) {
            refused.push((
                uid.clone(),
                ClaimFailure::NamedTwice {
                    first: claim,
                    second: Box::new(other.clone()),
                },
            ));
        } else {
            distinct.push(claim);
        }
    }
    (distinct, refused)
}

/// Rewrites each recorded CDI spec of `prepared` that is missing or differs from what prepare
/// wrote. `Ok(false)`: a spec is missing and its content was not recorded.
fn heal_specs(prepared: &PreparedClaim) -> Result<bool, ClaimFailure> {
    let failed = |what, path: &Path| {
        let path = path.to_path_buf();
        move |cause| ClaimFailure::Spec { what, path, cause }
    };
    for path in &prepared.cdi_spec_files {
        let on_disk = match std::fs::read_to_string(path) {
            Ok(content) => Some(content),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(failed("reading", path)(e)),
        };
        let Some(recorded) = prepared.cdi_spec_contents.get(path) else {
            if on_disk.is_none() {
                return Ok(false);
            }
            continue;
        };
        if on_disk.as_ref() == Some(recorded) {
            continue;
        }
        tracing::warn!(uid = %prepared.uid, spec = %path.display(), missing = on_disk.is_none(), "rewriting the claim's CDI spec from the checkpoint");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(failed("creating the directory of", path))?;
        }
        node_io::files::write_replacing(path, recorded.as_bytes(), crate::cdi::SPEC_FILE_MODE)
            .map_err(failed("rewriting", path))?;
    }
    for file in &prepared.metadata_files {
        let on_disk = std::fs::read_to_string(&file.path).ok();
        if on_disk.as_ref() != Some(&file.content) {
            tracing::warn!(uid = %prepared.uid, file = %file.path.display(), "rewriting the claim's device metadata from the checkpoint");
            crate::metadata::write(file).map_err(ClaimFailure::Metadata)?;
        }
    }
    Ok(true)
}

/// One lock per claim UID, so prepare and unprepare of a claim never overlap.
#[derive(Default)]
struct ClaimLocks(std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>);

impl ClaimLocks {
    /// Locks every UID, in sorted order (two calls sharing claims cannot deadlock).
    async fn lock<'a>(&self, uids: impl Iterator<Item = &'a str>) -> Vec<OwnedMutexGuard<()>> {
        let mut uids: Vec<&str> = uids.collect();
        uids.sort_unstable();
        // A UID twice would wait for itself forever.
        uids.dedup();
        let locks: Vec<Arc<Mutex<()>>> = {
            let mut locks = self.0.lock().expect("claim locks");
            // Forget locks nobody holds or waits for, so the map does not grow forever.
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            uids.iter()
                .map(|uid| locks.entry(uid.to_string()).or_default().clone())
                .collect()
        };
        let mut guards = Vec::with_capacity(locks.len());
        for lock in locks {
            guards.push(lock.lock_owned().await);
        }
        guards
    }
}

/// Every claim of a call refused because the shared checkpoint could not be used.
fn refuse_all<T>(
    claims: Vec<ClaimRef>,
    error: &Arc<SharedError>,
) -> HashMap<String, Result<T, ClaimFailure>> {
    tracing::error!(%error, "the shared checkpoint is unusable; the call's claims are refused");
    (claims.into_iter())
        .map(|claim| (claim.uid, Err(ClaimFailure::Shared(error.clone()))))
        .collect()
}

/// Stores the checkpoint on a blocking thread: its fsyncs take milliseconds, during which an
/// async worker would serve nothing else (health streams, other calls).
async fn store(
    checkpoint: &Checkpoint,
    claims: &PreparedClaims,
) -> Result<(), crate::checkpoint::Error> {
    // Encoded here, so that only the bytes go to the blocking thread, which waits for fsync.
    let bytes = checkpoint.encode(claims)?;
    let checkpoint = checkpoint.clone();
    let path = checkpoint.path().to_path_buf();
    tokio::task::spawn_blocking(move || checkpoint.write(&bytes))
        .await
        .unwrap_or_else(|joined| {
            Err(crate::checkpoint::Error::Write {
                path,
                cause: std::io::Error::other(joined),
            })
        })
}

fn claim_ref(namespace: String, name: String, uid: String) -> ClaimRef {
    ClaimRef {
        namespace,
        name,
        uid,
    }
}

/// The request a result's request name belongs to: `req/sub`, a subrequest of a
/// `firstAvailable` list, belongs to `req`. Containers name the request, and the kubelet
/// matches them against the names a prepare reports, so it is told base names (as upstream's
/// kubelet-plugin helper does); a driver may record either form.
pub fn base_request_name(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

fn base_request_names(names: Vec<String>) -> Vec<String> {
    names
        .iter()
        .map(|n| base_request_name(n).to_string())
        .collect()
}

impl From<PreparedDevice> for v1::Device {
    fn from(d: PreparedDevice) -> Self {
        v1::Device {
            request_names: base_request_names(d.request_names),
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
            request_names: base_request_names(d.request_names),
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
                                error: error.to_string(),
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
                                error: result.err().map(|e| e.to_string()).unwrap_or_default(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelet_is_told_base_request_names() {
        let device = PreparedDevice {
            request_names: vec!["echo/any".into(), "plain".into()],
            pool_name: "pool".into(),
            device_name: "dev".into(),
            cdi_device_ids: vec![],
            share_id: None,
        };
        assert_eq!(
            v1::Device::from(device.clone()).request_names,
            ["echo", "plain"]
        );
        assert_eq!(
            v1beta1::Device::from(device).request_names,
            ["echo", "plain"]
        );
    }
}
