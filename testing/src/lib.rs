//! Real Kubernetes for tests.
//!
//! [`ControlPlane`] runs etcd and kube-apiserver (and, when asked, kube-scheduler and
//! kube-controller-manager) built from source by `hack/k8s-bins.sh`, as plain processes on
//! loopback ports with generated certificates. [`KubeletPeer`] runs the kubelet's own plugin
//! watcher, DRA manager and device manager for one simulated node, so our plugins talk to
//! the kubelet's real code.
//!
//! Processes are started with a parent-death signal, from a thread that lives as long as the
//! test binary, so nothing outlives a test run, even one that panics or is killed.
//! [`TcpProxy`] puts a stallable network path between one client and the API server;
//! [`SlowLists`] makes one client's LISTs slow.
//!
//! ```no_run
//! # async fn demo() -> Result<(), akri_testing::Error> {
//! let cp = akri_testing::ControlPlane::shared().await?;
//! let client = cp.client().await?;
//! cp.create_node("node-a").await?;
//! # Ok(()) }
//! ```

pub mod admission;
pub mod akris_agent;
mod bins;
mod certs;
#[cfg(feature = "components")]
pub mod components;
mod control_plane;
mod conventions;
pub mod discovery;
pub mod docs;
mod error;
mod kubelet_peer;
mod loop_device;
pub mod monitoring;
pub mod peers;
mod process;
pub mod product;
mod proxy;
pub mod rbac;
mod real_node;
mod services;
pub mod side_by_side;
mod slow_lists;
pub mod wire;

pub use bins::{BinDir, NodeBins};
pub use control_plane::{
    AuditedWrite, Capabilities, ControlPlane, ControlPlaneOptions, with_user_agent,
};
pub use error::Error;
pub use kubelet_peer::KubeletPeer;
pub use loop_device::LoopDevice;
pub use process::Component;
pub use proxy::{TcpProxy, UnixRelay};
pub use real_node::{RealNode, Refusal};
pub use slow_lists::SlowLists;

/// Logs of the components a test runs in its own runtime go to the test's output, shown when
/// it fails (`RUST_LOG`, warnings by default): a controller's failed reconciliations say why a
/// wait timed out. A global subscriber, so the suites that start controllers call it (the
/// first call wins) and a suite with a global subscriber of its own does not.
pub fn test_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A free TCP port on 127.0.0.1, for a component the harness starts (bound and released;
/// tests run on one machine).
///
/// Three things could take the port between this check and the component's own bind, and
/// the first two have failed CI runs: the kernel handing it out as the local port of an
/// outgoing connection (the ephemeral range), a concurrent test of this process getting it
/// from its own `bind(0)`, and another test process (the node agent's suite runs beside the
/// others) picking the same one. So ports come from below the ephemeral range, none is handed
/// out twice by one process, and each is reserved across processes by a lock on
/// `$TMPDIR/akri-test-ports/<port>`, held until this process ends (the kernel drops it then,
/// so a killed test leaves nothing reserved).
pub fn free_port() -> Result<u16, Error> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static GIVEN: OnceLock<Mutex<HashMap<u16, std::fs::File>>> = OnceLock::new();
    let mut given = GIVEN
        .get_or_init(Default::default)
        .lock()
        .expect("port lock");
    let locks = std::env::temp_dir().join("akri-test-ports");
    std::fs::create_dir_all(&locks).map_err(Error::io("create the port reservations"))?;
    let (low, high) = ports_below_ephemeral();
    let span = u32::from(high - low);
    // Start each process somewhere else, so that test binaries run side by side rarely meet.
    let start = (std::process::id().wrapping_mul(7919) + given.len() as u32 * 13) % span;
    for offset in 0..span {
        let port = low + ((start + offset) % span) as u16;
        if given.contains_key(&port) {
            continue;
        }
        let reservation = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(locks.join(port.to_string()))
            .map_err(Error::io("open a port reservation"))?;
        if reservation.try_lock().is_err() {
            // Another test process holds it.
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port, reservation);
            return Ok(port);
        }
    }
    Err(Error::Other(format!(
        "no free port on 127.0.0.1 in {low}..{high}"
    )))
}

/// Ports no outgoing connection takes: from 15000 to the start of the kernel's ephemeral
/// range (`ip_local_port_range`, 32768..60999 by default), or above its end when it starts
/// lower.
fn ports_below_ephemeral() -> (u16, u16) {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(|b| b.parse::<u16>().ok());
            Some((bounds.next()??, bounds.next()??))
        })
        .unwrap_or((32768, 60999));
    match range {
        (start, _) if start > 16000 => (15000, start),
        (_, end) if end < 64000 => (end + 1, 65535),
        // The whole port space is ephemeral: nothing is safer than anything else.
        _ => (15000, 65535),
    }
}

/// The Event with `reason` that regards Node `node` and whose note contains `note_has`, if
/// the API server has one (one look: wrap it in [`eventually`] to wait for it).
pub async fn node_event(
    client: &kube::Client,
    node: &str,
    reason: &str,
    note_has: &str,
) -> Option<k8s_openapi::api::events::v1::Event> {
    kube::Api::<k8s_openapi::api::events::v1::Event>::all(client.clone())
        .list(&Default::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                && e.note.as_ref().is_some_and(|n| n.contains(note_has))
        })
}

/// Waits up to `timeout` for pod `namespace/name` to be bound; returns it. On timeout it
/// panics with what the scheduler and the drivers said: the pod's events and, for each of its
/// claims, the allocation (node selector, devices, binding conditions) and `status.devices`.
pub async fn bound_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    timeout: std::time::Duration,
) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::Pod;
    let pods = kube::Api::<Pod>::namespaced(client.clone(), namespace);
    let bound = async || {
        let pod = pods.get_opt(name).await.ok()??;
        pod.spec.as_ref()?.node_name.as_ref()?;
        Some(pod)
    };
    let started = std::time::Instant::now();
    loop {
        if let Some(pod) = bound().await {
            return pod;
        }
        if started.elapsed() > timeout {
            panic!(
                "timed out after {timeout:?} waiting for pod {name} to be bound\n{}",
                why_not_bound(client, namespace, name).await
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// What the API server shows about pod `namespace/name` waiting to be scheduled: its events
/// and its claims' allocations and device statuses, a line each.
async fn why_not_bound(client: &kube::Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let mut report = Vec::new();
    let events = kube::Api::<Event>::namespaced(client.clone(), namespace);
    for event in events
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let about = event.regarding.as_ref().and_then(|r| r.name.as_deref());
        if about == Some(name) || about.is_some_and(|claim| claim.starts_with(name)) {
            report.push(format!(
                "event {} x{}: {}",
                event.reason.unwrap_or_default(),
                event.deprecated_count.unwrap_or(1),
                event.note.unwrap_or_default()
            ));
        }
    }
    let claims = kube::Api::<ResourceClaim>::namespaced(client.clone(), namespace);
    for claim in claims
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let owned = (claim.metadata.owner_references.iter().flatten()).any(|o| o.name == name);
        if !owned
            && !claim
                .metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(name))
        {
            continue;
        }
        let status = claim.status.unwrap_or_default();
        report.push(format!(
            "claim {}: allocation {} status.devices {}",
            claim.metadata.name.unwrap_or_default(),
            serde_json::to_string(&status.allocation).unwrap_or_default(),
            serde_json::to_string(&status.devices).unwrap_or_default(),
        ));
    }
    report.join("\n")
}

/// How long [`eventually`] waits: long enough for a loaded CI machine's controllers, scheduler
/// and kubelet, short enough that a test that cannot pass fails in reasonable time.
pub const EVENTUALLY: std::time::Duration = std::time::Duration::from_secs(90);

/// Polls `check` every 250 ms until it returns `Some`, panicking with `what` after
/// [`EVENTUALLY`]: for tests waiting on a controller, the scheduler or the kubelet to converge.
pub async fn eventually<T, F: AsyncFn() -> Option<T>>(what: &str, check: F) -> T {
    eventually_within(what, EVENTUALLY, check).await
}

/// [`eventually`] with another timeout: for a wait whose length is what the test is about.
pub async fn eventually_within<T, F: AsyncFn() -> Option<T>>(
    what: &str,
    timeout: std::time::Duration,
    check: F,
) -> T {
    poll(timeout, check, || {
        format!("timed out after {timeout:?} waiting for {what}")
    })
    .await
}

/// Polls `check` every 250 ms until it returns `Some`; panics with `failure()` after `timeout`.
pub(crate) async fn poll<T, F: AsyncFn() -> Option<T>>(
    timeout: std::time::Duration,
    check: F,
    failure: impl Fn() -> String,
) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < timeout, "{}", failure());
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// The API server's record of one object's changes: every version of `name` it gives a watch
/// from `version` on, until one that is `done` (or the watch ends). The later event a test
/// waits for, after which the versions before it are all in (they come in order), so that "no
/// change came before it" is a check rather than a quiet window.
pub fn modifications_until<K>(
    api: kube::Api<K>,
    name: &str,
    version: &str,
    done: impl Fn(&K) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let (name, version) = (name.to_string(), version.to_string());
    tokio::spawn(async move {
        let params = WatchParams::default().fields(&format!("metadata.name={name}"));
        let stream = api
            .watch(&params, &version)
            .await
            .expect("watch from the version");
        futures::pin_mut!(stream);
        let mut modified = Vec::new();
        while let Some(event) = stream.next().await {
            if let WatchEvent::Modified(object) = event.expect("a watch event") {
                let finished = done(&object);
                modified.push(object);
                if finished {
                    break;
                }
            }
        }
        modified
    })
}

/// A running pod's identity, once it runs: its UID, its first container's id and restart count
/// (the kubelet reports a started container a moment after it started). Equal before and after
/// means the pod was neither replaced nor restarted.
pub async fn running_pod(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
    timeout: std::time::Duration,
) -> (String, String, i32) {
    eventually_within(&format!("pod {name} running"), timeout, async || {
        let pod = pods.get(name).await.ok()?;
        let status = pod.status?;
        // A pod that failed (admission refused it, say) never runs: say why at once.
        if status.phase.as_deref() == Some("Failed") {
            panic!(
                "pod {name} failed: {} {}",
                status.reason.unwrap_or_default(),
                status.message.unwrap_or_default()
            );
        }
        (status.phase.as_deref() == Some("Running")).then_some(())?;
        let container = status.container_statuses?.into_iter().next()?;
        let id = container.container_id.filter(|id| !id.is_empty())?;
        Some((pod.metadata.uid?, id, container.restart_count))
    })
    .await
}

/// The median and the 99th percentile of `durations`, for a test to print.
pub fn quantiles(mut durations: Vec<std::time::Duration>) -> String {
    durations.sort();
    if durations.is_empty() {
        return "no samples".into();
    }
    let at = |q: f64| durations[((durations.len() - 1) as f64 * q).round() as usize];
    format!(
        "p50 {:?}, p99 {:?} of {}",
        at(0.5),
        at(0.99),
        durations.len()
    )
}

/// A typed object from the JSON a test writes it in; panics on a mistake in the test.
pub fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("valid object")
}

/// The devices of the slices `api` lists with `params`, each with the effects of its taints
/// of key `key`, sorted: what a test of device taints compares.
pub async fn device_taint_effects(
    api: &kube::Api<k8s_openapi::api::resource::v1::ResourceSlice>,
    params: &kube::api::ListParams,
    key: &str,
) -> Result<Vec<(String, Vec<String>)>, kube::Error> {
    let mut devices: Vec<_> = api
        .list(params)
        .await?
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| {
            let effects = d
                .taints
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key == key)
                .map(|t| t.effect)
                .collect();
            (d.name, effects)
        })
        .collect();
    devices.sort();
    Ok(devices)
}

/// The value of one sample in a Prometheus text exposition (`/metrics`), by its series as
/// written there: `akri_broker_controller_reconciles_total{result="ok"}`. `None` when the
/// series is absent.
pub fn metric(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// The comma-separated numbers in environment variable `var` (`default` when unset; empty
/// items skipped): a bench's sizes, e.g. `FLEET_NODES=10,50,200`.
pub fn sizes_from_env(var: &str, default: &str) -> Result<Vec<usize>, Error> {
    let value = std::env::var(var).unwrap_or_else(|_| default.to_string());
    (value.split(',').filter(|s| !s.trim().is_empty()))
        .map(|s| (s.trim().parse()).map_err(|e| Error::Other(format!("{var}: {s:?}: {e}"))))
        .collect()
}

/// How many watch events of `resource` the API server sent since it counted `before`, read
/// once an edit of `name` through `api` (an annotation nobody writes back) was sent too: a
/// watch sends in order, so every earlier event of a watch that carries the edit is counted
/// by then. A watcher of only `name` has heard exactly 1.
pub async fn watch_events_through_edit<K>(
    client: &kube::Client,
    api: &kube::Api<K>,
    name: &str,
    resource: &str,
    before: f64,
) -> f64
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let seen = serde_json::json!({ "metadata": { "annotations": { "seen-by": "test" } } });
    let params = kube::api::PatchParams::default();
    (api.patch(name, &params, &kube::api::Patch::Merge(seen)))
        .await
        .expect("the edit is written");
    eventually(&format!("the watch event of {name}'s edit"), async || {
        let heard = watch_events_sent(client, resource).await.ok()? - before;
        (heard >= 1.0).then_some(heard)
    })
    .await
}

/// The watch events the API server has sent of `resource` (plural, as `instances`), over
/// every watch: its `apiserver_watch_events_total`, which names the resource `resource` or
/// (before 1.34) `kind`.
pub async fn watch_events_sent(client: &kube::Client, resource: &str) -> Result<f64, Error> {
    let samples = apiserver_samples(client, "apiserver_watch_events_total").await?;
    Ok((samples.into_iter())
        .filter(|(labels, _)| {
            labels
                .get("resource")
                .or(labels.get("kind"))
                .map(String::as_str)
                == Some(resource)
        })
        .map(|(_, value)| value)
        .sum())
}

/// The samples of the API server's own metric `name` (its `/metrics`, read with `client`):
/// each one's labels and value. The independent oracle of what components ask of it.
pub async fn apiserver_samples(
    client: &kube::Client,
    name: &str,
) -> Result<Vec<(std::collections::BTreeMap<String, String>, f64)>, Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Error::Other(e.to_string()))?;
    let text = client.request_text(request).await?;
    let prefix = format!("{name}{{");
    let mut samples = Vec::new();
    for line in text.lines() {
        let Some((labels, value)) = (line.strip_prefix(&prefix)).and_then(|l| l.rsplit_once("} "))
        else {
            continue;
        };
        let labels = (labels.split(','))
            .filter_map(|l| l.split_once("=\""))
            .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
            .collect();
        let value = value
            .parse::<f64>()
            .map_err(|e| Error::Other(format!("{name}: {e}")))?;
        samples.push((labels, value));
    }
    Ok(samples)
}

/// `GET <path>` on a component's plain-HTTP endpoint (`/metrics`, `/readyz`): the status code
/// and the body.
pub async fn http_get(
    address: impl tokio::net::ToSocketAddrs,
    path: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let code = response
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(invalid)?;
    let body = response.split_once("\r\n\r\n").ok_or_else(invalid)?.1;
    Ok((code, body.to_string()))
}

/// One of our controller binaries (`env!("CARGO_BIN_EXE_…")`) against `cp`, its Instances and
/// Lease in `namespace`, `/metrics` on `127.0.0.1:<port>`; killed when dropped. Logs at
/// `warn` unless `BENCH_CONTROLLER_LOG` says otherwise. For benchmarks of the real binaries.
pub fn spawn_controller(
    exe: &str,
    cp: &ControlPlane,
    namespace: &str,
    port: u16,
) -> std::io::Result<tokio::process::Child> {
    // A profiler to run the controller under, e.g. BENCH_CONTROLLER_WRAPPER=heaptrack (the
    // figures the bench prints are then the wrapper's process's).
    let wrapper = std::env::var("BENCH_CONTROLLER_WRAPPER").unwrap_or_default();
    // Another build of the controller, e.g. the static musl binary the image ships
    // (`target/x86_64-unknown-linux-musl/release/...`): its allocator is musl's, not glibc's.
    // A relative path is the workspace's (a bench runs in its own package's directory).
    let exe = match std::env::var("BENCH_CONTROLLER_BIN") {
        Ok(path) => std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(path)
            .to_string_lossy()
            .into_owned(),
        Err(_) => exe.to_string(),
    };
    let exe = exe.as_str();
    let mut words = wrapper.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut command = tokio::process::Command::new(program);
            command.args(words).arg(exe);
            command
        }
        None => tokio::process::Command::new(exe),
    };
    command
        .env("KUBECONFIG", cp.kubeconfig())
        .env(
            "RUST_LOG",
            std::env::var("BENCH_CONTROLLER_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .args([
            "--instance-namespace",
            namespace,
            "--lease-namespace",
            namespace,
        ])
        .args(["--metrics-address", &format!("127.0.0.1:{port}")])
        .kill_on_drop(true)
        .spawn()
}

/// Sends SIGTERM to `child` (what the kubelet sends a container it stops) and waits up to
/// `timeout` for it to exit; returns its exit status. Uses procps' `kill` (`.ci/run` installs
/// it), the workspace forbidding the `unsafe` a direct `kill(2)` would need.
pub async fn terminate(
    child: &mut tokio::process::Child,
    timeout: std::time::Duration,
) -> std::io::Result<std::process::ExitStatus> {
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("the process has already exited"))?;
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    if !sent.success() {
        return Err(std::io::Error::other(format!("kill -TERM {pid}: {sent}")));
    }
    tokio::time::timeout(timeout, child.wait())
        .await
        .map_err(|_| std::io::Error::other(format!("still running {timeout:?} after SIGTERM")))?
}

/// Resident and peak resident memory of a process, in kB (Linux).
pub fn memory_kb(pid: u32) -> std::io::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0)
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

#[cfg(test)]
mod metric_tests {
    #[test]
    fn a_sample_is_found_by_its_whole_series() {
        let text =
            "# HELP x_total X.\nx_total{result=\"ok\"} 3\nx_total{result=\"okay\"} 5\ny 1.5\n";
        assert_eq!(super::metric(text, "x_total{result=\"ok\"}"), Some(3.0));
        assert_eq!(super::metric(text, "y"), Some(1.5));
        assert_eq!(super::metric(text, "x_total"), None);
        assert_eq!(super::metric(text, "z"), None);
    }
}
