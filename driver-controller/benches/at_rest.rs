//! Prints the API writes a node and the driver-controller make while nothing changes, and
//! for one device change, counted by the kube-apiserver itself (`apiserver_request_total`):
//! `cargo bench -p akri-driver-controller --bench at_rest`.
//!
//! A node agent (the kubelet-plugin's, embedded) with 100 debugEcho devices on one simulated
//! node; then the driver-controller binary beside it. Each phase is counted over [`WINDOW`]
//! after a settling pause.

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

/// The writes the API server counted, by `group/resource[/subresource] VERB`. The API
/// server's own Lease and Endpoints writes are left out: nothing of ours writes those here.
async fn writes(
    client: &kube::Client,
) -> Result<BTreeMap<String, f64>, Box<dyn std::error::Error>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = labels.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or_default()
                .to_string()
        };
        let verb = label("verb");
        let resource = label("resource");
        if ![
            "POST",
            "PUT",
            "PATCH",
            "APPLY",
            "DELETE",
            "DELETECOLLECTION",
        ]
        .contains(&verb.as_str())
            || resource == "leases"
            || resource == "endpoints"
        {
            continue;
        }
        let mut key = format!("{}/{resource}", label("group"));
        let subresource = label("subresource");
        if !subresource.is_empty() {
            key = format!("{key}/{subresource}");
        }
        *counts.entry(format!("{key} {verb}")).or_default() += value.parse::<f64>()?;
    }
    Ok(counts)
}

/// What was written between two [`writes`] samples: total and the non-zero entries.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> (f64, String) {
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (key, value) in after {
        let n = value - before.get(key).copied().unwrap_or_default();
        if n > 0.0 {
            total += n;
            parts.push(format!("{key}: {n}"));
        }
    }
    (total, parts.join(", "))
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

async fn wait_for(what: &str, check: impl AsyncFn() -> bool) {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < Duration::from_secs(120), "{what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Counts the writes over [`WINDOW`], per minute.
async fn at_rest(client: &kube::Client, who: &str) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::sleep(SETTLE).await;
    let before = writes(client).await?;
    tokio::time::sleep(WINDOW).await;
    let (total, parts) = delta(&before, &writes(client).await?);
    let per_minute = total * 60.0 / WINDOW.as_secs_f64();
    eprintln!("{who} at rest: {per_minute:.1} API writes/min ({parts})");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client().await?;
    cp.install_crds(&akri_api::crds::all()).await?;
    let ns = cp.create_namespace("bench").await?;
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
    let descriptions: Vec<String> = (0..DEVICES).map(|i| format!("dev{i}")).collect();
    configs
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": "local" },
                "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": format!("descriptions: [{}]", descriptions.join(", ")) } },
            }))?,
        )
        .await?;
    wait_for("node-local devices published", async || {
        node_devices(&client, node).await == DEVICES
    })
    .await;
    at_rest(&client, &format!("kubelet-plugin, {DEVICES} devices")).await?;

    // One device goes.
    let before = writes(&client).await?;
    std::fs::write(&availability, "dev0")?;
    wait_for("one device gone", async || {
        node_devices(&client, node).await == DEVICES - 1
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    let (total, parts) = delta(&before, &writes(&client).await?);
    eprintln!("kubelet-plugin, one device gone: {total} API writes ({parts})");

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
    )
    .await?;
    Ok(())
}
