//! Helpers the tests of this binary share (besides `tests/support`, which `allocation` shares
//! too).

use super::support::from_json;
use akri_api::v1::DiscoveryConfiguration;
use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::metrics::Metrics;
use akri_testing::ControlPlane;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::Duration;

pub(crate) async fn configuration(client: &kube::Client, prefix: &str) -> String {
    let name = ControlPlane::unique_name(prefix);
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name },
                "spec": { "discoveryHandler": { "name": "onvif" }, "capacity": 2 },
            })),
        )
        .await
        .unwrap();
    name
}

pub(crate) async fn unique_node(cp: &ControlPlane) -> String {
    let name = ControlPlane::unique_name("edge");
    cp.create_node(&name).await.unwrap();
    name
}

/// A controller (no leader election) for `namespace`'s Instances.
pub(crate) fn controller_for(
    client: kube::Client,
    namespace: &str,
    metrics: Metrics,
) -> tokio::task::JoinHandle<()> {
    let mut config = ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    tokio::spawn(async move {
        akri_driver_controller::controller::run(client, config, metrics)
            .await
            .unwrap();
    })
}

/// The shared devices an Instance of a uniqueDevices configuration with `capacity` becomes:
/// one, or one per slot where the API server lacks consumable capacity (1.34).
pub(crate) fn devices_per_instance(cp: &akri_testing::ControlPlane, capacity: i32) -> i32 {
    if cp.capabilities().consumable_capacity {
        1
    } else {
        capacity
    }
}

/// Instance `instance` of `configuration` (shared, capacity 2) as node `node`'s kubelet-plugin
/// writes it: its own entry of `nodes`, under its own field manager.
pub(crate) async fn seen_by(
    instances: &Api<akri_api::v1::Instance>,
    configuration: &str,
    instance: &str,
    node: &str,
) {
    use akri_api::v1::{INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL};
    let object = json!({
        "apiVersion": "akri.sh/v0", "kind": "Instance",
        "metadata": { "name": instance, "labels": {
            INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION } },
        "spec": {
            "configurationName": configuration, "cdiName": format!("akri.sh/onvif={instance}"),
            "capacity": 2, "shared": true, "nodes": [node],
        },
    });
    instances
        .patch(
            instance,
            &kube::api::PatchParams::apply(&akri_devices::node_field_manager(node)).force(),
            &kube::api::Patch::Apply(&object),
        )
        .await
        .unwrap();
}
