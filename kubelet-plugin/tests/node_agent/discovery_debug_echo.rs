//! The embedded debugEcho handler over its real socket: registration like an external
//! handler, devices from the discovery details, availability from the file.

use akri_kubelet_plugin::discovery::debug_echo::{self, DebugEcho, DebugEchoConfig};
use akri_kubelet_plugin::discovery::{
    DiscoveredDevice, DiscoveryEvent, DiscoveryRequest, DiscoveryStream, Registry, StreamConfig,
    connect,
};
use akri_proto::discovery::v0 as proto;
use std::path::Path;
use std::time::Duration;

fn config(dir: &Path) -> DebugEchoConfig {
    DebugEchoConfig {
        availability_file: dir.join("availability.txt"),
        poll_interval: Duration::from_millis(50),
        ..DebugEchoConfig::new(dir.join("debug-echo.sock"))
    }
}

async fn next_devices(stream: &mut DiscoveryStream) -> Vec<DiscoveredDevice> {
    match tokio::time::timeout(Duration::from_secs(5), stream.next_event()).await {
        Ok(Some(DiscoveryEvent::Devices(devices))) => devices,
        other => panic!("expected a device list, got {other:?}"),
    }
}

fn ids(devices: &[DiscoveredDevice]) -> Vec<&str> {
    devices.iter().map(|d| d.id.as_str()).collect()
}

#[tokio::test]
async fn follows_the_availability_file() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::serve(
        &dir.path().join("reg.sock"),
        &dir.path().join("handlers.json"),
    )
    .unwrap();
    let echo = DebugEcho::serve(config(dir.path())).unwrap();
    echo.register(registry.socket()).await.unwrap();
    let handler = registry.handlers()[debug_echo::NAME].clone();
    assert_eq!(&handler, echo.handler());
    assert!(!handler.shared);

    let request = DiscoveryRequest {
        details: "descriptions:\n- foo0\n- foo1\n".into(),
        ..Default::default()
    };
    let mut stream = DiscoveryStream::start(handler, request, StreamConfig::default());
    let devices = next_devices(&mut stream).await;
    assert_eq!(ids(&devices), ["foo0", "foo1"]);
    assert_eq!(
        devices[0].properties[debug_echo::DESCRIPTION_PROPERTY],
        "foo0"
    );
    assert_eq!(devices[1].properties.len(), 1);

    let availability = dir.path().join("availability.txt");
    std::fs::write(&availability, "OFFLINE\n").unwrap();
    assert!(next_devices(&mut stream).await.is_empty());

    std::fs::write(&availability, "foo1\n").unwrap();
    assert_eq!(ids(&next_devices(&mut stream).await), ["foo0"]);

    std::fs::write(&availability, "").unwrap();
    assert_eq!(ids(&next_devices(&mut stream).await), ["foo0", "foo1"]);

    std::fs::remove_file(&availability).unwrap();
    std::fs::write(&availability, "OFFLINE").unwrap();
    assert!(next_devices(&mut stream).await.is_empty());
}

#[tokio::test]
async fn speaks_akris_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let echo = DebugEcho::serve(DebugEchoConfig {
        shared: true,
        ..config(dir.path())
    })
    .unwrap();
    assert!(echo.handler().shared);
    let channel = connect::unix_channel(&dir.path().join("debug-echo.sock"))
        .await
        .unwrap();
    let mut client = proto::discovery_handler_client::DiscoveryHandlerClient::new(channel);

    let mut stream = client
        .discover(proto::DiscoverRequest {
            discovery_details: "descriptions: [foo0]".into(),
            discovery_properties: Default::default(),
        })
        .await
        .unwrap()
        .into_inner();
    let response = stream.message().await.unwrap().unwrap();
    assert_eq!(
        response.devices,
        [proto::Device {
            id: "foo0".into(),
            properties: [("DEBUG_ECHO_DESCRIPTION".into(), "foo0".into())].into(),
            mounts: vec![],
            device_specs: vec![],
        }]
    );

    let status = client
        .discover(proto::DiscoverRequest {
            discovery_details: "descriptions: not-a-list".into(),
            discovery_properties: Default::default(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}
