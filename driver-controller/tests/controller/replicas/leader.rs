//! Leader election: takeover when the leader dies or is cut off, and one name twice.

use super::common::{configuration, unique_node};
use super::support::{self, eventually};
use akri_api::v1::{CONDITION_DEGRADED, CONDITION_READY, DiscoveryConfiguration};
use akri_driver_controller::controller::ControllerConfig;
use akri_driver_controller::http::{self, Readiness};
use akri_driver_controller::leader::LeaseConfig;
use akri_driver_controller::metrics::Metrics;
use akri_testing::TcpProxy;
use akri_testing::monitoring::Alert;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

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
    replica_until(client, namespace, name, std::future::pending()).await
}

/// A replica that stops (as on SIGTERM) when `stop` completes.
async fn replica_until(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Replica {
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
        akri_driver_controller::run_as_leader(client, config, lease, metrics, readiness, stop)
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
    akri_testing::http_get(address, path).await.unwrap()
}

fn is_leader(replica: &Replica) -> bool {
    leads(&replica.metrics.encode())
}

/// Whether a replica's `/metrics` text says it leads.
fn leads(metrics: &str) -> bool {
    metrics
        .lines()
        .any(|l| l == "akri_driver_controller_leader 1")
}

/// The API writes and reconciles a replica has counted (its own metrics).
fn work_done(replica: &Replica) -> u64 {
    replica
        .metrics
        .encode()
        .lines()
        .filter(|l| {
            l.starts_with("akri_driver_controller_api_writes_total")
                || l.starts_with("akri_driver_controller_reconciles_total")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn a_stopped_leader_hands_the_lease_over() {
    let (_cp, client, namespace) = support::control_plane().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = replica_until(&client, &namespace, "first", async {
        let _ = stopped.await;
    })
    .await;
    eventually("the first replica leads", async || {
        is_leader(&first).then_some(())
    })
    .await;
    let second = replica(&client, &namespace, "second").await;

    // Stopped (SIGTERM in the binary), it gives the Lease up before it returns: the standby
    // does not wait for the Lease to expire.
    stop.send(()).unwrap();
    first
        .task
        .await
        .unwrap()
        .expect("a stopped replica ends without error");
    let lease = Api::<Lease>::namespaced(client.clone(), &namespace)
        .get("akri-driver-controller")
        .await
        .unwrap();
    assert_ne!(
        lease.spec.unwrap().holder_identity,
        Some(first.identity.clone()),
        "the stopped leader still holds the Lease: it was left to expire"
    );
    eventually("the standby leads", async || {
        is_leader(&second).then_some(())
    })
    .await;
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
    let selector = &class.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0]
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
    // Each replica's requests carry a user agent of its own, which the API server's audit log
    // keeps: the oracle of who wrote what, beside the replicas' own metrics.
    let agent = |config: kube::Config, name: &str| {
        let config = akri_testing::with_user_agent(config, &format!("replica-{name}"));
        kube::Client::try_from(config).unwrap()
    };
    let cut_off = agent(proxy.client_config(&config).unwrap(), "first");

    let mut first = replica(&cut_off, &namespace, "first").await;
    eventually("the first replica leads", async || {
        is_leader(&first).then_some(())
    })
    .await;
    let second = replica(&agent(config.clone(), "second"), &namespace, "second").await;
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
    let scrape = || {
        [
            ("first", first.metrics.encode()),
            ("second", second.metrics.encode()),
        ]
    };
    let alert = Alert::named("AkriDriverControllerNotOneLeader").silent(&scrape());
    let mut none_leads = None;
    proxy.stall();
    let cut = Instant::now();
    let mut stopped = None;
    let mut work_when_stopped = None;
    let mut unready = None;
    // A change only the new leader may act on (the cut-off one cannot see it).
    let during = configuration(&client, "during").await;
    let took_over = loop {
        let scraped = scrape();
        let (a, b) = (leads(&scraped[0].1), leads(&scraped[1].1));
        if !a && !b && none_leads.is_none() {
            none_leads = Some(scraped);
        }
        assert!(
            !(a && b),
            "both replicas act {:?} after the cut",
            cut.elapsed()
        );
        if !a && stopped.is_none() {
            stopped = Some(cut.elapsed());
            work_when_stopped = Some(work_done(&first));
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
    // Between the two, no replica led: what the chart's alert of "not one leader" is about.
    let none_leads = none_leads.expect("a moment when neither replica led");
    (alert.pending(&none_leads, &[&[]]).silent(&scrape())).check();
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
    // the Lease stays with the new one. Its run ended and its client goes, so each of its
    // connections closes once the API server has answered what waited in it: then the API
    // server has seen the last of its requests.
    drop(cut_off);
    proxy.resume();
    tokio::time::timeout(Duration::from_secs(60), proxy.all_closed())
        .await
        .expect("the old leader's connections close once what waited in them is answered");
    assert!(!is_leader(&first) && is_leader(&second));
    assert_eq!(
        holder(&client, &namespace).await,
        Some(second.identity.clone())
    );
    let later = configuration(&client, "later").await;
    for name in [&during, &later] {
        eventually("the new leader acts", async || {
            Api::<DeviceClass>::all(client.clone())
                .get_opt(name)
                .await
                .ok()?
        })
        .await;
    }
    // One writer at a time: from the moment it stopped, the old leader wrote and reconciled
    // nothing, through the cut and after the network came back.
    assert_eq!(
        Some(work_done(&first)),
        work_when_stopped,
        "the old leader worked after it stopped"
    );
    assert!(
        work_done(&second) > 0,
        "the metric counts the new leader's work"
    );
    // The API server's own record: every write of the old leader's that it accepted (its
    // Lease renewals, its DeviceClasses and status) came before the new leader's first, none
    // after, not even what waited in the stalled connection. A request it refused changed
    // nothing: a renewal caught in the stalled connection was answered 504 (it timed out,
    // nothing written) and logged after the new leader's first writes (a CI run, on 1.34).
    let writes = cp.audited_writes().unwrap();
    let by = |agent: &str| {
        (writes.iter().enumerate())
            .filter(|(_, w)| w.user_agent == agent && w.namespace != "kube-system")
            .filter(|(_, w)| (200..300).contains(&w.code))
            .map(|(i, _)| i)
            .collect::<Vec<_>>()
    };
    let (old, new) = (by("replica-first"), by("replica-second"));
    assert!(
        !old.is_empty() && !new.is_empty(),
        "both replicas wrote: {writes:#?}"
    );
    assert!(
        (writes[*new.first().unwrap()..].iter()).any(|w| w.resource == "deviceclasses"),
        "the new leader wrote DeviceClasses"
    );
    assert!(
        old.last() < new.first(),
        "the old leader wrote after the new one began: {:#?}",
        &writes[*new.first().unwrap()..]
    );
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
