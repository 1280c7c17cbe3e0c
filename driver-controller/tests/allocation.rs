//! The driver-controller with the real scheduler: shared devices with capacity, uniqueDevices,
//! extended-resource requests and PropertyFilters. Runs against whatever Kubernetes version
//! `AKRI_K8S_VERSION` selects; where the API server lacks consumable capacity, per-device
//! node selection or extended resources, the same scenarios exercise the fallbacks.

mod support;

use akri_api::v0::Instance;
use akri_api::v1::{CONDITION_READY, PropertyFilter};
use akri_driver_controller::shared_devices::selected_nodes;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
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
    let cluster = Cluster::start(3, true).await;
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
    let slices = Api::<ResourceSlice>::all(cluster.client.clone());
    let shared_nodes = async || -> Option<BTreeSet<String>> {
        let slices = slices.list(&ListParams::default()).await.ok()?.items;
        let mut nodes = BTreeSet::new();
        let mut found = false;
        for slice in slices.iter().filter(|s| s.spec.driver == support::DRIVER) {
            assert!(
                slice.spec.node_name.is_none(),
                "shared devices are never in a node's pool: {slice:?}"
            );
            let pool_selector = slice.spec.node_selector.as_ref();
            for device in slice.spec.devices.iter().flatten() {
                if instance_of(&device.name, &config) != instance {
                    continue;
                }
                found = true;
                let selector = device.node_selector.as_ref().or(pool_selector)?;
                nodes.extend(selected_nodes(selector));
            }
        }
        found.then_some(nodes)
    };
    let nodes = eventually("the device selects its nodes", async || {
        shared_nodes().await
    })
    .await;
    assert_eq!(
        nodes,
        cluster.nodes.iter().cloned().collect::<BTreeSet<_>>()
    );

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

    // The node set follows the nodes that see the device; the last one gone removes it.
    let availability = cluster.availability_files();
    std::fs::write(&availability[2], "OFFLINE").unwrap();
    eventually("the device selects two nodes", async || {
        (shared_nodes().await?.len() == 2).then_some(())
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
            class.spec.extended_resource_name.as_deref(),
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
        assert_eq!(class.spec.extended_resource_name, None);
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
