//! The standalone binary, logging everything (RUST_LOG=trace), with the kubelet-plugin's
//! registry and client and a camera that needs a credential: the credential is used (the
//! camera's address comes back) and appears nowhere in the log.

use akri_kubelet_plugin::discovery::{
    DiscoveryEvent, DiscoveryRequest, DiscoveryStream, Registry, StreamConfig,
};
use akri_testing::peers::Peer;
use std::time::Duration;

#[tokio::test]
async fn a_camera_credential_is_used_and_never_logged() {
    const PASSWORD: &str = "n0t-in-any-log";
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::serve(
        &dir.path().join("agent-registration.sock"),
        &dir.path().join("handlers.json"),
    )
    .unwrap();
    let log = dir.path().join("handler.log");
    let _handler = tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-onvif-discovery-handler"))
        .arg("--handlers-dir")
        .arg(dir.path())
        .args(["--rescan-seconds", "1"])
        .env("RUST_LOG", "trace")
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let uuid = "5a1e0000-0000-4000-8000-00000000b1a5";
    let port = akri_testing::free_port().unwrap();
    let _camera = Peer::start(
        "camera",
        "onvif_camera.py",
        &[
            "--port",
            &port.to_string(),
            "--uuid",
            uuid,
            "--ip",
            "10.9.8.7",
            "--mac",
            "00:aa:bb:cc:dd:ee",
            "--username",
            "admin",
            "--password",
            PASSWORD,
        ]
        .map(String::from),
    )
    .unwrap();
    let registered = akri_testing::eventually_within(
        "the handler registered",
        Duration::from_secs(15),
        async || registry.handlers().get("onvif").cloned(),
    )
    .await;
    assert!(registered.shared, "cameras are shared");
    let request = DiscoveryRequest {
        details: format!("uuids: {{items: [{uuid}]}}"),
        properties: [
            (format!("username_{uuid}"), b"admin".to_vec()),
            (format!("password_{uuid}"), PASSWORD.as_bytes().to_vec()),
        ]
        .into(),
    };
    let mut stream = DiscoveryStream::start(registered, request, StreamConfig::default());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, stream.next_event()).await {
            Ok(Some(DiscoveryEvent::Devices(devices))) if devices.len() == 1 => {
                let logged = std::fs::read_to_string(&log).unwrap();
                assert_eq!(
                    devices[0]
                        .properties
                        .get("ONVIF_DEVICE_IP_ADDRESS")
                        .map(String::as_str),
                    Some("10.9.8.7"),
                    "{:?}\n{logged}",
                    devices[0].properties
                );
                break;
            }
            Ok(Some(_)) => continue,
            other => panic!("expected the camera, got {other:?}"),
        }
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("registered with the node agent"),
        "{logged}"
    );
    assert!(
        !logged.contains(PASSWORD),
        "the password is in the log:\n{logged}"
    );
}
