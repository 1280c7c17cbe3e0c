//! The library as a whole against the kubelet's own DRA manager (kubelet peer) and the real
//! scheduler: the example driver (`examples/minimal.rs`), started with the builder as the
//! README shows, is found, prepares through the kubelet, survives its own restart through the
//! checkpoint, and registers again after the kubelet's.

use akri_testing::{ControlPlane, KubeletPeer};
use dra_plugin::Plugin;
use dra_plugin::cdi::CdiRoot;
use dra_plugin::registration::RegistrationStatus;
use dra_plugin::service::{ClaimRef, DraService, DriverOnNode};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    Device, DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kubelet_proto::pluginregistration::InfoRequest;
use kubelet_proto::pluginregistration::registration_client::RegistrationClient;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::minimal::{CDI_VENDOR, GadgetDriver, gadgets};

async fn wait_until<F: AsyncFn() -> bool>(what: &str, check: F) {
    let start = Instant::now();
    while !check().await {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// DeviceClass `class`: every device of `driver`.
async fn gadget_class(client: &kube::Client, class: &str, driver: &str) {
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": class },
            "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == '{driver}'") } }] },
        })).unwrap())
        .await
        .unwrap();
}

/// Pod `user` in `ns` with one claim for `count` devices of `class` (from a template of its
/// own), once the scheduler bound it.
async fn bound_user_pod(client: &kube::Client, ns: &str, class: &str, count: u32) {
    let template = format!("g-{count}");
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": template },
            "spec": { "spec": { "devices": { "requests": [{ "name": "g", "exactly": { "deviceClassName": class, "count": count } }] } } },
        })).unwrap())
        .await
        .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &serde_json::from_value(json!({
        "metadata": { "name": "user" },
        "spec": {
            "resourceClaims": [{ "name": "g", "resourceClaimTemplateName": template }],
            "containers": [{ "name": "app", "image": "none", "resources": { "claims": [{ "name": "g" }] } }],
        },
    })).unwrap())
    .await
    .unwrap();
    wait_until("pod bound", async || {
        pods.get("user")
            .await
            .ok()
            .and_then(|p| p.spec.and_then(|s| s.node_name))
            .is_some()
    })
    .await;
}

/// The example driver with the builder's defaults (but `health`), in `dir`, with no kubelet to
/// register with (for what it does with the API server alone).
async fn plugin_without_kubelet(
    client: &kube::Client,
    driver: &str,
    node: &str,
    dir: &std::path::Path,
    health: bool,
) -> Plugin<GadgetDriver> {
    Plugin::builder(driver, node)
        .registry_dir(dir.join("registry"))
        .plugin_dir(dir.join("plugin"))
        .health(health)
        .start(
            client.clone(),
            GadgetDriver {
                cdi: CdiRoot::new(dir.join("cdi"), CDI_VENDOR).unwrap(),
            },
        )
        .await
        .unwrap()
}

/// `.health(false)`: the health service is neither advertised (so a 1.37 kubelet opens no
/// stream) nor served (an older one, which opens it anyway, is told it is not there).
#[tokio::test]
async fn a_driver_may_switch_health_off() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let driver = format!("{}.gadgets.example.com", ControlPlane::unique_name("g"));
    let dir = tempfile::tempdir().unwrap();
    let _plugin = plugin_without_kubelet(&client, &driver, &node, dir.path(), false).await;
    let registration =
        dra_plugin::authority::connect(&dir.path().join(format!("registry/{driver}-reg.sock")))
            .await
            .unwrap();
    let info = RegistrationClient::new(registration)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    let service = dra_plugin::authority::connect(&dir.path().join("plugin/dra.sock"))
        .await
        .unwrap();
    use kubelet_proto::dra::health::v1alpha1 as health;
    let watch = health::dra_resource_health_client::DraResourceHealthClient::new(service)
        .node_watch_resources(health::NodeWatchResourcesRequest {})
        .await;
    assert_eq!(
        watch.err().map(|status| status.code()),
        Some(tonic::Code::Unimplemented)
    );
}

#[tokio::test]
async fn prepares_through_the_kubelet_and_survives_restarts() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("plugin").await.unwrap();
    let node_name = ControlPlane::unique_name("node");
    cp.create_node(&node_name).await.unwrap();
    let driver = format!("{}.gadgets.example.com", ControlPlane::unique_name("g"));
    let class = ControlPlane::unique_name("gadgets");
    let peer = KubeletPeer::start(cp, &node_name).await.unwrap();

    gadget_class(&client, &class, &driver).await;

    // The plugin, and the node's gadgets published through it.
    let state_dir = tempfile::tempdir().unwrap();
    let checkpoint = state_dir.path().join("checkpoint.json");
    let start_plugin = async || {
        Plugin::builder(&driver, &node_name)
            .registry_dir(peer.registry_dir())
            .plugin_dir(peer.plugins_dir().join(&driver))
            .checkpoint(&checkpoint)
            .start(
                client.clone(),
                GadgetDriver {
                    cdi: CdiRoot::new(peer.cdi_dir(), CDI_VENDOR).unwrap(),
                },
            )
            .await
            .unwrap()
    };
    let plugin = start_plugin().await;
    plugin.publish(gadgets(&["g0", "g1"])).await.unwrap();
    peer.wait_for_driver(&driver, Duration::from_secs(30))
        .await
        .unwrap();
    wait_until("registration reported", async || {
        plugin.registration_status() == RegistrationStatus::Registered
    })
    .await;
    // What the kubelet read: both DRA versions and the health service, as upstream lists them.
    let registration =
        dra_plugin::authority::connect(&peer.registry_dir().join(format!("{driver}-reg.sock")))
            .await
            .unwrap();
    let info = RegistrationClient::new(registration)
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ]
    );

    // A pod with one claim for both gadgets.
    bound_user_pod(&client, &ns, &class, 2).await;

    let ids = peer
        .prepare(&ns, "user")
        .await
        .expect("prepared through the kubelet");
    let app = &ids["app"];
    assert_eq!(app.len(), 2);
    let edits = peer
        .cdi_inject(app)
        .await
        .expect("the Go CDI library resolves our spec");
    let env: Vec<String> = serde_json::from_value(edits["env"].clone()).unwrap();
    // Each device's edits land in the container (two devices setting the same variable would
    // collapse to one: CDI merges env by name).
    assert!(
        env.contains(&"GADGET_G0=g0".to_string()) && env.contains(&"GADGET_G1=g1".to_string()),
        "{env:?}"
    );
    let prepared = plugin.service().prepared().await;
    assert_eq!(prepared.len(), 1);
    let spec_file: PathBuf = prepared.values().next().unwrap().cdi_spec_files[0].clone();
    assert!(spec_file.exists());

    // The plugin dies between prepare and unprepare, and comes back from its checkpoint. The
    // node "reboots": the CDI spec is gone and the kubelet restarts, forgetting the claim was
    // prepared, so the next prepare is answered by the plugin's checkpoint (not the
    // kubelet's cache) and must bring the spec back.
    drop(plugin);
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    let uid = prepared.keys().next().unwrap();
    assert_eq!(
        recorded["claims"][uid]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["cdi_device_ids"][0].as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        *app,
        "the checkpoint file records the claim with its CDI ids: {recorded}"
    );
    std::fs::remove_file(&spec_file).unwrap();
    let plugin = start_plugin().await;
    assert_eq!(
        plugin.service().prepared().await.len(),
        1,
        "the checkpoint remembers the claim"
    );
    peer.restart().await.unwrap();
    peer.wait_for_driver(&driver, Duration::from_secs(30))
        .await
        .unwrap();
    // The kubelet adds the ids of a claim prepared again after its restart to the ones it
    // restored from its own checkpoint, so the container lists each twice: compare the sets.
    let mut again = peer.prepare(&ns, "user").await.unwrap()["app"].clone();
    again.sort();
    again.dedup();
    let mut expected = app.clone();
    expected.sort();
    assert_eq!(again, expected, "preparing again gives the same CDI ids");
    assert!(
        spec_file.exists(),
        "the plugin rewrote the spec the reboot wiped"
    );
    peer.cdi_inject(app)
        .await
        .expect("the CDI ids resolve again");
    peer.unprepare(&ns, "user")
        .await
        .expect("unprepared after the plugin restart");
    assert!(
        !spec_file.exists(),
        "unprepare removed the CDI spec prepare wrote"
    );
    assert!(plugin.service().prepared().await.is_empty());

    // The kubelet restarts with a wiped registry directory: the plugin registers again by itself.
    for entry in std::fs::read_dir(peer.registry_dir()).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    peer.restart().await.unwrap();
    peer.wait_for_driver(&driver, Duration::from_secs(30))
        .await
        .expect("re-registered without a plugin restart");
    wait_until("registration reported again", async || {
        plugin.registration_status() == RegistrationStatus::Registered
    })
    .await;
}

#[tokio::test]
async fn one_bad_claim_does_not_fail_the_others() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = DraService::new(
        GadgetDriver {
            cdi: CdiRoot::new(dir.path().join("cdi"), CDI_VENDOR).unwrap(),
        },
        client.clone(),
        DriverOnNode {
            driver: "x.example.com".into(),
            node: "n".into(),
        },
        &dir.path().join("checkpoint.json"),
    )
    .unwrap();
    // A claim allocated to this driver (as the scheduler would write it): it must prepare
    // although the other claims of the call fail.
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), "default");
    let good = claims
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "metadata": { "name": ControlPlane::unique_name("good") },
            "spec": { "devices": { "requests": [{ "name": "g", "exactly": { "deviceClassName": "any" } }] } },
        })).unwrap())
        .await
        .unwrap();
    let good_name = good.metadata.name.clone().unwrap();
    let good_uid = good.metadata.uid.clone().unwrap();
    claims
        .patch_status(&good_name, &PatchParams::default(), &Patch::Merge(json!({ "status": { "allocation": {
            "devices": { "results": [{ "request": "g", "driver": "x.example.com", "pool": "p", "device": "g7" }] },
        } } })))
        .await
        .unwrap();
    let results = service
        .prepare_claims(vec![
            ClaimRef {
                namespace: "default".into(),
                name: good_name.clone(),
                uid: good_uid.clone(),
            },
            ClaimRef {
                namespace: "default".into(),
                name: "missing".into(),
                uid: "u-1".into(),
            },
            ClaimRef {
                namespace: String::new(),
                name: "no-namespace".into(),
                uid: "u-2".into(),
            },
        ])
        .await;
    assert_eq!(results.len(), 3);
    let devices = results[&good_uid]
        .as_ref()
        .expect("the good claim is prepared");
    assert_eq!(devices[0].device_name, "g7");
    assert!(service.prepared().await.contains_key(&good_uid));
    assert!(
        results["u-1"]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("no longer exists"),
        "{:?}",
        results["u-1"]
    );
    assert!(
        results["u-2"]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("lacks a namespace"),
        "{:?}",
        results["u-2"]
    );
    // Unpreparing claims nobody prepared succeeds.
    let results = service
        .unprepare_claims(vec![ClaimRef {
            namespace: "default".into(),
            name: "never".into(),
            uid: "u-3".into(),
        }])
        .await;
    assert!(results["u-3"].is_ok());
}

#[tokio::test]
async fn slices_changed_or_deleted_behind_its_back_are_repaired() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let node = ControlPlane::unique_name("repair");
    cp.create_node(&node).await.unwrap();
    let driver = format!("{}.gadgets.example.com", ControlPlane::unique_name("r"));
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_without_kubelet(&client, &driver, &node, dir.path(), true).await;
    let published = plugin.publish(gadgets(&["g0", "g1"])).await.unwrap();
    let slices = Api::<ResourceSlice>::all(client.clone());
    let ours = ListParams::default().fields(&format!("spec.driver={driver}"));
    let devices = async || -> Vec<String> {
        let listed = slices.list(&ours).await.unwrap().items;
        dra_plugin::slices::current_devices(&listed)
            .into_iter()
            .map(|d| d.name)
            .collect()
    };
    assert_eq!(devices().await, ["g0", "g1"]);
    let name = slices.list(&ours).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();

    // Someone edits the slice: one device fewer. The plugin puts it back.
    let edit_and_wait_for_the_repair = async |mut slice: ResourceSlice| {
        let name = slice.metadata.name.clone().unwrap();
        slice.spec.devices.as_mut().unwrap().truncate(1);
        slice.metadata.managed_fields = None;
        slices
            .replace(&name, &PostParams::default(), &slice)
            .await
            .unwrap();
        wait_until("the edited slice repaired", async || {
            devices().await == ["g0", "g1"]
        })
        .await;
    };
    edit_and_wait_for_the_repair(slices.get(&name).await.unwrap()).await;

    // Someone deletes it (as a restarting kubelet does).
    slices.delete(&name, &Default::default()).await.unwrap();
    wait_until("the deleted slice repaired", async || {
        devices().await == ["g0", "g1"]
    })
    .await;
    let repaired = slices.list(&ours).await.unwrap().items;
    assert!(
        repaired
            .iter()
            .all(|s| s.spec.pool.generation > published.generation),
        "a repair is a new generation, never an old one again: {:?}",
        repaired
            .iter()
            .map(|s| s.spec.pool.generation)
            .collect::<Vec<_>>()
    );

    // At rest the repair writes nothing: its own writes' events find nothing to do. The proof
    // is a later event: one more edit, whose repair the watch brings after every event before
    // it. From the settled slice on, the API server's watch then shows the edit and its repair,
    // and nothing the repair wrote in between.
    let settled = slices.list(&ours).await.unwrap().items[0].clone();
    edit_and_wait_for_the_repair(settled.clone()).await;
    // The repair of the deletion made it anew, maybe under another name.
    let repaired = (slices.get(settled.metadata.name.as_ref().unwrap()).await).unwrap();
    let from = settled.metadata.resource_version.clone().unwrap();
    let events = slices
        .watch(
            &WatchParams::default().fields(&format!("spec.driver={driver}")),
            &from,
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        let (WatchEvent::Added(slice) | WatchEvent::Modified(slice) | WatchEvent::Deleted(slice)) =
            event.unwrap()
        else {
            continue;
        };
        let devices = slice.spec.devices.as_ref().map_or(0, Vec::len);
        let done = slice.metadata.resource_version == repaired.metadata.resource_version;
        seen.push(devices);
        if done {
            break;
        }
    }
    assert_eq!(
        seen,
        [1, 2],
        "the writes after the slice settled (devices in each): the edit and its repair only"
    );
}

#[tokio::test]
async fn its_own_writes_do_not_send_the_repair_watch_back_to_list() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let lists = akri_testing::SlowLists::new();
    let client = lists.client(cp.client_config().await.unwrap()).unwrap();
    let node = ControlPlane::unique_name("own");
    cp.create_node(&node).await.unwrap();
    let driver = format!("{}.gadgets.example.com", ControlPlane::unique_name("o"));
    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_without_kubelet(&client, &driver, &node, dir.path(), true).await;
    let names: Vec<String> = (0..130).map(|i| format!("g{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    // The repair watch says when it judged a burst of events (and repaired if it had to), so
    // the LISTs are counted once it judged the burst of a publish's writes: no window.
    let mut repairs = plugin.pools().repairs();
    let judged = async |repairs: &mut tokio::sync::watch::Receiver<dra_plugin::Repairs>,
                        after: u64| {
        let judged = repairs.wait_for(|r| r.bursts > after);
        *tokio::time::timeout(Duration::from_secs(30), judged)
            .await
            .expect("the repair watch judges the burst")
            .unwrap()
    };
    // Its first list, a burst of its own.
    let mut last = judged(&mut repairs, 0).await;
    let mut publish = async |devices: &[&str], what: &str| {
        // The publish itself lists the pool; what counts is what its events set off.
        let published = plugin.publish(gadgets(devices)).await.unwrap();
        let before = lists.count("resourceslices");
        let now = judged(&mut repairs, last.bursts).await;
        assert_eq!(lists.count("resourceslices"), before, "LISTs after {what}");
        assert_eq!(now.own, last.own + 1, "{what}: its own writes");
        last = now;
        published
    };

    // Two slices written, then one rewritten and one deleted: every event the repair watch
    // sees is the plugin's own doing, and reading the pool again would find nothing to do.
    let first = publish(&names, "the first publish").await;
    assert_eq!(first.written, 2);
    let what = "a publish that rewrote one slice and deleted one";
    let second = publish(&names[..3], what).await;
    assert_eq!((second.written, second.deleted), (1, 1));

    // Someone else's edit still brings it back to read the pool, and repair it.
    let slices = Api::<ResourceSlice>::all(cp.client().await.unwrap());
    let ours = ListParams::default().fields(&format!("spec.driver={driver}"));
    let before = lists.count("resourceslices");
    let name = slices.list(&ours).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    slices.delete(&name, &Default::default()).await.unwrap();
    wait_until("the deleted slice repaired", async || {
        !slices.list(&ours).await.unwrap().items.is_empty()
    })
    .await;
    assert!(lists.count("resourceslices") > before);
}

#[tokio::test]
async fn a_node_keeps_exactly_the_pools_its_driver_wants() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let client = cp.client().await.unwrap();
    let node = ControlPlane::unique_name("pools");
    let node_uid = cp.create_node(&node).await.unwrap().metadata.uid.unwrap();
    let driver = format!("{}.gadgets.example.com", ControlPlane::unique_name("p"));
    let slices = Api::<ResourceSlice>::all(client.clone());
    let ours = ListParams::default().fields(&format!("spec.driver={driver}"));
    let pools = async || -> BTreeMap<String, Vec<String>> {
        let mut by_pool: BTreeMap<String, Vec<ResourceSlice>> = BTreeMap::new();
        for slice in slices.list(&ours).await.unwrap().items {
            by_pool
                .entry(slice.spec.pool.name.clone())
                .or_default()
                .push(slice);
        }
        by_pool
            .into_iter()
            .map(|(pool, stored)| {
                let names = dra_plugin::slices::current_devices(&stored);
                (pool, names.into_iter().map(|d| d.name).collect())
            })
            .collect()
    };

    // A pool a previous process published and nobody wants any more.
    let stale = dra_plugin::slices::SlicePublisher::new(
        client.clone(),
        &driver,
        "stale",
        dra_plugin::slices::PoolScope::Node {
            name: node.clone(),
            uid: node_uid,
        },
        "earlier",
    );
    stale.publish(&gadgets(&["old"])).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let plugin = plugin_without_kubelet(&client, &driver, &node, dir.path(), true).await;
    let want = |pools: &[(&str, &[&str])]| -> BTreeMap<String, Vec<Device>> {
        pools
            .iter()
            .map(|(pool, names)| (pool.to_string(), gadgets(names)))
            .collect()
    };
    let listed = |pools: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
        pools
            .iter()
            .map(|(pool, names)| {
                (
                    pool.to_string(),
                    names.iter().map(|n| n.to_string()).collect(),
                )
            })
            .collect()
    };
    let two: &[(&str, &[&str])] = &[("a", &["g0"]), ("b", &["g1", "g2"])];
    plugin.publish_pools(want(two)).await.unwrap();
    assert_eq!(
        pools().await,
        listed(two),
        "both pools, and the stale one gone"
    );

    // Pool b's slice deleted behind the plugin's back comes back.
    let b = slices
        .list(&ours)
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|s| s.spec.pool.name == "b")
        .unwrap();
    slices
        .delete(b.metadata.name.as_deref().unwrap(), &Default::default())
        .await
        .unwrap();
    wait_until("pool b repaired", async || pools().await == listed(two)).await;

    // The driver drops pool b: its slices go.
    let one: &[(&str, &[&str])] = &[("a", &["g0"])];
    plugin.publish_pools(want(one)).await.unwrap();
    assert_eq!(pools().await, listed(one));
}

/// A rolling update of the plugin: two pods of one driver on one node, side by side. The
/// kubelet registers both (per-pod sockets); a claim prepared through one is known to the
/// other (the shared checkpoint), which unprepares it once the first has gone; the slices
/// stay as published all along.
#[tokio::test]
async fn two_plugin_pods_of_one_driver_hand_over_through_the_shared_checkpoint() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("rolling").await.unwrap();
    let node_name = ControlPlane::unique_name("node");
    cp.create_node(&node_name).await.unwrap();
    let driver = format!("{}.gadgets.example.com", ControlPlane::unique_name("g"));
    let class = ControlPlane::unique_name("gadgets");
    let peer = KubeletPeer::start(cp, &node_name).await.unwrap();
    gadget_class(&client, &class, &driver).await;
    let start_pod = async |uid: &str| {
        Plugin::builder(&driver, &node_name)
            .registry_dir(peer.registry_dir())
            .plugin_dir(peer.plugins_dir().join(&driver))
            .rolling_update(uid)
            .start(
                client.clone(),
                GadgetDriver {
                    cdi: CdiRoot::new(peer.cdi_dir(), CDI_VENDOR).unwrap(),
                },
            )
            .await
            .unwrap()
    };
    let old = start_pod("pod-old").await;
    old.publish(gadgets(&["g0", "g1"])).await.unwrap();
    let slices = Api::<ResourceSlice>::all(client.clone());
    let mine = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
    let published = async || {
        (slices.list(&mine).await.unwrap().items.into_iter())
            .map(|s| (s.metadata.uid.unwrap(), s.metadata.generation))
            .collect::<Vec<_>>()
    };
    peer.wait_for_driver(&driver, Duration::from_secs(30))
        .await
        .unwrap();
    let before = published().await;

    // The new pod comes up beside the old one and publishes what it finds (the same).
    let new = start_pod("pod-new").await;
    new.publish(gadgets(&["g0", "g1"])).await.unwrap();
    wait_until("both pods registered", async || {
        peer.driver_endpoints(&driver).await.unwrap().len() == 2
    })
    .await;
    let endpoints = peer.driver_endpoints(&driver).await.unwrap();
    assert!(
        endpoints.iter().any(|e| e.ends_with("dra-pod-old.sock"))
            && endpoints.iter().any(|e| e.ends_with("dra-pod-new.sock")),
        "{endpoints:?}"
    );
    let registry = peer.registry_dir();
    assert!(
        registry
            .join(dra_plugin::registration::socket_name(
                &registry,
                &driver,
                Some("pod-new")
            ))
            .exists(),
        "the registration socket is named after the pod"
    );

    // A claim prepared while both serve: through either, the kubelet picks.
    bound_user_pod(&client, &ns, &class, 1).await;
    let ids = peer
        .prepare(&ns, "user")
        .await
        .expect("prepared while both serve");
    assert_eq!(
        old.service().prepared().await,
        new.service().prepared().await,
        "both see the one checkpoint"
    );
    let prepared = new.service().prepared().await;
    let spec_file = prepared.values().next().unwrap().cdi_spec_files[0].clone();

    // The old pod goes (its sockets with it); the new one answers for the claim.
    drop(old);
    wait_until("the old pod deregistered", async || {
        peer.driver_endpoints(&driver).await.unwrap().len() == 1
    })
    .await;
    assert_eq!(
        peer.prepare(&ns, "user").await.unwrap()["app"],
        ids["app"],
        "prepared again through the new pod: the same CDI ids"
    );
    peer.unprepare(&ns, "user")
        .await
        .expect("unprepared through the new pod");
    assert!(
        !spec_file.exists(),
        "the new pod removed what the old one may have written"
    );
    assert!(new.service().prepared().await.is_empty());
    assert_eq!(published().await, before, "no slice replaced or rewritten");
}

/// The example driver, and the background errors it heard of.
struct Hearing {
    inner: GadgetDriver,
    heard: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl dra_plugin::Driver for Hearing {
    type Error = <GadgetDriver as dra_plugin::Driver>::Error;

    async fn prepare(
        &self,
        claim: &dra_plugin::Claim,
    ) -> Result<dra_plugin::Prepared, Self::Error> {
        self.inner.prepare(claim).await
    }

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        prepared: Option<&dra_plugin::PreparedClaim>,
    ) -> Result<(), Self::Error> {
        self.inner.unprepare(claim, prepared).await
    }

    fn background_error(&self, error: &dra_plugin::BackgroundError) {
        self.heard.lock().unwrap().push(error.to_string());
    }
}

/// A failure of the plugin's background work, which no kubelet call returns, reaches the
/// driver (as `HandleError` does a Go driver on upstream's helper): the kubelet's registry
/// directory gone and a file in its place, the plugin cannot register again, and the driver
/// hears why.
#[tokio::test]
async fn background_errors_reach_the_driver() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let driver = format!("{}.gadgets.example.com", ControlPlane::unique_name("b"));
    let dir = tempfile::tempdir().unwrap();
    let registry = dir.path().join("registry");
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let _plugin = Plugin::builder(&driver, &node)
        .registry_dir(&registry)
        .plugin_dir(dir.path().join("plugin"))
        .start(
            client.clone(),
            Hearing {
                inner: GadgetDriver {
                    cdi: CdiRoot::new(dir.path().join("cdi"), CDI_VENDOR).unwrap(),
                },
                heard: heard.clone(),
            },
        )
        .await
        .unwrap();
    assert!(heard.lock().unwrap().is_empty(), "{heard:?}");
    std::fs::remove_dir_all(&registry).unwrap();
    std::fs::write(&registry, "not a directory").unwrap();
    wait_until("the driver hears of the failed registration", async || {
        (heard.lock().unwrap().iter())
            .any(|e| e.starts_with("could not register with the kubelet again"))
    })
    .await;
}
