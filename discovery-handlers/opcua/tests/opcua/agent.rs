//! The standalone binary beside the kubelet-plugin's agent, as a node runs it: garbage details,
//! a discovery URL nobody answers and the handler killed mid-stream each show in the
//! configuration's status for this node, without touching another configuration, and clear
//! once put right.

use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_testing::discovery::AgentCluster;
use akri_testing::eventually_within;
use akri_testing::peers::Peer;
use std::path::Path;
use std::time::Duration;

fn start_handler(handlers_dir: &Path, pki_dir: &Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-opcua-discovery-handler"))
        .arg("--handlers-dir")
        .arg(handlers_dir)
        .args(["--rescan-seconds", "1"])
        .arg("--pki-dir")
        .arg(pki_dir)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn bad_details_an_unreachable_server_and_a_killed_handler_show_in_the_status_and_clear() {
    let cluster = AgentCluster::start(&akri_api::crds::all()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig::embedded(&cluster.node, &cluster.namespace, dir.path());
    let handlers_dir = config.discovery_socket.parent().unwrap().to_path_buf();
    let _agent = agent::start(cluster.client.clone(), config)
        .await
        .expect("agent starts");
    let pki = dir.path().join("pki");
    let handler = start_handler(&handlers_dir, &pki);

    let port = akri_testing::free_port().unwrap();
    let url = format!("opc.tcp://127.0.0.1:{port}/");
    let (plant, garbage) = ("plant", "garbage");
    let details = format!("opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: ['{url}']\n");
    cluster.apply_configuration(plant, "opcua", &details).await;
    cluster
        .apply_configuration(garbage, "opcua", "opcuaDiscoveryMethod: [no, urls]")
        .await;
    let error_of = async |name: &str| cluster.discovery_error(name).await;

    // Nobody answers at the URL yet: the status says which URL.
    let message = cluster.error_appears(plant).await;
    assert!(message.contains(&url), "names the URL: {message}");
    let message = cluster.error_appears(garbage).await;
    assert!(
        message.contains("opcua discovery details"),
        "says the details are wrong: {message}"
    );

    // The server comes up: found, and the error clears (the agent retries the stream).
    let _server = Peer::start(
        "Boiler",
        "opcua_server.py",
        &[
            "--port",
            &port.to_string(),
            "--name",
            "Boiler",
            "--type",
            "server",
        ]
        .map(String::from),
    )
    .unwrap();
    let found = async || {
        cluster
            .instance_properties(plant)
            .await
            .iter()
            .any(|p| {
                p.get("OPCUA_DISCOVERY_URL") == Some(&url)
                    && p.get("OPCUA_APPLICATION_NAME").map(String::as_str) == Some("Boiler")
            })
            .then_some(())
    };
    eventually_within("the server's Instance", Duration::from_secs(90), found).await;
    cluster.error_clears(plant).await;
    assert!(
        error_of(garbage).await.is_some(),
        "the garbage configuration still fails on its own"
    );

    // Killed mid-stream: the status names the handler; started again, all is as before.
    let _handler = cluster
        .kill_and_restart_handler(plant, "opcua", handler, || {
            start_handler(&handlers_dir, &pki)
        })
        .await;
    eventually_within("the Instance back", Duration::from_secs(30), found).await;

    // The garbage details put right: that configuration finds the server too, and its error
    // clears.
    cluster
        .apply_configuration(garbage, "opcua", &details)
        .await;
    cluster.error_clears(garbage).await;
    let found_by_fixed =
        async || (!cluster.instance_properties(garbage).await.is_empty()).then_some(());
    eventually_within(
        "the fixed configuration's Instance",
        Duration::from_secs(30),
        found_by_fixed,
    )
    .await;
}
