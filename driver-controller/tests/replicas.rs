//! Two replicas of the driver-controller against a real control plane: one acts, the other
//! waits and takes over when the first dies; objects are garbage-collected with their
//! configuration; status and the HTTP endpoints say what is going on.

mod support;

use akri_api::v1::{CONDITION_DEGRADED, CONDITION_READY, DiscoveryConfiguration};
use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::http::{self, Readiness};
use akri_driver_controller::leader::LeaseConfig;
use akri_driver_controller::metrics::Metrics;
use akri_testing::{ControlPlane, SlowLists, TcpProxy};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::{eventually, from_json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Scheduling and API latency on a loaded test machine, on top of the bounds that follow from
/// the Lease timing.
const SLACK: Duration = Duration::from_millis(1500);

struct Replica {
    task: tokio::task::JoinHandle<Result<(), akri_driver_controller::Error>>,
    metrics: Metrics,
    address: SocketAddr,
    /// The holder identity it writes into the Lease.
    identity: String,
    _server: tokio::task::JoinHandle<()>,
}

/// The Lease timing of every replica here: short, so that takeovers are quick.
fn lease_config(namespace: &str, name: &str) -> LeaseConfig {
    let mut lease = LeaseConfig::new(namespace, "akri-driver-controller", name);
    lease.lease_duration = Duration::from_secs(3);
    lease.renew_deadline = Duration::from_secs(2);
    lease.retry_period = Duration::from_millis(500);
    lease
}

async fn replica(client: &kube::Client, namespace: &str, name: &str) -> Replica {
    let metrics = Metrics::default();
    let readiness = Readiness::default();
    let (address, server) = http::serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
        readiness.clone(),
    )
    .await
    .unwrap();
    let lease = lease_config(namespace, name);
    let identity = lease.identity.clone();
    let mut config = ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    let task = tokio::spawn({
        let (client, metrics) = (client.clone(), metrics.clone());
        akri_driver_controller::run_as_leader(client, config, lease, metrics, readiness)
    });
    Replica {
        task,
        metrics,
        address,
        identity,
        _server: server,
    }
}

/// GET `path`: status code and body.
async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let code = response[9..12].parse().unwrap();
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (code, body)
}

fn is_leader(replica: &Replica) -> bool {
    replica
        .metrics
        .encode()
        .lines()
        .any(|l| l == "akri_driver_controller_leader 1")
}

async fn configuration(client: &kube::Client, prefix: &str) -> String {
    let name = ControlPlane::unique_name(prefix);
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": name },
                "spec": { "discoveryHandler": { "name": "onvif" }, "capacity": 2 },
            })),
        )
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn a_standby_replica_takes_over_when_the_leader_dies() {
    let (cp, client, namespace) = support::control_plane().await;
    let classes = Api::<DeviceClass>::all(client.clone());
    let configs = Api::<DiscoveryConfiguration>::all(client.clone());

    let first = replica(&client, &namespace, "first").await;
    eventually("the first replica leads", async || {
        is_leader(&first).then_some(())
    })
    .await;
    let second = replica(&client, &namespace, "second").await;
    assert_eq!(get(second.address, "/healthz").await.0, 200);
    eventually("the standby is ready", async || {
        (get(second.address, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    // The leader acts: a DeviceClass per configuration, owned by it, with its extended resource.
    let kept = configuration(&client, "kept").await;
    let class = eventually("the leader's DeviceClass", async || {
        classes.get_opt(&kept).await.ok()?
    })
    .await;
    let owner = &class.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("DiscoveryConfiguration", kept.as_str())
    );
    let selector = &class.spec.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression;
    assert!(selector.contains("\"onvif.akri.sh\"") && selector.contains(&format!("\"{kept}\"")));
    let status = eventually("status written", async || {
        let status = configs.get(&kept).await.ok()?.status?;
        status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_READY)
            .then_some(status)
    })
    .await;
    assert_eq!(status.device_class_name.as_deref(), Some(kept.as_str()));
    assert_eq!((status.instances, status.devices_published), (0, 0));
    assert!(!is_leader(&second), "one active replica");
    let (code, body) = get(first.address, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        body.contains(
            "akri_driver_controller_api_writes_total{resource=\"deviceclass\",verb=\"apply\"} 1"
        ),
        "{body}"
    );

    // A node reporting a discovery error (as the kubelet-plugin writes it) degrades it.
    let node = unique_node(&cp).await;
    let node_entry = json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration", "metadata": { "name": kept },
        "status": { "discoveryErrors": [{ "node": node, "message": "handler onvif: connection refused" }] },
    });
    configs
        .patch_status(
            &kept,
            &PatchParams::apply(&akri_devices::node_field_manager(&node)),
            &Patch::Apply(&node_entry),
        )
        .await
        .unwrap();
    let degraded = eventually("Degraded", async || {
        let status = configs.get(&kept).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_DEGRADED && c.status == "True")
    })
    .await;
    assert!(
        degraded
            .message
            .contains(&format!("{node}: handler onvif: connection refused")),
        "{degraded:?}"
    );
    let status = configs.get(&kept).await.unwrap().status.unwrap();
    assert_eq!(
        status.discovery_errors.len(),
        1,
        "the node's entry is kept: {status:?}"
    );

    // The leader dies without a word; the standby takes over once the Lease expires.
    first.task.abort();
    let died = Instant::now();
    let later = configuration(&client, "later").await;
    eventually("the standby's DeviceClass", async || {
        classes.get_opt(&later).await.ok()?
    })
    .await;
    let takeover = died.elapsed();
    // The standby sees the last renewal within a retry period, waits a lease duration from
    // then and takes the Lease at its next attempt; one more retry period covers the reconcile.
    let lease = lease_config(&namespace, "bound");
    let bound = lease.lease_duration + 3 * lease.retry_period + SLACK;
    assert!(
        takeover < bound,
        "took over in {takeover:?}, bound {bound:?}"
    );
    assert!(is_leader(&second));
    let lease = Api::<Lease>::namespaced(client.clone(), &namespace)
        .get("akri-driver-controller")
        .await
        .unwrap();
    let spec = lease.spec.unwrap();
    assert_eq!(spec.holder_identity, Some(second.identity.clone()));
    assert_eq!(spec.lease_transitions, Some(1));

    // Deleting a configuration takes its DeviceClass with it (garbage collector).
    configs
        .delete(&kept, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the DeviceClass garbage-collected", async || {
        classes.get_opt(&kept).await.ok()?.is_none().then_some(())
    })
    .await;
    second.task.abort();
}

async fn holder(client: &kube::Client, namespace: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt("akri-driver-controller")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// A partition between the leader and the API server: the leader stops acting before its
/// Lease can expire, the standby takes over only after that, never are both acting, and the
/// old leader does not come back when the network does.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_stops_before_a_standby_takes_over() {
    let (cp, client, namespace) = support::control_plane().await;
    let config = cp.client_config().await.unwrap();
    let proxy = TcpProxy::start(cp.api_server_address()).await.unwrap();
    let cut_off = kube::Client::try_from(proxy.client_config(&config).unwrap()).unwrap();

    let mut first = replica(&cut_off, &namespace, "first").await;
    eventually("the first replica leads", async || {
        is_leader(&first).then_some(())
    })
    .await;
    let second = replica(&client, &namespace, "second").await;
    eventually("the standby is ready", async || {
        (get(second.address, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(get(first.address, "/readyz").await.0, 200);
    assert_eq!(
        holder(&client, &namespace).await,
        Some(first.identity.clone())
    );
    let kept = configuration(&client, "kept").await;
    eventually("the leader acts", async || {
        Api::<DeviceClass>::all(client.clone())
            .get_opt(&kept)
            .await
            .ok()?
    })
    .await;

    let lease = lease_config(&namespace, "bound");
    proxy.stall();
    let cut = Instant::now();
    let mut stopped = None;
    let mut unready = None;
    let took_over = loop {
        let (a, b) = (is_leader(&first), is_leader(&second));
        assert!(
            !(a && b),
            "both replicas act {:?} after the cut",
            cut.elapsed()
        );
        if !a && stopped.is_none() {
            stopped = Some(cut.elapsed());
        }
        if unready.is_none() && get(first.address, "/readyz").await.0 == 503 {
            unready = Some(cut.elapsed());
        }
        if b {
            break cut.elapsed();
        }
        assert!(
            cut.elapsed() < 4 * lease.lease_duration,
            "nobody took over (first acting: {a})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stopped = stopped.expect("the old leader stopped");
    assert!(
        stopped < lease.lease_duration,
        "the old leader still acted {stopped:?} after the cut, past a lease duration ({:?})",
        lease.lease_duration
    );
    // It gives up a renew deadline after the start of its last renewal, which was before the cut.
    assert!(
        stopped <= lease.renew_deadline + SLACK,
        "stopped {stopped:?} after the cut, renew deadline {:?}",
        lease.renew_deadline
    );
    assert!(
        stopped < took_over,
        "stopped {stopped:?}, taken over {took_over:?}"
    );
    // Its last renewal was at most a retry period before the cut; the standby saw it within a
    // retry period, waits a lease duration, and takes the Lease at its next attempt.
    let bound = lease.lease_duration + 2 * lease.retry_period + SLACK;
    assert!(
        took_over < bound,
        "took over {took_over:?} after the cut, bound {bound:?}"
    );
    let unready = unready.expect("the cut-off replica reported not ready");
    assert!(unready <= stopped + SLACK, "unready after {unready:?}");
    let outcome = (&mut first.task).await.unwrap();
    assert!(
        matches!(outcome, Err(akri_driver_controller::Error::LostLeadership)),
        "{outcome:?}"
    );
    assert_eq!(
        holder(&client, &namespace).await,
        Some(second.identity.clone())
    );

    // The network comes back: what waited in it does not make the old leader act again, and
    // the Lease stays with the new one.
    proxy.resume();
    tokio::time::sleep(4 * lease.retry_period).await;
    assert!(!is_leader(&first) && is_leader(&second));
    assert_eq!(
        holder(&client, &namespace).await,
        Some(second.identity.clone())
    );
    let later = configuration(&client, "later").await;
    eventually("the new leader acts", async || {
        Api::<DeviceClass>::all(client.clone())
            .get_opt(&later)
            .await
            .ok()?
    })
    .await;
    second.task.abort();
}

/// Two processes started with the same name (two pods of one name in different clusters'
/// pasts, a copy-pasted flag, no POD_NAME at all) still take turns.
#[tokio::test]
async fn two_replicas_of_one_name_never_both_act() {
    let (_cp, client, namespace) = support::control_plane().await;
    let one = replica(&client, &namespace, "same").await;
    let two = replica(&client, &namespace, "same").await;
    eventually("one of them leads", async || {
        (is_leader(&one) || is_leader(&two)).then_some(())
    })
    .await;
    let lease = lease_config(&namespace, "same");
    let watch = Instant::now();
    while watch.elapsed() < lease.lease_duration + 2 * lease.retry_period {
        assert!(
            is_leader(&one) != is_leader(&two),
            "exactly one acts ({:?})",
            watch.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(
        one.identity, two.identity,
        "holder identities are per process"
    );
    let leader = if is_leader(&one) { &one } else { &two };
    assert_eq!(
        holder(&client, &namespace).await,
        Some(leader.identity.clone())
    );
    one.task.abort();
    two.task.abort();
}

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
    use std::collections::BTreeMap;
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
    futures::stream::iter(0..INSTANCES)
        .map(|i| {
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
                        "brokerProperties": { "ROOM": if i % 2 == 0 { "a" } else { "b" } },
                        "shared": true,
                        "nodes": [a, b],
                    },
                }));
                instances.create(&PostParams::default(), &instance).await
            }
        })
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
    let published = INSTANCES as i32 * devices_per_instance(&client, 2).await;
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

    // Everything that must not happen, as the API server sees it.
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let slices_ready = Arc::new(tokio::sync::Notify::new());
    let slice_watch = tokio::spawn({
        let (violations, ready) = (violations.clone(), slices_ready.clone());
        let api = Api::<ResourceSlice>::all(client.clone());
        let selector = format!("{SHARED_CONFIGURATION_LABEL}={name}");
        async move {
            let mut generations = BTreeMap::<String, i64>::new();
            let mut events =
                std::pin::pin!(watcher(api, watcher::Config::default().labels(&selector)));
            while let Some(Ok(event)) = events.next().await {
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
        let violations = violations.clone();
        async move {
            let mut events = std::pin::pin!(watcher(classes, watcher::Config::default()));
            while let Some(Ok(event)) = events.next().await {
                if let watcher::Event::Delete(class) = event {
                    violations.lock().unwrap().push(format!(
                        "DeviceClass {} deleted",
                        class.metadata.name.unwrap_or_default()
                    ));
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
        metrics
            .encode()
            .contains("akri_driver_controller_reconciles_total{result=\"ok\"}")
            .then_some(())
    })
    .await;
    let first_reconcile = restarted.elapsed();
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(restarted.elapsed())).await;
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

/// A Node deleted for good (its kubelet-plugin never comes back to clean up): its entries of
/// Instances' `nodes` and of `status.discoveryErrors` go, the Instances only it saw go, and the
/// configuration stops being Degraded because of it.
#[tokio::test]
async fn a_deleted_node_leaves_no_instance_entry_or_discovery_error_behind() {
    use akri_api::v1::{INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL, Instance};
    use akri_driver_controller::controller;
    use k8s_openapi::api::core::v1::Node;

    let (cp, client, namespace) = support::control_plane().await;
    let (a, b) = (unique_node(&cp).await, unique_node(&cp).await);
    let name = configuration(&client, "nodes").await;
    let instances = Api::<Instance>::namespaced(client.clone(), &namespace);
    let configs = Api::<DiscoveryConfiguration>::all(client.clone());
    // As each node's kubelet-plugin writes them: its own entry, under its own field manager.
    let seen_by = async |instance: &str, node: &str| {
        let object = json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance",
            "metadata": { "name": instance, "labels": {
                INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION } },
            "spec": {
                "configurationName": name, "cdiName": format!("akri.sh/onvif={instance}"),
                "capacity": 2, "shared": true, "nodes": [node],
            },
        });
        instances
            .patch(
                instance,
                &PatchParams::apply(&akri_devices::node_field_manager(node)).force(),
                &Patch::Apply(&object),
            )
            .await
            .unwrap();
    };
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
        akri_testing::eventually(&format!("{a} forgotten"), gone, async || {
            let (condition, errors) = degraded("discovery fails on 1 node").await?;
            let left = instances.get(&both).await.ok()?.spec.nodes;
            let only_a_gone = instances.get_opt(&only_a).await.ok()?.is_none();
            (left == [b.clone()] && only_a_gone).then_some((condition, errors))
        })
        .await;
    assert!(!condition.message.contains(&a), "{condition:?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].node, b);

    nodes.delete(&b, &DeleteParams::default()).await.unwrap();
    akri_testing::eventually(&format!("{b} forgotten"), gone, async || {
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

async fn unique_node(cp: &ControlPlane) -> String {
    let name = ControlPlane::unique_name("edge");
    cp.create_node(&name).await.unwrap();
    name
}

/// A controller (no leader election) for `namespace`'s Instances.
fn controller_for(
    client: kube::Client,
    namespace: &str,
    metrics: Metrics,
) -> tokio::task::JoinHandle<()> {
    let mut config = ControllerConfig::new(namespace);
    config.debounce = Duration::from_millis(100);
    tokio::spawn(async move {
        akri_driver_controller::controller::run(client, config, metrics)
            .await
            .unwrap();
    })
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
    let published = 2 * devices_per_instance(&client, 2).await;

    let condition = async |name: &str| {
        let status = filters.get(name).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_READY && c.observed_generation.is_some())
    };
    let wait = Duration::from_secs(30);
    for name in [&before, &after, &elsewhere] {
        let ready = akri_testing::eventually(&format!("{name} ready"), wait, async || {
            condition(name).await.filter(|c| c.status == "True")
        })
        .await;
        assert_eq!(ready.reason, "Compiled", "{name}: {ready:?}");
    }
    let configs = Api::<DiscoveryConfiguration>::all(client.clone());
    for config in [&mine, &other] {
        akri_testing::eventually(&format!("{config} published"), wait, async || {
            let status = configs.get(config).await.ok()?.status?;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == CONDITION_READY && c.status == "True");
            (ready && status.devices_published == published).then_some(())
        })
        .await;
    }
    let refused = akri_testing::eventually("the huge filter's condition", wait, async || {
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

/// The shared devices an Instance of a uniqueDevices configuration with `capacity` becomes:
/// one, or one per slot where the API server lacks consumable capacity (1.34).
async fn devices_per_instance(client: &kube::Client, capacity: i32) -> i32 {
    let support = dra_plugin::api_support::ApiSupport::detect(client)
        .await
        .unwrap();
    if support.consumable_capacity {
        1
    } else {
        capacity
    }
}
