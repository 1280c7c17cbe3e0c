//! Start-up of the real control plane: timing, and failures that explain themselves.

use akri_testing::{ControlPlane, ControlPlaneOptions, Error};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, ListParams};

#[tokio::test]
async fn a_failed_start_reports_the_components_log_tail() {
    let options = ControlPlaneOptions::default().feature_gate("NoSuchGateForAkriTesting", true);
    let error = ControlPlane::start(options)
        .await
        .expect_err("an unknown feature gate must stop kube-apiserver");
    match &error {
        Error::Exited {
            component, tail, ..
        } => {
            assert_eq!(component, "kube-apiserver");
            assert!(
                tail.contains("NoSuchGateForAkriTesting"),
                "the log tail should name the bad gate: {tail}"
            );
        }
        other => panic!("expected Error::Exited, got {other}"),
    }
    assert!(error.to_string().contains("last lines of"), "{error}");
}

/// From 1.34 the API server serves `resource.k8s.io/v1`; on 1.33 (DRA beta and off by
/// default) it serves no `resource.k8s.io` at all, as on the legacy-only clusters of that
/// release, and still becomes ready.
#[tokio::test]
async fn api_server_serves_resource_k8s_io_v1_from_1_34() {
    let control_plane = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane starts");
    let version = control_plane.bins().version().to_string();
    eprintln!(
        "etcd + kube-apiserver ready in {:?} (Kubernetes {version})",
        control_plane.started_in(),
    );
    let client = control_plane.client().await.unwrap();
    let classes = Api::<DeviceClass>::all(client)
        .list(&ListParams::default())
        .await;
    let minor: u32 = version.split('.').nth(1).unwrap().parse().unwrap();
    if minor < 34 {
        assert!(!control_plane.serves_dra());
        match classes {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 404, "{status:?}"),
            other => panic!("Kubernetes {version} should serve no DeviceClasses: {other:?}"),
        }
        return;
    }
    assert!(control_plane.serves_dra());
    let classes = classes.expect("resource.k8s.io/v1 DeviceClasses are served");
    assert!(classes.items.is_empty());
    // Every beta DRA gate of the binary is on; on the main version that includes consumable
    // capacity (beta, on by default) and fractional capacity ranges (beta, off by default),
    // but not DRAWorkloadResourceClaims, whose GenericWorkload dependency is off (the API
    // server would not start with it).
    if minor >= 37 {
        let gates = control_plane.feature_gates();
        for gate in [
            "DRAConsumableCapacity=true",
            "DRAFractionalCapacityRange=true",
        ] {
            assert!(gates.contains(gate), "{gate} missing from {gates}");
        }
        assert!(!gates.contains("DRAWorkloadResourceClaims"), "{gates}");
    }
}
