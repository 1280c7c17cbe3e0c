//! Wire-format checks: each service's main messages encode to bytes written out by hand from
//! the upstream field numbers and types, and decode back. A renumbered or retyped field in
//! `protos/` fails here even though both sides of our own code would still agree.

use akri_testing::wire::{assert_wire, ld};
use kubelet_proto::{deviceplugin, dra, pluginregistration, podresources};
use std::collections::HashMap;

#[test]
fn plugin_registration() {
    let info = pluginregistration::PluginInfo {
        r#type: "DRAPlugin".into(),
        name: "d.akri.sh".into(),
        endpoint: "/p/s.sock".into(),
        supported_versions: vec!["v1.DRAPlugin".into()],
    };
    let expected = [
        ld(0x0a, b"DRAPlugin"),
        ld(0x12, b"d.akri.sh"),
        ld(0x1a, b"/p/s.sock"),
        ld(0x22, b"v1.DRAPlugin"),
    ]
    .concat();
    assert_wire(&info, &expected);

    let status = pluginregistration::RegistrationStatus {
        plugin_registered: true,
        error: "x".into(),
    };
    assert_wire(&status, &[0x08, 0x01, 0x12, 0x01, b'x']);
}

#[test]
fn dra_v1_prepare() {
    let claim = || dra::v1::Claim {
        namespace: "ns".into(),
        uid: "u1".into(),
        name: "c".into(),
    };
    let claim_bytes = [ld(0x0a, b"ns"), ld(0x12, b"u1"), ld(0x1a, b"c")].concat();
    let request = dra::v1::NodePrepareResourcesRequest {
        claims: vec![claim()],
    };
    assert_wire(&request, &ld(0x0a, &claim_bytes));

    let device = dra::v1::Device {
        request_names: vec!["r".into()],
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: vec!["akri.sh/x=d".into()],
        share_id: Some("s".into()),
    };
    let device_bytes = [
        ld(0x0a, b"r"),
        ld(0x12, b"p"),
        ld(0x1a, b"d"),
        ld(0x22, b"akri.sh/x=d"),
        ld(0x2a, b"s"),
    ]
    .concat();
    let response = dra::v1::NodePrepareResourcesResponse {
        claims: HashMap::from([(
            "u1".to_string(),
            dra::v1::NodePrepareResourceResponse {
                devices: vec![device],
                error: String::new(),
            },
        )]),
    };
    let entry = [ld(0x0a, b"u1"), ld(0x12, &ld(0x0a, &device_bytes))].concat();
    assert_wire(&response, &ld(0x0a, &entry));

    let unprepare = dra::v1::NodeUnprepareResourcesResponse {
        claims: HashMap::from([(
            "u1".to_string(),
            dra::v1::NodeUnprepareResourceResponse { error: "e".into() },
        )]),
    };
    let entry = [ld(0x0a, b"u1"), ld(0x12, &ld(0x0a, b"e"))].concat();
    assert_wire(&unprepare, &ld(0x0a, &entry));
}

#[test]
fn dra_v1beta1_prepare() {
    let device = dra::v1beta1::Device {
        request_names: vec!["r".into()],
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: vec!["akri.sh/x=d".into()],
    };
    let expected = [
        ld(0x0a, b"r"),
        ld(0x12, b"p"),
        ld(0x1a, b"d"),
        ld(0x22, b"akri.sh/x=d"),
    ]
    .concat();
    assert_wire(&device, &expected);
    let request = dra::v1beta1::NodeUnprepareResourcesRequest {
        claims: vec![dra::v1beta1::Claim {
            namespace: "ns".into(),
            uid: "u1".into(),
            name: "c".into(),
        }],
    };
    let claim_bytes = [ld(0x0a, b"ns"), ld(0x12, b"u1"), ld(0x1a, b"c")].concat();
    assert_wire(&request, &ld(0x0a, &claim_bytes));
}

#[test]
fn dra_health() {
    use dra::health::v1alpha1::*;
    let response = NodeWatchResourcesResponse {
        devices: vec![DeviceHealth {
            device: Some(DeviceIdentifier {
                pool_name: "p".into(),
                device_name: "d".into(),
            }),
            health: HealthStatus::Unhealthy as i32,
            last_updated_time: 5,
            health_check_timeout_seconds: 30,
            message: "gone".into(),
        }],
    };
    let health = [
        ld(0x0a, &[ld(0x0a, b"p"), ld(0x12, b"d")].concat()),
        vec![0x10, 0x02, 0x18, 0x05, 0x20, 0x1e],
        ld(0x2a, b"gone"),
    ]
    .concat();
    assert_wire(&response, &ld(0x0a, &health));
}

#[test]
fn device_plugin() {
    use deviceplugin::v1beta1::*;
    let register = RegisterRequest {
        version: VERSION.into(),
        endpoint: "a.sock".into(),
        resource_name: "akri.sh/c".into(),
        options: Some(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    };
    let expected = [
        ld(0x0a, b"v1beta1"),
        ld(0x12, b"a.sock"),
        ld(0x1a, b"akri.sh/c"),
        ld(0x22, &[0x10, 0x01]),
    ]
    .concat();
    assert_wire(&register, &expected);

    let list = ListAndWatchResponse {
        devices: vec![Device {
            id: "d1".into(),
            health: HEALTHY.into(),
            topology: None,
        }],
    };
    assert_wire(
        &list,
        &ld(0x0a, &[ld(0x0a, b"d1"), ld(0x12, b"Healthy")].concat()),
    );

    let preferred = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_ids: vec!["a".into(), "b".into()],
            must_include_device_ids: vec!["a".into()],
            allocation_size: 1,
        }],
    };
    let expected = [
        ld(0x0a, b"a"),
        ld(0x0a, b"b"),
        ld(0x12, b"a"),
        vec![0x18, 0x01],
    ]
    .concat();
    assert_wire(&preferred, &ld(0x0a, &expected));

    let allocate = AllocateResponse {
        container_responses: vec![ContainerAllocateResponse {
            envs: HashMap::from([("K".into(), "V".into())]),
            mounts: vec![],
            devices: vec![DeviceSpec {
                container_path: "/dev/x".into(),
                host_path: "/dev/y".into(),
                permissions: "rw".into(),
            }],
            annotations: HashMap::new(),
            cdi_devices: vec![CdiDevice {
                name: "akri.sh/c=d".into(),
            }],
        }],
    };
    let container = [
        ld(0x0a, &[ld(0x0a, b"K"), ld(0x12, b"V")].concat()),
        ld(
            0x1a,
            &[ld(0x0a, b"/dev/x"), ld(0x12, b"/dev/y"), ld(0x1a, b"rw")].concat(),
        ),
        ld(0x2a, &ld(0x0a, b"akri.sh/c=d")),
    ]
    .concat();
    assert_wire(&allocate, &ld(0x0a, &container));
}

#[test]
fn pod_resources() {
    use podresources::v1::*;
    let get = GetPodResourcesRequest {
        pod_name: "p".into(),
        pod_namespace: "n".into(),
    };
    assert_wire(&get, &[ld(0x0a, b"p"), ld(0x12, b"n")].concat());

    let dynamic = DynamicResource {
        claim_name: "c".into(),
        claim_namespace: "n".into(),
        claim_resources: vec![ClaimResource {
            cdi_devices: vec![CdiDevice { name: "x".into() }],
            driver_name: "d".into(),
            pool_name: "p".into(),
            device_name: "v".into(),
            share_id: None,
        }],
    };
    let claim_resource = [
        ld(0x0a, &ld(0x0a, b"x")),
        ld(0x12, b"d"),
        ld(0x1a, b"p"),
        ld(0x22, b"v"),
    ]
    .concat();
    let expected = [ld(0x12, b"c"), ld(0x1a, b"n"), ld(0x22, &claim_resource)].concat();
    assert_wire(&dynamic, &expected);
}

/// The fully qualified service names are what the peers dial; they must be upstream's.
#[test]
fn service_names() {
    assert_eq!(
        pluginregistration::registration_server::SERVICE_NAME,
        "pluginregistration.Registration"
    );
    assert_eq!(
        dra::v1::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        dra::v1beta1::dra_plugin_server::SERVICE_NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    assert_eq!(
        dra::health::v1alpha1::dra_resource_health_server::SERVICE_NAME,
        "v1alpha1.DRAResourceHealth"
    );
    assert_eq!(
        dra::health::v1::dra_resource_health_server::SERVICE_NAME,
        dra::health::v1::SUPPORTED_VERSION
    );
    assert_eq!(
        deviceplugin::v1beta1::registration_server::SERVICE_NAME,
        "v1beta1.Registration"
    );
    assert_eq!(
        deviceplugin::v1beta1::device_plugin_server::SERVICE_NAME,
        "v1beta1.DevicePlugin"
    );
    assert_eq!(
        podresources::v1::pod_resources_lister_server::SERVICE_NAME,
        "v1.PodResourcesLister"
    );
}
