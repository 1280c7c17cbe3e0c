//! The `akri-broker-controller` binary against a real API server: its endpoints, leader
//! election, broker objects, and SIGTERM handing the Lease over.

use akri_api::v1::{INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL};
use akri_testing::{ControlPlane, ControlPlaneOptions, from_json, http_get, metric};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

use akri_testing::eventually;

#[tokio::test]
async fn the_binary_leads_serves_its_endpoints_and_hands_over_on_sigterm() {
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let akri = cp.create_namespace("akri").await.unwrap();
    let apps = cp.create_namespace("apps").await.unwrap();
    let port = akri_testing::free_port().unwrap();
    let mut process = tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-broker-controller"))
        .env("KUBECONFIG", cp.kubeconfig())
        .env("POD_NAME", "broker-controller-0")
        .args(["--instance-namespace", &akri, "--lease-namespace", &akri])
        .args(["--metrics-address", &format!("127.0.0.1:{port}")])
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    eventually("/readyz 200", async || {
        (http_get(("127.0.0.1", port), "/readyz").await.ok()?.0 == 200).then_some(())
    })
    .await;
    assert_eq!(
        http_get(("127.0.0.1", port), "/healthz").await.unwrap().0,
        200
    );
    eventually("leading", async || {
        let (_, body) = http_get(("127.0.0.1", port), "/metrics").await.ok()?;
        (metric(&body, "akri_broker_controller_leader") == Some(1.0)).then_some(())
    })
    .await;
    let leases = Api::<Lease>::namespaced(client.clone(), &akri);
    let holder = leases
        .get("akri-broker-controller")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    assert!(holder.starts_with("broker-controller-0_"), "{holder}");

    // It acts: a ConfigMap per Instance.
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": "cams" },
                "spec": { "discoveryHandler": { "name": "onvif" } },
            })),
        )
        .await
        .unwrap();
    Api::<akri_api::v1::BrokerTemplate>::namespaced(client.clone(), &apps)
        .patch(
            "cams",
            &PatchParams::apply("test"),
            &Patch::Apply(json!({
                "apiVersion": "akri.sh/v1", "kind": "BrokerTemplate",
                "metadata": { "name": "cams" },
                "spec": {
                    "discoveryReference": { "name": "cams" },
                    "instanceBrokerResources": [{ "apiVersion": "v1", "kind": "ConfigMap",
                        "data": { "address": "$(AKRI_PROPERTY_ADDRESS)" } }],
                },
            })),
        )
        .await
        .unwrap();
    Api::<akri_api::v0::Instance>::namespaced(client.clone(), &akri)
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v0", "kind": "Instance",
                "metadata": { "name": "cams-a1b2c3", "labels": {
                    INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION } },
                "spec": {
                    "configurationName": "cams", "cdiName": "akri.sh/onvif=cams-a1b2c3",
                    "capacity": 1, "shared": true, "nodes": ["node-a"],
                    "brokerProperties": { "ADDRESS": "10.0.0.7" },
                },
            })),
        )
        .await
        .unwrap();
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), &apps);
    let made = eventually("the Instance's ConfigMap", async || {
        configmaps.get_opt("cams-a1b2c3-configmap").await.ok()?
    })
    .await;
    assert_eq!(made.data.unwrap()["address"], "10.0.0.7");

    // SIGTERM: it exits cleanly and gives the Lease up on the way.
    let exit = akri_testing::terminate(&mut process, Duration::from_secs(30))
        .await
        .expect("exits after SIGTERM");
    assert!(exit.success(), "{exit}");
    let lease = leases.get("akri-broker-controller").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity,
        None,
        "the Lease is handed over"
    );
}
