//! Handlers embedded in the agent register like external ones, each on its socket beside the
//! registration socket, and serve their own discovery there.

use akri_discovery_handler::client::discover;
use akri_kubelet_plugin::discovery::{Endpoint, Registry};
use akri_kubelet_plugin::embedded::Embedded;

#[tokio::test]
async fn embedded_handlers_register_beside_the_registration_socket_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::serve(
        &dir.path().join("handlers/agent-registration.sock"),
        &dir.path().join("state/handlers.json"),
    )
    .unwrap();
    let state = dir.path().join("state");
    let mut served = Vec::new();
    for handler in [Embedded::Udev, Embedded::Opcua, Embedded::Onvif] {
        served.push(handler.start(registry.socket(), &state).await.unwrap());
    }
    let handlers = registry.handlers();
    for (name, shared, says) in [
        ("udev", false, "udevRules"),
        ("opcua", true, "opcuaDiscoveryMethod"),
        ("onvif", true, "discoveryTimeoutSeconds"),
    ] {
        let registered = &handlers[name];
        let socket = dir.path().join(format!("handlers/{name}.sock"));
        assert_eq!(registered.endpoint, Endpoint::Uds(socket.clone()));
        assert_eq!(registered.shared, shared, "{name}");
        // Each socket serves its own handler: its own complaint about bad details.
        let details = if name == "onvif" {
            "discoveryTimeoutSeconds: 0"
        } else {
            "{}"
        };
        let status = discover(&socket, details, &[]).await.unwrap_err();
        assert!(
            status.message().contains(says),
            "{name}: {}",
            status.message()
        );
    }
}
