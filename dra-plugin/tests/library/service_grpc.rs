//! The DRA service over raw gRPC, as a kubelet (or a broken client) can call it: duplicate
//! and empty UIDs, a batch of 10,000 claims, prepare racing unprepare of one claim, and a
//! reboot that wiped the CDI directory.
//!
//! The driver here is a small one that writes a CDI spec per claim and needs no cluster: its
//! claims come from [`AllocatedClaims`], which answers every read with a claim allocated to
//! it. What is under test is the service around it (the kubelet-facing contract); reading
//! claims from a real API server, and the kubelet's own DRA manager, are the other suites'.

use dra_plugin::Prepared;
use dra_plugin::cdi::{CdiDevice, CdiRoot};
use dra_plugin::checkpoint::PreparedClaim;
use dra_plugin::metadata::{DeviceMetadata, MetadataWriter, Version};
use dra_plugin::service::{
    Claim, ClaimRef, ClaimSource, DraService, Driver, DriverOnNode, MAX_CONCURRENT_CLAIMS,
};
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim};
use kubelet_proto::dra::v1;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Longer than any call here takes (10,000 claims take seconds).
const ANSWER_WITHIN: Duration = Duration::from_secs(120);

/// Prepares every claim with one device `dev`, after `delay`; records what it sees.
struct SpecDriver {
    cdi: CdiRoot,
    delay: Duration,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    prepares: AtomicUsize,
    /// Claim UIDs currently inside prepare or unprepare: two at once is a failure.
    busy: Mutex<BTreeMap<String, &'static str>>,
    overlaps: AtomicUsize,
    /// Writes its spec with [`Claim::write_cdi_spec`], device metadata mounts included.
    one_spec: bool,
}

impl SpecDriver {
    fn new(dir: &Path, delay: Duration) -> Self {
        SpecDriver {
            cdi: CdiRoot::new(dir.join("cdi"), "example.com").unwrap(),
            delay,
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
            prepares: AtomicUsize::new(0),
            busy: Mutex::default(),
            overlaps: AtomicUsize::new(0),
            one_spec: false,
        }
    }

    async fn work(&self, uid: &str, what: &'static str) {
        if self.busy.lock().unwrap().insert(uid.into(), what).is_some() {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.busy.lock().unwrap().remove(uid);
    }
}

const DRIVER: &str = "gadget.example.com";
const NODE: &str = "node";

/// Every claim read is there, with the UID asked for, allocated one device of [`DRIVER`].
struct AllocatedClaims;

#[tonic::async_trait]
impl ClaimSource for AllocatedClaims {
    async fn read(&self, claim: &ClaimRef) -> Result<ResourceClaim, kube::Error> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": { "namespace": claim.namespace, "name": claim.name, "uid": claim.uid },
            "spec": {},
            "status": { "allocation": { "devices": { "results": [
                { "request": "r", "driver": DRIVER, "pool": NODE, "device": "dev" },
            ] } } },
        }))
        .expect("a valid claim"))
    }
}

fn service(driver: SpecDriver, checkpoint: &Path) -> DraService<SpecDriver> {
    let on = DriverOnNode {
        driver: DRIVER.into(),
        node: NODE.into(),
    };
    DraService::new(driver, AllocatedClaims, on, checkpoint).unwrap()
}

impl Driver for SpecDriver {
    type Error = dra_plugin::cdi::Error;

    async fn prepare(&self, checked: &Claim) -> Result<Prepared, Self::Error> {
        let claim = &checked.reference;
        self.work(&claim.uid, "prepare").await;
        self.prepares.fetch_add(1, Ordering::SeqCst);
        let device = CdiDevice {
            name: "dev".into(),
            env: vec![("CLAIM".into(), claim.name.clone())],
            ..CdiDevice::default()
        };
        let spec = match self.one_spec {
            true => checked.write_cdi_spec(&self.cdi, "gadget", vec![device])?,
            false => self.cdi.write_claim_spec("gadget", &claim.uid, &[device])?,
        };
        // What the device metadata file shows, where the service writes one.
        let model = DeviceAttribute {
            string: Some("gadget-2".into()),
            ..DeviceAttribute::default()
        };
        Ok(Prepared {
            metadata: vec![DeviceMetadata {
                attributes: [("model".to_string(), model)].into(),
                network_data: None,
            }],
            ..Prepared::one_spec(spec)
        })
    }

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        _: Option<&PreparedClaim>,
    ) -> Result<(), Self::Error> {
        self.work(&claim.uid, "unprepare").await;
        let path = self.cdi.spec_path("gadget", &claim.uid)?;
        dra_plugin::cdi::remove_claim_spec(&path)
    }
}

/// The service on a Unix socket, and a raw gRPC client of it.
struct Served {
    service: DraService<SpecDriver>,
    client: v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    _server: tokio::task::JoinHandle<()>,
}

async fn serve(dir: &Path, delay: Duration) -> Served {
    serve_service(dir, service(SpecDriver::new(dir, delay), &checkpoint(dir))).await
}

async fn serve_service(dir: &Path, service: DraService<SpecDriver>) -> Served {
    let socket = dir.join(format!("dra-{}.sock", rand_suffix()));
    let listener = dra_plugin::authority::bind(&socket, dra_plugin::authority::OWNER_ONLY).unwrap();
    let router = tonic::transport::Server::builder().add_service(service.v1());
    let server = tokio::spawn(async move {
        router
            .serve_with_incoming(dra_plugin::authority::incoming(listener))
            .await
            .unwrap();
    });
    let channel = dra_plugin::authority::connect(&socket).await.unwrap();
    Served {
        service,
        client: v1::dra_plugin_client::DraPluginClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20),
        _server: server,
    }
}

fn rand_suffix() -> u64 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::SeqCst) as u64
}

fn checkpoint(dir: &Path) -> PathBuf {
    dir.join("checkpoint.json")
}

fn claim(namespace: &str, name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

async fn prepare(
    served: &Served,
    claims: Vec<v1::Claim>,
) -> std::collections::HashMap<String, v1::NodePrepareResourceResponse> {
    let mut client = served.client.clone();
    answered(client.node_prepare_resources(v1::NodePrepareResourcesRequest { claims }))
        .await
        .claims
}

async fn unprepare(
    served: &Served,
    claims: Vec<v1::Claim>,
) -> std::collections::HashMap<String, v1::NodeUnprepareResourceResponse> {
    let mut client = served.client.clone();
    answered(client.node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims }))
        .await
        .claims
}

/// The call's answer, within `ANSWER_WITHIN` (a hang is a failure, not a stuck test).
async fn answered<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> T {
    tokio::time::timeout(ANSWER_WITHIN, call)
        .await
        .expect("the call answers (a hang is a failure, not a stuck test)")
        .unwrap()
        .into_inner()
}

/// The spans a test's thread saw opened, each as `name field=value ...`.
#[derive(Clone, Default)]
struct Spans(std::sync::Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={value:?}", field.name()));
            }
        }
        let mut fields = Fields(attrs.metadata().name().to_string());
        attrs.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }
}

/// The README's promise: a `tracing` span per call (driver, number of claims) and per claim
/// prepared, so a driver's own logs in `prepare` say which claim they are about.
#[tokio::test]
async fn each_call_and_each_claim_prepared_has_a_span() {
    use tracing_subscriber::layer::SubscriberExt;
    // A global subscriber, not a scoped one: a callsite another test's thread registers
    // while a scoped subscriber is being set up keeps "no interest" for good (tracing-core
    // caches it per callsite), and this test then missed `prepare_claims` about one run in two.
    static SPANS: std::sync::OnceLock<Spans> = std::sync::OnceLock::new();
    let spans = SPANS.get_or_init(|| {
        let spans = Spans::default();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(spans.clone()))
            .expect("the only global subscriber of this test binary");
        spans
    });
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path(), Duration::ZERO).await;
    prepare(
        &served,
        vec![
            claim("spans", "a", "uid-span-a"),
            claim("spans", "b", "uid-span-b"),
        ],
    )
    .await;
    unprepare(&served, vec![claim("spans", "a", "uid-span-a")]).await;
    let spans = spans.0.lock().unwrap().clone();
    for expected in [
        format!("prepare_claims driver={DRIVER} claims=2"),
        "prepare_claim claim=spans/a uid=uid-span-a".to_string(),
        "prepare_claim claim=spans/b uid=uid-span-b".to_string(),
        format!("unprepare_claims driver={DRIVER} claims=1"),
    ] {
        assert!(spans.contains(&expected), "{expected:?} not in {spans:#?}");
    }
}

#[tokio::test]
async fn a_uid_named_twice_is_done_once_or_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path(), Duration::ZERO).await;

    // The same claim twice: prepared once, one answer.
    let same = prepare(
        &served,
        vec![claim("a", "x", "uid-x"), claim("a", "x", "uid-x")],
    )
    .await;
    assert_eq!(same.len(), 1);
    assert_eq!(same["uid-x"].error, "");
    assert_eq!(served.service.driver().prepares.load(Ordering::SeqCst), 1);

    // One UID under two names: which is meant? Nothing is done and the answer says so.
    let twice = prepare(
        &served,
        vec![
            claim("a", "y", "uid-y"),
            claim("b", "y", "uid-y"),
            claim("a", "z", "uid-z"),
        ],
    )
    .await;
    assert!(
        twice["uid-y"].error.contains("named twice"),
        "{:?}",
        twice["uid-y"]
    );
    assert_eq!(
        twice["uid-z"].error, "",
        "the other claim of the call is prepared"
    );
    let prepared = served.service.prepared().await;
    assert!(
        !prepared.contains_key("uid-y"),
        "a refused claim is not left prepared"
    );
    assert!(prepared.contains_key("uid-z"));

    // Unprepare with an empty UID fails that claim only.
    let answers = unprepare(&served, vec![claim("a", "x", ""), claim("a", "z", "uid-z")]).await;
    assert!(answers[""].error.contains("lacks"), "{:?}", answers[""]);
    assert_eq!(answers["uid-z"].error, "");
    assert!(!served.service.prepared().await.contains_key("uid-z"));
    assert!(served.service.prepared().await.contains_key("uid-x"));
}

#[tokio::test]
async fn ten_thousand_claims_in_one_call_with_bounded_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path(), Duration::from_millis(1)).await;
    let claims: Vec<_> = (0..10_000)
        .map(|i| claim("batch", &format!("c{i}"), &format!("uid-{i:05}")))
        .collect();
    let answers = prepare(&served, claims.clone()).await;
    assert_eq!(answers.len(), 10_000);
    assert!(
        answers
            .values()
            .all(|a| a.error.is_empty() && a.devices.len() == 1)
    );
    let driver = served.service.driver();
    let most = driver.most_in_flight.load(Ordering::SeqCst);
    assert!(
        most <= MAX_CONCURRENT_CLAIMS,
        "{most} claims were with the driver at once"
    );
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(checkpoint(dir.path())).unwrap()).unwrap();
    assert_eq!(recorded["claims"].as_object().unwrap().len(), 10_000);

    let answers = unprepare(&served, claims).await;
    assert!(answers.values().all(|a| a.error.is_empty()));
    assert!(served.service.prepared().await.is_empty());
    assert_eq!(
        std::fs::read_dir(dir.path().join("cdi")).unwrap().count(),
        0,
        "every CDI spec is gone"
    );
}

#[tokio::test]
async fn prepare_and_unprepare_of_one_claim_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path(), Duration::from_millis(5)).await;
    for round in 0..20 {
        let uid = format!("uid-race-{round}");
        let c = claim("race", "c", &uid);
        let (prepared, unprepared) = tokio::join!(
            prepare(&served, vec![c.clone()]),
            unprepare(&served, vec![c.clone()])
        );
        assert_eq!(prepared[&uid].error, "");
        assert_eq!(unprepared[&uid].error, "");
        // Whichever ran last decides; the checkpoint and the CDI directory must agree.
        let recorded = served.service.prepared().await.contains_key(&uid);
        let spec = dir
            .path()
            .join(format!("cdi/example.com-gadget-{uid}.json"));
        assert_eq!(
            recorded,
            spec.exists(),
            "round {round}: checkpoint and CDI spec disagree"
        );
        unprepare(&served, vec![c]).await;
        assert!(!spec.exists(), "round {round}: nothing leaks");
    }
    assert_eq!(served.service.driver().overlaps.load(Ordering::SeqCst), 0);
}

/// A reboot empties the CDI directory (a tmpfs) and keeps the checkpoint (on disk); the
/// kubelet then prepares every claim again. The spec must come back, the same.
#[tokio::test]
async fn prepare_again_rewrites_a_spec_the_reboot_wiped() {
    let dir = tempfile::tempdir().unwrap();
    let served = serve(dir.path(), Duration::ZERO).await;
    let first = prepare(&served, vec![claim("r", "c", "uid-reboot")]).await;
    let ids = first["uid-reboot"].devices[0].cdi_device_ids.clone();
    let spec = dir.path().join("cdi/example.com-gadget-uid-reboot.json");
    let content = std::fs::read(&spec).unwrap();
    drop(served);

    std::fs::remove_dir_all(dir.path().join("cdi")).unwrap();
    let served = serve(dir.path(), Duration::ZERO).await;
    let again = prepare(&served, vec![claim("r", "c", "uid-reboot")]).await;
    assert_eq!(again["uid-reboot"].devices[0].cdi_device_ids, ids);
    assert_eq!(
        std::fs::read(&spec).unwrap(),
        content,
        "the spec is back, unchanged"
    );
    assert_eq!(
        served.service.driver().prepares.load(Ordering::SeqCst),
        0,
        "rewritten from the checkpoint, not prepared anew"
    );

    // A spec someone changed is put back too.
    std::fs::write(&spec, b"{}").unwrap();
    prepare(&served, vec![claim("r", "c", "uid-reboot")]).await;
    assert_eq!(std::fs::read(&spec).unwrap(), content);
}

/// A checkpoint that cannot be written fails the call, and memory keeps matching the disk:
/// the kubelet's retry does the work again instead of finding it done.
#[tokio::test]
async fn a_failed_checkpoint_store_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let service = service(
        SpecDriver::new(dir.path(), Duration::ZERO),
        &state.join("checkpoint.json"),
    );
    let claim = ClaimRef {
        namespace: "s".into(),
        name: "c".into(),
        uid: "uid-store".into(),
    };
    assert!(service.prepare_claims(vec![claim.clone()]).await["uid-store"].is_ok());

    // The state directory becomes a file: no store can succeed (root ignores modes).
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::write(&state, b"").unwrap();
    let answer = service.unprepare_claims(vec![claim.clone()]).await;
    assert!(answer["uid-store"].is_err(), "{answer:?}");
    assert!(
        service.prepared().await.contains_key("uid-store"),
        "still recorded, as on disk"
    );
    let other = ClaimRef {
        uid: "uid-new".into(),
        ..claim.clone()
    };
    assert!(service.prepare_claims(vec![other]).await["uid-new"].is_err());
    assert!(!service.prepared().await.contains_key("uid-new"));

    // Writable again: the retry records the unprepare.
    std::fs::remove_file(&state).unwrap();
    std::fs::create_dir_all(&state).unwrap();
    assert!(service.unprepare_claims(vec![claim]).await["uid-store"].is_ok());
    assert!(service.prepared().await.is_empty());
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("checkpoint.json")).unwrap()).unwrap();
    assert!(recorded["claims"].as_object().unwrap().is_empty());
}

/// The service writing device metadata under `dir` (both versions); its driver writes its spec
/// with `Claim::write_cdi_spec` if `one_spec`.
fn metadata_service(dir: &Path, one_spec: bool) -> DraService<SpecDriver> {
    let writer = MetadataWriter::new(
        DRIVER,
        &dir.join("plugin"),
        &dir.join("cdi"),
        [Version::V1alpha1, Version::V1beta1],
    )
    .unwrap();
    let mut driver = SpecDriver::new(dir, Duration::ZERO);
    driver.one_spec = one_spec;
    service(driver, &checkpoint(dir)).device_metadata(writer)
}

/// Device metadata (KEP-5304): the answer's first device of each request carries the CDI id
/// that mounts the request's file, which holds the claim, the request and each device with
/// the driver's attributes, newest version first; a reboot that wiped the CDI directory gets
/// it back from the checkpoint, and unprepare takes everything away. Without it, the answer
/// is the driver's alone.
#[tokio::test]
async fn device_metadata_is_mounted_healed_after_a_reboot_and_removed_with_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    let plain = serve(dir.path(), Duration::ZERO).await;
    let answer = prepare(&plain, vec![claim("r", "c", "uid-plain")]).await;
    assert_eq!(answer["uid-plain"].devices[0].cdi_device_ids.len(), 1);
    assert!(!dir.path().join("plugin").exists(), "no metadata written");
    drop(plain);

    let with_metadata = || metadata_service(dir.path(), false);
    let served = serve_service(dir.path(), with_metadata()).await;
    let answer = prepare(&served, vec![claim("r", "c", "uid-meta")]).await;
    let ids = answer["uid-meta"].devices[0].cdi_device_ids.clone();
    assert_eq!(
        ids,
        [
            "example.com/gadget=uid-meta-dev",
            "gadget.example.com/metadata=uid-meta-r"
        ],
        "{answer:?}"
    );

    let file = dir
        .path()
        .join("plugin/dra-device-metadata/uid-meta.r.json");
    let content = std::fs::read_to_string(&file).unwrap();
    let objects: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&content)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    let versions: Vec<&str> = objects
        .iter()
        .map(|o| o["apiVersion"].as_str().unwrap())
        .collect();
    assert_eq!(
        versions,
        [
            "metadata.resource.k8s.io/v1beta1",
            "metadata.resource.k8s.io/v1alpha1"
        ],
        "newest first"
    );
    assert_eq!(
        objects[0],
        serde_json::json!({
            "kind": "DeviceMetadata",
            "apiVersion": "metadata.resource.k8s.io/v1beta1",
            "metadata": { "name": "c", "namespace": "r", "uid": "uid-meta", "generation": 1 },
            "requests": [{ "name": "r", "devices": [{
                "driver": DRIVER, "pool": NODE, "name": "dev",
                "attributes": { "model": { "string": "gadget-2" } },
            }] }],
        })
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "containers of any user read it");
    let spec_path = dir
        .path()
        .join("cdi/gadget.example.com-metadata-uid-meta.json");
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"][0],
        serde_json::json!({
            "hostPath": file.to_str().unwrap(),
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/gadget.example.com-metadata.json",
            "options": ["bind", "ro"],
        })
    );
    let spec_content = std::fs::read(&spec_path).unwrap();
    drop(served);

    // A reboot: the CDI directory is a tmpfs.
    std::fs::remove_dir_all(dir.path().join("cdi")).unwrap();
    let served = serve_service(dir.path(), with_metadata()).await;
    let again = prepare(&served, vec![claim("r", "c", "uid-meta")]).await;
    assert_eq!(again["uid-meta"].devices[0].cdi_device_ids, ids);
    assert_eq!(std::fs::read(&spec_path).unwrap(), spec_content, "healed");
    assert_eq!(served.service.driver().prepares.load(Ordering::SeqCst), 0);

    let undone = unprepare(&served, vec![claim("r", "c", "uid-meta")]).await;
    assert_eq!(undone["uid-meta"].error, "");
    assert!(!spec_path.exists(), "the metadata spec is gone");
    assert!(!file.exists(), "the claim's metadata file is gone");
    let left: Vec<_> = std::fs::read_dir(dir.path().join("plugin/dra-device-metadata"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "nothing else was made: {left:?}");
}

/// A driver that writes its spec with `Claim::write_cdi_spec` gets the metadata mounts in it:
/// one spec file per claim, no second one from the library; healed and removed as before.
#[tokio::test]
async fn device_metadata_in_the_drivers_own_spec_needs_no_second_spec() {
    let dir = tempfile::tempdir().unwrap();
    let with_metadata = || metadata_service(dir.path(), true);
    let served = serve_service(dir.path(), with_metadata()).await;
    let answer = prepare(&served, vec![claim("r", "c", "uid-one")]).await;
    let ids = answer["uid-one"].devices[0].cdi_device_ids.clone();
    assert_eq!(
        ids,
        [
            "example.com/gadget=uid-one-dev",
            "example.com/gadget=uid-one-r.metadata"
        ],
        "{answer:?}"
    );
    let specs = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.path().join("cdi"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        specs(),
        ["example.com-gadget-uid-one.json"],
        "one spec file"
    );
    let spec_path = dir.path().join("cdi/example.com-gadget-uid-one.json");
    let spec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&spec_path).unwrap()).unwrap();
    let file = dir.path().join("plugin/dra-device-metadata/uid-one.r.json");
    assert_eq!(spec["devices"][1]["name"], "uid-one-r.metadata");
    assert_eq!(
        spec["devices"][1]["containerEdits"]["mounts"][0],
        serde_json::json!({
            "hostPath": file.to_str().unwrap(),
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/gadget.example.com-metadata.json",
            "options": ["bind", "ro"],
        })
    );
    assert!(
        std::fs::read_to_string(&file).unwrap().contains("gadget-2"),
        "the file holds the driver's attributes"
    );
    let spec_content = std::fs::read(&spec_path).unwrap();
    drop(served);

    // A reboot wipes the CDI directory and the metadata file; both come back unchanged.
    std::fs::remove_dir_all(dir.path().join("cdi")).unwrap();
    std::fs::remove_file(&file).unwrap();
    let served = serve_service(dir.path(), with_metadata()).await;
    let again = prepare(&served, vec![claim("r", "c", "uid-one")]).await;
    assert_eq!(again["uid-one"].devices[0].cdi_device_ids, ids);
    assert_eq!(std::fs::read(&spec_path).unwrap(), spec_content, "healed");
    assert!(file.exists(), "the metadata file is healed too");
    assert_eq!(served.service.driver().prepares.load(Ordering::SeqCst), 0);

    let undone = unprepare(&served, vec![claim("r", "c", "uid-one")]).await;
    assert_eq!(undone["uid-one"].error, "");
    assert!(specs().is_empty(), "no spec left: {:?}", specs());
    assert!(!file.exists(), "the claim's metadata file is gone");
}
