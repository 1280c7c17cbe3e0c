//! The DiscoveryConfigurations' specs mirrored for the nodes (`spec_mirror.rs`), judged by the
//! API server's own record: the watch events of a mirror.

use crate::support::{Cluster, eventually};
use akri_api::v1::DiscoveryConfiguration;
use akri_api::v1::spec_mirror::{MIRRORED_MARKER, config_map_name};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

/// A node (running as the chart's kubelet-plugin, which may not read DiscoveryConfigurations)
/// discovers through the mirror; status writes, however many, never touch it; a spec change
/// does, once; a deleted configuration's mirror goes.
#[tokio::test]
async fn a_mirror_changes_with_the_spec_and_never_with_status_writes() {
    let c = Cluster::start(1, false).await;
    let name = c.discovery("mirror", &["m0"], 1, true).await;
    c.wait_published(&name, 1).await;
    let mirrors = Api::<ConfigMap>::namespaced(c.client.clone(), &c.namespace);
    let cm = config_map_name(&name);
    let mirror = mirrors.get(&cm).await.expect("the mirror exists");
    assert!(mirrors.get_opt(MIRRORED_MARKER).await.unwrap().is_some());
    let version = mirror.metadata.resource_version.clone().unwrap();

    // The API server's events of the mirror from now on, until it shows the spec change.
    let events = akri_testing::modifications_until(mirrors.clone(), &cm, &version, |cm| {
        (cm.data.iter().flatten()).any(|(_, v)| v.contains("m1"))
    });

    // Status writes as nodes make them (each its own entry), ten of them.
    let configs = Api::<DiscoveryConfiguration>::all(c.client.clone());
    for i in 0..10 {
        let patch = json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": name },
            "status": { "discoveryErrors": [{ "node": format!("node-{i}"), "message": "down" }] },
        });
        let params = PatchParams::apply(&format!("akri-kubelet-plugin/node-{i}")).force();
        configs
            .patch_status(&name, &params, &Patch::Apply(&patch))
            .await
            .unwrap();
    }
    // Then the spec: the watch ends at its mirror, after every status write above.
    let spec = json!({ "spec": { "discoveryHandler": {
        "name": "debugEcho", "discoveryDetails": "descriptions: [m0, m1]" } } });
    configs
        .patch(&name, &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
    let modified = tokio::time::timeout(std::time::Duration::from_secs(60), events)
        .await
        .expect("the mirror shows the spec change within 60 s")
        .unwrap();
    assert_eq!(
        modified.len(),
        1,
        "one write of the mirror, the spec's; none for the 10 status writes (the last: {:?})",
        modified.last().map(|cm| &cm.data)
    );
    c.wait_published(&name, 2).await;

    configs
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted configuration's mirror to go", async || {
        mirrors
            .get_opt(&config_map_name(&name))
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

/// The reconciler and the mirror writer read one watch of the configurations: every status
/// write reaches the driver-controller once, not once per reader. Counted by the API server
/// (`apiserver_longrunning_requests` of WATCHes) on a control plane where the driver-controller
/// is the only client, once it has mirrored (so both readers run).
#[tokio::test]
async fn the_driver_controller_watches_the_configurations_once() {
    use akri_driver_controller::controller::{self, ControllerConfig};
    let cp = akri_testing::ControlPlane::start(akri_testing::ControlPlaneOptions {
        crds: akri_api::crds::all(),
        ..Default::default()
    })
    .await
    .expect("control plane");
    let client = cp.client().await.unwrap();
    let namespace = cp.create_namespace("akri").await.unwrap();
    let running = tokio::spawn(controller::run(
        client.clone(),
        ControllerConfig::new(&namespace),
        Default::default(),
    ));
    let mirrors = Api::<ConfigMap>::namespaced(client.clone(), &namespace);
    eventually("the marker: every configuration mirrored", async || {
        mirrors.get_opt(MIRRORED_MARKER).await.ok()?
    })
    .await;
    let watches = async |resource: &str| -> f64 {
        (akri_testing::apiserver_samples(&client, "apiserver_longrunning_requests").await)
            .unwrap()
            .into_iter()
            .filter(|(l, _)| {
                l.get("verb").map(String::as_str) == Some("WATCH")
                    && l.get("resource").map(String::as_str) == Some(resource)
            })
            .map(|(_, value)| value)
            .sum()
    };
    // A configuration made now reaches both readers through their watches (a store is ready
    // after its first LIST, before its WATCH is open): its mirror and its DeviceClass.
    let config: DiscoveryConfiguration = serde_json::from_value(json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": "watched" },
        "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [w0]" } },
    }))
    .unwrap();
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(&Default::default(), &config)
        .await
        .unwrap();
    let classes = Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(client.clone());
    eventually(
        "the mirror and the DeviceClass of a new configuration",
        async || {
            mirrors.get_opt(&config_map_name("watched")).await.ok()??;
            classes.get_opt("watched").await.ok()?
        },
    )
    .await;
    assert_eq!(watches("discoveryconfigurations").await, 1.0);
    running.abort();
}
