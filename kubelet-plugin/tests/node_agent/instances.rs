//! Instances written by several nodes on a real kube-apiserver: each node owns its entry of
//! `nodes` (server-side apply, one field manager per node); the last node to lose a shared
//! device deletes the Instance, after the grace period.

use akri_kubelet_plugin::discovery::DiscoveredDevice;
use akri_kubelet_plugin::instances::InstanceWriter;
use akri_kubelet_plugin::node_devices::KnownDevice;
use akri_testing::ControlPlane;
use kube::api::Api;
use std::time::Duration;

/// A client of this binary's API server, with the CRDs, and a fresh namespace.
async fn namespace(prefix: &str) -> (kube::Client, String) {
    let cp = ControlPlane::shared_api_server()
        .await
        .expect("control plane");
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace(prefix).await.unwrap();
    (cp.client().await.unwrap(), ns)
}

#[tokio::test]
async fn shared_instances_follow_their_nodes() {
    let (client, ns) = namespace("instances").await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);

    let camera = KnownDevice {
        configuration: "cams".into(),
        instance: akri_devices::instance_name("cams", "rtsp://10.0.0.7/stream", true, ""),
        device: DiscoveredDevice {
            id: "rtsp://10.0.0.7/stream".into(),
            properties: [(
                "ONVIF_DEVICE_IP_ADDRESS".to_string(),
                "10.0.0.7".to_string(),
            )]
            .into(),
            ..DiscoveredDevice::default()
        },
    };
    let grace = Duration::from_millis(500);
    let mut a = InstanceWriter::new(client.clone(), &ns, "node-a", grace);
    let mut b = InstanceWriter::new(client.clone(), &ns, "node-b", grace);
    let seen = vec![(camera.clone(), 2, true)];
    a.sync(&seen).await.unwrap();
    b.sync(&seen).await.unwrap();
    let nodes = |i: &akri_api::v0::Instance| {
        let mut nodes = i.spec.nodes.clone();
        nodes.sort();
        nodes
    };
    let instance = instances.get(&camera.instance).await.unwrap();
    assert_eq!(
        nodes(&instance),
        ["node-a", "node-b"],
        "both nodes own their entry"
    );
    assert_eq!(instance.spec.capacity, 2);
    assert!(instance.spec.shared);

    // Node A stops seeing the camera: nothing changes within the grace period, then A leaves.
    a.sync(&[]).await.unwrap();
    assert!(a.pending());
    assert_eq!(
        nodes(&instances.get(&camera.instance).await.unwrap()),
        ["node-a", "node-b"]
    );
    tokio::time::sleep(grace).await;
    a.sync(&[]).await.unwrap();
    assert_eq!(
        nodes(&instances.get(&camera.instance).await.unwrap()),
        ["node-b"]
    );

    // Node B, the last one, deletes the Instance after its grace period.
    b.sync(&[]).await.unwrap();
    tokio::time::sleep(grace).await;
    b.sync(&[]).await.unwrap();
    assert!(
        instances.get_opt(&camera.instance).await.unwrap().is_none(),
        "the last node deleted it"
    );
}

/// Node names may have 253 characters; field managers may have 128. A node with the longest
/// name still writes its Instances (and two such nodes still own separate entries).
#[tokio::test]
async fn nodes_with_the_longest_names_write_instances() {
    let (client, ns) = namespace("long-names").await;
    let long = |last: char| format!("{}.{}{last}", "n".repeat(63), "m".repeat(188));
    let (node_a, node_b) = (long('a'), long('b'));
    assert_eq!(node_a.len(), 253);
    let camera = KnownDevice {
        configuration: "cams".into(),
        instance: akri_devices::instance_name("cams", "rtsp://10.0.0.8/s", true, ""),
        device: DiscoveredDevice {
            id: "rtsp://10.0.0.8/s".into(),
            ..DiscoveredDevice::default()
        },
    };
    let seen = vec![(camera.clone(), 1, true)];
    for node in [&node_a, &node_b] {
        InstanceWriter::new(client.clone(), &ns, node, Duration::ZERO)
            .sync(&seen)
            .await
            .expect("the field manager is valid (kube-rs checks the API server's 128-byte limit before sending)");
    }
    let instance = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns)
        .get(&camera.instance)
        .await
        .unwrap();
    assert_eq!(instance.spec.nodes.len(), 2, "{:?}", instance.spec.nodes);
}

/// A device with more properties than DRA allows attributes: its slice is accepted (the
/// attributes that fit), and its Instance names the properties left out.
#[tokio::test]
async fn a_device_with_too_many_properties_is_published() {
    let (client, ns) = namespace("many-props").await;
    let properties: std::collections::BTreeMap<String, String> = (0..40)
        .map(|i| (format!("PROP_{i:02}"), format!("v{i}")))
        .collect();
    let camera = KnownDevice {
        configuration: "cams".into(),
        instance: akri_devices::instance_name("cams", "many", false, "node-p"),
        device: DiscoveredDevice {
            id: "many".into(),
            properties: properties.clone(),
            ..DiscoveredDevice::default()
        },
    };
    let devices = akri_devices::devices(
        &akri_devices::InstanceDevice {
            instance: &camera.instance,
            configuration: "cams",
            capacity: 2,
            properties: &properties,
        },
        akri_devices::Sharing::ConsumableCapacity,
    );
    let slice: k8s_openapi::api::resource::v1::ResourceSlice =
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": ControlPlane::unique_name("many") },
            "spec": { "driver": "debugecho.akri.sh", "nodeName": "node-p",
                      "pool": { "name": "node-p", "generation": 1, "resourceSliceCount": 1 },
                      "devices": devices },
        }))
        .unwrap();
    Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(client.clone())
        .create(&Default::default(), &slice)
        .await
        .expect("the API server takes the device");

    InstanceWriter::new(client.clone(), &ns, "node-p", Duration::ZERO)
        .sync(&[(camera.clone(), 2, false)])
        .await
        .unwrap();
    let instance = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns)
        .get(&camera.instance)
        .await
        .unwrap();
    let left_out =
        instance.metadata.annotations.unwrap()[akri_devices::UNPUBLISHED_PROPERTIES].clone();
    assert_eq!(
        left_out.split(',').count(),
        40 - akri_devices::MAX_PROPERTY_ATTRIBUTES
    );
    assert!(left_out.contains("PROP_39"), "{left_out}");
    assert_eq!(
        instance.spec.broker_properties.len(),
        40,
        "brokers still get every property"
    );
}

/// The writer knows what is stored from a watch, not a read per pass: an Instance deleted or
/// edited behind its back is written again by a later pass, once the watch has told it.
#[tokio::test]
async fn an_instance_deleted_or_edited_behind_its_back_is_written_again() {
    let (client, ns) = namespace("instances").await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let device = KnownDevice {
        configuration: "echo".into(),
        instance: akri_devices::instance_name("echo", "lobby", false, "node-a"),
        device: DiscoveredDevice {
            id: "lobby".into(),
            ..DiscoveredDevice::default()
        },
    };
    let mut writer = InstanceWriter::new(client.clone(), &ns, "node-a", Duration::ZERO);
    let known = vec![(device.clone(), 1, false)];
    writer.sync(&known).await.unwrap();
    assert!(instances.get_opt(&device.instance).await.unwrap().is_some());

    // Passes until the watch has told the writer (a bounded wait, not a timing assertion).
    async fn passes_until<T>(
        writer: &mut InstanceWriter,
        known: &[(KnownDevice, i32, bool)],
        what: &str,
        mut done: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        for _ in 0..80 {
            writer.sync(known).await.unwrap();
            if let Some(value) = done().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("{what}: not so after 20 s of passes");
    }

    instances
        .delete(&device.instance, &Default::default())
        .await
        .unwrap();
    passes_until(
        &mut writer,
        &known,
        "the deleted Instance written again",
        async || instances.get_opt(&device.instance).await.unwrap(),
    )
    .await;

    let edit = serde_json::json!({ "spec": { "capacity": 5 } });
    instances
        .patch(
            &device.instance,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&edit),
        )
        .await
        .unwrap();
    passes_until(
        &mut writer,
        &known,
        "the edited Instance written back",
        async || {
            let capacity = instances.get(&device.instance).await.unwrap().spec.capacity;
            (capacity == 1).then_some(())
        },
    )
    .await;
}
