//! Prints the kubelet-plugin's NodePrepareResources latency (p50/p99, 1 and 8 claims per call)
//! and its resident memory with 100 devices, measured on the real binary against a real
//! kube-apiserver: `cargo bench -p akri-kubelet-plugin --bench prepare`.

use akri_kubelet_plugin::discovery::connect::unix_channel;
use akri_testing::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kubelet_proto::dra::v1 as dra;
use serde_json::json;
use std::time::{Duration, Instant};

const DEVICES: usize = 100;
const ROUNDS: usize = 200;
const DRIVER: &str = "debugecho.akri.sh";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client().await?;
    cp.install_crds(&akri_api::crds::all()).await?;
    let ns = cp.create_namespace("bench").await?;
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    let node = "bench-node";
    cp.create_node(node).await?;
    let dir = tempfile::tempdir()?;
    let socket_dir = dir.path().join("plugins");
    let kubelet = [
        dir.path().join("registry"),
        socket_dir.clone(),
        dir.path().join("cdi"),
    ];
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_akri-kubelet-plugin"));
    let nodes = (node, ns.as_str());
    let mut plugin =
        akri_testing::components::agent_command(bin, cp.kubeconfig(), nodes, kubelet, dir.path())
            .env("RUST_LOG", "warn")
            .spawn()?;

    // 100 devices discovered and published.
    let descriptions: Vec<String> = (0..DEVICES).map(|i| format!("dev{i}")).collect();
    let discovery: akri_api::v1::DiscoveryConfiguration = serde_json::from_value(json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": "bench" },
        "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": format!("descriptions: [{}]", descriptions.join(", ")) } },
    }))?;
    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone());
    let start = Instant::now();
    configs.create(&PostParams::default(), &discovery).await?;
    let slices = Api::<ResourceSlice>::all(client.clone());
    let names: Vec<String> = loop {
        let published: Vec<String> = slices
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?
            .items
            .into_iter()
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .map(|d| d.name)
            .collect();
        if published.len() == DEVICES {
            break published;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "devices not published"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "{DEVICES} devices discovered and published in {:.2}s",
        start.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = std::fs::read_to_string(format!("/proc/{}/status", plugin.id().expect("running")))?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .map(|l| l.trim_start_matches("VmRSS:").trim().to_string())
        .unwrap_or_default();
    eprintln!("plugin resident memory with {DEVICES} devices: {rss}");

    // Eight claims allocated by hand to eight devices of this node.
    let claims_api = Api::<ResourceClaim>::namespaced(client.clone(), &ns);
    let mut claims = Vec::new();
    for (i, device) in names.iter().take(8).enumerate() {
        let name = format!("claim-{i}");
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "bench" } }] } },
        }))?;
        let created = claims_api.create(&PostParams::default(), &claim).await?;
        let status = json!({ "status": { "allocation": { "devices": { "results": [
            { "request": "r", "driver": DRIVER, "pool": node, "device": device }
        ] } } } });
        claims_api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        claims.push(dra::Claim {
            namespace: ns.clone(),
            name,
            uid: created.metadata.uid.unwrap(),
        });
    }

    let channel = unix_channel(&socket_dir.join(DRIVER).join("dra.sock")).await?;
    let mut grpc = dra::dra_plugin_client::DraPluginClient::new(channel);
    for per_call in [1usize, 8] {
        let mut latencies = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let batch = claims[..per_call].to_vec();
            let started = Instant::now();
            let answer = grpc
                .node_prepare_resources(dra::NodePrepareResourcesRequest {
                    claims: batch.clone(),
                })
                .await?
                .into_inner();
            latencies.push(started.elapsed());
            assert!(
                answer.claims.values().all(|c| c.error.is_empty()),
                "{answer:?}"
            );
            grpc.node_unprepare_resources(dra::NodeUnprepareResourcesRequest { claims: batch })
                .await?;
        }
        latencies.sort();
        let at =
            |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
        eprintln!(
            "NodePrepareResources, {per_call} claim(s) per call, {ROUNDS} calls: p50 {:.2} ms, p99 {:.2} ms",
            at(0.50).as_secs_f64() * 1e3,
            at(0.99).as_secs_f64() * 1e3
        );
    }
    plugin.kill().await?;
    Ok(())
}
