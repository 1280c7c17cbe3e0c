//! The standalone binary with the kubelet-plugin's registration socket and discovery client.

use akri_kubelet_plugin::discovery::{
    DiscoveryEvent, DiscoveryRequest, DiscoveryStream, Registry, StreamConfig,
};
use std::time::Duration;

#[tokio::test]
async fn registers_as_a_node_local_handler_and_finds_devices() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::serve(
        &dir.path().join("agent-registration.sock"),
        &dir.path().join("handlers.json"),
    )
    .unwrap();
    let _handler = tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-udev-discovery-handler"))
        .arg("--handlers-dir")
        .arg(dir.path())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let registered = akri_testing::eventually_within(
        "the handler registered",
        Duration::from_secs(15),
        async || registry.handlers().get("udev").cloned(),
    )
    .await;
    assert!(!registered.shared, "udev devices belong to their node");
    let request = DiscoveryRequest {
        details: "udevRules: ['KERNEL==\"null\"']".into(),
        ..Default::default()
    };
    let mut stream = DiscoveryStream::start(registered, request, StreamConfig::default());
    match tokio::time::timeout(Duration::from_secs(10), stream.next_event()).await {
        Ok(Some(DiscoveryEvent::Devices(devices))) => {
            let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
            assert_eq!(ids, ["/devices/virtual/mem/null"]);
        }
        other => panic!("expected a device list, got {other:?}"),
    }
}
