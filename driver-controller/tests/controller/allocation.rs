//! The driver-controller with the real scheduler: shared devices with capacity, uniqueDevices,
//! extended-resource requests and PropertyFilters. Runs against whatever Kubernetes version
//! `AKRI_K8S_VERSION` selects; where the API server lacks consumable capacity, per-device
//! node selection or extended resources, the same scenarios exercise the fallbacks.

use crate::support;

use akri_api::v0::Instance;
use akri_api::v1::{CONDITION_READY, PropertyFilter};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceRequestAllocationResult, ResourceClaim};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use support::{Cluster, eventually, from_json, instance_of};

/// No slot is held twice and no Instance by more claims than its capacity.
fn assert_no_double_allocation(
    allocations: &BTreeMap<String, Vec<DeviceRequestAllocationResult>>,
    configuration: &str,
    capacity: usize,
    consumable: bool,
) {
    let mut holders: BTreeMap<String, BTreeSet<&str>> = BTreeMap::new();
    let mut slots: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (claim, results) in allocations {
        for result in results {
            *slots
                .entry((result.pool.as_str(), result.device.as_str()))
                .or_default() += 1;
            holders
                .entry(instance_of(&result.device, configuration))
                .or_default()
                .insert(claim);
        }
    }
    for (instance, claims) in &holders {
        assert!(
            claims.len() <= capacity,
            "{instance} held by {} claims, capacity {capacity}: {allocations:?}",
            claims.len()
        );
    }
    if !consumable {
        for (slot, n) in &slots {
            assert_eq!(
                *n, 1,
                "slot device {slot:?} allocated twice: {allocations:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_shared_device_with_capacity_two_serves_two_pods_of_three_nodes() {
    // Without binding conditions: each binding would wait for the scheduler's next 5 s poll
    // (50 rounds of it); they have a test of their own (binding.rs).
    let cluster = Cluster::start_with(3, true, |c| c.binding_conditions = Some(false)).await;
    let consumable = cluster.support.consumable_capacity;
    let config = cluster.discovery("cam", &["cam0"], 2, true).await;
    let instance = akri_devices::instance_name(&config, "cam0", true, "");

    // One Instance seen by the three nodes, published once (not once per node).
    let instances = Api::<Instance>::namespaced(cluster.client.clone(), &cluster.namespace);
    eventually("the Instance lists three nodes", async || {
        let i = instances.get_opt(&instance).await.ok()??;
        (i.spec.nodes.len() == 3 && i.spec.shared).then_some(())
    })
    .await;
    cluster
        .wait_published(&config, if consumable { 1 } else { 2 })
        .await;
    // The Instance's third node may reach the published device a pass after the count does.
    let shared_nodes = async || support::shared_device_nodes(&cluster.client, &instance).await;
    let all: BTreeSet<String> = cluster.nodes.iter().cloned().collect();
    eventually("the device selects its three nodes", async || {
        shared_nodes().await.filter(|nodes| *nodes == all)
    })
    .await;

    // Three pods: two get the device, one waits.
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(cluster.pod_claiming(&config, 1).await);
    }
    let split = async |pods: &[String]| -> Option<(Vec<String>, Vec<String>)> {
        let allocations = cluster.all_allocations().await;
        assert_no_double_allocation(&allocations, &config, 2, consumable);
        let (mut allocated, mut pending) = (Vec::new(), Vec::new());
        for pod in pods {
            if allocations.contains_key(pod) && cluster.bound_node(pod).await.is_some() {
                allocated.push(pod.clone());
            } else if cluster.unschedulable(pod).await.is_some() {
                pending.push(pod.clone());
            }
        }
        (allocated.len() == 2 && pending.len() == pods.len() - 2).then_some((allocated, pending))
    };
    let (allocated, pending) = eventually("two pods allocated, one pending", async || {
        split(&pods).await
    })
    .await;
    for pod in &allocated {
        let node = cluster.bound_node(pod).await.unwrap();
        assert!(cluster.nodes.contains(&node), "{pod} on {node}");
    }

    // Freeing one lets the pending pod in; then 50 rounds of churn never double-allocate.
    cluster.delete_pod(&allocated[0]).await;
    pods.retain(|p| *p != allocated[0]);
    let (allocated, _) = eventually("the pending pod allocated", async || split(&pods).await).await;
    assert!(allocated.contains(&pending[0]));
    for round in 0..50 {
        let victim = split(&pods).await.map(|(a, _)| a[round % 2].clone());
        let victim = match victim {
            Some(victim) => victim,
            None => eventually("two allocated", async || split(&pods).await)
                .await
                .0[0]
                .clone(),
        };
        cluster.delete_pod(&victim).await;
        pods.retain(|p| *p != victim);
        pods.push(cluster.pod_claiming(&config, 1).await);
        eventually(
            &format!("round {round}: two allocated, one pending"),
            async || split(&pods).await,
        )
        .await;
    }

    // The node set follows the nodes that see the device; once no claim holds it, the last
    // one gone removes it (a held one stays, tainted: the next test).
    let availability = cluster.availability_files();
    std::fs::write(&availability[2], "OFFLINE").unwrap();
    eventually("the device selects two nodes", async || {
        (shared_nodes().await?.len() == 2).then_some(())
    })
    .await;
    for pod in &pods {
        cluster.delete_pod(pod).await;
    }
    eventually("no claim holds the device", async || {
        cluster.all_allocations().await.is_empty().then_some(())
    })
    .await;
    for file in &availability[..2] {
        std::fs::write(file, "OFFLINE").unwrap();
    }
    cluster.wait_published(&config, 0).await;
    assert!(shared_nodes().await.is_none(), "the device is gone");
}

#[tokio::test]
async fn unique_devices_extended_resources_and_property_filters_steer_the_scheduler() {
    let cluster = Cluster::start(1, false).await;
    let node = cluster.nodes[0].clone();
    let consumable = cluster.support.consumable_capacity;

    // uniqueDevices, the seeds' example: 2 devices x capacity 2, a request for 2 and for 3.
    // The scheduler enforces uniqueness through consumable capacity (one device per Instance,
    // never twice in one request); without it (1.34, where distinctAttribute is missing too)
    // capacity wins and a request may get two slots of one Instance: the documented limit,
    // shown in the configuration's status.
    for unique in [true, false] {
        for count in [2usize, 3] {
            let config = cluster
                .discovery("uniq", &["foo0", "foo1"], 2, unique)
                .await;
            let enforced = unique && consumable;
            cluster
                .wait_published(&config, if enforced { 2 } else { 4 })
                .await;
            let pod = cluster.pod_claiming(&config, count as i64).await;
            let case = format!("uniqueDevices={unique}, request for {count}");
            if enforced && count == 3 {
                let why = eventually(&format!("{case}: unschedulable"), async || {
                    cluster.unschedulable(&pod).await
                })
                .await;
                assert!(cluster.allocated(&pod).await.is_none(), "{case}: {why}");
                continue;
            }
            let results = eventually(&format!("{case}: allocated"), async || {
                cluster.allocated(&pod).await
            })
            .await;
            assert_eq!(results.len(), count, "{case}: {results:?}");
            let instances: BTreeSet<String> = results
                .iter()
                .map(|r| instance_of(&r.device, &config))
                .collect();
            if enforced {
                assert_eq!(
                    instances.len(),
                    count,
                    "{case}: distinct instances {results:?}"
                );
            } else if count == 3 {
                assert!(
                    instances.len() < count,
                    "{case}: slots of one instance {results:?}"
                );
            }
            if unique && !enforced {
                let ready = cluster.ready_condition(&config).await;
                assert!(
                    ready.message.contains("uniqueDevices is not enforced"),
                    "{ready:?}"
                );
            }
        }
    }

    // An extended-resource request: `akri.sh/<config>: 2`, no claim written by the user.
    let config = cluster.discovery("ext", &["foo0", "foo1"], 2, true).await;
    cluster
        .wait_published(&config, if consumable { 2 } else { 4 })
        .await;
    let class = Api::<DeviceClass>::all(cluster.client.clone())
        .get(&config)
        .await
        .unwrap();
    let resource = format!("akri.sh/{config}");
    let pod = cluster
        .create_pod(json!({
            "metadata": { "name": support::unique("ext") },
            "spec": { "containers": [{ "name": "c", "image": "none",
                "resources": { "limits": { resource.clone(): "2" } } }] },
        }))
        .await;
    if cluster.support.extended_resource_name {
        assert_eq!(
            class
                .spec
                .as_ref()
                .unwrap()
                .extended_resource_name
                .as_deref(),
            Some(resource.as_str())
        );
        let claim = eventually("the extended-resource claim", async || {
            let pod = Api::<Pod>::namespaced(cluster.client.clone(), &cluster.namespace)
                .get(&pod)
                .await
                .ok()?;
            Some(
                pod.status?
                    .extended_resource_claim_status?
                    .resource_claim_name,
            )
        })
        .await;
        let results = eventually("the extended-resource claim allocated", async || {
            cluster.allocated(&claim).await
        })
        .await;
        assert_eq!(results.len(), 2, "{results:?}");
        if consumable {
            let instances: BTreeSet<String> = results
                .iter()
                .map(|r| instance_of(&r.device, &config))
                .collect();
            assert_eq!(instances.len(), 2, "uniqueDevices holds: {results:?}");
        }
        assert!(cluster.bound_node(&pod).await.is_some());
    } else {
        assert_eq!(class.spec.unwrap().extended_resource_name, None);
        let ready = cluster.ready_condition(&config).await;
        assert!(ready.message.contains("DRAExtendedResource"), "{ready:?}");
        let why = eventually("the extended-resource pod pending", async || {
            cluster.unschedulable(&pod).await
        })
        .await;
        assert!(why.contains(&resource), "{why}");
    }

    // PropertyFilters: include and exclude steer allocation; bad filters say why.
    let config = cluster.discovery("pf", &["foo0", "foo1"], 1, true).await;
    cluster.wait_published(&config, 2).await;
    let filters = Api::<PropertyFilter>::all(cluster.client.clone());
    let filter = async |mode: &str, key: &str, value: &str| -> String {
        let name = support::unique("pf");
        filters
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "apiVersion": "akri.sh/v1", "kind": "PropertyFilter",
                    "metadata": { "name": name },
                    "spec": {
                        "discoveryReference": { "name": config },
                        "filters": [{ "key": key, "value": value, "mode": mode }],
                    },
                })),
            )
            .await
            .unwrap();
        name
    };
    let ready = async |name: &str| -> Option<(bool, String, PropertyFilter)> {
        let filter = filters.get(name).await.ok()?;
        let condition = filter
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)?
            .clone();
        Some((condition.status == "True", condition.message, filter))
    };
    let include = filter("Include", "DEBUG_ECHO_DESCRIPTION", "foo1").await;
    let bad_key = filter("Include", "not-a-property", "x").await;
    let long_value = filter("Include", "DEBUG_ECHO_DESCRIPTION", &"x".repeat(65)).await;
    let (ok, message, object) = eventually("include filter ready", async || {
        let (ok, message, filter) = ready(&include).await?;
        (filter.status.as_ref()?.matching_devices == 1).then_some((ok, message, filter))
    })
    .await;
    assert!(ok, "{message}");
    let status = object.status.unwrap();
    assert!(
        status.compiled_expression.unwrap().contains("\"foo1\""),
        "the compiled CEL is shown"
    );
    assert_eq!(status.device_class_name.as_deref(), Some(include.as_str()));
    // Both devices are free for every claim, so the scheduler has a real choice; each mode is
    // tried on both values (whichever device it would pick unfiltered, one case differs from
    // it), and repeated, so a filter that does nothing cannot pass by chance.
    let mut cases = vec![(include.clone(), "foo1")];
    for (mode, value, expected) in [
        ("Include", "foo0", "foo0"),
        ("Exclude", "foo1", "foo0"),
        ("Exclude", "foo0", "foo1"),
    ] {
        cases.push((
            filter(mode, "DEBUG_ECHO_DESCRIPTION", value).await,
            expected,
        ));
    }
    for (filter, description) in &cases {
        eventually("filter class", async || {
            Api::<DeviceClass>::all(cluster.client.clone())
                .get_opt(filter)
                .await
                .ok()?
        })
        .await;
        for round in 0..4 {
            let pod = cluster.pod_claiming(filter, 1).await;
            let results = eventually(&format!("{filter} allocated"), async || {
                cluster.allocated(&pod).await
            })
            .await;
            assert_eq!(
                results[0].device,
                akri_devices::instance_name(&config, description, false, &node),
                "filter {filter} steers to {description} (round {round})"
            );
            cluster.delete_pod(&pod).await;
            eventually("the claim gone", async || {
                Api::<ResourceClaim>::namespaced(cluster.client.clone(), &cluster.namespace)
                    .get_opt(&pod)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            })
            .await;
        }
    }
    for (filter, expected) in [(&bad_key, "C identifier"), (&long_value, "at most 64")] {
        let (ok, message, object) =
            eventually("bad filter condition", async || ready(filter).await).await;
        assert!(!ok, "{message}");
        assert!(message.contains(expected), "{message}");
        let reason = object.status.unwrap().conditions[0].reason.clone();
        assert_eq!(reason, "InvalidFilter");
        assert!(
            Api::<DeviceClass>::all(cluster.client.clone())
                .get_opt(filter)
                .await
                .unwrap()
                .is_none(),
            "no DeviceClass for a filter that does not compile"
        );
    }
}

/// A shared device whose Instance loses its last node while a pod holds it stays published
/// with the `akri.sh/not-discovered` taint: `NoSchedule` at once (a new pod does not get it),
/// `NoExecute` after the grace, which the device-taint eviction controller turns into evicting
/// the holder; released, it leaves, and the replacement runs on a device that exists; back, it
/// is untainted and allocatable. Without device taints (1.34) it leaves at once, and an Event
/// and the configuration's status say its holders are not evicted.
#[tokio::test]
async fn a_held_shared_device_that_loses_its_last_node_is_tainted_and_its_holder_evicted() {
    use k8s_openapi::api::events::v1::Event;
    let grace = std::time::Duration::from_secs(15);
    let cluster = Cluster::start_with(2, true, |c| c.vanished_grace = grace).await;
    let client = &cluster.client;
    let config = cluster.discovery("lost", &["cam0", "cam1"], 1, false).await;
    cluster.wait_published(&config, 2).await;

    // The holder gets one device, a blocker the other.
    let holder = cluster.pod_claiming(&config, 1).await;
    let held = eventually("the holder allocated", async || {
        Some(cluster.allocated(&holder).await?.first()?.device.clone())
    })
    .await;
    let blocker = cluster.pod_claiming(&config, 1).await;
    eventually("the blocker allocated", async || {
        cluster.allocated(&blocker).await.map(|_| ())
    })
    .await;
    let description = ["cam0", "cam1"]
        .into_iter()
        .find(|d| instance_of(&held, &config) == akri_devices::instance_name(&config, d, true, ""))
        .unwrap();

    // Every node stops seeing it.
    for file in cluster.availability_files() {
        std::fs::write(file, description).unwrap();
    }
    let events = Api::<Event>::all(client.clone());
    let warned = async |reason: &str| {
        let events = events.list(&ListParams::default()).await.ok()?.items;
        events.into_iter().find(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(config.as_str())
        })
    };

    if !cluster.support.device_taints {
        eventually("the device gone at once", async || {
            let devices = support::shared_device_taints(client, &config).await;
            (devices.len() == 1 && devices[0].0 != held).then_some(())
        })
        .await;
        let event = eventually("a Warning Event", async || {
            warned("DeviceVanishedHoldersNotEvicted").await
        })
        .await;
        assert!(event.note.unwrap().contains(&held));
        let ready = cluster.ready_condition(&config).await;
        assert!(
            ready.message.contains("pods that hold it are not evicted"),
            "{ready:?}"
        );
        assert!(
            cluster.allocated(&holder).await.is_some(),
            "the holder keeps its allocation"
        );
        return;
    }

    // Whether the held device is published with exactly these effects of our taint.
    let held_with = async |effects: &[&str]| {
        let effects: Vec<String> = effects.iter().map(|e| e.to_string()).collect();
        support::shared_device_taints(client, &config)
            .await
            .contains(&(held.clone(), effects))
    };
    eventually("the held device NoSchedule-tainted", async || {
        held_with(&["NoSchedule"]).await.then_some(())
    })
    .await;
    let tainted = std::time::Instant::now();
    let event = eventually("a Warning Event", async || {
        warned("DeviceVanishedWhileHeld").await
    })
    .await;
    assert!(event.note.unwrap().contains(&held));
    let replacement = cluster.pod_claiming(&config, 1).await;
    eventually("the replacement unschedulable", async || {
        cluster.unschedulable(&replacement).await
    })
    .await;

    eventually("the taint NoExecute", async || {
        held_with(&["NoExecute"]).await.then_some(())
    })
    .await;
    assert!(
        tainted.elapsed() >= grace - std::time::Duration::from_secs(2),
        "NoExecute after {:?}, before the grace of {grace:?}",
        tainted.elapsed()
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &cluster.namespace);
    let evicted = eventually("the holder evicted", async || {
        let pod = pods.get(&holder).await.ok()?;
        pod.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    })
    .await;
    assert_eq!(
        evicted.reason.as_deref(),
        Some("DeletionByDeviceTaintManager")
    );

    // No kubelet finishes the deletion here: done by hand. Released, the device leaves.
    cluster.delete_pod(&holder).await;
    eventually("the released device gone", async || {
        let devices = support::shared_device_taints(client, &config).await;
        (!devices.iter().any(|(d, _)| *d == held)).then_some(())
    })
    .await;
    assert!(cluster.allocated(&replacement).await.is_none());

    // The blocker's device freed: the replacement gets a device that exists.
    cluster.delete_pod(&blocker).await;
    let got = eventually("the replacement allocated", async || {
        Some(
            cluster
                .allocated(&replacement)
                .await?
                .first()?
                .device
                .clone(),
        )
    })
    .await;
    assert_ne!(got, held);

    // Back: untainted, and a new pod gets it.
    for file in cluster.availability_files() {
        std::fs::write(file, "").unwrap();
    }
    eventually("the device back untainted", async || {
        held_with(&[]).await.then_some(())
    })
    .await;
    let fourth = cluster.pod_claiming(&config, 1).await;
    let got = eventually("a new pod allocated", async || {
        Some(cluster.allocated(&fourth).await?.first()?.device.clone())
    })
    .await;
    assert_eq!(got, held);
}
