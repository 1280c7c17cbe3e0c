//! The standalone binary beside the kubelet-plugin's agent: killed mid-stream, the failure
//! shows in the configuration's status for this node; started again, discovery recovers and
//! the error clears.

use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_testing::{ControlPlane, ControlPlaneOptions, from_json};
use kube::api::{Api, PostParams};
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
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("akri").await.unwrap();
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = AgentConfig::embedded(&node, &ns, dir.path());
    let handlers_dir = config.discovery_socket.parent().unwrap().to_path_buf();
    let _agent = agent::start(client.clone(), config)
        .await
        .expect("agent starts");
    let mut handler = start_handler(&handlers_dir);

    let name = ControlPlane::unique_name("null");
    let configuration: akri_api::v1::DiscoveryConfiguration = from_json(serde_json::json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": name },
        "spec": { "discoveryHandler": {
            "name": "udev", "discoveryDetails": "udevRules: ['KERNEL==\"null\"']",
        } },
    }));
    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    configs
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let found = async || {
        instances
            .list(&Default::default())
            .await
            .ok()?
            .items
            .iter()
            .any(|i| {
                i.spec.configuration_name == name
                    && i.spec
                        .broker_properties
                        .get("UDEV_DEVNODE")
                        .map(String::as_str)
                        == Some("/dev/null")
            })
            .then_some(())
    };
    akri_testing::eventually("the null device's Instance", Duration::from_secs(30), found).await;
    let error_of = async || {
        configs
            .get(&name)
            .await
            .ok()?
            .status?
            .discovery_errors
            .into_iter()
            .find(|e| e.node == node)
            .map(|e| e.message)
    };
    assert_eq!(error_of().await, None);

    handler.kill().await.unwrap();
    let message = akri_testing::eventually(
        "the killed handler in the status",
        Duration::from_secs(30),
        error_of,
    )
    .await;
    assert!(message.contains("udev"), "names the handler: {message}");

    let _handler = start_handler(&handlers_dir);
    akri_testing::eventually("the error cleared", Duration::from_secs(60), async || {
        error_of().await.is_none().then_some(())
    })
    .await;
    akri_testing::eventually("the Instance back", Duration::from_secs(30), found).await;
}
