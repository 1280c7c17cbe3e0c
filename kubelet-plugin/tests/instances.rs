//! Instances written by several nodes on a real kube-apiserver: each node owns its entry of
//! `nodes` (server-side apply, one field manager per node); the last node to lose a shared
//! device deletes the Instance, after the grace period.

use akri_kubelet_plugin::discovery::DiscoveredDevice;
use akri_kubelet_plugin::instances::InstanceWriter;
use akri_kubelet_plugin::node_devices::KnownDevice;
use akri_testing::ControlPlane;
use kube::api::Api;
use std::time::Duration;

#[tokio::test]
async fn shared_instances_follow_their_nodes() {
    let cp = ControlPlane::shared_api_server()
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("instances").await.unwrap();
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
