//! Prints how fast the broker-controller turns new Instances into broker objects: 1,000
//! Instances created (32 at a time) under a BrokerTemplate with a Pod and a Service per
//! Instance, and for each the time from its creation to all three of its objects (Pod,
//! Service, ResourceClaimTemplate) existing; what a restart costs (time, API writes); then
//! the time to delete them all when the Instances go. The real binary against a real
//! kube-apiserver: `cargo bench -p akri-broker-controller --bench instances`.
//!
//! The DiscoveryConfiguration's DeviceClass is written into its status here (the
//! driver-controller's part), so only the broker-controller works while it is measured.

use akri_api::v1::{
    DiscoveryConfiguration, INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL,
};
use akri_testing::{ControlPlane, ControlPlaneOptions, metric};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const INSTANCES: usize = 1_000;
/// Instances then added one at a time.
const SINGLES: usize = 20;
/// Objects per Instance: the Pod, its ResourceClaimTemplate, the Service.
const PER_INSTANCE: usize = 3;
const INSTANCE_ANNOTATION: &str = "akri.sh/instance";
const EXE: &str = env!("CARGO_BIN_EXE_akri-broker-controller");

type Seen = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let client = cp.client().await?;
    cp.install_crds(&akri_api::crds::all()).await?;
    let akri = cp.create_namespace("akri").await?;
    let apps = cp.create_namespace("apps").await?;

    let configurations = Api::<DiscoveryConfiguration>::all(client.clone());
    configurations
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": "cams" },
                "spec": { "discoveryHandler": { "name": "onvif" } },
            }))?,
        )
        .await?;
    configurations
        .patch_status(
            "cams",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "deviceClassName": "cams" } })),
        )
        .await?;
    Api::<akri_api::v1::BrokerTemplate>::namespaced(client.clone(), &apps)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "akri.sh/v1", "kind": "BrokerTemplate",
                "metadata": { "name": "cams" },
                "spec": {
                    "discoveryReference": { "name": "cams" },
                    "instanceBrokerResources": [
                        { "apiVersion": "v1", "kind": "Pod",
                          "metadata": { "labels": { "instance": "$(AKRI_INSTANCE)" } },
                          "spec": { "containers": [{ "name": "broker", "image": "broker:1",
                            "env": [{ "name": "ADDRESS", "value": "$(AKRI_PROPERTY_ONVIF_DEVICE_IP_ADDRESS)" }] }] } },
                        { "apiVersion": "v1", "kind": "Service", "metadata": { "name": "$(AKRI_INSTANCE)-svc" },
                          "spec": { "selector": { "instance": "$(AKRI_INSTANCE)" }, "ports": [{ "port": 80 }] } },
                    ],
                },
            }))?,
        )
        .await?;

    let port = akri_testing::free_port()?;
    let controller = akri_testing::spawn_controller(EXE, &cp, &akri, port)?;
    let pid = controller.id().expect("running");
    wait_for("the controller leads", async || {
        Ok(metric(&scrape(port).await?, "akri_broker_controller_leader") == Some(1.0))
    })
    .await?;

    // Every broker object's first appearance, by Instance.
    let seen: Seen = Arc::default();
    watch::<Pod>(&client, &apps, &seen);
    watch::<Service>(&client, &apps, &seen);
    watch::<ResourceClaimTemplate>(&client, &apps, &seen);

    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &akri);
    let names: Vec<String> = (0..INSTANCES).map(|i| format!("cams-{i:06x}")).collect();
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let start = Instant::now();
    futures::stream::iter(names.iter().enumerate())
        .map(|(n, name)| {
            let (instances, created) = (instances.clone(), created.clone());
            async move {
                let sent = Instant::now();
                create_instance(&instances, name, n).await?;
                created.lock().unwrap().insert(name.clone(), sent);
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    let created_in = start.elapsed();
    wait_for("every broker object", async || {
        let seen = seen.lock().unwrap();
        Ok(seen.len() == INSTANCES && seen.values().all(|t| t.len() == PER_INSTANCE))
    })
    .await?;
    let all_in = start.elapsed();
    let mut latencies: Vec<Duration> = {
        let (seen, created) = (seen.lock().unwrap(), created.lock().unwrap());
        names
            .iter()
            .map(|n| {
                let last = seen[n].iter().max().expect("seen");
                last.saturating_duration_since(created[n])
            })
            .collect()
    };
    latencies.sort();
    let writes = settle(port).await?;
    let (rss, peak) = akri_testing::memory_kb(pid)?;
    eprintln!(
        "create: {INSTANCES} Instances created in {:.2}s; all {} broker objects applied {:.2}s after the first creation",
        created_in.as_secs_f64(),
        INSTANCES * PER_INSTANCE,
        all_in.as_secs_f64()
    );
    eprintln!(
        "create: Instance creation to its Pod, Service and ResourceClaimTemplate applied: p50 {}, p90 {}, p99 {}, max {}",
        ms(percentile(&latencies, 50)),
        ms(percentile(&latencies, 90)),
        ms(percentile(&latencies, 99)),
        ms(*latencies.last().expect("measured"))
    );
    eprintln!(
        "create: {writes} object writes (apply); controller memory {rss} kB resident, {peak} kB peak"
    );

    // One more Instance at a time on the loaded template: what a device plugged in later waits.
    let mut single = Vec::new();
    for n in INSTANCES..INSTANCES + SINGLES {
        let name = format!("cams-{n:06x}");
        let sent = Instant::now();
        create_instance(&instances, &name, n).await?;
        wait_for("the Instance's objects", async || {
            Ok(seen
                .lock()
                .unwrap()
                .get(&name)
                .is_some_and(|t| t.len() == PER_INSTANCE))
        })
        .await?;
        let last = *seen.lock().unwrap()[&name].iter().max().expect("seen");
        single.push(last.saturating_duration_since(sent));
    }
    single.sort();
    eprintln!(
        "one more: {SINGLES} Instances added one at a time beside the {INSTANCES}: creation to its objects applied p50 {}, max {} (the controller's 500 ms debounce included)",
        ms(percentile(&single, 50)),
        ms(*single.last().expect("measured"))
    );

    // A restarted controller (the old one stopped with SIGTERM, as in a rolling update: it
    // hands the Lease over) finds everything as it should be.
    let mut controller = controller;
    let restarted = Instant::now();
    akri_testing::terminate(&mut controller, Duration::from_secs(30)).await?;
    let port = akri_testing::free_port()?;
    let _controller = akri_testing::spawn_controller(EXE, &cp, &akri, port)?;
    wait_for("the restarted controller reconciles", async || {
        let text = scrape(port).await?;
        Ok(metric(
            &text,
            "akri_broker_controller_reconciles_total{result=\"ok\"}",
        ) >= Some(1.0))
    })
    .await?;
    let reconciled_in = restarted.elapsed();
    let writes = settle(port).await?;
    eprintln!(
        "restart: SIGTERM to the first reconciliation of the new process {:.2}s, {writes} object writes",
        reconciled_in.as_secs_f64()
    );

    // Every Instance goes.
    let start = Instant::now();
    let every: Vec<String> = (0..INSTANCES + SINGLES)
        .map(|i| format!("cams-{i:06x}"))
        .collect();
    futures::stream::iter(every.iter())
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
        .try_collect::<Vec<()>>()
        .await?;
    let deleted_in = start.elapsed();
    let pods = Api::<Pod>::namespaced(client.clone(), &apps);
    let services = Api::<Service>::namespaced(client.clone(), &apps);
    wait_for("every broker object deleted", async || {
        let left = pods
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len()
            + services
                .list_metadata(&ListParams::default())
                .await?
                .items
                .len();
        Ok(left == 0)
    })
    .await?;
    eprintln!(
        "delete: {} Instances deleted in {:.2}s; their Pods and Services gone {:.2}s after the first deletion",
        every.len(),
        deleted_in.as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// An Instance of `cams` as a kubelet-plugin writes it, with a property its broker gets.
async fn create_instance(
    instances: &Api<akri_api::v0::Instance>,
    name: &str,
    n: usize,
) -> Result<(), kube::Error> {
    let instance: akri_api::v0::Instance = serde_json::from_value(json!({
        "apiVersion": "akri.sh/v0", "kind": "Instance",
        "metadata": { "name": name, "labels": {
            INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION } },
        "spec": {
            "configurationName": "cams", "cdiName": format!("akri.sh/onvif={name}"),
            "capacity": 1, "shared": true, "nodes": ["node-a"],
            "brokerProperties": { "ONVIF_DEVICE_IP_ADDRESS": format!("10.0.{}.{}", n / 256, n % 256) },
        },
    }))
    .expect("valid Instance");
    instances
        .create(&PostParams::default(), &instance)
        .await
        .map(|_| ())
}

/// Records when each object of kind `K` in `namespace` is first seen, by its Instance.
fn watch<K>(client: &kube::Client, namespace: &str, seen: &Seen)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), namespace);
    let seen = seen.clone();
    tokio::spawn(async move {
        let mut names = std::collections::HashSet::new();
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let now = Instant::now();
            let objects = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
                _ => continue,
            };
            for object in objects {
                let meta = object.meta();
                let (Some(name), Some(instance)) = (
                    meta.name.clone(),
                    meta.annotations
                        .as_ref()
                        .and_then(|a| a.get(INSTANCE_ANNOTATION).cloned()),
                ) else {
                    continue;
                };
                if names.insert(name) {
                    seen.lock().unwrap().entry(instance).or_default().push(now);
                }
            }
        }
    });
}

/// Polls `check` every 100 ms for up to 10 minutes.
async fn wait_for<F: AsyncFn() -> Result<bool, Box<dyn std::error::Error>>>(
    what: &str,
    check: F,
) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if check().await.unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the controller's object writes stop moving for two seconds; returns them.
async fn settle(port: u16) -> Result<u64, Box<dyn std::error::Error>> {
    let applied = async || -> Result<u64, Box<dyn std::error::Error>> {
        let text = scrape(port).await?;
        Ok(metric(
            &text,
            "akri_broker_controller_object_writes_total{result=\"apply\"}",
        )
        .unwrap_or(0.0) as u64)
    };
    let mut last = applied().await?;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = applied().await?;
        if now == last {
            return Ok(now);
        }
        last = now;
    }
}

/// The controller's /metrics.
async fn scrape(port: u16) -> std::io::Result<String> {
    akri_testing::http_get(("127.0.0.1", port), "/metrics")
        .await
        .map(|(_, body)| body)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}
