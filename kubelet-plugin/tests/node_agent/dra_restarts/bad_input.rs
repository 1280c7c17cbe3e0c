//! Claims the plugin must refuse or keep apart: malformed claims, colliding names, two
//! requests on one device.

use super::support::{DRIVER, allocated_claim, cdi_env, driver_seeing, from_json};
use akri_testing::ControlPlane;
use dra_plugin::service::ClaimRef;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn malformed_claims_fail_alone() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("claims").await.unwrap();
    let node = "node-here";
    let dir = tempfile::tempdir().unwrap();
    let service = driver_seeing(&client, node, &["foo0"], 1, dir.path());
    let device = akri_devices::instance_name("echo", "foo0", false, node);

    // Claims allocated by hand (an admin may write claim status), each wrong in one way.
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let mut refs = Vec::new();
    for (name, driver, device, on_node) in [
        ("good", DRIVER, device.as_str(), node),
        ("other-driver", "other.akri.sh", "x", node),
        ("other-node", DRIVER, device.as_str(), "node-elsewhere"),
        ("gone-device", DRIVER, "echo-000000", node),
    ] {
        let claim: ResourceClaim = from_json(json!({
            "metadata": { "name": name },
            "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "any" } }] } },
        }));
        let created = claims.create(&PostParams::default(), &claim).await.unwrap();
        let status = json!({ "status": { "allocation": {
            "devices": { "results": [{ "request": "r", "driver": driver, "pool": on_node, "device": device }] },
            "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [on_node] }] }] },
        } } });
        claims
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        refs.push(ClaimRef {
            namespace: ns.clone(),
            name: name.into(),
            uid: created.metadata.uid.unwrap(),
        });
    }
    refs.push(ClaimRef {
        namespace: ns.clone(),
        name: "deleted".into(),
        uid: "no-such-uid".into(),
    });

    let results = service.prepare_claims(refs.clone()).await;
    let by_name = |name: &str| {
        let result = &results[&refs.iter().find(|r| r.name == name).unwrap().uid];
        result.as_ref().map_err(ToString::to_string).cloned()
    };
    let good = by_name("good").expect("the good claim is prepared despite the others");
    assert_eq!(good[0].device_name, device);
    let expect_error = |name: &str, words: &str| {
        let error = by_name(name).expect_err(name);
        assert!(
            error.contains(words),
            "{name}: {error:?} should contain {words:?}"
        );
    };
    expect_error("other-driver", "has no device of driver");
    expect_error("other-node", "allocated for other nodes");
    expect_error("gone-device", "not available on node");
    expect_error("deleted", "no longer exists");
}

/// Two debugEcho devices whose Akri names collide on node-a get two names, and a claim for
/// each gets its own device (the collision used to hand both claims one of them).
#[tokio::test]
async fn colliding_instance_names_never_mix_devices() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("collide").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = ("cam2839", "cam3489");
    assert_eq!(
        akri_devices::instance_name("echo", a, false, "node-a"),
        akri_devices::instance_name("echo", b, false, "node-a"),
        "the pair collides in Akri's naming"
    );
    let service = driver_seeing(&client, "node-a", &[a, b], 1, dir.path());
    let published: Vec<String> = service
        .driver()
        .devices
        .local_dra_devices(DRIVER)
        .into_iter()
        .map(|(d, _)| d.name)
        .collect();
    assert_eq!(published.len(), 2);
    assert_ne!(
        published[0], published[1],
        "two devices, two names: {published:?}"
    );

    let mut seen = Vec::new();
    for (i, device) in published.iter().enumerate() {
        let claim = allocated_claim(
            &client,
            &ns,
            &format!("c{i}"),
            "node-a",
            &[("r", device, None)],
        )
        .await;
        let prepared = service.prepare_claims(vec![claim.clone()]).await;
        let ids = &prepared[&claim.uid].as_ref().unwrap()[0].cdi_device_ids;
        let env = cdi_env(&dir.path().join("cdi"), &ids[0]);
        let description = env
            .iter()
            .find_map(|e| e.strip_prefix("DEBUG_ECHO_DESCRIPTION="))
            .unwrap()
            .to_string();
        seen.push(description);
    }
    seen.sort();
    assert_eq!(seen, [a, b], "each claim got its own device");
}

/// With consumable capacity, two requests of one claim may get the same device (two shares);
/// the claim must prepare, both requests with the device's one CDI id.
#[tokio::test]
async fn two_requests_on_one_shared_device_prepare() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("shares").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = driver_seeing(&client, "node-s", &["cam"], 2, dir.path());
    let device = akri_devices::instance_name("echo", "cam", false, "node-s");
    let claim = allocated_claim(
        &client,
        &ns,
        "two-shares",
        "node-s",
        &[
            (
                "first",
                &device,
                Some("0b6c1c5e-8d0e-4b53-9a3f-1f2e3d4c5b6a"),
            ),
            (
                "second",
                &device,
                Some("7d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"),
            ),
        ],
    )
    .await;
    let prepared = service.prepare_claims(vec![claim.clone()]).await;
    let devices = prepared[&claim.uid].as_ref().expect("the claim prepares");
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0].cdi_device_ids, devices[1].cdi_device_ids);
    // One place builds the CDI name: `<claim uid>-<device>`, the UID once.
    assert_eq!(
        devices[0].cdi_device_ids,
        [format!("akri.sh/debugecho={}-{device}", claim.uid)]
    );
    let requests: Vec<_> = devices
        .iter()
        .map(|d| d.request_names[0].as_str())
        .collect();
    assert_eq!(requests, ["first", "second"]);
    let shares: Vec<_> = devices.iter().map(|d| d.share_id.as_deref()).collect();
    assert_eq!(
        shares,
        [
            Some("0b6c1c5e-8d0e-4b53-9a3f-1f2e3d4c5b6a"),
            Some("7d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")
        ]
    );
    assert_eq!(
        cdi_env(&dir.path().join("cdi"), &devices[0].cdi_device_ids[0]).len(),
        1
    );
}
