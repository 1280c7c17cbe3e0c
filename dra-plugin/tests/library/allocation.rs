//! The whole DRA path on real Kubernetes: a ResourceSlice with one device on a simulated
//! node, a pod with a ResourceClaimTemplate, the real scheduler allocating the device and
//! binding the pod, then the kubelet's own DRA manager (kubelet peer) preparing the pod
//! through the example driver (`examples/minimal.rs`) and handing back CDI ids that the
//! reference CDI library resolves.

use crate::minimal::{CDI_CLASS, CDI_VENDOR, GadgetDriver};
use akri_testing::{ControlPlane, KubeletPeer, eventually};
use dra_plugin::Plugin;
use dra_plugin::cdi::CdiRoot;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::Duration;

use akri_testing::from_json;

#[tokio::test]
async fn scheduler_allocates_and_kubelet_prepares() {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("alloc").await.unwrap();
    let node = ControlPlane::unique_name("node");
    let driver = format!("{}.test.akri.sh", ControlPlane::unique_name("drv"));
    let class = ControlPlane::unique_name("class");
    cp.create_node(&node).await.unwrap();

    // A DeviceClass for the driver, and one device on the node.
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "metadata": { "name": class },
                "spec": { "selectors": [{ "cel": {
                    "expression": format!("device.driver == '{driver}'")
                }}]},
            })),
        )
        .await
        .unwrap();
    Api::<ResourceSlice>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "metadata": { "name": format!("{node}-slice") },
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
                    "devices": [{
                        "name": "dev-0",
                        "attributes": { "akri.sh/instance": { "string": "instance-0" } },
                    }],
                },
            })),
        )
        .await
        .unwrap();

    // A pod that asks for one device through a template.
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &from_json(json!({
                "metadata": { "name": "one-device" },
                "spec": { "spec": { "devices": { "requests": [{
                    "name": "dev",
                    "exactly": { "deviceClassName": class },
                }]}}},
            })),
        )
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &from_json(json!({
            "metadata": { "name": "consumer" },
            "spec": {
                "resourceClaims": [{ "name": "dev", "resourceClaimTemplateName": "one-device" }],
                "containers": [{
                    "name": "app",
                    "image": "registry.invalid/none:never-pulled",
                    "resources": { "claims": [{ "name": "dev" }] },
                }],
            },
        })),
    )
    .await
    .unwrap();

    // The real scheduler allocates the device and binds the pod to the node that has it.
    let pod = eventually("pod bound", async || {
        let pod = pods.get("consumer").await.ok()?;
        pod.spec.as_ref()?.node_name.as_ref()?;
        Some(pod)
    })
    .await;
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(node.as_str())
    );
    let claim_name = pod
        .status
        .as_ref()
        .unwrap()
        .resource_claim_statuses
        .as_ref()
        .unwrap()[0]
        .resource_claim_name
        .clone()
        .expect("the controller-manager created a claim from the template");
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), &ns)
        .get(&claim_name)
        .await
        .unwrap();
    let allocation = claim
        .status
        .as_ref()
        .unwrap()
        .allocation
        .as_ref()
        .expect("allocated");
    let result = &allocation
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        (
            result.driver.as_str(),
            result.pool.as_str(),
            result.device.as_str()
        ),
        (driver.as_str(), node.as_str(), "dev-0")
    );
    let reserved = claim
        .status
        .as_ref()
        .unwrap()
        .reserved_for
        .as_ref()
        .unwrap();
    assert_eq!(reserved[0].name, "consumer");

    // The kubelet's DRA manager prepares the pod through the example driver.
    let peer = KubeletPeer::start(cp, &node)
        .await
        .expect("kubelet peer starts");
    let plugin = Plugin::builder(&driver, &node)
        .registry_dir(peer.registry_dir())
        .plugin_dir(peer.plugins_dir().join(&driver))
        .start(
            client.clone(),
            GadgetDriver {
                cdi: CdiRoot::new(peer.cdi_dir(), CDI_VENDOR).unwrap(),
            },
        )
        .await
        .unwrap();
    peer.wait_for_driver(&driver, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        plugin.registration_status(),
        dra_plugin::registration::RegistrationStatus::Registered,
        "the kubelet reported the registration back"
    );

    let containers = peer
        .prepare(&ns, "consumer")
        .await
        .expect("prepare succeeds");
    let uid = claim.metadata.uid.clone().unwrap();
    let expected_id = format!("{CDI_VENDOR}/{CDI_CLASS}={uid}-dev-0");
    assert_eq!(containers.get("app"), Some(&vec![expected_id.clone()]));
    // Preparing again (kubelet restarts do this) gives the same answer.
    assert_eq!(peer.prepare(&ns, "consumer").await.unwrap(), containers);

    // The reference CDI library resolves the ids from the spec our plugin wrote.
    let edits = peer
        .cdi_inject(std::slice::from_ref(&expected_id))
        .await
        .expect("CDI ids resolve");
    let env: Vec<String> = serde_json::from_value(edits["env"].clone()).unwrap();
    assert!(
        env.contains(&"GADGET_DEV-0=dev-0".to_string()),
        "env was {env:?}"
    );
    let unknown = peer
        .cdi_inject(&[format!("{CDI_VENDOR}/{CDI_CLASS}={uid}-nope")])
        .await;
    assert!(unknown.is_err(), "an unknown CDI device must not resolve");

    peer.unprepare(&ns, "consumer")
        .await
        .expect("unprepare succeeds");
    assert!(plugin.service().prepared().await.is_empty(), "forgotten");
    assert!(
        peer.cdi_inject(&[expected_id]).await.is_err(),
        "the claim's CDI spec is gone"
    );
}
