//! The legacy path end to end: Akri v0 Configurations served as device plugins by the node
//! agent, with the kubelet's own device manager (kubelet peer) as the peer, on 2 simulated
//! nodes that both reach 2 cameras (debugEcho, shared) of capacity 2: seed 000's
//! walkthroughs, Akri #843, restarts, reclamation and deletion.

mod cluster;

use akri_api::v0::Configuration;
use akri_api::v1::DiscoveryConfiguration;
use akri_testing::ControlPlane;
use akri_testing::monitoring::Alert;
use cluster::{
    Healthy, NODE_LOST_GRACE, allocated_slot, cluster, eventually, expect_view, kubelet_view,
    registered, slot, start_pod,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[tokio::test]
async fn seed_000_configuration_and_instance_level_claims_share_slots() {
    let c = cluster(2, Duration::from_secs(600)).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let config = ControlPlane::unique_name("onvif");
    let [cam1, cam2] = c.cameras(&config, true).await;
    let cl = format!("akri.sh/{config}");
    let (il1, il2) = (format!("akri.sh/{cam1}"), format!("akri.sh/{cam2}"));
    let (s10, s11, s20, s21) = (
        slot(&cam1, 0),
        slot(&cam1, 1),
        slot(&cam2, 0),
        slot(&cam2, 1),
    );

    // Initial state: every slot free. The CL plugin offers one virtual device per camera
    // with a free slot (seed 003), the IL plugins every slot, on both nodes.
    for node in [a, b] {
        expect_view(node, &cl, 2, Healthy::Count(2)).await;
        expect_view(node, &il1, 2, Healthy::Ids(vec![&s10, &s11])).await;
        expect_view(node, &il2, 2, Healthy::Ids(vec![&s20, &s21])).await;
    }

    // A pod on node-a asks for 2 cameras through the CL resource: one slot of each camera.
    c.pod("cl-pair", &[("broker", &cl, 2)]).await;
    let options = a.peer.allocate(&c.ns, "cl-pair", "broker").await.unwrap();
    assert_eq!(options["envs"]["RESOLUTION"], "1080p", "{options}");
    // Each camera's properties, suffixed with its id (as Akri does), so both are there.
    let mut descriptions: Vec<&str> = [&cam1, &cam2]
        .iter()
        .map(|cam| {
            let suffix = cam.rsplit('-').next().unwrap().to_uppercase();
            options["envs"][format!("DEBUG_ECHO_DESCRIPTION_{suffix}")]
                .as_str()
                .unwrap_or_default()
        })
        .collect();
    descriptions.sort();
    assert_eq!(descriptions, ["cam0", "cam1"], "{options}");
    for cam in [&cam1, &cam2] {
        assert_eq!(c.usage(cam, true).await, ["", &format!("C:{}", a.name)]);
    }
    // node-a: the IL plugins see the slots reserved by the CL plugin as unhealthy; the CL
    // plugin offers its 2 held ids plus one per camera with a free slot (seed 003's rule;
    // seed 000's table, written before it, shows only the 2 held ones).
    let free1 = if c.slot_free(&cam1, 0).await {
        &s10
    } else {
        &s11
    };
    let free2 = if c.slot_free(&cam2, 0).await {
        &s20
    } else {
        &s21
    };
    expect_view(a, &cl, 4, Healthy::Count(4)).await;
    expect_view(a, &il1, 2, Healthy::Ids(vec![free1])).await;
    expect_view(a, &il2, 2, Healthy::Ids(vec![free2])).await;
    // node-b: one free slot per camera.
    expect_view(b, &cl, 2, Healthy::Count(2)).await;
    expect_view(b, &il1, 2, Healthy::Ids(vec![free1])).await;
    expect_view(b, &il2, 2, Healthy::Ids(vec![free2])).await;

    // A pod on node-b asks for the second camera through its IL resource: its free slot.
    c.pod("il-one", &[("broker", &il2, 1)]).await;
    let options = b.peer.allocate(&c.ns, "il-one", "broker").await.unwrap();
    assert!(
        options["envs"]["DEBUG_ECHO_DESCRIPTION"].is_string(),
        "{options}"
    );
    assert_eq!(
        c.usage(&cam2, true).await,
        [format!("C:{}", a.name), b.name.clone()]
    );
    // node-b: the CL plugin has a free slot on the first camera only; the IL plugin of the
    // second camera holds its own slot (healthy) and sees node-a's as unhealthy.
    expect_view(b, &cl, 1, Healthy::Count(1)).await;
    expect_view(b, &il2, 2, Healthy::Ids(vec![free2])).await;
    // node-a: both slots of the second camera are taken for it now.
    expect_view(a, &il2, 2, Healthy::Count(0)).await;
    expect_view(a, &cl, 3, Healthy::Count(3)).await;
    // The second camera has no slot left: a third pod on node-b asking for 2 cameras fails
    // admission, and the kubelet's view stays what the Instances say.
    c.pod("cl-too-many", &[("broker", &cl, 2)]).await;
    assert!(
        b.peer
            .allocate(&c.ns, "cl-too-many", "broker")
            .await
            .is_err()
    );
    expect_view(b, &cl, 1, Healthy::Count(1)).await;
}

#[tokio::test]
async fn seed_000_instance_level_claims_leave_configuration_level_slots() {
    let c = cluster(2, Duration::from_secs(600)).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let config = ControlPlane::unique_name("onvif");
    let [cam1, cam2] = c.cameras(&config, true).await;
    let cl = format!("akri.sh/{config}");

    // One pod per camera on node-a, each through the camera's IL resource.
    for (pod, cam) in [("il-1", &cam1), ("il-2", &cam2)] {
        registered(a, &format!("akri.sh/{cam}"), 2).await;
        c.pod(pod, &[("broker", &format!("akri.sh/{cam}"), 1)])
            .await;
        a.peer.allocate(&c.ns, pod, "broker").await.unwrap();
        assert_eq!(c.usage(cam, false).await, ["", a.name.as_str()]);
    }
    for cam in [&cam1, &cam2] {
        let il = format!("akri.sh/{cam}");
        let taken = c.device_usage(cam).await;
        let free: Vec<&str> = taken
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k.as_str())
            .collect();
        // node-a: its own slot and the free one are healthy; node-b: only the free one.
        expect_view(a, &il, 2, Healthy::Count(2)).await;
        expect_view(b, &il, 2, Healthy::Ids(free)).await;
    }
    // Both nodes' CL plugins: one free slot per camera.
    expect_view(a, &cl, 2, Healthy::Count(2)).await;
    expect_view(b, &cl, 2, Healthy::Count(2)).await;
}

#[tokio::test]
async fn seed_000_without_unique_devices_one_camera_can_serve_a_request_twice() {
    let c = cluster(2, Duration::from_secs(600)).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let config = ControlPlane::unique_name("gpu");
    let [cam1, cam2] = c.cameras(&config, false).await;
    let cl = format!("akri.sh/{config}");
    let all = [
        slot(&cam1, 0),
        slot(&cam1, 1),
        slot(&cam2, 0),
        slot(&cam2, 1),
    ];
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    for node in [a, b] {
        expect_view(node, &cl, 4, Healthy::Ids(all.clone())).await;
    }
    // 2 CL devices on node-a: both slots of the first camera (the seed's example).
    c.pod("cl-pair", &[("broker", &cl, 2)]).await;
    a.peer.allocate(&c.ns, "cl-pair", "broker").await.unwrap();
    assert_eq!(
        c.usage(&cam1, false).await,
        [
            format!("C:{}:{}", slot(&cam1, 0), a.name),
            format!("C:{}:{}", slot(&cam1, 1), a.name)
        ]
    );
    assert_eq!(c.usage(&cam2, false).await, ["", ""]);
    expect_view(a, &cl, 4, Healthy::Ids(all.clone())).await;
    expect_view(a, &format!("akri.sh/{cam1}"), 2, Healthy::Count(0)).await;
    expect_view(b, &cl, 4, Healthy::Ids(all[2..].to_vec())).await;
    expect_view(b, &format!("akri.sh/{cam1}"), 2, Healthy::Count(0)).await;
    expect_view(b, &format!("akri.sh/{cam2}"), 2, Healthy::Count(2)).await;
}

#[tokio::test]
async fn two_containers_of_one_pod_each_get_a_configuration_level_device() {
    // Akri #843: the second container's request failed.
    let c = cluster(1, Duration::from_secs(600)).await;
    let a = &c.nodes[0];
    let config = ControlPlane::unique_name("cams");
    let [cam1, cam2] = c.cameras(&config, true).await;
    let cl = format!("akri.sh/{config}");
    registered(a, &cl, 2).await;
    c.pod("two", &[("first", &cl, 1), ("second", &cl, 1)]).await;
    let first = a.peer.allocate(&c.ns, "two", "first").await.unwrap();
    let second = a.peer.allocate(&c.ns, "two", "second").await.unwrap();
    for options in [&first, &second] {
        assert!(
            options["envs"]["DEBUG_ECHO_DESCRIPTION"].is_string(),
            "{options}"
        );
    }
    let mut held = 0;
    for cam in [&cam1, &cam2] {
        held += c
            .usage(cam, true)
            .await
            .iter()
            .filter(|v| !v.is_empty())
            .count();
    }
    assert_eq!(held, 2, "one slot per container");
    // Both allocations, and the slot each claimed, are in the node's /metrics.
    let metrics = a.agent.metrics().encode();
    for line in [
        "akri_kubelet_plugin_legacy_allocations_total 2",
        "akri_kubelet_plugin_legacy_slot_claims_total 2",
        "akri_kubelet_plugin_legacy_failed_allocations_total 0",
    ] {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
}

#[tokio::test]
async fn slots_return_after_the_pod_and_plugins_survive_restarts_and_deletion() {
    let c = cluster(1, Duration::from_secs(1)).await;
    let a = &c.nodes[0];
    let config = ControlPlane::unique_name("cams");
    let [cam1, _] = c.cameras(&config, true).await;
    let il = format!("akri.sh/{cam1}");

    // A pod holds a slot; once pod-resources no longer lists it, the slot is freed after the
    // grace period and the kubelet sees it healthy again.
    registered(a, &il, 2).await;
    c.pod("holder", &[("broker", &il, 1)]).await;
    a.peer.allocate(&c.ns, "holder", "broker").await.unwrap();
    let slot_of = |usage: &BTreeMap<String, String>| {
        (usage.iter()).find_map(|(slot, holder)| (holder == &a.name).then(|| slot.clone()))
    };
    let held = slot_of(&c.device_usage(&cam1).await).expect("the holder's slot");
    // A later pod takes the other slot and is gone at once: once its slot is freed, past the
    // grace period, the holder's has been past it as long.
    c.pod("passing", &[("broker", &il, 1)]).await;
    a.peer.allocate(&c.ns, "passing", "broker").await.unwrap();
    let usage = c.device_usage(&cam1).await;
    let passing = (usage.keys().find(|slot| **slot != held).cloned()).expect("two slots");
    assert_eq!(usage[&passing], a.name, "{usage:?}");
    a.peer.release(&c.ns, "passing").await.unwrap();
    eventually("the passing pod's slot freed", async || {
        (c.device_usage(&cam1).await[&passing].is_empty()).then_some(())
    })
    .await;
    assert_eq!(
        c.device_usage(&cam1).await[&held],
        a.name,
        "a running container's slot is kept past the grace period"
    );
    a.peer.release(&c.ns, "holder").await.unwrap();
    eventually("the slot freed", async || {
        (c.usage(&cam1, false).await == ["", ""]).then_some(())
    })
    .await;
    expect_view(a, &il, 2, Healthy::Count(2)).await;

    // A kubelet restart: the plugins register again and allocation goes on.
    a.peer.restart().await.unwrap();
    expect_view(a, &il, 2, Healthy::Count(2)).await;
    c.pod("after-restart", &[("broker", &il, 1)]).await;
    a.peer
        .allocate(&c.ns, "after-restart", "broker")
        .await
        .unwrap();

    // The Configuration deleted: none of its resources keeps devices on the node (the
    // kubelet drops the names themselves after its fixed 5-minute endpoint grace).
    Api::<Configuration>::namespaced(c.client.clone(), &c.ns)
        .delete(&config, &DeleteParams::default())
        .await
        .unwrap();
    eventually("no akri.sh capacity left", async || {
        let body = a.peer.device_capacity().await.ok()?;
        let left: BTreeMap<String, i64> = body["capacity"]
            .as_object()?
            .iter()
            .filter(|(k, v)| k.starts_with("akri.sh/") && v.as_i64() != Some(0))
            .map(|(k, v)| (k.clone(), v.as_i64().unwrap_or(-1)))
            .collect();
        left.is_empty().then_some(())
    })
    .await;
    let _ = &c.cp;
}

/// A deleted node's slots are freed by the driver-controller (a node frees only its own:
/// issue 52), and not while the node is there.
#[tokio::test]
async fn slots_of_a_node_that_left_are_freed_by_the_driver_controller() {
    let c = cluster(2, Duration::from_secs(1)).await;
    let _freer = c.slot_freer();
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let (cam1, il) = c.one_slot_held_by(b).await;
    // Nobody touches the slot of a node that is still there, past the grace period.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.usage(&cam1, false).await, ["", b.name.as_str()]);

    Api::<Node>::all(c.client.clone())
        .delete(&b.name, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the slot of the deleted node freed", async || {
        (c.usage(&cam1, false).await == ["", ""]).then_some(())
    })
    .await;
    expect_view(a, &il, 2, Healthy::Count(2)).await;
}

/// A camera that vanishes (longer than the Instance grace) while a container holds its only
/// slot: the Instance, and with it the slot's holder, stays until the slot is free. It used to
/// be deleted and, when the camera came back, recreated with every slot free, so the other
/// node took the slot still in use.
#[tokio::test]
async fn a_held_slot_outlives_its_vanished_device_and_is_never_given_twice() {
    let c = cluster(2, Duration::from_secs(1)).await;
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let config = ControlPlane::unique_name("cam");
    let [cam] = c.configuration(&config, &["cam0"], 1, true).await;
    let il = format!("akri.sh/{cam}");
    registered(a, &il, 1).await;
    c.pod("holder", &[("broker", &il, 1)]).await;
    a.peer.allocate(&c.ns, "holder", "broker").await.unwrap();
    assert_eq!(c.usage(&cam, false).await, [a.name.as_str()]);

    // The camera reboots: gone from both nodes past the Instance grace (0 here).
    for node in [a, b] {
        std::fs::write(&node.availability, "cam0\n").unwrap();
    }
    // node-b, which holds nothing, leaves the Instance at once (or it is gone: asserted
    // below); node-a has a whole pass after its handler stopped reporting the camera.
    eventually("node-b gone from the Instance", async || {
        let instance = c.instances().get_opt(&cam).await.ok()?;
        (instance.is_none_or(|i| i.spec.nodes == [a.name.clone()])).then_some(())
    })
    .await;
    akri_testing::components::wait_reported(&a.agent, (&c.ns, &cam), false).await;
    a.whole_pass().await;
    let kept = c.instances().get_opt(&cam).await.unwrap();
    assert_eq!(
        kept.map(|i| i.spec.device_usage.into_values().collect::<Vec<_>>()),
        Some(vec![a.name.clone()]),
        "the Instance of a held slot stays, with its holder"
    );
    for node in [a, b] {
        std::fs::write(&node.availability, "").unwrap();
    }
    // node-b serves the camera again and sees its slot taken.
    expect_view(b, &il, 1, Healthy::Count(0)).await;
    c.pod("taker", &[("broker", &il, 1)]).await;
    assert!(
        b.peer.allocate(&c.ns, "taker", "broker").await.is_err(),
        "node-b was given a slot a running container holds"
    );

    // Released: the slot is freed, and a camera gone again takes its Instance with it.
    a.peer.release(&c.ns, "holder").await.unwrap();
    eventually("the slot freed", async || {
        (c.usage(&cam, false).await == [""]).then_some(())
    })
    .await;
    for node in [a, b] {
        std::fs::write(&node.availability, "cam0\n").unwrap();
    }
    eventually("the free Instance gone with its camera", async || {
        c.instances()
            .get_opt(&cam)
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
}

/// A slot the API server will not let the node write (an admission policy here, as a
/// cluster's policy engine or a broken RBAC role would): the plugin refuses the Allocate, the
/// pod fails admission with the API server's reason, and the chart's alert of refused
/// allocations is pending on what the node's /metrics then say, silent before. (A slot taken
/// by another node is not such a refusal: the plugin advertises it unhealthy and the kubelet
/// does not ask.)
#[tokio::test]
async fn a_slot_the_api_server_refuses_fails_the_allocation_and_the_alert_says_so() {
    let c = cluster(1, Duration::from_secs(600)).await;
    let a = &c.nodes[0];
    let config = ControlPlane::unique_name("cam");
    let [cam] = c.configuration(&config, &["cam0"], 1, true).await;
    let il = format!("akri.sh/{cam}");
    registered(a, &il, 1).await;
    let scrape = || [(a.name.as_str(), a.agent.metrics().encode())];
    let alert = Alert::named("AkriLegacyAllocationsFailing").silent(&scrape());

    let denial = akri_testing::admission::Denial {
        name: "no-held-slots",
        rule: serde_json::json!({
            "apiGroups": ["akri.sh"], "apiVersions": ["*"],
            "operations": ["UPDATE"], "resources": ["instances"],
        }),
        expression: "object.spec.?deviceUsage.orValue({}).all(k, object.spec.deviceUsage[k] == '')",
        message: "no slot may be held here",
        forbidden: false,
        namespace: None,
    };
    akri_testing::admission::deny_unless(&c.client, denial)
        .await
        .unwrap();
    // In force once a dry-run update holding a slot is refused.
    eventually("the policy in force", async || {
        let mut held = c.instances().get(&cam).await.ok()?;
        let slot = held.spec.device_usage.keys().next()?.clone();
        held.spec.device_usage.insert(slot, a.name.clone());
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        match c.instances().replace(&cam, &dry_run, &held).await {
            Err(kube::Error::Api(status)) if status.code == 422 => Some(()),
            _ => None,
        }
    })
    .await;
    let alert = alert.silent(&scrape());

    c.pod("refused", &[("broker", &il, 1)]).await;
    let error = a
        .peer
        .allocate(&c.ns, "refused", "broker")
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("no slot may be held here"),
        "{error}"
    );
    // Refused by the kubelet's admission of the pod (UnexpectedAdmissionError), where a
    // kubelet calls Allocate, not later when its container would start.
    assert!(
        error.to_string().contains("pod admission failed"),
        "refused outside the pod's admission: {error}"
    );
    assert_eq!(c.usage(&cam, false).await, [""], "no slot held");
    (alert.pending(&scrape(), &[&[("pod", a.name.as_str())]])).check();
}

/// A node that stays NotReady (powered off, its Node object kept) past the node-lost grace
/// has its slots freed by the driver-controller, and not before; it used to keep them for
/// ever.
#[tokio::test]
async fn slots_of_a_node_not_ready_past_the_grace_are_freed_by_the_driver_controller() {
    let c = cluster(2, Duration::from_secs(1)).await;
    let _freer = c.slot_freer();
    let (a, b) = (&c.nodes[0], &c.nodes[1]);
    let (cam1, il) = c.one_slot_held_by(b).await;

    // What the node-lifecycle controller does when a kubelet stops reporting.
    let unknown = serde_json::json!({ "status": { "conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now(),
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now(),
    }] } });
    Api::<Node>::all(c.client.clone())
        .patch_status(
            &b.name,
            &PatchParams::default(),
            &Patch::Strategic(&unknown),
        )
        .await
        .unwrap();
    let since = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        c.usage(&cam1, false).await,
        ["", b.name.as_str()],
        "freed before the node-lost grace"
    );
    eventually("the slot of the lost node freed", async || {
        (c.usage(&cam1, false).await == ["", ""]).then_some(())
    })
    .await;
    // The condition's time is stored to the second: the grace may start up to 1 s before
    // `since`.
    assert!(
        since.elapsed() + Duration::from_secs(1) >= NODE_LOST_GRACE,
        "freed after {:?}, before the grace",
        since.elapsed()
    );
    expect_view(a, &il, 2, Healthy::Count(2)).await;
}

/// A v0 Configuration and the DiscoveryConfiguration `akri-migrate` made of it (same name,
/// same devices) on a node that serves both paths, its DRA Instances in the v0 one's
/// namespace: the device is never offered to DRA while a legacy slot holds it or the v0
/// Configuration is there (the v1 one is held back, saying why in its status), and nothing
/// is written at rest. It used to be published to DRA at once, and the two writers flipped the
/// shared Instance's labels on every pass.
#[tokio::test]
async fn a_v0_and_a_v1_configuration_of_one_name_never_offer_a_device_twice() {
    let c = cluster::cluster_of_both_paths(Duration::from_secs(1)).await;
    let a = &c.nodes[0];
    let name = ControlPlane::unique_name("cams");
    let [cam] = c.configuration(&name, &["cam0"], 1, true).await;
    let il = format!("akri.sh/{cam}");
    registered(a, &il, 1).await;
    c.pod("holder", &[("broker", &il, 1)]).await;
    a.peer.allocate(&c.ns, "holder", "broker").await.unwrap();

    let v1 = Api::<DiscoveryConfiguration>::all(c.client.clone());
    (c.discovery_configuration(&name, Some(format!("{}/{name}", c.ns)))).await;
    // Offered to DRA: a DRA Instance of the configuration, or a device in the node's pool.
    let offered = async || {
        let dra = c.dra_instances().await;
        let slices = Api::<ResourceSlice>::all(c.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap();
        let published = slices
            .items
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default());
        dra.iter().any(|i| i.spec.configuration_name == name)
            || published.into_iter().any(|d| {
                d.attributes
                    .unwrap_or_default()
                    .get(akri_devices::ATTR_CONFIGURATION)
                    .and_then(|a| a.string.clone())
                    == Some(name.clone())
            })
    };
    let status = async || {
        let config = v1.get(&name).await.ok()?;
        let errors = config.status?.discovery_errors;
        errors
            .into_iter()
            .find(|e| e.node == a.name)
            .map(|e| e.message)
    };
    let held = eventually("the v1 configuration held back on the node", status).await;
    assert!(
        held.contains(&format!(
            "the v0 Configuration {}/{name} it was made of",
            c.ns
        )),
        "{held}"
    );
    // The pass that held it back would have published it before writing that status.
    assert!(
        !offered().await,
        "offered to DRA while the v0 Configuration serves it"
    );
    let version = async || {
        c.instances()
            .get(&cam)
            .await
            .unwrap()
            .metadata
            .resource_version
    };
    let at_rest = version().await;
    // At rest for three of the node's passes (each looks at both configurations again, and
    // the last began after `at_rest`): never offered, the Instance never written.
    let from = a.passes();
    while a.passes() < from + 3.0 {
        assert!(
            !offered().await,
            "offered to DRA while the v0 Configuration serves it"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        !offered().await,
        "offered to DRA while the v0 Configuration serves it"
    );
    assert_eq!(version().await, at_rest, "the Instance changed at rest");

    // The v0 Configuration deleted: still not offered while the container holds its slot.
    Api::<Configuration>::namespaced(c.client.clone(), &c.ns)
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    let left = eventually("held back for the Instance left", async || {
        let held = status().await?;
        held.contains("Instances of the deleted v0 Configuration")
            .then_some(held)
    })
    .await;
    assert!(left.contains(&format!("{}/{cam}", c.ns)), "{left}");
    // That pass, and a whole pass after it.
    assert!(
        !offered().await,
        "offered to DRA while a legacy slot holds it"
    );
    a.whole_pass().await;
    assert!(
        !offered().await,
        "offered to DRA while a legacy slot holds it"
    );
    // Released: the legacy Instance goes with its slot, and the device moves to DRA.
    a.peer.release(&c.ns, "holder").await.unwrap();
    eventually("the device offered to DRA", async || {
        offered().await.then_some(())
    })
    .await;
    eventually("the hold cleared from the status", async || {
        status().await.is_none().then_some(())
    })
    .await;
}

/// An Instance as Akri's agent left it (no label of ours, owned by its Configuration, held by
/// this node's finalizer, a freed slot's key gone, a running broker's slot held): the node
/// agent that takes over adopts it: the held slot stays held, the missing slot comes back
/// free, and neither Akri's finalizer nor its owner reference is left to let garbage
/// collection delete it (and forget the held slot) when the Configuration goes.
#[tokio::test]
async fn what_akris_agent_wrote_is_adopted_with_held_slots_and_finalizers_released() {
    let mut c = cluster(0, Duration::from_secs(300)).await;
    let node = ControlPlane::unique_name("node");
    let config = ControlPlane::unique_name("cam");
    let mut configuration: Configuration = akri_testing::from_json(
        akri_testing::discovery::v0_debug_echo(&config, &["cam0"], 2, true),
    );
    // Akri's agent on each node that served it left the node's name; another node's stays.
    let elsewhere = "akri-only-node".to_string();
    configuration.metadata.finalizers = Some(vec![elsewhere.clone(), node.clone()]);
    let configuration = Api::<Configuration>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    let name = akri_devices::instance_name(&config, "cam0", true, &node);
    let held = slot(&name, 1);
    let akris: akri_api::v0::Instance =
        akri_testing::from_json(akri_testing::discovery::akri_written_instance(
            &config,
            configuration.metadata.uid.as_deref(),
            &name,
            &node,
            &held,
        ));
    c.instances()
        .create(&PostParams::default(), &akris)
        .await
        .unwrap();
    c.nodes
        .push(cluster::start_named(&c.cp, &c.client, &node, Duration::from_secs(300)).await);
    let a = &c.nodes[0];
    let il = format!("akri.sh/{name}");
    // Both slots offered on this node: the free one, and the one its own broker holds.
    expect_view(a, &il, 2, Healthy::Count(2)).await;
    let adopted = eventually("the Instance adopted", async || {
        let instance = c.instances().get(&name).await.ok()?;
        let labels = instance.metadata.labels.clone().unwrap_or_default();
        let released = instance
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .is_empty()
            && instance
                .metadata
                .owner_references
                .clone()
                .unwrap_or_default()
                .is_empty();
        (labels.contains_key(akri_api::v1::INSTANCE_SOURCE_LABEL) && released).then_some(instance)
    })
    .await;
    assert_eq!(
        adopted.spec.device_usage,
        BTreeMap::from([
            (slot(&name, 0), String::new()),
            (held.clone(), node.clone())
        ]),
        "the held slot kept, the missing one free"
    );
    // Which of the two a new pod gets is the kubelet's choice: its checkpoint holds the
    // running broker's slot (a real node's; the peer here never ran Akri's broker).
    let configurations = Api::<Configuration>::namespaced(c.client.clone(), &c.ns);
    eventually(
        "this node's finalizer released from the Configuration",
        async || {
            let finalizers = configurations.get(&config).await.ok()?.metadata.finalizers;
            (finalizers == Some(vec![elsewhere.clone()])).then_some(())
        },
    )
    .await;
    let none = serde_json::json!([{ "op": "remove", "path": "/metadata/finalizers" }]);
    configurations
        .patch(
            &config,
            &Default::default(),
            &kube::api::Patch::<()>::Json(serde_json::from_value(none).unwrap()),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn two_nodes_racing_for_a_shared_device_never_hold_more_than_its_slots() {
    // One camera of capacity 3 seen by both nodes; each node asks for it 100 times (200
    // allocations), holding up to 2 pods at once, releasing the oldest as it goes. A released
    // slot is reclaimed (grace 0) before the node asks again, so every admission claims a
    // slot with a write and the two nodes race for each freed one.
    let c = Arc::new(cluster(2, Duration::ZERO).await);
    let config = ControlPlane::unique_name("cam");
    let [cam] = c.configuration(&config, &["cam0"], 3, true).await;
    let il = format!("akri.sh/{cam}");
    for node in &c.nodes {
        registered(node, &il, 3).await;
    }
    let live = Arc::new(AtomicI64::new(0));
    // Slot -> the live pod the plugin gave it to (from Akri's slot annotation).
    let holders = Arc::new(Mutex::new(BTreeMap::<String, String>::new()));
    let most = Arc::new(AtomicI64::new(0));
    let mut racers = Vec::new();
    for n in 0..2 {
        let (c, il, cam) = (c.clone(), il.clone(), cam.clone());
        let (live, most, holders) = (live.clone(), most.clone(), holders.clone());
        racers.push(tokio::spawn(async move {
            let node = &c.nodes[n];
            let (mut admitted, mut conflicts) = (0, 0);
            let mut slowest = Duration::ZERO;
            // Each node holds up to 2 pods: together they want 4 of the 3 slots.
            let mut held = VecDeque::new();
            for i in 0..100 {
                let pod = format!("race-{n}-{i}");
                c.pod(&pod, &[("broker", &il, 1)]).await;
                match node.peer.allocate(&c.ns, &pod, "broker").await {
                    Ok(options) => {
                        let slot = allocated_slot(&options);
                        let twice = holders.lock().unwrap().insert(slot.clone(), pod.clone());
                        assert_eq!(twice, None, "slot {slot} given to {pod} while a live pod holds it");
                        admitted += 1;
                        let now = live.fetch_add(1, SeqCst) + 1;
                        most.fetch_max(now, SeqCst);
                        held.push_back((pod, slot));
                    }
                    Err(error) => {
                        if error.to_string().contains("taken by another claim") {
                            conflicts += 1;
                        }
                        // Then the kubelet's healthy slots become what the Instance says. How
                        // soon is a figure, printed below, not a bound: a loaded CI machine
                        // took over 1 s once.
                        let start = std::time::Instant::now();
                        loop {
                            let usage = c.device_usage(&cam).await;
                            let expected: Vec<String> = usage
                                .iter()
                                .filter(|(_, v)| v.is_empty() || **v == node.name)
                                .map(|(k, _)| k.clone())
                                .collect();
                            let (_, healthy) = kubelet_view(&node.peer, &il).await;
                            if healthy == expected {
                                slowest = slowest.max(start.elapsed());
                                break;
                            }
                            assert!(
                                start.elapsed() < Duration::from_secs(30),
                                "{}: a refused allocation was not followed by a correct advertisement: kubelet {healthy:?}, Instance {usage:?}",
                                node.name
                            );
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                if held.len() >= 2 || (held.len() == 1 && i % 3 == 0) {
                    let (old, slot) = held.pop_front().unwrap();
                    holders.lock().unwrap().remove(&slot);
                    live.fetch_sub(1, SeqCst);
                    c.release_and_reclaim(node, &old, &cam, &slot).await;
                }
            }
            for (old, slot) in held {
                holders.lock().unwrap().remove(&slot);
                live.fetch_sub(1, SeqCst);
                c.release_and_reclaim(node, &old, &cam, &slot).await;
            }
            (admitted, conflicts, slowest)
        }));
    }
    let mut admitted = 0;
    for (n, racer) in racers.into_iter().enumerate() {
        let (a, refused_by_conflict, slowest) = racer.await.unwrap();
        admitted += a;
        let counters = c.nodes[n].agent.legacy_counters().unwrap();
        let (claims, conflicts) = (
            counters.claims.load(SeqCst),
            counters.conflicts.load(SeqCst),
        );
        eprintln!(
            "racer {n}: {a} admitted, {claims} claims, {conflicts} conflicts, {refused_by_conflict} refused for a lost slot, the advertisement right {slowest:?} after a refusal at the latest"
        );
        // Every admission took a reclaimed slot: one write each, counted.
        assert_eq!(claims, a, "node {n}: claims written vs pods admitted");
        assert!(
            conflicts >= refused_by_conflict,
            "node {n}: {refused_by_conflict} refusals for a lost slot, {conflicts} conflicts counted"
        );
    }
    assert!(
        most.load(SeqCst) <= 3,
        "more pods held the capacity-3 camera at once than it has slots"
    );
    assert!(admitted >= 3, "the race admitted only {admitted} pods");
}

/// A rolling update of the kubelet-plugin on a node serving v0 Configurations, as the chart's
/// `maxSurge: 1` makes it: the new pod's agent serves the device plugins beside the old one's
/// under sockets of its own, is ready once the kubelet took them, and the kubelet's device
/// manager (1.37's, which keeps a client per socket) allocates through it all along, also
/// while the old agent stops. Not one allocation fails, before, during or after.
#[tokio::test]
async fn a_standby_agent_serves_the_device_plugins_and_no_allocation_fails_in_the_hand_over() {
    let mut c = cluster(0, Duration::from_secs(600)).await;
    let node = start_pod(&c.cp, &c.client, Duration::from_secs(600), "pod-old").await;
    c.nodes.push(node);
    let config = ControlPlane::unique_name("cams");
    let [cam1, _] = c.cameras(&config, true).await;
    let mut node = c.nodes.pop().unwrap();
    let (il, cl) = (format!("akri.sh/{cam1}"), format!("akri.sh/{config}"));
    registered(&node, &il, 2).await;

    // Admit and release a pod asking for one device of each resource, `rounds` times; the
    // allocations that failed.
    let round = AtomicI64::new(0);
    let cycle = async |node: &cluster::SimNode, rounds: usize| {
        let mut failed = Vec::new();
        for _ in 0..rounds {
            let pod = format!("user-{}", round.fetch_add(1, SeqCst));
            c.pod(&pod, &[("il", &il, 1), ("cl", &cl, 1)]).await;
            for container in ["il", "cl"] {
                if let Err(error) = node.peer.allocate(&c.ns, &pod, container).await {
                    failed.push(format!("{pod}/{container}: {error}"));
                }
            }
            node.peer.release(&c.ns, &pod).await.unwrap();
        }
        failed
    };
    let mut failed = cycle(&node, 10).await;

    // The new pod: ready once the kubelet took its plugins, which it serves beside the old
    // one's, each under its own socket.
    let mut new_config = node.config.clone();
    new_config.pod_uid = Some("pod-new".into());
    let new = akri_kubelet_plugin::agent::start(c.client.clone(), new_config)
        .await
        .expect("the new agent starts beside the old one");
    eventually("the new agent ready", async || {
        new.readiness().is_ready().then_some(())
    })
    .await;
    let dir = node
        .config
        .legacy
        .as_ref()
        .unwrap()
        .device_plugin_dir
        .clone();
    let sockets = |resource: &str| {
        let prefix = resource.replace('/', "_");
        let mut names: Vec<String> = (std::fs::read_dir(&dir).unwrap())
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix) && n.ends_with(".sock"))
            .collect();
        names.sort();
        names
    };
    let both = sockets(&il);
    assert_eq!(both.len(), 2, "two sockets for {il}: {both:?}");
    let new_counters = new.legacy_counters().unwrap();
    failed.extend(cycle(&node, 10).await);
    // The kubelet calls the newest registration: the process standing by.
    assert!(
        new_counters.allocations.load(SeqCst) >= 20,
        "{new_counters:?}"
    );

    // The old agent goes (SIGTERM) while pods keep being admitted.
    let old = std::mem::replace(&mut node.agent, new);
    let (_, during) = tokio::join!(old.stop(), cycle(&node, 10));
    failed.extend(during);
    failed.extend(cycle(&node, 10).await);
    assert_eq!(failed, Vec::<String>::new(), "allocations failed");
    let left = sockets(&il);
    assert!(
        left.len() == 1 && both.contains(&left[0]),
        "{left:?} of {both:?}"
    );
    expect_view(&node, &il, 2, Healthy::Count(2)).await;
}

/// A v0 Configuration is namespaced, so its discovery properties read its own namespace's
/// Secrets only: one naming a Secret of another namespace (Akri's default for a reference is
/// `default`) does not run, even on a node allowed to read there, while one naming a Secret
/// of its own namespace does.
#[tokio::test]
async fn a_v0_configuration_reads_secrets_of_its_own_namespace_only() {
    let c = cluster(1, Duration::from_secs(600)).await;
    let other = c.cp.create_namespace("elsewhere").await.unwrap();
    for namespace in [&c.ns, &other] {
        let secret: k8s_openapi::api::core::v1::Secret =
            akri_testing::from_json(serde_json::json!({
                "metadata": { "name": "camera-creds" },
                "stringData": { "password": "hunter2" },
            }));
        Api::namespaced(c.client.clone(), namespace)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let with_secret_in = |name: &str, namespace: &str| {
        let mut config = akri_testing::discovery::v0_debug_echo(name, &["cam0"], 1, true);
        config["spec"]["discoveryHandler"]["discoveryProperties"] = serde_json::json!([
            { "name": "PASSWORD", "valueFrom": { "secretKeyRef": {
                "name": "camera-creds", "namespace": namespace, "key": "password" } } },
        ]);
        akri_testing::from_json::<Configuration>(config)
    };
    let configurations = Api::<Configuration>::namespaced(c.client.clone(), &c.ns);
    let (own, foreign) = (
        ControlPlane::unique_name("own"),
        ControlPlane::unique_name("foreign"),
    );
    for config in [
        with_secret_in(&foreign, &other),
        with_secret_in(&own, &c.ns),
    ] {
        configurations
            .create(&PostParams::default(), &config)
            .await
            .unwrap();
    }
    let instances_of = async |name: &str| {
        let list = c.instances().list(&Default::default()).await.unwrap();
        (list.items.iter())
            .filter(|i| i.spec.configuration_name == name)
            .count()
    };
    eventually("the own-namespace configuration's Instance", async || {
        (instances_of(&own).await == 1).then_some(())
    })
    .await;
    // Both were created before: the refused one had every pass the other had, and a whole
    // pass more.
    c.nodes[0].whole_pass().await;
    assert_eq!(
        instances_of(&foreign).await,
        0,
        "a Secret of another namespace reached the handler"
    );
}

/// What a namespace's v0 Configurations cannot do (issue 52): one named like a
/// DiscoveryConfiguration that was not made of it took that configuration's devices away from
/// DRA on every node (held back) and would serve `akri.sh/<name>` under it; one in a
/// namespace the operator did not list was served like any other. Now neither is served,
/// and the DiscoveryConfiguration's device is offered to DRA. (Two v0 Configurations of one
/// name: the older serves it, `same_name`'s table.)
#[tokio::test]
async fn a_namespace_users_configuration_takes_nothing_from_dra_or_unlisted_namespaces() {
    // Its DRA Instances in the served namespace, where the namesake's would be.
    let c = cluster::cluster_of_both_paths(Duration::from_secs(600)).await;
    let a = &c.nodes[0];
    let name = ControlPlane::unique_name("cams");
    let v1 = Api::<DiscoveryConfiguration>::all(c.client.clone());
    c.discovery_configuration(&name, None).await;
    let v0 = |name: &str| -> Configuration {
        akri_testing::from_json(akri_testing::discovery::v0_debug_echo(
            name,
            &["cam0"],
            1,
            true,
        ))
    };
    Api::<Configuration>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &v0(&name))
        .await
        .unwrap();
    let tenant = c.cp.create_namespace("tenant").await.unwrap();
    let usb = ControlPlane::unique_name("usb");
    // With the finalizer Akri's agent left for the node: not served, and still not kept
    // Terminating once deleted (nothing of it is on the node to clean up).
    let mut unlisted = v0(&usb);
    unlisted.metadata.finalizers = Some(vec![a.name.clone()]);
    let tenants = Api::<Configuration>::namespaced(c.client.clone(), &tenant);
    tenants
        .create(&PostParams::default(), &unlisted)
        .await
        .unwrap();
    // Created after both: once it is served, the node has passed over them.
    let served = ControlPlane::unique_name("served");
    c.configuration(&served, &["ok0"], 1, true).await;
    registered(a, &format!("akri.sh/{served}"), 1).await;
    for resource in [format!("akri.sh/{name}"), format!("akri.sh/{usb}")] {
        assert_eq!(
            kubelet_view(&a.peer, &resource).await,
            (0, Vec::new()),
            "{resource} is served"
        );
    }
    // Offered to DRA: its DRA Instance (a shared device: the driver-controller publishes it).
    let dra_instance = async || {
        (c.dra_instances().await.iter())
            .any(|i| i.spec.configuration_name == name && i.spec.nodes.contains(&a.name))
            .then_some(())
    };
    eventually(
        "the DiscoveryConfiguration's device offered to DRA",
        dra_instance,
    )
    .await;
    let status = v1.get(&name).await.unwrap().status.unwrap_or_default();
    assert!(
        status.discovery_errors.iter().all(|e| e.node != a.name),
        "{:?}",
        status.discovery_errors
    );
    tenants
        .delete(&usb, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the unlisted Configuration gone, its node's finalizer released",
        async || tenants.get_opt(&usb).await.ok()?.is_none().then_some(()),
    )
    .await;
}

/// What `akri-migrate --rename` makes of a v0 Configuration: a DiscoveryConfiguration of
/// another name, linked by `akri.sh/migrated-from`. It offered to DRA the capacity-1 device
/// the v0 Configuration still served as a device plugin (issue 52: the hold-back went by
/// name); it is held back as one of the same name is.
#[tokio::test]
async fn a_renamed_migration_is_held_back_while_its_v0_configuration_serves() {
    let c = cluster::cluster_of_both_paths(Duration::from_secs(600)).await;
    let a = &c.nodes[0];
    let v0_name = ControlPlane::unique_name("cams");
    let [cam] = c.configuration(&v0_name, &["cam0"], 1, true).await;
    registered(a, &format!("akri.sh/{cam}"), 1).await;
    let renamed = ControlPlane::unique_name("lobby");
    (c.discovery_configuration(&renamed, Some(format!("{}/{v0_name}", c.ns)))).await;
    let held = eventually(
        "the renamed configuration held back on the node",
        async || akri_testing::discovery::discovery_error(&c.client, &renamed, &a.name).await,
    )
    .await;
    assert!(
        held.contains(&format!(
            "the v0 Configuration {}/{v0_name} it was made of",
            c.ns
        )),
        "{held}"
    );
    let dra = c.dra_instances().await;
    assert!(
        dra.iter().all(|i| i.spec.configuration_name != renamed),
        "offered to DRA while the v0 Configuration serves it"
    );
}

/// A v0 Configuration's `brokerProperties` reach every namespace's pods that ask for its
/// resources: only the names the administrator lists (`--legacy-broker-property-names`,
/// `RESOLUTION` here) are handed on (issue 52: `LD_PRELOAD` and `PYTHONWARNINGS` reached the
/// container's environment). The device's own properties still do.
#[tokio::test]
async fn broker_properties_reach_containers_only_by_the_names_listed() {
    let c = cluster(1, Duration::from_secs(600)).await;
    let a = &c.nodes[0];
    let name = ControlPlane::unique_name("cams");
    let mut config = akri_testing::discovery::v0_debug_echo(&name, &["cam0"], 1, true);
    config["spec"]["brokerProperties"] = serde_json::json!({
        "RESOLUTION": "1080p", "LD_PRELOAD": "/tmp/evil.so", "PYTHONWARNINGS": "all",
    });
    Api::<Configuration>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &akri_testing::from_json(config))
        .await
        .unwrap();
    let resource = format!("akri.sh/{name}");
    registered(a, &resource, 1).await;
    c.pod("holder", &[("broker", &resource, 1)]).await;
    let options = a.peer.allocate(&c.ns, "holder", "broker").await.unwrap();
    let envs = options["envs"].as_object().expect("envs");
    assert_eq!(envs.get("RESOLUTION"), Some(&"1080p".into()), "{options}");
    for refused in ["LD_PRELOAD", "PYTHONWARNINGS"] {
        assert!(
            !envs.contains_key(refused),
            "{refused} handed on: {options}"
        );
    }
    assert!(
        envs.keys().any(|k| k.starts_with("DEBUG_ECHO_DESCRIPTION")),
        "the device's own property: {options}"
    );
}

/// Issue 53: a legacy node's device plugins watched every legacy Instance of each served
/// namespace, beside its Instance writer's watch of its own. Now the writer's watch (of the
/// Instances labelled with the node's name) is the node's one view of the namespace, and the
/// plugins are fed from it. Counted by the API server (`apiserver_watch_events_total` of
/// Instances) on a control plane where this node's agent is the only watcher of Instances:
/// 60 writes of another node's legacy Instances send it nothing, and one edit of its own
/// Instance is sent once (one watch; it failed with 62: 60 and the edit twice).
#[tokio::test]
async fn a_legacy_node_hears_nothing_of_other_nodes_instances() {
    use akri_api::v1::{
        INSTANCE_NODES_LABELLED, INSTANCE_SOURCE_CONFIGURATION, INSTANCE_SOURCE_LABEL,
        instance_node_label,
    };
    let c = cluster(1, Duration::from_secs(600)).await;
    let a = &c.nodes[0];
    let config = ControlPlane::unique_name("cams");
    let [own, _] = c.cameras(&config, true).await;
    let cl = format!("akri.sh/{config}");
    expect_view(a, &cl, 2, Healthy::Count(2)).await;
    let sent = async || -> f64 {
        (akri_testing::watch_events_sent(&c.client, "instances").await).unwrap()
    };
    let before = sent().await;
    // Node b's devices of the same Configuration, labelled as node b labels them.
    let instances = c.instances();
    for i in 0..20 {
        let name = format!("b-{i}");
        let instance: akri_api::v0::Instance = akri_testing::from_json(serde_json::json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance",
            "metadata": { "name": name, "labels": {
                INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_CONFIGURATION,
                INSTANCE_NODES_LABELLED: "true",
                instance_node_label("node-b").unwrap(): "true",
            } },
            "spec": {
                "configurationName": config, "cdiName": format!("akri.sh/{config}={name}"),
                "capacity": 2, "shared": i % 2 == 0,
                "nodes": ["node-b"], "deviceUsage": { format!("{name}-0"): "", format!("{name}-1"): "" },
            },
        }));
        instances
            .create(&PostParams::default(), &instance)
            .await
            .unwrap();
        let taken =
            serde_json::json!({ "spec": { "deviceUsage": { format!("{name}-0"): "node-b" } } });
        instances
            .patch(&name, &PatchParams::default(), &Patch::Merge(taken))
            .await
            .unwrap();
        instances
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
    }
    // Then one edit of node a's own Instance (an annotation it does not set: no write back).
    let heard =
        akri_testing::watch_events_through_edit(&c.client, &instances, &own, "instances", before)
            .await;
    assert_eq!(
        heard, 1.0,
        "node a was sent {heard} Instance events for its own Instance's edit and node b's 60 writes"
    );
    // Its device plugins still serve from that one view.
    expect_view(a, &cl, 2, Healthy::Count(2)).await;
}
