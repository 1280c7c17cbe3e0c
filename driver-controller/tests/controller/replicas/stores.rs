//! A restarted controller acts only once its stores are complete.

use super::common::{configuration, devices_per_instance, unique_node};
use super::support::{self, eventually, from_json};
use akri_api::v1::DiscoveryConfiguration;
use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::metrics::Metrics;
use akri_testing::{ControlPlane, SlowLists};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, PostParams};
use serde_json::json;
use std::time::{Duration, Instant};

/// A controller restarted with 1,000 shared Instances already published, whose LISTs are slow
/// (configurations 4 s, Instances 6 s), acts only on complete stores: while they fill, no
/// shared slice is deleted, no pool generation goes back, no DeviceClass is removed.
#[tokio::test]
async fn a_restarted_controller_waits_for_its_stores_before_acting() {
    use akri_api::v1::{INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL, Instance};
    use akri_driver_controller::controller::{self, SHARED_CONFIGURATION_LABEL};
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use kube::runtime::watcher;
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Arc, Mutex};

    const INSTANCES: usize = 1000;
    let (cp, client, namespace) = support::control_plane().await;
    let (a, b) = (unique_node(&cp).await, unique_node(&cp).await);
    let name = configuration(&client, "many").await;
    let filter = ControlPlane::unique_name("room-a");
    Api::<akri_api::v1::PropertyFilter>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "PropertyFilter",
                "metadata": { "name": filter },
                "spec": {
                    "discoveryReference": { "name": name },
                    "filters": [{ "key": "ROOM", "value": "a" }],
                },
            })),
        )
        .await
        .unwrap();
    let instances = Api::<Instance>::namespaced(client.clone(), &namespace);
    let create = |i: usize| {
        let (instances, name) = (instances.clone(), name.clone());
        let (a, b) = (a.clone(), b.clone());
        async move {
            let instance: Instance = from_json(json!({
                "apiVersion": "akri.sh/v0", "kind": "Instance",
                "metadata": {
                    "name": format!("{name}-{i:06x}"),
                    "labels": { INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION },
                },
                "spec": {
                    "configurationName": name,
                    "cdiName": format!("akri.sh/{name}={i}"),
                    "capacity": 2,
                    "brokerProperties": { "ROOM": if i.is_multiple_of(2) { "a" } else { "b" } },
                    "shared": true,
                    "nodes": [a, b],
                },
            }));
            instances.create(&PostParams::default(), &instance).await
        }
    };
    futures::stream::iter(0..INSTANCES)
        .map(create)
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();

    let run = |client: kube::Client, metrics: Metrics| {
        let mut config = ControllerConfig::new(&namespace);
        config.debounce = Duration::from_millis(100);
        tokio::spawn(async move {
            controller::run(client, config, metrics).await.unwrap();
        })
    };
    let configs = Api::<DiscoveryConfiguration>::all(client.clone());
    let classes = Api::<DeviceClass>::all(client.clone());
    let published = INSTANCES as i32 * devices_per_instance(&cp, 2);
    let first = run(client.clone(), Metrics::default());
    eventually(
        "every Instance published, the filter compiled",
        async || {
            let status = configs.get(&name).await.ok()?.status?;
            let published = status.devices_published == published;
            (published
                && classes
                    .get_opt(&filter)
                    .await
                    .ok()??
                    .metadata
                    .name
                    .is_some())
            .then_some(())
        },
    )
    .await;
    first.abort();

    // Everything that must not happen, as the API server sees it; and the devices and
    // DeviceClasses the watches saw written, which show when they have seen a later write.
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let (devices_seen, classes_seen) = (
        Arc::new(Mutex::new(BTreeSet::<String>::new())),
        Arc::new(Mutex::new(BTreeSet::<String>::new())),
    );
    let slices_ready = Arc::new(tokio::sync::Notify::new());
    let slice_watch = tokio::spawn({
        let (violations, ready) = (violations.clone(), slices_ready.clone());
        let seen_devices = devices_seen.clone();
        let api = Api::<ResourceSlice>::all(client.clone());
        let selector = format!("{SHARED_CONFIGURATION_LABEL}={name}");
        async move {
            let mut generations = BTreeMap::<String, i64>::new();
            let mut events =
                std::pin::pin!(watcher(api, watcher::Config::default().labels(&selector)));
            // A watch that fails could miss what it is here to see: the test fails with it.
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(error) => {
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("the slice watch failed: {error}"));
                        ready.notify_one();
                        break;
                    }
                };
                match event {
                    watcher::Event::InitApply(slice) | watcher::Event::Apply(slice) => {
                        let pool = slice.spec.pool.name.clone();
                        let seen = generations.entry(pool.clone()).or_default();
                        if slice.spec.pool.generation < *seen {
                            violations.lock().unwrap().push(format!(
                                "pool {pool}: generation {} after {seen}",
                                slice.spec.pool.generation
                            ));
                        }
                        *seen = (*seen).max(slice.spec.pool.generation);
                        let names = slice.spec.devices.iter().flatten().map(|d| d.name.clone());
                        seen_devices.lock().unwrap().extend(names);
                    }
                    watcher::Event::Delete(slice) => violations.lock().unwrap().push(format!(
                        "slice {} deleted",
                        slice.metadata.name.unwrap_or_default()
                    )),
                    watcher::Event::InitDone => ready.notify_one(),
                    watcher::Event::Init => {}
                }
            }
        }
    });
    let class_watch = tokio::spawn({
        let (violations, seen_classes) = (violations.clone(), classes_seen.clone());
        async move {
            let mut events = std::pin::pin!(watcher(classes, watcher::Config::default()));
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(error) => {
                        let failed = format!("the DeviceClass watch failed: {error}");
                        violations.lock().unwrap().push(failed);
                        break;
                    }
                };
                match event {
                    watcher::Event::Delete(class) => violations.lock().unwrap().push(format!(
                        "DeviceClass {} deleted",
                        class.metadata.name.unwrap_or_default()
                    )),
                    watcher::Event::Apply(class) | watcher::Event::InitApply(class) => {
                        let name = class.metadata.name.unwrap_or_default();
                        seen_classes.lock().unwrap().insert(name);
                    }
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
            }
        }
    });
    slices_ready.notified().await;

    let slow = SlowLists::new()
        .delay("discoveryconfigurations", Duration::from_secs(4))
        .delay("instances", Duration::from_secs(6))
        .client(cp.client_config().await.unwrap())
        .unwrap();
    let metrics = Metrics::default();
    let restarted = Instant::now();
    let second = run(slow, metrics.clone());
    eventually("the restarted controller reconciles", async || {
        // Its series is there from the start, at 0: a reconcile counts 1.
        let series = "akri_driver_controller_reconciles_total{result=\"ok\"}";
        (akri_testing::metric(&metrics.encode(), series) >= Some(1.0)).then_some(())
    })
    .await;
    let first_reconcile = restarted.elapsed();
    // Later writes of the restarted controller, each watch in order: one more Instance
    // published in the configuration's pool and a new configuration's DeviceClass. Once the
    // watches have seen them, they have seen whatever it did while its stores filled.
    let marker = create(INSTANCES).await.unwrap().metadata.name.unwrap();
    let later = configuration(&client, "later").await;
    eventually(
        "the later Instance and configuration published",
        async || {
            let slot = |device: &String| {
                (device.strip_prefix(marker.as_str()))
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
            };
            let device = devices_seen.lock().unwrap().iter().any(slot);
            let class = classes_seen.lock().unwrap().contains(&later);
            (device && class).then_some(())
        },
    )
    .await;
    let published = published + devices_per_instance(&cp, 2);
    eventually("every device still published", async || {
        let status = configs.get(&name).await.ok()?.status?;
        (status.devices_published == published).then_some(())
    })
    .await;
    let violations = violations.lock().unwrap().clone();
    assert!(
        violations.is_empty(),
        "while the stores filled: {violations:?}"
    );
    assert!(
        first_reconcile >= Duration::from_secs(6),
        "reconciled after {first_reconcile:?}, before its Instances were listed"
    );
    second.abort();
    slice_watch.abort();
    class_watch.abort();
}
