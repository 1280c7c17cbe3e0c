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

#[tokio::test]
async fn api_server_serves_resource_k8s_io_v1() {
    let control_plane = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane starts");
    eprintln!(
        "etcd + kube-apiserver ready in {:?} (Kubernetes {})",
        control_plane.started_in(),
        control_plane.bins().version()
    );
    let client = control_plane.client().await.unwrap();
    let classes = Api::<DeviceClass>::all(client)
        .list(&ListParams::default())
        .await
        .expect("resource.k8s.io/v1 DeviceClasses are served");
    assert!(classes.items.is_empty());
    // Every beta DRA gate of the binary is on; on the main version that includes consumable
    // capacity (beta, on by default) and device taint rules (beta, off by default).
    if control_plane.bins().version().starts_with("1.36.") {
        for gate in [
            "DRAConsumableCapacity=true",
            "DRADeviceTaintRules=true",
            "DRAExtendedResource=true",
        ] {
            assert!(
                control_plane.feature_gates().contains(gate),
                "{gate} missing from {}",
                control_plane.feature_gates()
            );
        }
    }
}
