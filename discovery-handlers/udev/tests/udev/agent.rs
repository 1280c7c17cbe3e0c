//! The standalone binary beside the kubelet-plugin's agent: killed mid-stream, the failure
//! shows in the configuration's status for this node; started again, discovery recovers and
//! the error clears.

use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_testing::ControlPlane;
use akri_testing::discovery::AgentCluster;
use std::time::Duration;

fn start_handler(handlers_dir: &std::path::Path) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_akri-udev-discovery-handler"))
        .arg("--handlers-dir")
        .arg(handlers_dir)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn a_killed_handler_shows_in_the_status_and_its_return_clears_it() {
    let cluster = AgentCluster::start(&akri_api::crds::all()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig::embedded(&cluster.node, &cluster.namespace, dir.path());
    let handlers_dir = config.discovery_socket.parent().unwrap().to_path_buf();
    let _agent = agent::start(cluster.client.clone(), config)
        .await
        .expect("agent starts");
    let handler = start_handler(&handlers_dir);

    let name = ControlPlane::unique_name("null");
    cluster
        .apply_configuration(&name, "udev", "udevRules: ['KERNEL==\"null\"']")
        .await;
    let found = async || {
        cluster
            .instance_properties(&name)
            .await
            .iter()
            .any(|p| p.get("UDEV_DEVNODE").map(String::as_str) == Some("/dev/null"))
            .then_some(())
    };
    akri_testing::eventually_within("the null device's Instance", Duration::from_secs(30), found)
        .await;
    let error_of = async || cluster.discovery_error(&name).await;
    assert_eq!(error_of().await, None);

    let _handler = cluster
        .kill_and_restart_handler(&name, "udev", handler, || start_handler(&handlers_dir))
        .await;
    akri_testing::eventually_within("the Instance back", Duration::from_secs(30), found).await;
}
