//! The kubelet's pod-resources API (`podresources/v1`, `/var/lib/kubelet/pod-resources/
//! kubelet.sock`): which devices the containers the kubelet runs hold. The device-plugin API
//! has no deallocate call, so this is how a plugin learns that a container is gone.

use kubelet_proto::podresources::v1 as api;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The kubelet's pod-resources socket, relative to its root directory.
pub const SOCKET: &str = "pod-resources/kubelet.sock";

/// How long one `List` may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of asking the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach the kubelet's pod-resources API at {path}: {cause}")]
    Connect {
        path: PathBuf,
        cause: tonic::transport::Error,
    },
    #[error("the kubelet's pod-resources API failed: {0}")]
    List(tonic::Status),
    #[error("the kubelet's pod-resources API did not answer within {0:?}")]
    TimedOut(Duration),
}

/// Device ids held by the containers the kubelet runs, by extended resource.
pub type DevicesInUse = BTreeMap<String, BTreeSet<String>>;

/// Lists the pods the kubelet runs and returns the device ids their containers hold.
pub async fn devices_in_use(socket: &Path) -> Result<DevicesInUse, Error> {
    let call = async {
        let channel =
            node_io::authority::connect(socket)
                .await
                .map_err(|cause| Error::Connect {
                    path: socket.to_path_buf(),
                    cause,
                })?;
        api::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(api::ListPodResourcesRequest {})
            .await
            .map_err(Error::List)
    };
    let listed = tokio::time::timeout(LIST_TIMEOUT, call)
        .await
        .unwrap_or(Err(Error::TimedOut(LIST_TIMEOUT)))?;
    let mut in_use = DevicesInUse::new();
    for pod in listed.into_inner().pod_resources {
        for container in pod.containers {
            for devices in container.devices {
                in_use
                    .entry(devices.resource_name)
                    .or_default()
                    .extend(devices.device_ids);
            }
        }
    }
    Ok(in_use)
}
