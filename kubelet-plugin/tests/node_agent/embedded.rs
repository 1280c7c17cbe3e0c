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
        served.push(
            handler
                .start(registry.socket(), &state, "node-a")
                .await
                .unwrap(),
        );
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

/// The `static` handler, embedded (`--embed-handlers=static`): a configuration's hand-listed
/// devices become Instances on the nodes they list (a device node is each node's own), with their properties;
/// a list that is wrong shows in the configuration's status for the node.
#[tokio::test]
async fn static_devices_become_instances_where_they_are_listed() {
    use akri_kubelet_plugin::agent::{self, AgentConfig};
    use akri_testing::discovery::AgentCluster;

    let cluster = AgentCluster::start(&akri_api::crds::all()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::embedded(&cluster.node, &cluster.namespace, dir.path());
    config.embedded_handlers = vec![Embedded::Static];
    let _agent = agent::start(cluster.client.clone(), config)
        .await
        .expect("agent starts");
    let node = &cluster.node;
    let details = format!(
        "devices:
- {{id: line-3-plc, nodes: [{node}, edge-2], properties: {{PLC_ADDRESS: '10.1.3.7:502'}}}}
- {{id: elsewhere, nodes: [edge-2], properties: {{PLC_ADDRESS: '10.1.3.8:502'}}}}
- {{id: console, nodes: [{node}], properties: {{BAUD: '9600'}}, deviceNodes: [/dev/tty]}}
"
    );
    cluster
        .apply_configuration("plcs", "static", &details)
        .await;
    let found = akri_testing::eventually("the listed devices' Instances", async || {
        let found = cluster.instance_properties("plcs").await;
        (found.len() == 2).then_some(found)
    })
    .await;
    let mut values: Vec<&str> = (found.iter())
        .filter_map(|p| p.get("PLC_ADDRESS").or(p.get("BAUD")).map(String::as_str))
        .collect();
    values.sort();
    assert_eq!(values, ["10.1.3.7:502", "9600"], "{found:?}");
    assert_eq!(cluster.discovery_error("plcs").await, None);

    cluster
        .apply_configuration("plcs", "static", "devices: [{id: a, nodes: []}]")
        .await;
    let message = cluster.error_appears("plcs").await;
    assert!(message.contains("nodes lists no node"), "{message}");
}
