//! The standalone binary with the kubelet-plugin's registration socket and discovery client:
//! it registers (waiting for an agent that starts after it), serves discovery, and stops on
//! SIGTERM leaving no socket behind.

use akri_kubelet_plugin::discovery::{
    DiscoveryEvent, DiscoveryRequest, DiscoveryStream, Endpoint, Registry, StreamConfig,
};
use std::time::Duration;

#[tokio::test]
async fn registers_with_a_late_agent_serves_discovery_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut handler =
        tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-debug-echo-discovery-handler"))
            .arg("--handlers-dir")
            .arg(dir.path())
            .arg("--availability-file")
            .arg(dir.path().join("availability.txt"))
            // Akri's DaemonSet setting, read as Akri's handler reads it.
            .env("DEBUG_ECHO_INSTANCES_SHARED", "true")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
    // The agent comes after the handler.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let registry = Registry::serve(
        &dir.path().join("agent-registration.sock"),
        &dir.path().join("handlers.json"),
    )
    .unwrap();
    let socket = dir.path().join("debugEcho.sock");
    let registered = akri_testing::eventually_within(
        "the handler registered",
        Duration::from_secs(15),
        async || registry.handlers().get("debugEcho").cloned(),
    )
    .await;
    assert_eq!(registered.endpoint, Endpoint::Uds(socket.clone()));
    assert!(registered.shared, "DEBUG_ECHO_INSTANCES_SHARED=true");

    let request = DiscoveryRequest {
        details: "descriptions: [foo0, foo1]".into(),
        ..Default::default()
    };
    let mut stream = DiscoveryStream::start(registered, request, StreamConfig::default());
    match tokio::time::timeout(Duration::from_secs(10), stream.next_event()).await {
        Ok(Some(DiscoveryEvent::Devices(devices))) => {
            let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
            assert_eq!(ids, ["foo0", "foo1"]);
        }
        other => panic!("expected a device list, got {other:?}"),
    }

    let pid = handler.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status();
    assert!(killed.unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(10), handler.wait())
        .await
        .expect("it stops within 10 s")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(!socket.exists(), "its socket is removed");
}
