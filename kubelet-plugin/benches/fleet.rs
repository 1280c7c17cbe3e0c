//! A node's API cost at fleet size, counted by the kube-apiserver itself:
//! `cargo bench -p akri-kubelet-plugin --bench fleet` (`FLEET_NODES=10,50,200`, the default).
//!
//! For each fleet size, on a fresh API server: the driver-controller (in this process) and
//! that many node agents, each the kubelet-plugin's binary as a process of its own with the
//! embedded debugEcho handler (10 local devices each) and the chart's kubelet-plugin identity
//! (impersonated: its RBAC), on a simulated node (a Node object; kubelet directories that no
//! kubelet reads, so no claim is ever prepared). Once every node has published, for
//! [`WINDOW`]: 1,000 ResourceClaims of another driver are created, allocated to other nodes
//! (their status written as a scheduler would) and deleted, 200 Instances of other nodes'
//! devices are created and deleted (labelled as those nodes label them), and the
//! configuration's status is written once a second under the driver-controller's field
//! manager (its counts, as when devices come and go). Printed per node per minute: LIST, WATCH and GET requests, writes,
//! and watch events sent (`apiserver_watch_events_total`, by kind), after taking off what the
//! same window costs with the driver-controller alone (its own watch of claims). Target:
//! flat in the fleet size, and no event of a claim, a DiscoveryConfiguration or another node's
//! Instance at all on a node.

use akri_api::v1::{
    INSTANCE_NODES_LABELLED, INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL,
    instance_node_label,
};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the churn is counted.
const WINDOW: Duration = Duration::from_secs(60);
/// Claims of another driver made, allocated and deleted over the window.
const CLAIMS: usize = 1_000;
const DEVICES: usize = 10;

type Counts = BTreeMap<String, f64>;

/// Requests by `VERB group/resource`, and watch events sent by kind, the API server's
/// counters (Leases, Endpoints and non-resource requests left out: nothing of ours).
async fn counters(client: &kube::Client) -> Result<(Counts, Counts), Box<dyn std::error::Error>> {
    let mut requests = Counts::new();
    for (labels, value) in
        akri_testing::apiserver_samples(client, "apiserver_request_total").await?
    {
        let get = |k: &str| labels.get(k).map_or("", String::as_str).to_string();
        let resource = get("resource");
        if resource.is_empty() || resource == "leases" || resource == "endpoints" {
            continue;
        }
        let mut key = format!("{} {}/{resource}", get("verb"), get("group"));
        if !get("subresource").is_empty() {
            key = format!("{key}/{}", get("subresource"));
        }
        *requests.entry(key).or_default() += value;
    }
    let mut events = Counts::new();
    for (labels, value) in
        akri_testing::apiserver_samples(client, "apiserver_watch_events_total").await?
    {
        let kind = (labels.get("resource").or(labels.get("kind")))
            .cloned()
            .unwrap_or_default();
        *events.entry(kind).or_default() += value;
    }
    Ok((requests, events))
}

fn minus(after: &Counts, before: &Counts) -> Counts {
    (after.iter())
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or_default()))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// The churn of one window: claims of another driver, and configuration status writes.
async fn churn(
    client: &kube::Client,
    configuration: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), "apps");
    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), "akri");
    let start = Instant::now();
    let per_claim = WINDOW / CLAIMS as u32;
    let mut status_writes = 0u32;
    for i in 0..CLAIMS {
        let name = format!("gpu-{i}");
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "devices": { "requests": [
                { "name": "gpu", "exactly": { "deviceClassName": "gpu.example.com" } },
            ] } },
        }))?;
        claims.create(&PostParams::default(), &claim).await?;
        let allocated = json!({ "status": { "allocation": {
            "devices": { "results": [{ "request": "gpu", "driver": "gpu.example.com",
                "pool": format!("other-node-{}", i % 50), "device": "gpu-0" }] },
            "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [
                { "key": "metadata.name", "operator": "In", "values": [format!("other-node-{}", i % 50)] },
            ] }] },
        } } });
        claims
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&allocated))
            .await?;
        claims.delete(&name, &DeleteParams::default()).await?;
        // Another node's device, one in five claims: its Instance, labelled as that node
        // labels it, comes and goes.
        if i % 5 == 0 {
            let other = format!("other-node-{}", i % 50);
            let instance: akri_api::v0::Instance = serde_json::from_value(json!({
                "apiVersion": "akri.sh/v0", "kind": "Instance",
                "metadata": { "name": format!("other-{i}"), "labels": {
                    INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
                    INSTANCE_NODES_LABELLED: "true",
                    instance_node_label(&other).expect("a short name"): "true",
                } },
                "spec": { "configurationName": configuration, "cdiName": format!("akri.sh=other-{i}"),
                    "capacity": 1, "shared": i % 10 == 0, "nodes": [other] },
            }))?;
            instances.create(&PostParams::default(), &instance).await?;
            (instances.delete(&format!("other-{i}"), &DeleteParams::default())).await?;
        }
        // The configuration's status, once a second.
        if start.elapsed().as_secs() as u32 >= status_writes {
            status_writes += 1;
            let status = json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": configuration },
                "status": { "observedGeneration": status_writes },
            });
            configs
                .patch_status(
                    configuration,
                    &PatchParams::apply("akri-driver-controller").force(),
                    &Patch::Apply(&status),
                )
                .await?;
        }
        let due = per_claim * (i as u32 + 1);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    Ok(())
}

/// A fresh API server with the driver-controller and `nodes` agents at rest; the window's
/// counts, and the agents' processes (none when `nodes` is 0).
async fn fleet(nodes: usize) -> Result<(Counts, Counts), Box<dyn std::error::Error>> {
    let cp = ControlPlane::start(ControlPlaneOptions {
        crds: akri_api::crds::all(),
        ..ControlPlaneOptions::default()
    })
    .await?;
    let client = cp.client().await?;
    let ns = cp.create_namespace_named("akri").await?;
    cp.create_namespace_named("apps").await?;
    let mut config = akri_driver_controller::controller::ControllerConfig::new(&ns);
    config.binding_conditions = Some(true);
    let _controller = tokio::spawn(akri_driver_controller::controller::run(
        client.clone(),
        config,
        Default::default(),
    ));
    let user = akri_testing::rbac::grant_kubelet_plugin_as_charted(&cp, &ns).await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    cp.write_kubeconfig(&kubeconfig, None, Some(&user))?;
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_akri-kubelet-plugin"));
    let mut agents = Vec::new();
    for i in 0..nodes {
        let node = format!("fleet-node-{i}");
        cp.create_node(&node).await?;
        let home = dir.path().join(&node);
        let kubelet = ["registry", "plugins", "cdi"].map(|d| home.join("kubelet").join(d));
        for d in &kubelet {
            std::fs::create_dir_all(d)?;
        }
        let log = std::fs::File::create(home.join("agent.log"))?;
        let agent =
            akri_testing::components::agent_command(bin, &kubeconfig, (&node, &ns), kubelet, &home)
                .args(["--binding-conditions", "on"])
                .env("RUST_LOG", "warn")
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
        agents.push(agent);
    }
    let descriptions: Vec<String> = (0..DEVICES).map(|i| format!("dev{i}")).collect();
    let configuration = "fleet";
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": configuration },
                "spec": { "discoveryHandler": { "name": "debugEcho",
                    "discoveryDetails": format!("descriptions: [{}]", descriptions.join(", ")) } },
            }))?,
        )
        .await?;
    let slices = Api::<ResourceSlice>::all(client.clone());
    let started = Instant::now();
    loop {
        let published = (slices.list(&ListParams::default()).await?.items.into_iter())
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .count();
        if published == nodes * DEVICES {
            break;
        }
        if started.elapsed() > Duration::from_secs(900) {
            return Err(format!("{published} of {} devices published", nodes * DEVICES).into());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!(
        "{nodes} nodes published {} devices in {:.0?}",
        nodes * DEVICES,
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (requests, events) = counters(&client).await?;
    churn(&client, configuration).await?;
    // What the window set off has arrived by now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (requests_after, events_after) = counters(&client).await?;
    drop(agents);
    Ok((
        minus(&requests_after, &requests),
        minus(&events_after, &events),
    ))
}

/// Per node per minute, `counts` beyond `alone`.
fn per_node(counts: &Counts, alone: &Counts, nodes: usize) -> Counts {
    let minutes = WINDOW.as_secs_f64() / 60.0;
    (counts.iter())
        .map(|(k, v)| {
            let ours = v - alone.get(k).copied().unwrap_or_default();
            (k.clone(), ours / nodes as f64 / minutes)
        })
        .collect()
}

fn show(counts: &Counts) -> String {
    (counts.iter())
        .filter(|(_, v)| v.abs() >= 0.05)
        .map(|(k, v)| format!("{k}: {v:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sizes = akri_testing::sizes_from_env("FLEET_NODES", "10,50,200")?;
    let (requests_alone, events_alone) = fleet(0).await?;
    eprintln!(
        "the driver-controller alone over the window: requests {}; watch events {}",
        show(&requests_alone),
        show(&events_alone)
    );
    for nodes in sizes {
        let (requests, events) = fleet(nodes).await?;
        let requests = per_node(&requests, &requests_alone, nodes);
        let events = per_node(&events, &events_alone, nodes);
        let sum = |prefix: &[&str]| -> f64 {
            (requests.iter())
                .filter(|(k, _)| prefix.iter().any(|p| k.starts_with(p)))
                .map(|(_, v)| v)
                .sum()
        };
        eprintln!(
            "{nodes} nodes, per node per minute: LIST {:.1}, WATCH {:.1}, GET {:.1}, writes {:.1}; watch events sent {:.1} ({}); requests: {}",
            sum(&["LIST "]),
            sum(&["WATCH "]),
            sum(&["GET "]),
            sum(&["POST ", "PUT ", "PATCH ", "APPLY ", "DELETE "]),
            events.values().sum::<f64>(),
            show(&events),
            show(&requests),
        );
    }
    Ok(())
}
