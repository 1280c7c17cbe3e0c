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
        refs.push((
            dra_plugin::ClaimRef {
                namespace: ns.clone(),
                name: name.to_string(),
                uid: created.metadata.uid.unwrap(),
            },
            allocated.metadata.resource_version.unwrap(),
        ));
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
    tokio::time::sleep(2 * device_status::BATCH_WINDOW).await;
    let undone = claims.get("undone").await.unwrap();
    assert_eq!(
        undone.metadata.resource_version.as_ref(),
        Some(&refs[1].1),
        "prepared and unprepared within a window: never written"
    );
    writer.write(&refs[0].0, Vec::new());
    akri_testing::eventually("the kept claim's entries removed", async || {
        entries(&claims, "kept").await.is_empty().then_some(())
    })
    .await;
}

/// A status asked for and not yet applied when the process dies (here: its runtime is dropped
/// while the API server cannot be reached) is applied by the next process's writer, from the
/// journal; the journal is gone once nothing is left to apply.
#[tokio::test]
async fn a_status_asked_before_a_crash_is_applied_by_the_next_process() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("journal").await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let driver = "j.status.example.com";
    let claim: ResourceClaim = from_json(json!({
        "metadata": { "name": "journaled" },
        "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "any" } }] } },
    }));
    let created = claims.create(&PostParams::default(), &claim).await.unwrap();
    let allocation = json!({ "status": { "allocation": { "devices": { "results": [
        { "request": "r", "driver": driver, "pool": "pool", "device": "dev" },
    ] } } } });
    claims
        .patch_status(
            "journaled",
            &PatchParams::default(),
            &Patch::Merge(&allocation),
        )
        .await
        .unwrap();
    let claim = dra_plugin::ClaimRef {
        namespace: ns.clone(),
        name: "journaled".into(),
        uid: created.metadata.uid.unwrap(),
    };
    let status = vec![DeviceStatus {
        pool: "pool".into(),
        device: "dev".into(),
        data: Some(json!({ "survived": true })),
        ..DeviceStatus::default()
    }];
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("status-journal.json");

    // The first process: asked, cannot apply, dies.
    let unreachable =
        kube::Client::try_from(kube::Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
    let (path, asked, ask) = (journal.clone(), claim.clone(), status.clone());
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let writer = device_status::Writer::start_journaled(unreachable, driver, path.clone());
            writer.write(&asked, ask);
            akri_testing::eventually("the journal holds the status", async || {
                std::fs::read_to_string(&path)
                    .ok()
                    .filter(|text| text.contains(&asked.uid))
            })
            .await;
        });
        // Dropping the runtime ends the writer's task, as a crash would.
    })
    .join()
    .unwrap();
    assert!(entries(&claims, "journaled").await.is_empty());

    // The next process applies it without being asked again.
    let _writer = device_status::Writer::start_journaled(client.clone(), driver, journal.clone());
    let expected = vec![(
        driver.to_string(),
        "dev".to_string(),
        json!({ "survived": true }),
    )];
    akri_testing::eventually("the status from the journal", async || {
        (entries(&claims, "journaled").await == expected).then_some(())
    })
    .await;
    akri_testing::eventually("the journal removed", async || {
        (!journal.exists()).then_some(())
    })
    .await;
}
