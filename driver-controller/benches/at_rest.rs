//! Prints the API requests (writes, and reads: GET, LIST, WATCH) a node and the
//! driver-controller make while nothing changes, and for one device change, counted by the
//! kube-apiserver itself (`apiserver_request_total`):
//! `cargo bench -p akri-driver-controller --bench at_rest`.
//!
//! A node agent (the kubelet-plugin's, embedded) with 100 debugEcho devices on one simulated
//! node; then the driver-controller binary beside it. Then the scale figure: on a fresh API
//! server, 20 and then 50 agents (simulated nodes) with 50 devices each, their requests at
//! rest per node; it should not grow with the number of nodes and Instances. Each phase is
//! counted over [`WINDOW`] after a settling pause, beside what the API server alone does over
//! a window (its own requests, which are not ours). `AT_REST_SCALE=20,50` sets the agent counts
//! (`AT_REST_SCALE=` skips the scale figure; `AT_REST_SCALE_ONLY=1` runs only it).

use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const DEVICES: usize = 100;
/// Longer than every periodic pass of the components (30 s).
const WINDOW: Duration = Duration::from_secs(70);
const SETTLE: Duration = Duration::from_secs(5);

/// The samples of the API server's metric `name`: each one's labels and value.
async fn samples(
    client: &kube::Client,
    name: &str,
) -> Result<Vec<(BTreeMap<String, String>, f64)>, Box<dyn std::error::Error>> {
    Ok(akri_testing::apiserver_samples(client, name).await?)
}

/// A label's value, `""` when absent.
fn label<'a>(labels: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    labels.get(name).map_or("", String::as_str)
}

/// The requests the API server counted, by `group/resource[/subresource] VERB`. Requests for
/// Leases and Endpoints (the API server's own) and for no resource (`/metrics`, the bench's
/// sampling) are left out: nothing of ours makes those here. A WATCH counts when it ends.
async fn requests(
    client: &kube::Client,
) -> Result<BTreeMap<String, f64>, Box<dyn std::error::Error>> {
    let mut counts = BTreeMap::new();
    for (labels, value) in samples(client, "apiserver_request_total").await? {
        let resource = label(&labels, "resource");
        if resource.is_empty() || resource == "leases" || resource == "endpoints" {
            continue;
        }
        let mut key = format!("{}/{resource}", label(&labels, "group"));
        let subresource = label(&labels, "subresource");
        if !subresource.is_empty() {
            key = format!("{key}/{subresource}");
        }
        *counts
            .entry(format!("{key} {}", label(&labels, "verb")))
            .or_default() += value;
    }
    Ok(counts)
}

const WRITES: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// What was requested between two [`requests`] samples.
#[derive(Default)]
struct Delta {
    writes: f64,
    reads: f64,
    /// The non-zero entries.
    parts: Vec<String>,
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Delta {
    let mut d = Delta::default();
    for (key, value) in after {
        let n = value - before.get(key).copied().unwrap_or_default();
        if n > 0.0 {
            if WRITES.iter().any(|w| key.ends_with(&format!(" {w}"))) {
                d.writes += n;
            } else {
                d.reads += n;
            }
            d.parts.push(format!("{key}: {n}"));
        }
    }
    d
}

async fn node_devices(client: &kube::Client, node: &str) -> usize {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .flat_map(|s| s.spec.devices.unwrap_or_default())
                .count()
        })
        .unwrap_or_default()
}

async fn wait_for(what: &str, check: impl AsyncFnMut() -> bool) {
    wait_longer(what, Duration::from_secs(120), check).await
}

async fn wait_longer(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < timeout, "{what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("{what}: {:.1} s", start.elapsed().as_secs_f64());
}

/// The watches open now, by `group/resource` (`apiserver_longrunning_requests`).
async fn open_watches(
    client: &kube::Client,
) -> Result<BTreeMap<String, f64>, Box<dyn std::error::Error>> {
    let mut open = BTreeMap::new();
    for (labels, value) in samples(client, "apiserver_longrunning_requests").await? {
        if label(&labels, "verb") == "WATCH" {
            let resource = format!("{}/{}", label(&labels, "group"), label(&labels, "resource"));
            *open.entry(resource).or_default() += value;
        }
    }
    Ok(open)
}

/// Counts the requests over [`WINDOW`] and prints them per minute (and per node, of
/// `nodes`).
async fn at_rest(
    client: &kube::Client,
    who: &str,
    nodes: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::sleep(SETTLE).await;
    let before = requests(client).await?;
    tokio::time::sleep(WINDOW).await;
    let d = delta(&before, &requests(client).await?);
    let per_minute = |n: f64| n * 60.0 / WINDOW.as_secs_f64();
    let per_node = if nodes > 1 {
        format!(
            "; per node {:.2} writes/min, {:.2} reads/min",
            per_minute(d.writes) / nodes as f64,
            per_minute(d.reads) / nodes as f64
        )
    } else {
        String::new()
    };
    eprintln!(
        "{who} at rest: {:.1} API writes/min, {:.1} reads/min{per_node} ({})",
        per_minute(d.writes),
        per_minute(d.reads),
        d.parts.join(", ")
    );
    Ok(())
}

/// A control plane with the CRDs and a namespace for the Instances.
async fn control_plane() -> Result<(ControlPlane, kube::Client, String), Box<dyn std::error::Error>>
{
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client().await?;
    cp.install_crds(&akri_api::crds::all()).await?;
    let ns = cp.create_namespace("bench").await?;
    // The driver-controller's mirrors of the configurations, which the agents read (the
    // binary, started later beside them, keeps them too).
    tokio::spawn(akri_driver_controller::spec_mirror::run(
        client.clone(),
        ns.clone(),
        "akri-driver-controller".into(),
        Default::default(),
    ));
    Ok((cp, client, ns))
}

/// A configuration of the embedded debugEcho handler that finds `devices` devices per node,
/// with a discovery property from a Secret in `ns` (as cameras' credentials are): its reads
/// count too.
async fn echo_configuration(
    client: &kube::Client,
    ns: &str,
    devices: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "credentials" }, "stringData": { "password": "hunter2" },
            }))?,
        )
        .await?;
    let descriptions: Vec<String> = (0..devices).map(|i| format!("dev{i}")).collect();
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": "local" },
                "spec": { "discoveryHandler": { "name": "debugEcho",
                    "discoveryDetails": format!("descriptions: [{}]", descriptions.join(", ")),
                    "discoveryProperties": [{ "name": "password", "valueFrom": { "secretKeyRef": {
                        "name": "credentials", "namespace": ns, "key": "password" } } }] } },
            }))?,
        )
        .await?;
    Ok(())
}

/// The scale figure: `agents` nodes' agents at rest, `devices` devices each.
async fn scale(agents: usize, devices: usize) -> Result<(), Box<dyn std::error::Error>> {
    let (cp, client, ns) = control_plane().await?;
    at_rest(&client, "the API server alone", 1).await?;
    let dir = tempfile::tempdir()?;
    let before = open_watches(&client).await?;
    let mut running = Vec::new();
    for i in 0..agents {
        let node = format!("scale-node-{i}");
        cp.create_node(&node).await?;
        let config = AgentConfig::embedded(&node, &ns, &dir.path().join(&node));
        // A client (a connection) per node, as nodes have: one shared connection would run out
        // of HTTP/2 streams for everyone's watches.
        running.push(agent::start(cp.client().await?, config).await?);
    }
    echo_configuration(&client, &ns, devices).await?;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    // Every node's devices published, and an Instance for each: 6 hex digits name an Instance
    // (Akri's scheme), so two nodes' devices may share one (the count says so).
    let slices = Api::<ResourceSlice>::all(client.clone());
    wait_longer(
        &format!("{agents} nodes' {} devices published", agents * devices),
        Duration::from_secs(600),
        async || {
            let published = slices.list(&ListParams::default()).await.map(|l| {
                (l.items.into_iter())
                    .flat_map(|s| s.spec.devices.unwrap_or_default())
                    .count()
            });
            published.is_ok_and(|n| n == agents * devices)
        },
    )
    .await;
    let mut written = 0;
    wait_longer(
        "their Instances written",
        Duration::from_secs(120),
        async || {
            let nodes = instances
                .list(&ListParams::default())
                .await
                .map(|l| (l.items.iter()).map(|i| i.spec.nodes.len()).sum::<usize>());
            let done = nodes.as_ref().is_ok_and(|n| *n == agents * devices);
            if done {
                written = instances
                    .list(&ListParams::default())
                    .await
                    .map_or(0, |l| l.items.len());
            }
            done
        },
    )
    .await;
    eprintln!(
        "{} Instances for {} devices ({} named alike on two nodes)",
        written,
        agents * devices,
        agents * devices - written
    );
    let after = open_watches(&client).await?;
    let watches: Vec<String> = (after.iter())
        .map(|(resource, n)| {
            (
                resource,
                n - before.get(resource).copied().unwrap_or_default(),
            )
        })
        .filter(|(_, n)| *n > 0.0)
        .map(|(resource, n)| format!("{resource}: {:.1}", n / agents as f64))
        .collect();
    eprintln!(
        "{agents} kubelet-plugins hold their watches, per node: {}",
        watches.join(", ")
    );
    at_rest(
        &client,
        &format!(
            "{agents} kubelet-plugins, {devices} devices each ({} Instances)",
            agents * devices
        ),
        agents,
    )
    .await?;
    drop(running);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let counts = akri_testing::sizes_from_env("AT_REST_SCALE", "20,50")?;
    if std::env::var_os("AT_REST_SCALE_ONLY").is_some() {
        for agents in counts {
            scale(agents, 50).await?;
        }
        return Ok(());
    }
    let (cp, client, ns) = control_plane().await?;
    let node = "bench-node";
    cp.create_node(node).await?;
    let dir = tempfile::tempdir()?;
    let config = AgentConfig::embedded(node, &ns, dir.path());
    let availability = config
        .debug_echo
        .as_ref()
        .expect("embedded")
        .availability_file
        .clone();
    let _agent = agent::start(client.clone(), config).await?;

    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    echo_configuration(&client, &ns, DEVICES).await?;
    wait_for("node-local devices published", async || {
        node_devices(&client, node).await == DEVICES
    })
    .await;
    at_rest(&client, &format!("kubelet-plugin, {DEVICES} devices"), 1).await?;

    // One device goes.
    let before = requests(&client).await?;
    std::fs::write(&availability, "dev0")?;
    wait_for("one device gone", async || {
        node_devices(&client, node).await == DEVICES - 1
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    let d = delta(&before, &requests(&client).await?);
    eprintln!(
        "kubelet-plugin, one device gone: {} API writes ({}; the bench's own LISTs of slices included)",
        d.writes,
        d.parts.join(", ")
    );

    let port = akri_testing::free_port()?;
    let _controller = akri_testing::spawn_controller(
        env!("CARGO_BIN_EXE_akri-driver-controller"),
        &cp,
        &ns,
        port,
    )?;
    wait_for("the controller's DeviceClass", async || {
        configs
            .get("local")
            .await
            .ok()
            .and_then(|c| c.status?.device_class_name)
            .is_some()
    })
    .await;
    at_rest(
        &client,
        &format!(
            "kubelet-plugin and driver-controller, {} devices",
            DEVICES - 1
        ),
        1,
    )
    .await?;
    drop(_controller);
    drop(_agent);
    drop(cp);

    for agents in counts {
        scale(agents, 50).await?;
    }
    Ok(())
}
