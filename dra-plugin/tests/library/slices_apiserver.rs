//! The slice publisher against a real kube-apiserver.

use akri_testing::ControlPlane;
use dra_plugin::slices::{PoolScope, SlicePublisher};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};
use kube::api::{Api, ListParams};

fn devices(n: usize) -> Vec<Device> {
    (0..n)
        .map(|i| Device {
            name: format!("dev-{i}"),
            attributes: Some(
                [(
                    "akri.sh/instance".to_string(),
                    DeviceAttribute {
                        string: Some(format!("instance-{i}")),
                        ..DeviceAttribute::default()
                    },
                )]
                .into(),
            ),
            ..Device::default()
        })
        .collect()
}

#[tokio::test]
async fn publishes_node_pools_with_generations() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let node_name = ControlPlane::unique_name("node");
    let node: Node = cp.create_node(&node_name).await.unwrap();
    let driver = format!("{}.test.akri.sh", ControlPlane::unique_name("pub"));
    let publisher = SlicePublisher::new(
        client.clone(),
        &driver,
        &node_name,
        PoolScope::Node {
            name: node_name.clone(),
            uid: node.metadata.uid.clone().unwrap(),
        },
        "test-publisher",
    );
    let slices = Api::<ResourceSlice>::all(client);
    let mine = || async {
        let mut items: Vec<ResourceSlice> = slices
            .list(&ListParams::default().fields(&format!("spec.driver={driver}")))
            .await
            .unwrap()
            .items;
        items.sort_by_key(|s| s.metadata.name.clone());
        items
    };

    let first = publisher.publish(&devices(130)).await.unwrap();
    assert_eq!((first.generation, first.written, first.deleted), (1, 2, 0));
    let stored = mine().await;
    assert_eq!(stored.len(), 2);
    assert_eq!(
        stored
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .sum::<usize>(),
        130
    );
    assert!(
        stored
            .iter()
            .all(|s| s.spec.pool.resource_slice_count == 2 && s.spec.pool.generation == 1)
    );
    assert!(
        stored
            .iter()
            .all(|s| s.spec.node_name.as_deref() == Some(node_name.as_str()))
    );

    let again = publisher.publish(&devices(130)).await.unwrap();
    assert_eq!(
        (again.generation, again.written),
        (1, 0),
        "nothing changed, nothing written"
    );

    let shrunk = publisher.publish(&devices(3)).await.unwrap();
    assert_eq!(
        (shrunk.generation, shrunk.written, shrunk.deleted),
        (2, 1, 1)
    );
    let stored = mine().await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].spec.pool.generation, 2);
    assert_eq!(stored[0].spec.devices.as_ref().unwrap().len(), 3);

    // A kubelet restart deletes the node's slices; publishing again restores them.
    slices
        .delete(
            stored[0].metadata.name.as_ref().unwrap(),
            &Default::default(),
        )
        .await
        .unwrap();
    let restored = publisher.publish(&devices(3)).await.unwrap();
    assert_eq!(
        (restored.generation, restored.written),
        (3, 1),
        "generations never go back"
    );
    assert_eq!(mine().await.len(), 1);

    publisher.unpublish().await.unwrap();
    assert!(mine().await.is_empty());
}

#[tokio::test]
async fn api_support_is_read_back_from_the_server_and_nothing_is_stored() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let support = dra_plugin::api_support::ApiSupport::detect(&client)
        .await
        .unwrap();
    // The harness turns every beta DRA gate on: what the server keeps must follow the gates
    // (GA ones are on without being named).
    let gate = |name: &str| cp.gate_enabled(name);
    assert_eq!(
        support.consumable_capacity,
        gate("DRAConsumableCapacity"),
        "{support:?} with gates {}",
        cp.feature_gates()
    );
    assert_eq!(
        support.per_device_node_selection,
        gate("DRAPartitionableDevices")
    );
    assert_eq!(support.extended_resource_name, gate("DRAExtendedResource"));
    assert_eq!(support.device_taints, gate("DRADeviceTaints"));
    // Alpha in 1.37, unknown before, so off on this server: the server drops the field. The
    // real-node suite turns it on and sees the slices keep it.
    assert!(!support.optional_node_operations, "{support:?}");
    // The whole of it, as the other suites take it to branch on.
    let expected = cp.capabilities();
    assert_eq!(
        akri_testing::Capabilities {
            consumable_capacity: support.consumable_capacity,
            per_device_node_selection: support.per_device_node_selection,
            extended_resource_name: support.extended_resource_name,
            device_taints: support.device_taints,
            binding_conditions: support.binding_conditions,
            optional_node_operations: support.optional_node_operations,
        },
        expected,
        "the probe against the gates {}",
        cp.feature_gates()
    );
    let probes = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.driver.starts_with("probe."))
        .count();
    assert_eq!(probes, 0, "dry runs store nothing");
}
