//! Akri's agent as the kubelet sees it, for tests of the move off Akri: the instance-level
//! device plugin of one device, `akri.sh/<instance>` with slots `<instance>-<n>`, as Akri's
//! agent registers it. Dropping it is what uninstalling Akri does to the node: the plugin's
//! socket goes and nothing is cleaned up.

use device_plugin::plugin::Device;
use kubelet_proto::deviceplugin::v1beta1::ContainerAllocateResponse;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;

/// One device's instance-level plugin.
struct InstancePlugin {
    devices: watch::Sender<Vec<Device>>,
    envs: HashMap<String, String>,
}

#[tonic::async_trait]
impl device_plugin::DevicePlugin for InstancePlugin {
    fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.subscribe()
    }

    async fn allocate(
        &self,
        requests: &[Vec<String>],
    ) -> Result<Vec<ContainerAllocateResponse>, tonic::Status> {
        Ok(requests
            .iter()
            .map(|_| ContainerAllocateResponse {
                envs: self.envs.clone(),
                ..Default::default()
            })
            .collect())
    }
}

/// Serves `akri.sh/<instance>` on the kubelet whose device-plugin directory is `dir`:
/// `capacity` slots, those in `free` healthy (Akri offers a slot another node holds as
/// unhealthy); a container allocated one gets `envs`, as Akri's brokers get the device's
/// properties. Runs until dropped.
pub fn serve_instance(
    dir: &Path,
    instance: &str,
    capacity: i32,
    free: &[i32],
    envs: &[(&str, &str)],
) -> Result<device_plugin::ServedPlugin, device_plugin::server::Error> {
    let devices = (0..capacity)
        .map(|n| {
            let id = format!("{instance}-{n}");
            match free.contains(&n) {
                true => Device::healthy(id),
                false => Device::unhealthy(id),
            }
        })
        .collect();
    let plugin = InstancePlugin {
        devices: watch::channel(devices).0,
        envs: (envs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    device_plugin::ServedPlugin::start(
        &device_plugin::PluginConfig {
            dir: dir.to_path_buf(),
            resource_name: format!("akri.sh/{instance}"),
            socket_name: format!("akri-{instance}.sock"),
        },
        Arc::new(plugin),
    )
}
