//! What goes away with a deleted Node, and what a configuration's or filter's status says
//! when its DeviceClass cannot be written: a foreign class of the same name, CEL too long.

use super::common::{configuration, controller_for, devices_per_instance, seen_by, unique_node};
use super::support::{self, eventually, from_json};
use akri_api::v1::{CONDITION_DEGRADED, CONDITION_READY, DiscoveryConfiguration};
use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::metrics::Metrics;
use akri_testing::ControlPlane;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

/// A Node deleted for good (its kubelet-plugin never comes back to clean up): its entries of
/// Instances' `nodes` and of `status.discoveryErrors` go, the shared devices' node selectors
/// drop it, the Instances only it saw go, and the configuration stops being Degraded because
/// of it.
#[tokio::test]
async fn a_deleted_node_leaves_no_instance_entry_or_discovery_error_behind() {
    use akri_api::v1::Instance;
    use akri_driver_controller::controller;
    use k8s_openapi::api::core::v1::Node;

    let (cp, client, namespace) = support::control_plane().await;
    let (a, b) = (unique_node(&cp).await, unique_node(&cp).await);
    let name = configuration(&client, "nodes").await;
    let instances = Api::<Instance>::namespaced(client.clone(), &namespace);
    let configs = Api::<DiscoveryConfiguration>::all(client.clone());
    let seen_by =
        async |instance: &str, node: &str| seen_by(&instances, &name, instance, node).await;
    let both = format!("{name}-both");
    let only_a = format!("{name}-only-a");
    seen_by(&both, &a).await;
    seen_by(&both, &b).await;
    seen_by(&only_a, &a).await;
    for node in [&a, &b] {
        let entry = json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration", "metadata": { "name": name },
            "status": { "discoveryErrors": [{ "node": node, "message": "handler onvif: connection refused" }] },
        });
        configs
            .patch_status(
                &name,
                &PatchParams::apply(&akri_devices::node_field_manager(node)).force(),
                &Patch::Apply(&entry),
            )
            .await
            .unwrap();
    }
    let mut config = ControllerConfig::new(&namespace);
    config.debounce = Duration::from_millis(100);
    let controller = tokio::spawn(controller::run(client.clone(), config, Metrics::default()));
    let degraded = async |needle: &str| {
        let status = configs.get(&name).await.ok()?.status?;
        let condition = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_DEGRADED)?;
        (condition.message.contains(needle)).then_some((condition, status.discovery_errors))
    };
    eventually("Degraded by both nodes", async || {
        degraded(&format!("{a}: handler")).await?;
        degraded(&format!("{b}: handler")).await
    })
    .await;

    let nodes = Api::<Node>::all(client.clone());
    nodes.delete(&a, &DeleteParams::default()).await.unwrap();
    let gone = Duration::from_secs(30);
    let (condition, errors) =
        akri_testing::eventually_within(&format!("{a} forgotten"), gone, async || {
            let (condition, errors) = degraded("discovery fails on 1 node").await?;
            let left = instances.get(&both).await.ok()?.spec.nodes;
            let only_a_gone = instances.get_opt(&only_a).await.ok()?.is_none();
            // The shared device no longer sends claims towards the deleted node.
            let selected = support::shared_device_nodes(&client, &both).await?;
            (left == [b.clone()] && only_a_gone && selected == [b.clone()].into())
                .then_some((condition, errors))
        })
        .await;
    assert!(!condition.message.contains(&a), "{condition:?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].node, b);

    nodes.delete(&b, &DeleteParams::default()).await.unwrap();
    akri_testing::eventually_within(&format!("{b} forgotten"), gone, async || {
        let status = configs.get(&name).await.ok()?.status?;
        let healthy = status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_DEGRADED && c.status == "False");
        let none_left = instances.get_opt(&both).await.ok()?.is_none();
        (healthy && none_left && status.discovery_errors.is_empty()).then_some(())
    })
    .await;
    controller.abort();
}

/// A node not Ready past the grace (its kubelet-plugin cannot clean up): shared devices are no
/// longer offered there, an Instance only it sees leaves the slices, its Instance entries stay;
/// Ready again, it is offered again.
#[tokio::test]
async fn a_node_not_ready_past_the_grace_is_left_out_of_shared_devices_until_ready() {
    use akri_api::v1::Instance;
    use k8s_openapi::api::core::v1::Node;

    let (cp, client, namespace) = support::control_plane().await;
    let (a, b) = (unique_node(&cp).await, unique_node(&cp).await);
    let name = configuration(&client, "lost").await;
    let instances = Api::<Instance>::namespaced(client.clone(), &namespace);
    let both = format!("{name}-both");
    let only_a = format!("{name}-only-a");
    seen_by(&instances, &name, &both, &a).await;
    seen_by(&instances, &name, &both, &b).await;
    seen_by(&instances, &name, &only_a, &a).await;
    let grace = Duration::from_secs(6);
    let mut config = ControllerConfig::new(&namespace);
    config.debounce = Duration::from_millis(100);
    config.node_lost_grace = grace;
    let controller = tokio::spawn(akri_driver_controller::controller::run(
        client.clone(),
        config,
        Metrics::default(),
    ));
    let selected = async || {
        Some((
            support::shared_device_nodes(&client, &both).await?,
            support::shared_device_nodes(&client, &only_a).await,
        ))
    };
    eventually("both nodes offered", async || {
        let (both_nodes, only_a_nodes) = selected().await?;
        (both_nodes == [a.clone(), b.clone()].into() && only_a_nodes == Some([a.clone()].into()))
            .then_some(())
    })
    .await;

    let ready = async |status: &str| {
        let patch = json!({ "status": { "conditions": [{
            "type": "Ready", "status": status, "reason": "Test", "message": "set by the test",
            "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now(),
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now(),
        }] } });
        Api::<Node>::all(client.clone())
            .patch_status(&a, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .unwrap();
    };
    ready("Unknown").await;
    let since = std::time::Instant::now();
    eventually(&format!("{a} left out"), async || {
        let (both_nodes, only_a_nodes) = selected().await?;
        (both_nodes == [b.clone()].into() && only_a_nodes.is_none()).then_some(())
    })
    .await;
    assert!(
        since.elapsed() >= grace - Duration::from_secs(1),
        "left out after {:?}, before the grace of {grace:?}",
        since.elapsed()
    );
    assert_eq!(
        instances.get(&both).await.unwrap().spec.nodes.len(),
        2,
        "the lost node's Instance entries stay"
    );
    assert!(instances.get_opt(&only_a).await.unwrap().is_some());

    ready("True").await;
    eventually(&format!("{a} offered again"), async || {
        let (both_nodes, only_a_nodes) = selected().await?;
        (both_nodes == [a.clone(), b.clone()].into() && only_a_nodes == Some([a.clone()].into()))
            .then_some(())
    })
    .await;
    controller.abort();
}

/// A DeviceClass someone else made is never taken over by a DiscoveryConfiguration or a
/// PropertyFilter of the same name: it stays as it was, and their status says why nothing
/// selects their devices under that name.
#[tokio::test]
async fn a_foreign_device_class_of_the_same_name_is_left_alone() {
    use akri_api::v1::PropertyFilter;

    let (_cp, client, namespace) = support::control_plane().await;
    let classes = Api::<DeviceClass>::all(client.clone());
    let foreign = async |name: &str| {
        let class: DeviceClass = from_json(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": { "name": name, "labels": { "team": "gpu" } },
            "spec": { "selectors": [{ "cel": { "expression": "device.driver == \"gpu.example.com\"" } }] },
        }));
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap()
    };
    let taken = ControlPlane::unique_name("taken");
    let before = foreign(&taken).await;
    let filter_name = ControlPlane::unique_name("taken-filter");
    let filter_before = foreign(&filter_name).await;
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": taken },
                "spec": { "discoveryHandler": { "name": "onvif" }, "capacity": 2 },
            })),
        )
        .await
        .unwrap();
    let filters = Api::<PropertyFilter>::all(client.clone());
    filters
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "PropertyFilter",
                "metadata": { "name": filter_name },
                "spec": {
                    "discoveryReference": { "name": taken },
                    "filters": [{ "key": "ROOM", "value": "a" }],
                },
            })),
        )
        .await
        .unwrap();
    let controller = controller_for(client.clone(), &namespace, Metrics::default());

    let configs = Api::<DiscoveryConfiguration>::all(client.clone());
    let ready = eventually("the configuration's Ready condition", async || {
        let status = configs.get(&taken).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_READY)
    })
    .await;
    let filter_ready = eventually("the filter's Ready condition", async || {
        let status = filters.get(&filter_name).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_READY)
    })
    .await;
    for (class, before) in [(&taken, &before), (&filter_name, &filter_before)] {
        let after = classes.get(class).await.unwrap();
        assert_eq!(after.spec, before.spec, "{class} unchanged");
        assert_eq!(after.metadata.labels, before.metadata.labels, "{class}");
        assert_eq!(after.metadata.owner_references, None, "{class}");
        assert_eq!(
            after.metadata.resource_version, before.metadata.resource_version,
            "{class}"
        );
    }
    for (what, condition) in [("configuration", &ready), ("filter", &filter_ready)] {
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "DeviceClassConflict"),
            "{what}: {condition:?}"
        );
        assert!(
            condition.message.contains("not managed by Akri"),
            "{what}: {condition:?}"
        );
    }
    controller.abort();
}

/// A PropertyFilter whose compiled CEL is longer than the API server takes for a DeviceClass
/// selector (10 Ki, resource.k8s.io's CELSelectorExpressionMaxLength) says so in its own
/// status; its sibling filters, its configuration and another configuration carry on.
#[tokio::test]
async fn a_filter_too_long_for_the_api_server_fails_alone() {
    use akri_api::v1::{
        INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL, Instance, PropertyFilter,
    };

    let (cp, client, namespace) = support::control_plane().await;
    let node = unique_node(&cp).await;
    let instances = Api::<Instance>::namespaced(client.clone(), &namespace);
    let filters = Api::<PropertyFilter>::all(client.clone());
    let (mine, other) = (
        configuration(&client, "mine").await,
        configuration(&client, "other").await,
    );
    for config in [&mine, &other] {
        for room in ["a", "b"] {
            let instance: Instance = from_json(json!({
                "apiVersion": "akri.sh/v0", "kind": "Instance",
                "metadata": { "name": format!("{config}-{room}"), "labels": {
                    INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION } },
                "spec": {
                    "configurationName": config, "cdiName": format!("akri.sh/onvif={config}-{room}"),
                    "capacity": 1, "shared": true, "nodes": [node], "brokerProperties": { "ROOM": room },
                },
            }));
            instances
                .create(&PostParams::default(), &instance)
                .await
                .unwrap();
        }
    }
    let filter = async |prefix: &str, config: &str, rules: serde_json::Value| {
        let name = ControlPlane::unique_name(prefix);
        filters
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "apiVersion": "akri.sh/v1", "kind": "PropertyFilter",
                    "metadata": { "name": name },
                    "spec": { "discoveryReference": { "name": config }, "filters": rules },
                })),
            )
            .await
            .unwrap();
        name
    };
    // 32 filters (the most a PropertyFilter has) on 32-character keys, each value 64 control
    // characters, which CEL spells as \u0001: about 17 KiB of CEL.
    let huge_rules: Vec<_> = (0..32)
        .map(|i| json!({ "key": format!("K{i:031}"), "value": "\u{1}".repeat(64) }))
        .collect();
    let before = filter("room-a", &mine, json!([{ "key": "ROOM", "value": "a" }])).await;
    let huge = filter("huge", &mine, json!(huge_rules)).await;
    let after = filter("room-b", &mine, json!([{ "key": "ROOM", "value": "b" }])).await;
    let elsewhere = filter("other-a", &other, json!([{ "key": "ROOM", "value": "a" }])).await;
    let controller = controller_for(client.clone(), &namespace, Metrics::default());
    let published = 2 * devices_per_instance(&cp, 2);

    let condition = async |name: &str| {
        let status = filters.get(name).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_READY && c.observed_generation.is_some())
    };
    let wait = Duration::from_secs(30);
    for name in [&before, &after, &elsewhere] {
        let ready = akri_testing::eventually_within(&format!("{name} ready"), wait, async || {
            condition(name).await.filter(|c| c.status == "True")
        })
        .await;
        assert_eq!(ready.reason, "Compiled", "{name}: {ready:?}");
    }
    let configs = Api::<DiscoveryConfiguration>::all(client.clone());
    for config in [&mine, &other] {
        akri_testing::eventually_within(&format!("{config} published"), wait, async || {
            let status = configs.get(config).await.ok()?.status?;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == CONDITION_READY && c.status == "True");
            (ready && status.devices_published == published).then_some(())
        })
        .await;
    }
    let refused =
        akri_testing::eventually_within("the huge filter's condition", wait, async || {
            condition(&huge).await
        })
        .await;
    assert_eq!(
        (refused.status.as_str(), refused.reason.as_str()),
        ("False", "InvalidFilter"),
        "{refused:?}"
    );
    assert!(refused.message.contains("10240"), "{refused:?}");
    assert!(
        Api::<DeviceClass>::all(client.clone())
            .get_opt(&huge)
            .await
            .unwrap()
            .is_none()
    );
    controller.abort();
}

/// A DeviceClass write the API server forbids (an admission policy here, as a cluster's policy
/// engine or a broken RBAC role would) fails that configuration's reconciliation, which is
/// retried; the chart's alert of failing reconciliations is pending on what the controller's
/// `/metrics` then say, and silent while every reconciliation succeeds.
#[tokio::test]
async fn forbidden_class_writes_fail_reconciliations_and_the_alert_says_so() {
    use akri_testing::monitoring::Alert;

    let (_cp, client, namespace) = support::control_plane().await;
    let metrics = Metrics::default();
    let controller = controller_for(client.clone(), &namespace, metrics.clone());
    let classes = Api::<DeviceClass>::all(client.clone());
    let fine = configuration(&client, "fine").await;
    eventually("the class of a configuration", async || {
        classes.get_opt(&fine).await.ok()?
    })
    .await;
    let scrape = || [("driver-controller", metrics.encode())];
    let alert = Alert::named("AkriDriverControllerReconcileErrors").silent(&scrape());

    let denial = akri_testing::admission::Denial {
        name: "no-forbidden-classes",
        rule: json!({
            "apiGroups": ["resource.k8s.io"], "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"], "resources": ["deviceclasses"],
        }),
        expression: "!object.metadata.name.startsWith('forbidden')",
        message: "no forbidden classes here",
        forbidden: true,
        namespace: None,
    };
    akri_testing::admission::deny_unless(&client, denial)
        .await
        .unwrap();
    let probe: DeviceClass = from_json(json!({ "metadata": { "name": "forbidden-probe" } }));
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually("the policy in force", async || {
        match classes.create(&dry_run, &probe).await {
            Err(kube::Error::Api(status)) if status.code == 403 => Some(()),
            _ => None,
        }
    })
    .await;
    let alert = alert.silent(&scrape());

    let forbidden = configuration(&client, "forbidden").await;
    let series = "akri_driver_controller_reconciles_total{result=\"error\"}";
    eventually("a failed reconciliation", async || {
        (akri_testing::metric(&metrics.encode(), series)? >= 1.0).then_some(())
    })
    .await;
    (alert.pending(&scrape(), &[&[]])).check();
    assert!(classes.get_opt(&forbidden).await.unwrap().is_none());
    controller.abort();
}
