//! A claim's `status.devices` written by two drivers against a real kube-apiserver: each
//! driver's apply changes its own entries only.

use akri_testing::{ControlPlane, from_json};
use dra_plugin::device_status::{self, Claim, DeviceStatus};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The claim's `status.devices` as `(driver, device, data)`, sorted.
async fn entries(
    claims: &Api<ResourceClaim>,
    name: &str,
) -> Vec<(String, String, serde_json::Value)> {
    let claim = claims.get(name).await.unwrap();
    let mut entries: Vec<_> = claim
        .status
        .and_then(|s| s.devices)
        .unwrap_or_default()
        .into_iter()
        .map(|d| (d.driver, d.device, d.data.map(|d| d.0).unwrap_or_default()))
        .collect();
    entries.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    entries
}

/// Claim `name` with one request, allocated device `dev` of `driver` as the scheduler would;
/// its reference and the allocated claim's resourceVersion.
async fn allocated_claim(
    claims: &Api<ResourceClaim>,
    name: &str,
    driver: &str,
) -> (dra_plugin::ClaimRef, String) {
    let claim: ResourceClaim = from_json(json!({
        "metadata": { "name": name },
        "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "any" } }] } },
    }));
    let created = claims.create(&PostParams::default(), &claim).await.unwrap();
    let allocation = json!({ "status": { "allocation": { "devices": { "results": [
        { "request": "r", "driver": driver, "pool": "pool", "device": "dev" },
    ] } } } });
    let allocated = claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&allocation))
        .await
        .unwrap();
    let reference = dra_plugin::ClaimRef {
        namespace: created.metadata.namespace.unwrap(),
        name: name.to_string(),
        uid: created.metadata.uid.unwrap(),
    };
    (reference, allocated.metadata.resource_version.unwrap())
}

#[tokio::test]
async fn each_driver_owns_only_its_entries_in_a_shared_claim() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("status").await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let (a, b) = ("a.status.example.com", "b.status.example.com");

    // A claim with one device of each driver, allocated as the scheduler would.
    let claim: ResourceClaim = from_json(json!({
        "metadata": { "name": "shared" },
        "spec": { "devices": { "requests": [
            { "name": "ra", "exactly": { "deviceClassName": "any" } },
            { "name": "rb", "exactly": { "deviceClassName": "any" } },
        ] } },
    }));
    let uid = claims
        .create(&PostParams::default(), &claim)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let allocation = json!({ "status": { "allocation": { "devices": { "results": [
        { "request": "ra", "driver": a, "pool": "pool", "device": "dev-a" },
        { "request": "rb", "driver": b, "pool": "pool", "device": "dev-b" },
    ] } } } });
    claims
        .patch_status(
            "shared",
            &PatchParams::default(),
            &Patch::Merge(&allocation),
        )
        .await
        .unwrap();
    let target = Claim {
        namespace: &ns,
        name: "shared",
        uid: &uid,
    };
    let status = |device: &str, data: serde_json::Value| DeviceStatus {
        pool: "pool".into(),
        device: device.into(),
        data: Some(data),
        ..DeviceStatus::default()
    };

    device_status::apply(&client, target, a, &[status("dev-a", json!({ "v": 1 }))])
        .await
        .unwrap();
    device_status::apply(&client, target, b, &[status("dev-b", json!({ "v": 1 }))])
        .await
        .unwrap();
    device_status::apply(&client, target, a, &[status("dev-a", json!({ "v": 2 }))])
        .await
        .unwrap();
    assert_eq!(
        entries(&claims, "shared").await,
        [
            (a.to_string(), "dev-a".to_string(), json!({ "v": 2 })),
            (b.to_string(), "dev-b".to_string(), json!({ "v": 1 })),
        ],
        "a's second apply changed its entry and left b's"
    );

    device_status::apply(&client, target, a, &[]).await.unwrap();
    assert_eq!(
        entries(&claims, "shared").await,
        [(b.to_string(), "dev-b".to_string(), json!({ "v": 1 }))],
        "a's empty apply removed its entry only"
    );

    // A claim replaced under the same name is not written into; one that is gone is fine.
    let other = Claim {
        uid: "00000000-0000-0000-0000-000000000000",
        ..target
    };
    device_status::apply(&client, other, b, &[]).await.unwrap();
    assert_eq!(
        entries(&claims, "shared").await.len(),
        1,
        "another UID's apply changed nothing"
    );
    let gone = Claim {
        name: "gone",
        ..target
    };
    device_status::apply(&client, gone, a, &[]).await.unwrap();
}

/// The writer off the kubelet's path: a status shows up after its batch window; a claim
/// prepared and unprepared within one window is never written (its resourceVersion stays);
/// an empty status removes the entries it wrote.
#[tokio::test]
async fn the_writer_applies_the_latest_status_and_skips_what_was_undone() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("writer").await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let driver = "w.status.example.com";
    let mut refs = Vec::new();
    for name in ["kept", "undone"] {
        refs.push(allocated_claim(&claims, name, driver).await);
    }
    let status = vec![DeviceStatus {
        pool: "pool".into(),
        device: "dev".into(),
        data: Some(json!({ "shown": true })),
        ..DeviceStatus::default()
    }];
    let writer = device_status::Writer::start(client.clone(), driver);
    writer.write(&refs[0].0, status.clone());
    writer.write(&refs[1].0, status.clone());
    writer.write(&refs[1].0, Vec::new());
    let expected = vec![(
        driver.to_string(),
        "dev".to_string(),
        json!({ "shown": true }),
    )];
    akri_testing::eventually("the kept claim's status", async || {
        (entries(&claims, "kept").await == expected).then_some(())
    })
    .await;
    writer.write(&refs[0].0, Vec::new());
    akri_testing::eventually("the kept claim's entries removed", async || {
        entries(&claims, "kept").await.is_empty().then_some(())
    })
    .await;
    // That removal was the next batch's, and a batch starts once the one before has ended: had
    // the first batch written the undone claim, that write would be in by now.
    let undone = claims.get("undone").await.unwrap();
    assert_eq!(
        undone.metadata.resource_version.as_ref(),
        Some(&refs[1].1),
        "prepared and unprepared within a window: never written"
    );
}

/// Prepares every claim with a CDI spec and gives one status entry per result, naming the
/// claim.
struct StatusDriver {
    cdi: dra_plugin::cdi::CdiRoot,
}

impl dra_plugin::Driver for StatusDriver {
    type Error = dra_plugin::cdi::Error;

    async fn prepare(
        &self,
        checked: &dra_plugin::Claim,
    ) -> Result<dra_plugin::Prepared, Self::Error> {
        let devices: Vec<_> = (checked.results.iter())
            .map(|r| dra_plugin::cdi::CdiDevice {
                name: r.device.clone(),
                env: vec![("CLAIM".into(), checked.reference.name.clone())],
                ..Default::default()
            })
            .collect();
        let spec = self
            .cdi
            .write_claim_spec("gadget", &checked.reference.uid, &devices)?;
        let status = (checked.results.iter())
            .map(|r| DeviceStatus {
                pool: r.pool.clone(),
                device: r.device.clone(),
                data: Some(json!({ "claim": checked.reference.name })),
                ..DeviceStatus::default()
            })
            .collect();
        Ok(dra_plugin::Prepared {
            status,
            ..dra_plugin::Prepared::one_spec(spec)
        })
    }

    async fn unprepare(
        &self,
        claim: &dra_plugin::ClaimRef,
        _: Option<&dra_plugin::PreparedClaim>,
    ) -> Result<(), Self::Error> {
        dra_plugin::cdi::remove_claim_spec(&self.cdi.spec_path("gadget", &claim.uid)?)
    }
}

/// The service of [`StatusDriver`] on `dir`'s checkpoint, its statuses written by `writer`.
fn status_service(
    client: &kube::Client,
    dir: &std::path::Path,
    driver: &str,
    writer: device_status::Writer,
) -> dra_plugin::service::DraService<StatusDriver> {
    let cdi = dra_plugin::cdi::CdiRoot::new(dir.join("cdi"), "example.com").unwrap();
    let on = dra_plugin::service::DriverOnNode {
        driver: driver.into(),
        node: "node".into(),
    };
    dra_plugin::service::DraService::new(
        StatusDriver { cdi },
        client.clone(),
        on,
        &dir.join("checkpoint.json"),
    )
    .unwrap()
    .device_status(writer)
}

/// Statuses of two claims prepared one right after the other, not yet applied when the
/// process dies (its runtime is dropped while the API server cannot be reached, so neither
/// can be), are applied by the next process from the checkpoint without being asked again. A
/// third process applies them again unchanged, which changes no claim, and removes a claim's
/// entries when it is unprepared.
#[tokio::test]
async fn statuses_not_applied_before_a_crash_are_applied_by_the_next_process() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("restart").await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let driver = "r.status.example.com";
    let mut refs = Vec::new();
    for name in ["first", "second"] {
        refs.push(allocated_claim(&claims, name, driver).await.0);
    }
    let dir = tempfile::tempdir().unwrap();

    // The first process: prepares both (the claims are read), cannot write status, dies.
    let unreachable =
        kube::Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
    let config = cp.client_config().await.unwrap();
    let (path, asked) = (dir.path().to_path_buf(), refs.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            // A client of this runtime's own: the test's is bound to the test's runtime.
            let reader = kube::Client::try_from(config).unwrap();
            let writer = device_status::Writer::start(unreachable, driver);
            let service = status_service(&reader, &path, driver, writer);
            for claim in asked {
                let answers = service.prepare_claims(vec![claim.clone()]).await;
                assert!(answers[&claim.uid].is_ok(), "{:?}", answers[&claim.uid]);
            }
        });
        // Dropping the runtime ends the writer's task, as a crash would.
    })
    .join()
    .unwrap();
    for name in ["first", "second"] {
        assert!(
            entries(&claims, name).await.is_empty(),
            "{name}: not applied yet"
        );
    }

    // The next process applies both without being asked again.
    let writer = device_status::Writer::start(client.clone(), driver);
    let restarted = status_service(&client, dir.path(), driver, writer);
    let mut versions = Vec::new();
    for name in ["first", "second"] {
        let expected = vec![(
            driver.to_string(),
            "dev".to_string(),
            json!({ "claim": name }),
        )];
        akri_testing::eventually(
            &format!("the status of {name} from the checkpoint"),
            async || (entries(&claims, name).await == expected).then_some(()),
        )
        .await;
        versions.push(claims.get(name).await.unwrap().metadata.resource_version);
    }
    drop(restarted);

    // Once more: applied again, unchanged; and `first` unprepared at once, within the new
    // writer's first window: the entries the process before wrote are removed all the same.
    // Its removal comes in the batch that applies `second` again, or a later one.
    let writer = device_status::Writer::start(client.clone(), driver);
    let again = status_service(&client, dir.path(), driver, writer);
    let answers = again.unprepare_claims(vec![refs[0].clone()]).await;
    assert!(answers[&refs[0].uid].is_ok());
    akri_testing::eventually("the unprepared claim's entries removed", async || {
        entries(&claims, "first").await.is_empty().then_some(())
    })
    .await;
    assert_eq!(
        claims
            .get("second")
            .await
            .unwrap()
            .metadata
            .resource_version,
        versions[1],
        "a restart applies what was right unchanged: the claim is not written"
    );
}
