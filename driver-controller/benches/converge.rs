//! Prints how the driver-controller copes with 10,000 shared Instances over 1,000 simulated
//! nodes (each Instance seen by 3 of them, 10 DiscoveryConfigurations of 1,000;
//! `CONVERGE_SCALE=100000/5000` for 100,000 over 5,000): time to converge from a cold start,
//! API writes issued, resident memory; then the same after a tenth of the Instances vanish; then a restart (SIGTERM, a new process) and a takeover (a standby, the
//! leader SIGKILLed) with everything already published: how long until the new leader has
//! reconciled every configuration, its API writes, how many ResourceSlices it rewrote and
//! whether any pool generation went backwards (both should be 0). Measured on the real binary
//! against a real kube-apiserver: `cargo bench -p akri-driver-controller --bench converge`.
//!
//! The nodes are Node objects (the controller forgets names in `Instance.nodes` that no Node
//! has) and names in `Instance.nodes`.

use akri_api::v1::{
    DiscoveryConfiguration, INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL,
};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant};

const CONFIGURATIONS: usize = 10;
const NODES_PER_INSTANCE: usize = 3;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let scale = std::env::var("CONVERGE_SCALE").unwrap_or_else(|_| "10000/1000".to_string());
    let (instances, nodes) = scale
        .split_once('/')
        .ok_or("CONVERGE_SCALE is <instances>/<nodes>")?;
    let instances_per_configuration = instances.parse::<usize>()? / CONFIGURATIONS;
    let node_count = nodes.parse::<usize>()?;
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client().await?;
    cp.install_crds(&akri_api::crds::all()).await?;
    let ns = cp.create_namespace("bench").await?;
    let nodes = Api::<Node>::all(client.clone());
    futures::stream::iter(0..node_count)
        .map(|n| {
            let nodes = nodes.clone();
            async move {
                let node: Node = serde_json::from_value(json!({
                    "metadata": { "name": format!("node-{n:04}") },
                }))
                .expect("valid Node");
                nodes
                    .create(&PostParams::default(), &node)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;

    let configs: Vec<String> = (0..CONFIGURATIONS).map(|i| format!("cams-{i}")).collect();
    for config in &configs {
        Api::<DiscoveryConfiguration>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                    "metadata": { "name": config },
                    "spec": { "discoveryHandler": { "name": "onvif" }, "capacity": 2 },
                }))?,
            )
            .await?;
    }
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let mut names = Vec::new();
    for (c, config) in configs.iter().enumerate() {
        for i in 0..instances_per_configuration {
            names.push((
                config.clone(),
                format!("{config}-{i:06x}"),
                c * instances_per_configuration + i,
            ));
        }
    }
    let start = Instant::now();
    futures::stream::iter(names.iter().cloned())
        .map(|(config, name, n)| {
            let instances = instances.clone();
            async move {
                let nodes: Vec<String> = (0..NODES_PER_INSTANCE)
                    .map(|k| format!("node-{:04}", (n + k * 337) % node_count))
                    .collect();
                let instance: akri_api::v0::Instance = serde_json::from_value(json!({
                    "apiVersion": "akri.sh/v0", "kind": "Instance",
                    "metadata": { "name": name, "labels": {
                        INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION } },
                    "spec": {
                        "configurationName": config, "cdiName": format!("akri.sh/onvif={name}"),
                        "capacity": 2, "shared": true, "nodes": nodes,
                        "brokerProperties": { "ONVIF_DEVICE_IP_ADDRESS": format!("10.{}.{}.{}", n / 65536, (n / 256) % 256, n % 256) },
                    },
                }))
                .expect("valid Instance");
                instances.create(&PostParams::default(), &instance).await.map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!(
        "created {} Instances in {:.1?}",
        names.len(),
        start.elapsed()
    );

    let spawn = |port| {
        akri_testing::spawn_controller(env!("CARGO_BIN_EXE_akri-driver-controller"), &cp, &ns, port)
    };
    let port = akri_testing::free_port()?;
    let started = Instant::now();
    let mut controller = spawn(port)?;
    let pid = controller.id().expect("running");

    let total = (CONFIGURATIONS * instances_per_configuration) as i32;
    wait_published(&client, &configs, total).await?;
    let converged = started.elapsed();
    settle(port).await?;
    let initial_writes = writes(port).await?;
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .len();
    let (rss, peak) = akri_testing::memory_kb(pid)?;
    eprintln!(
        "converge: {total} shared Instances over {node_count} nodes ({CONFIGURATIONS} configurations) published in {:.2}s as {slices} ResourceSlices",
        converged.as_secs_f64()
    );
    eprintln!("converge: {initial_writes} API writes (slices, DeviceClasses, status)");
    eprintln!("converge: controller memory {rss} kB resident, {peak} kB peak");

    // A tenth of the Instances vanish (1,000 of 10,000: 100 per configuration).
    let gone: Vec<&String> = names
        .iter()
        .filter(|(_, _, n)| n % instances_per_configuration < instances_per_configuration / 10)
        .map(|(_, name, _)| name)
        .collect();
    let started = Instant::now();
    futures::stream::iter(gone.iter())
        .map(|name| {
            let instances = instances.clone();
            async move {
                instances
                    .delete(name, &DeleteParams::default())
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    wait_published(&client, &configs, total - gone.len() as i32).await?;
    let reconverged = started.elapsed();
    settle(port).await?;
    let more = writes(port).await? - initial_writes;
    let (rss, peak) = akri_testing::memory_kb(pid)?;
    eprintln!(
        "churn: {} Instances removed, slices updated {:.2}s after the first deletion, {more} API writes",
        gone.len(),
        reconverged.as_secs_f64()
    );
    eprintln!("churn: controller memory {rss} kB resident, {peak} kB peak");

    // A restart: SIGTERM hands the Lease over; a new process with the state published.
    let before = slices_now(&client).await?;
    akri_testing::terminate(&mut controller, Duration::from_secs(30)).await?;
    let port = akri_testing::free_port()?;
    let started = Instant::now();
    let mut controller = spawn(port)?;
    new_leader("restart", port, started, &before, &client).await?;

    // A takeover: a standby, then the leader killed without a word (the Lease expires).
    let standby_port = akri_testing::free_port()?;
    let _standby = spawn(standby_port)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = slices_now(&client).await?;
    controller.kill().await?;
    new_leader("takeover", standby_port, Instant::now(), &before, &client).await?;
    Ok(())
}

/// Each ResourceSlice's resourceVersion and pool generation, by name.
async fn slices_now(client: &kube::Client) -> Result<Slices, Box<dyn std::error::Error>> {
    Ok(Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|s| {
            let name = s.metadata.name.unwrap_or_default();
            let version = s.metadata.resource_version.unwrap_or_default();
            (name, (version, s.spec.pool.generation))
        })
        .collect())
}

type Slices = std::collections::BTreeMap<String, (String, i64)>;

/// Waits for the controller on `port` to lead and reconcile every configuration, then prints
/// how long that took from `started`, its writes, and what it did to the slices in `before`.
async fn new_leader(
    what: &str,
    port: u16,
    started: Instant,
    before: &Slices,
    client: &kube::Client,
) -> Result<(), Box<dyn std::error::Error>> {
    reconciled_all(port).await?;
    let ready = started.elapsed();
    settle(port).await?;
    let writes = writes(port).await?;
    let after = slices_now(client).await?;
    let rewritten = before
        .iter()
        .filter(|(name, (version, _))| after.get(*name).is_none_or(|(v, _)| v != version))
        .count();
    let backwards = before
        .iter()
        .filter(|(name, (_, generation))| after.get(*name).is_some_and(|(_, g)| g < generation))
        .count();
    eprintln!(
        "{what}: every configuration reconciled {:.2}s after the new process (or the kill), {writes} API writes, {rewritten} of {} ResourceSlices rewritten or gone, {backwards} pool generations backwards",
        ready.as_secs_f64(),
        before.len()
    );
    Ok(())
}

/// Until the controller on `port` leads and has reconciled every configuration once.
async fn reconciled_all(port: u16) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let reconciles = metric_sum(port, "akri_driver_controller_reconciles_total{", "").await;
        if reconciles.is_ok_and(|n| n >= CONFIGURATIONS as u64) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("no configuration reconciled within 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Until every configuration's status counts its share of `total` published devices.
async fn wait_published(
    client: &kube::Client,
    configs: &[String],
    total: i32,
) -> Result<(), Box<dyn std::error::Error>> {
    let api = Api::<DiscoveryConfiguration>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let published: i32 = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| configs.contains(c.metadata.name.as_ref().expect("named")))
            .filter_map(|c| c.status.as_ref().map(|s| s.devices_published))
            .sum();
        if published == total {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("only {published} of {total} devices published after 600s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the write counter stops moving for two seconds.
async fn settle(port: u16) -> Result<(), Box<dyn std::error::Error>> {
    let mut last = writes(port).await?;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = writes(port).await?;
        if now == last {
            return Ok(());
        }
        last = now;
    }
}

/// Object writes (not the Lease) the controller reports in /metrics.
async fn writes(port: u16) -> Result<u64, Box<dyn std::error::Error>> {
    metric_sum(
        port,
        "akri_driver_controller_api_writes_total{",
        "resource=\"lease\"",
    )
    .await
}

/// The sum of the /metrics lines starting with `prefix`, leaving out those containing `skip`
/// (when not empty).
async fn metric_sum(
    port: u16,
    prefix: &str,
    skip: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    let body = akri_testing::http_get(("127.0.0.1", port), "/metrics")
        .await
        .map(|(_, body)| body)?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter(|l| skip.is_empty() || !l.contains(skip))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}
