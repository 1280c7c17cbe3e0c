//! Wire-format checks: each service's main messages encode to bytes written out by hand from
//! the upstream field numbers and types, and decode back. A renumbered or retyped field in
//! `protos/` fails here even though both sides of our own code would still agree.

use akri_proto::discovery;
use akri_testing::wire::{assert_wire, ld};
use std::collections::HashMap;

#[test]
fn akri_discovery() {
    use discovery::v0::*;
    let register = RegisterDiscoveryHandlerRequest {
        name: "udev".into(),
        endpoint: "/e.sock".into(),
        endpoint_type: register_discovery_handler_request::EndpointType::Network as i32,
        shared: true,
    };
    let expected = [
        ld(0x0a, b"udev"),
        ld(0x12, b"/e.sock"),
        vec![0x18, 0x01, 0x20, 0x01],
    ]
    .concat();
    assert_wire(&register, &expected);

    let request = DiscoverRequest {
        discovery_details: "x: 1".into(),
        discovery_properties: HashMap::from([(
            "k".into(),
            ByteData {
                vec: Some(b"v".to_vec()),
            },
        )]),
    };
    let entry = [ld(0x0a, b"k"), ld(0x12, &ld(0x0a, b"v"))].concat();
    assert_wire(&request, &[ld(0x0a, b"x: 1"), ld(0x12, &entry)].concat());

    let response = DiscoverResponse {
        devices: vec![Device {
            id: "i".into(),
            properties: HashMap::from([("a".into(), "b".into())]),
            mounts: vec![Mount {
                container_path: "/c".into(),
                host_path: "/h".into(),
                read_only: true,
            }],
            device_specs: vec![DeviceSpec {
                container_path: "/c".into(),
                host_path: "/h".into(),
                permissions: "r".into(),
            }],
        }],
    };
    let device = [
        ld(0x0a, b"i"),
        ld(0x12, &[ld(0x0a, b"a"), ld(0x12, b"b")].concat()),
        ld(
            0x1a,
            &[ld(0x0a, b"/c"), ld(0x12, b"/h"), vec![0x18, 0x01]].concat(),
        ),
        ld(
            0x22,
            &[ld(0x0a, b"/c"), ld(0x12, b"/h"), ld(0x1a, b"r")].concat(),
        ),
    ]
    .concat();
    assert_wire(&response, &ld(0x0a, &device));
}

/// The fully qualified service names are what the peers dial; they must be Akri's.
#[test]
fn service_names() {
    assert_eq!(
        discovery::v0::registration_server::SERVICE_NAME,
        "v0.Registration"
    );
    assert_eq!(
        discovery::v0::discovery_handler_server::SERVICE_NAME,
        "v0.DiscoveryHandler"
    );
}
