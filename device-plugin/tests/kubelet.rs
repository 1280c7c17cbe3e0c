//! The device-plugin library with the kubelet's own device manager (kubelet peer) as its
//! peer: registration, advertisement, allocation, pod-resources, kubelet restarts, shutdown.

use akri_testing::{ControlPlane, KubeletPeer};
use device_plugin::plugin::Device;
use device_plugin::{DevicePlugin, PluginConfig, ServedPlugin};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kubelet_proto::deviceplugin::v1beta1 as api;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

const RESOURCE: &str = "example.com/widget";

/// A plugin with a fixed set of devices that records what it allocated.
struct Widgets {
    devices: watch::Sender<Vec<Device>>,
    allocated: Mutex<Vec<Vec<String>>>,
}

#[tonic::async_trait]
impl DevicePlugin for Widgets {
    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.subscribe()
    }

    async fn allocate(
        &self,
        requests: &[Vec<String>],
    ) -> Result<Vec<api::ContainerAllocateResponse>, tonic::Status> {
        self.allocated.lock().unwrap().extend(requests.to_vec());
        Ok(requests
            .iter()
            .map(|ids| api::ContainerAllocateResponse {
                envs: BTreeMap::from([("WIDGETS".to_string(), ids.join(","))])
                    .into_iter()
                    .collect(),
                ..Default::default()
            })
            .collect())
    }
}

use akri_testing::eventually;

async fn capacity(peer: &KubeletPeer) -> (i64, i64) {
    let body = peer.device_capacity().await.unwrap();
    (
        body["capacity"][RESOURCE].as_i64().unwrap_or(-1),
        body["allocatable"][RESOURCE].as_i64().unwrap_or(-1),
    )
}

async fn create_pod(client: &kube::Client, namespace: &str, name: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name },
        "spec": { "containers": [{
            "name": "app", "image": "busybox",
            "resources": { "limits": { RESOURCE: "1" } },
        }] },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_plugin_registers_serves_and_survives_kubelet_restarts() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("widgets").await.unwrap();
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let peer = KubeletPeer::start(cp, &node).await.unwrap();

    let (devices, _) = watch::channel(vec![
        Device::healthy("w-0"),
        Device::healthy("w-1"),
        Device::unhealthy("w-2"),
    ]);
    let plugin = Arc::new(Widgets {
        devices,
        allocated: Mutex::default(),
    });
    let config = PluginConfig {
        dir: peer.device_plugin_dir(),
        resource_name: RESOURCE.to_string(),
        socket_name: "widget.sock".to_string(),
    };
    let served = ServedPlugin::start(&config, plugin.clone()).unwrap();

    // Registered and advertised: three devices, two of them allocatable.
    eventually("the widgets advertised", async || {
        (capacity(&peer).await == (3, 2)).then_some(())
    })
    .await;
    assert_eq!(
        peer.allocatable_devices().await.unwrap()[RESOURCE],
        ["w-0", "w-1"]
    );

    // A change of the devices reaches the kubelet.
    plugin.devices.send_replace(vec![
        Device::healthy("w-0"),
        Device::healthy("w-1"),
        Device::healthy("w-2"),
    ]);
    eventually("the health change", async || {
        (capacity(&peer).await == (3, 3)).then_some(())
    })
    .await;

    // The kubelet allocates through the plugin; pod-resources shows the container's device.
    create_pod(&client, &ns, "one").await;
    let options = peer.allocate(&ns, "one", "app").await.unwrap();
    let given = options["envs"]["WIDGETS"].as_str().unwrap().to_string();
    assert_eq!(*plugin.allocated.lock().unwrap(), [vec![given.clone()]]);
    let in_use = device_plugin::pod_resources::devices_in_use(&peer.pod_resources_socket())
        .await
        .unwrap();
    assert_eq!(in_use[RESOURCE].iter().collect::<Vec<_>>(), [&given]);
    peer.release(&ns, "one").await.unwrap();
    let in_use = device_plugin::pod_resources::devices_in_use(&peer.pod_resources_socket())
        .await
        .unwrap();
    assert!(!in_use.contains_key(RESOURCE), "{in_use:?}");

    // A kubelet restart empties the directory; the plugin serves and registers again.
    let mut registrations = served.registrations();
    assert_eq!(*registrations.borrow_and_update(), 1);
    peer.restart().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), registrations.changed())
        .await
        .expect("registered again within 10 s")
        .unwrap();
    eventually("the widgets advertised after the restart", async || {
        (capacity(&peer).await == (3, 3)).then_some(())
    })
    .await;
    create_pod(&client, &ns, "two").await;
    peer.allocate(&ns, "two", "app").await.unwrap();
    assert_eq!(plugin.allocated.lock().unwrap().len(), 2);

    // Shutdown leaves the kubelet with no devices of the resource, at once.
    served.shutdown().await;
    eventually("capacity 0 after shutdown", async || {
        (capacity(&peer).await == (0, 0)).then_some(())
    })
    .await;
}
