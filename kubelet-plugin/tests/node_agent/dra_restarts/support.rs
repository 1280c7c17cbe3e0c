//! What the tests of this binary share: the plugin binary, test nodes with their kubelet
//! peer, and the objects the tests create and read.

use akri_kubelet_plugin::discovery::DiscoveredDevice;
use akri_kubelet_plugin::driver::AkriDriver;
use akri_kubelet_plugin::node_devices::{ConfigDevices, NodeDevices};
use akri_testing::{ControlPlane, KubeletPeer};
use dra_plugin::cdi::CdiRoot;
use dra_plugin::service::{ClaimRef, DraService, DriverOnNode};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::Path;

pub(crate) const DRIVER: &str = "debugecho.akri.sh";

pub(crate) use akri_testing::eventually;

pub(crate) use akri_testing::from_json;

/// The plugin binary for `node`, with the embedded debugEcho, its state in `dir`.
pub(crate) fn spawn_plugin(
    cp: &ControlPlane,
    peer: &KubeletPeer,
    node: &str,
    namespace: &str,
    dir: &Path,
) -> tokio::process::Child {
    spawn_plugin_with(cp, peer, node, namespace, dir, &[])
}

pub(crate) fn spawn_plugin_with(
    cp: &ControlPlane,
    peer: &KubeletPeer,
    node: &str,
    namespace: &str,
    dir: &Path,
    extra: &[&str],
) -> tokio::process::Child {
    spawn_plugin_through(cp.kubeconfig(), peer, node, namespace, dir, extra)
}

/// The plugin binary reaching the API server as `kubeconfig` says.
pub(crate) fn spawn_plugin_through(
    kubeconfig: &Path,
    peer: &KubeletPeer,
    node: &str,
    namespace: &str,
    dir: &Path,
    extra: &[&str],
) -> tokio::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("plugin.log"))
        .unwrap();
    let kubelet = [peer.registry_dir(), peer.plugins_dir(), peer.cdi_dir()];
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_akri-kubelet-plugin"));
    akri_testing::components::agent_command(bin, kubeconfig, (node, namespace), kubelet, dir)
        .env("RUST_LOG", "info")
        .args(["--instance-grace-seconds", "0"])
        .args(extra)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("the plugin binary starts")
}

/// How many devices of `config` the node's pool has (other tests' configurations share the
/// cluster, and every plugin discovers them all).
pub(crate) async fn pool_size(client: &kube::Client, node: &str, config: &str) -> usize {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter(|d| d.name.starts_with(&format!("{config}-")))
        .count()
}

/// Creates a debugEcho DiscoveryConfiguration named `<prefix>-<unique>` whose devices are
/// `descriptions` (comma separated); its name.
pub(crate) async fn echo_config(client: &kube::Client, prefix: &str, descriptions: &str) -> String {
    let name = ControlPlane::unique_name(prefix);
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name },
                "spec": { "discoveryHandler": { "name": "debugEcho",
                    "discoveryDetails": format!("descriptions: [{descriptions}]") } },
            })),
        )
        .await
        .unwrap();
    name
}

/// What a node's publication looks like from the API server: slice (name, UID, generation,
/// device count) and Instance (name, UID).
pub(crate) type Publication = (Vec<(String, String, i64, usize)>, Vec<(String, String)>);

pub(crate) async fn publication(client: &kube::Client, node: &str, namespace: &str) -> Publication {
    publication_of(client, node, namespace, DRIVER).await
}

/// [`publication`] of `driver`'s slices.
pub(crate) async fn publication_of(
    client: &kube::Client,
    node: &str,
    namespace: &str,
    driver: &str,
) -> Publication {
    let mut slices: Vec<_> = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|s| s.spec.driver == driver)
        .map(|s| {
            (
                s.metadata.name.unwrap(),
                s.metadata.uid.unwrap(),
                s.spec.pool.generation,
                s.spec.devices.unwrap_or_default().len(),
            )
        })
        .collect();
    slices.sort();
    let mut instances: Vec<_> =
        Api::<akri_api::v0::Instance>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|i| (i.metadata.name.unwrap(), i.metadata.uid.unwrap()))
            .collect();
    instances.sort();
    (slices, instances)
}

/// A test node with the kubelet peer, a namespace and a state directory.
pub(crate) async fn node_with_peer(
    prefix: &str,
) -> (String, String, KubeletPeer, tempfile::TempDir) {
    node_on(ControlPlane::shared().await.expect("control plane"), prefix).await
}

/// A namespace, a Node with its kubelet peer, and a state directory, on `cp`.
pub(crate) async fn node_on(
    cp: &ControlPlane,
    prefix: &str,
) -> (String, String, KubeletPeer, tempfile::TempDir) {
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace(prefix).await.unwrap();
    akri_testing::components::spawn_spec_mirror(&cp.client().await.unwrap(), &ns);
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let peer = KubeletPeer::start(cp, &node).await.unwrap();
    (node, ns, peer, tempfile::tempdir().unwrap())
}

/// A driver for `node` that sees debugEcho devices `ids` of configuration `echo`, its CDI
/// specs under `dir`, writing its claims' status as the builder has it do.
pub(crate) fn driver_seeing(
    client: &kube::Client,
    node: &str,
    ids: &[&str],
    capacity: i32,
    dir: &Path,
) -> DraService<AkriDriver> {
    let devices = NodeDevices::new(node, true);
    devices.set(
        DRIVER,
        ConfigDevices {
            configuration: "echo".into(),
            capacity,
            unique_devices: true,
            shared: false,
            devices: ids
                .iter()
                .map(|id| DiscoveredDevice {
                    id: id.to_string(),
                    properties: [("DEBUG_ECHO_DESCRIPTION".to_string(), id.to_string())].into(),
                    ..DiscoveredDevice::default()
                })
                .collect(),
        },
    );
    DraService::new(
        AkriDriver {
            driver: DRIVER.into(),
            cdi_class: "debugecho".into(),
            cdi: CdiRoot::new(dir.join("cdi"), "akri.sh").unwrap(),
            devices,
        },
        client.clone(),
        DriverOnNode {
            driver: DRIVER.into(),
            node: node.into(),
        },
        &dir.join("checkpoint.json"),
    )
    .unwrap()
    .device_status(dra_plugin::device_status::Writer::start(
        client.clone(),
        DRIVER,
    ))
}

/// A claim allocated by hand (as the scheduler would) to `results` (request, device, share id)
/// on `node`.
pub(crate) async fn allocated_claim(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    results: &[(&str, &str, Option<&str>)],
) -> ClaimRef {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), ns);
    let requests: Vec<_> = results
        .iter()
        .map(|(request, _, _)| json!({ "name": request, "exactly": { "deviceClassName": "any" } }))
        .collect();
    let created = claims
        .create(
            &PostParams::default(),
            &from_json(json!({ "metadata": { "name": name }, "spec": { "devices": { "requests": requests } } })),
        )
        .await
        .unwrap();
    let results: Vec<_> = results
        .iter()
        .map(|(request, device, share)| {
            json!({ "request": request, "driver": DRIVER, "pool": node, "device": device, "shareID": share })
        })
        .collect();
    let status = json!({ "status": { "allocation": {
        "devices": { "results": results },
        "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [{ "key": "metadata.name", "operator": "In", "values": [node] }] }] },
    } } });
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    ClaimRef {
        namespace: ns.into(),
        name: name.into(),
        uid: created.metadata.uid.unwrap(),
    }
}

/// The environment a CDI id gives a container, read from the spec files in `cdi_dir`.
pub(crate) fn cdi_env(cdi_dir: &Path, id: &str) -> Vec<String> {
    let (_, device) = id.split_once('=').unwrap();
    for file in std::fs::read_dir(cdi_dir).unwrap() {
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(file.unwrap().path()).unwrap()).unwrap();
        for d in spec["devices"].as_array().unwrap() {
            if d["name"] == device {
                return serde_json::from_value(d["containerEdits"]["env"].clone()).unwrap();
            }
        }
    }
    panic!("no CDI device {id}");
}

/// A proxy in front of the API server, and a kubeconfig in `dir` that reaches it through the
/// proxy (as `user`, if given).
pub(crate) async fn through_proxy(
    cp: &ControlPlane,
    dir: &Path,
    user: Option<&str>,
) -> (akri_testing::TcpProxy, std::path::PathBuf) {
    let proxy = akri_testing::TcpProxy::start(cp.api_server_address())
        .await
        .unwrap();
    let kubeconfig = dir.join("kubeconfig");
    cp.write_kubeconfig(&kubeconfig, Some(proxy.address()), user)
        .unwrap();
    (proxy, kubeconfig)
}

/// CPU seconds (user + system) a process has used so far.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux.
    ticks as f64 / 100.0
}
