//! An upgrade of the installed product as docs/operations.md "Upgrades" gives it, its lines run
//! as written, on a real node (containerd + the kubelet) with our images and the chart: from
//! the previous release (its tag's tree, chart and images as `hack/previous.sh` builds them;
//! its BrokerTemplate CRD's spec described otherwise, a schema change the upgrade must make)
//! to this checkout's chart and images, while pods keep starting and
//! stopping on the node, each with a DRA claim (where the cluster serves DRA) and a legacy
//! device-plugin resource. The kubelet-plugin DaemonSet rolls with `maxSurge: 1`: the new pod
//! serves beside the old one, which leaves only once the new one is ready. Checked: every pod
//! started (none refused admission); against the kubelet's own metrics, no prepare or
//! unprepare failed; the node's slices kept their UIDs and generations; a running pod with a
//! claim and one holding a legacy device-plugin slot kept their containers, and the slot stayed
//! held. CI runs it on the main version and on 1.33 (legacy only, a kubelet before 1.37: one
//! device-plugin client per resource, see `device_plugin::server`).

use akri_api::v0::Instance;
use akri_testing::product::{CHART, Helm, Images, kubectl, repo, shell};
use akri_testing::{ControlPlane, ControlPlaneOptions, RealNode, from_json};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NODE: &str = "upgraded";
const USERS: &str = "apps";
const WAIT: Duration = Duration::from_secs(180);
/// The DiscoveryConfiguration the chart installs with `discoveryConfigurations.debugEcho`.
const CLASS: &str = "akri-debug-echo";

#[tokio::test]
async fn helm_upgrade_replaces_the_plugin_without_a_failed_prepare_or_a_changed_slice() {
    let cp = ControlPlane::start(ControlPlaneOptions::with_services())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    let images = Images::pushed().await.unwrap();
    let node = RealNode::start(&cp, NODE).await.expect("real node");
    let busybox = node.busybox_image().unwrap();

    // The previous release as the README installs it, with legacy mode on too, four debugEcho
    // devices.
    let kubeconfig = cp.kubeconfig().display().to_string();
    kubectl(&cp, &["apply", "-f", "examples/akri-namespace.yaml"]).unwrap();
    let helm = Helm::new().unwrap();
    // Pushed as a release is: its images under its version, its chart by version.
    let previous_images = Images::previous().unwrap();
    previous_images.push().await.unwrap();
    let previous = PreviousRelease::new(&previous_images.tag);
    previous.push(&helm).await;
    let registry = images.values()[0].clone();
    // The users' namespace, whose v0 Configuration the legacy device plugins serve.
    let users = cp.create_namespace(USERS).await.unwrap();
    let served = format!("legacyDevicePlugin.namespaces={{{users}}}");
    helm.ok(&[
        "install",
        "akri",
        CHART,
        "--version",
        &previous.version,
        "--plain-http",
        "--namespace",
        "akri",
        "--kubeconfig",
        &kubeconfig,
        "--set",
        &registry,
        "--set",
        "discoveryHandlers.debugEcho.enabled=true",
        "--set",
        "discoveryConfigurations.debugEcho.enabled=true",
        "--set",
        "discoveryConfigurations.debugEcho.discoveryDetails.descriptions={d0,d1,d2,d3}",
        "--set",
        "legacyDevicePlugin.enabled=true",
        "--set",
        &served,
        "--set",
        "brokerController.enabled=false",
        "--wait",
        "--timeout",
        "3m",
    ])
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let dra = cp.serves_dra();
    eprintln!("Kubernetes {}, DRA served: {dra}", cp.bins().version());
    if dra {
        Api::<ResourceClaimTemplate>::namespaced(client.clone(), &users)
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "metadata": { "name": "one" },
                    "spec": { "spec": { "devices": { "requests": [
                        { "name": "echo", "exactly": { "deviceClassName": CLASS } },
                    ] } } },
                })),
            )
            .await
            .unwrap();
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &users);

    // A pod holding a claim all along, and one holding a legacy slot.
    let v0: akri_api::v0::Configuration = from_json(akri_testing::discovery::v0_debug_echo(
        "slots",
        &["s0"],
        2,
        true,
    ));
    Api::<akri_api::v0::Configuration>::namespaced(client.clone(), &users)
        .create(&PostParams::default(), &v0)
        .await
        .unwrap();
    if dra {
        create_pod(&pods, "holder", &busybox, json!({}), true).await;
    }
    // The slot holder is placed on the node directly, and a kubelet admits a pod asking for a
    // resource no plugin serves yet without giving it anything: wait for the plugin first (it
    // offers one device per Instance with a free slot, seed 003).
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    akri_testing::eventually_within("the legacy resource allocatable", WAIT, async || {
        (allocatable(&nodes).await.as_deref() == Some("1")).then_some(())
    })
    .await;
    let slot = json!({ SLOT.0: SLOT.1 });
    create_pod(&pods, "slot-holder", &busybox, slot, false).await;
    let holder = match dra {
        true => Some(running(&pods, "holder").await),
        false => None,
    };
    let slot_holder = running(&pods, "slot-holder").await;
    let instances = Api::<Instance>::namespaced(client.clone(), &users);
    // The slot-holder's slot; the churn's pods take the other one in turn.
    let held = async || {
        let list = instances.list(&ListParams::default()).await.unwrap();
        let instances = list.items.into_iter();
        let usage = instances.filter(|i| i.spec.configuration_name == "slots");
        (usage.flat_map(|i| i.spec.device_usage))
            .filter(|(_, n)| n.to_string().contains(NODE))
            .collect::<Vec<_>>()
    };
    let slot = akri_testing::eventually_within("the slot held", WAIT, async || {
        let held = held().await;
        (held.len() == 1).then(|| held[0].clone())
    })
    .await;
    let (slices, failed_before) = match dra {
        true => (published(&client).await, kubelet_failures(&client).await),
        false => Default::default(),
    };

    // At rest: pods start and stop, one round after the other.
    let churn = Churn {
        pods: pods.clone(),
        busybox,
        dra,
    };
    let scraper = Prepares::scrape(&client);
    let before_rest = scraper.snapshot().await;
    let mut at_rest = Timings::default();
    for round in 0..5 {
        at_rest.add(churn.round(&format!("rest-{round}")).await);
    }
    let before_upgrade = scraper.snapshot().await;

    // The upgrade, its lines as the section gives them, while pods keep starting.
    let lines =
        akri_testing::docs::section_lines(&repo().join("docs/operations.md"), "Upgrades").unwrap();
    let [crds, upgrade] = &lines[..2] else {
        panic!("{lines:?}")
    };
    assert!(
        crds.starts_with("kubectl apply --server-side") && upgrade.starts_with("helm upgrade akri"),
        "{lines:?}"
    );
    let kubectl_bin = cp.bins().require("kubectl").unwrap();
    let run = async |line: &str| shell(cp.kubeconfig(), &[&kubectl_bin], line).await;
    // Helm created the previous release's CRDs: without --force-conflicts, the changed schema
    // is refused as a conflict with Helm's fields.
    let unforced = crds.replace(" --force-conflicts", "");
    let refused = (run(&unforced).await).expect_err("the CRDs applied without --force-conflicts");
    assert!(refused.to_string().contains("conflict"), "{refused}");
    run(crds).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        previous.crd_description(&client).await,
        PreviousRelease::current_crd_description(),
        "the CRD's schema after the upgrade's first line"
    );
    let upgrade = upgrade.clone();
    let shell_kubeconfig = cp.kubeconfig().to_path_buf();
    let shell_kubectl = kubectl_bin.clone();
    let upgrading =
        tokio::spawn(async move { shell(&shell_kubeconfig, &[&shell_kubectl], &upgrade).await });
    let started = Instant::now();
    let sampler = {
        let nodes = nodes.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            loop {
                let value = allocatable(&nodes).await;
                if seen.last().map(|(_, v)| v) != Some(&value) {
                    eprintln!("{:?} allocatable {value:?}", started.elapsed());
                    seen.push((started.elapsed(), value));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let mut during = Timings::default();
    let mut round = 0;
    while !upgrading.is_finished() || round < 5 {
        let took = churn.round(&format!("upgrade-{round}")).await;
        eprintln!("{:?} round {round}: {took:?}", started.elapsed());
        during.add(took);
        round += 1;
    }
    upgrading
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("helm upgrade: {e}"));
    eprintln!("helm upgrade --wait took {:?}", started.elapsed());

    // The plugin and the handler run this checkout's images, one pod each (the handler's rolled
    // too: it registered again with whichever plugin served the node's registration socket).
    let akri_pods = Api::<Pod>::namespaced(client.clone(), "akri");
    let mut plugin = String::new();
    for component in ["kubelet-plugin", "debug-echo-discovery-handler"] {
        let label = format!("app.kubernetes.io/component={component}");
        let pods = akri_pods
            .list(&ListParams::default().labels(&label))
            .await
            .unwrap();
        let images_running: Vec<String> = (pods.items.iter())
            .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
            .collect();
        assert!(
            images_running.len() == 1 && images_running[0].ends_with(&format!(":{}", images.tag)),
            "{component}: {images_running:?}"
        );
        if component == "kubelet-plugin" {
            plugin = pods.items[0].metadata.name.clone().unwrap();
        }
    }
    // How the kubelet took the hand-over of the device plugins: before 1.37 it dropped the
    // new pod's registrations when the old pod went (one client per resource), and the new
    // pod registered again; from 1.37 (a client per socket) it keeps them.
    let log = akri_pods
        .logs(&plugin, &LogParams::default())
        .await
        .unwrap();
    let registered_again = log.contains("the kubelet ended the device list stream");
    let minor: u32 = cp
        .bins()
        .version()
        .split('.')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(registered_again, minor < 37, "the new plugin's log:\n{log}");
    for _ in 0..3 {
        let took = churn.round(&format!("after-{round}")).await;
        eprintln!("{:?} round {round}: {took:?}", started.elapsed());
        during.add(took);
        round += 1;
    }
    sampler.abort();

    if dra {
        // Past the new plugin's start-up wait (30 s) and a resync: a discovery handler it had
        // lost in the hand-over would have left its configuration's devices unpublished.
        tokio::time::sleep(Duration::from_secs(35)).await;
        churn.round(&format!("after-{round}")).await;
        assert_eq!(
            published(&client).await,
            slices,
            "a slice was replaced or rewritten"
        );
    }
    // What neither the upgrade nor the rollback may change: no failed prepare or unprepare
    // (the kubelet's own counters), the pods holding a claim and a slot, the slot's holder.
    let undisturbed = async |when: &str| {
        if dra {
            assert_eq!(
                kubelet_failures(&client).await,
                failed_before,
                "a prepare or unprepare failed {when}; the kubelet said:\n{}",
                failed_calls(&node)
            );
            assert_eq!(
                Some(running(&pods, "holder").await),
                holder,
                "the claim's pod was disturbed {when}"
            );
        }
        assert_eq!(
            running(&pods, "slot-holder").await,
            slot_holder,
            "the slot's pod was disturbed {when}"
        );
        assert!(
            held().await.contains(&slot),
            "the legacy slot {slot:?} moved {when}"
        );
    };
    undisturbed("in the upgrade").await;
    // The running components export every metric the chart's alerts and dashboard query of
    // them (the broker-controller's, which this install leaves out: the demo's check). With
    // DRA: a family is exported once it has a sample (claims prepared, pools published).
    let components = [
        ("kubelet-plugin", "kubelet-plugin", 8080),
        ("driver-controller", "driver-controller", 8080),
        ("discovery-handler", "debug-echo-discovery-handler", 8094),
    ];
    for (component, selector, port) in components.into_iter().filter(|_| dra) {
        // Every replica's (only the leading driver-controller writes and reconciles).
        let label = format!("app.kubernetes.io/component={selector}");
        let listed = (akri_pods.list(&ListParams::default().labels(&label)))
            .await
            .unwrap();
        let mut text = String::new();
        for pod in listed.items.iter().filter_map(|p| p.metadata.name.as_ref()) {
            let path = format!("/api/v1/namespaces/akri/pods/{pod}:{port}/proxy/metrics");
            let request = http::Request::get(path).body(Vec::new()).unwrap();
            text.push_str(&client.request_text(request).await.unwrap());
        }
        let missing = akri_testing::monitoring::missing(component, &text).unwrap();
        assert!(
            missing.is_empty(),
            "the alerts and dashboard query what no {selector} pod exports: {missing:?}\n{text}"
        );
    }

    // The rollback, its line as the section gives it: every component back on the previous
    // release's images, the pods holding a claim and a slot undisturbed, no prepare failed.
    let rollback = (lines.iter().find(|l| l.starts_with("helm rollback ")))
        .unwrap_or_else(|| panic!("no helm rollback line in Upgrades: {lines:?}"));
    run(rollback).await.unwrap_or_else(|e| panic!("{e}"));
    for component in [
        "kubelet-plugin",
        "debug-echo-discovery-handler",
        "driver-controller",
    ] {
        let label = format!("app.kubernetes.io/component={component}");
        akri_testing::eventually_within(&format!("{component} rolled back"), WAIT, async || {
            let pods = (akri_pods.list(&ListParams::default().labels(&label)))
                .await
                .ok()?;
            let images: Vec<String> = (pods.items.iter())
                .filter_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
                .collect();
            let previous_tag = format!(":{}", previous.version);
            (!images.is_empty() && images.iter().all(|i| i.ends_with(&previous_tag))).then_some(())
        })
        .await;
    }
    churn.round("after-rollback").await;
    undisturbed("in the rollback").await;

    at_rest.print("at rest");
    during.print("during the upgrade");
    if dra {
        let after = scraper.snapshot().await;
        let rest = Prepares::between(&before_rest, &before_upgrade);
        let upgrade = Prepares::between(&before_upgrade, &after);
        eprintln!("the plugins' prepares at rest: {rest}");
        eprintln!("the plugins' prepares during and after the upgrade: {upgrade}");
        eprintln!(
            "the kubelet's PrepareResources: {}",
            kubelet_prepare(&client).await
        );
        // The bound, from the kubelet's view: no prepare of the run (at rest, through the
        // upgrade and the rollback) waited for a plugin, as one would on a hand-over that
        // left no plugin serving (the kubelet's gRPC timeout is 45 s).
        let text = kubelet_metrics(&client).await;
        let (count, within, bound) = kubelet_prepares_within(&text, 1.0);
        assert!(
            count > 0 && within == count,
            "the kubelet timed {count} successful PrepareResources, {within} within {bound} s"
        );
    }
}

/// The plugin pods' own prepare histograms (`akri_kubelet_plugin_prepare_seconds`, buckets
/// from 1 ms doubling: finer than the kubelet's, whose first is 0.1 s), read through the API
/// server every 250 ms while the test runs, the last read of each pod kept: the old pod's
/// prepares are counted up to its last quarter second (it stops taking prepares a second
/// before it exits).
struct Prepares {
    latest: std::sync::Arc<tokio::sync::Mutex<BTreeMap<String, Histogram>>>,
    task: tokio::task::JoinHandle<()>,
}

/// Cumulative counts by upper bound (seconds, as printed).
type Histogram = BTreeMap<String, u64>;

impl Drop for Prepares {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Prepares {
    fn scrape(client: &kube::Client) -> Self {
        let latest = std::sync::Arc::<tokio::sync::Mutex<BTreeMap<String, Histogram>>>::default();
        let (client, into) = (client.clone(), latest.clone());
        let task = tokio::spawn(async move {
            let pods = Api::<Pod>::namespaced(client.clone(), "akri");
            let plugins =
                ListParams::default().labels("app.kubernetes.io/component=kubelet-plugin");
            loop {
                for pod in pods
                    .list(&plugins)
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    let Some(name) = pod.metadata.name else {
                        continue;
                    };
                    let path = format!("/api/v1/namespaces/akri/pods/{name}:8080/proxy/metrics");
                    let request = http::Request::get(path).body(Vec::new()).unwrap();
                    if let Ok(text) = client.request_text(request).await {
                        into.lock().await.insert(name, ok_prepares(&text));
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Prepares { latest, task }
    }

    /// Every pod's latest histogram, after a fresh read.
    async fn snapshot(&self) -> BTreeMap<String, Histogram> {
        tokio::time::sleep(Duration::from_millis(600)).await;
        self.latest.lock().await.clone()
    }

    /// The prepares between two snapshots, all pods together: their count, and the median
    /// and 99th percentile as the bucket bounds they fall within.
    fn between(from: &BTreeMap<String, Histogram>, to: &BTreeMap<String, Histogram>) -> String {
        let mut sum = Histogram::new();
        for (pod, histogram) in to {
            for (le, n) in histogram {
                let before = from.get(pod).and_then(|h| h.get(le)).copied().unwrap_or(0);
                *sum.entry(le.clone()).or_default() += n - before;
            }
        }
        let mut buckets: Vec<(f64, u64)> = (sum.iter())
            .map(|(le, n)| (le.parse().unwrap_or(f64::INFINITY), *n))
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let count = buckets.last().map_or(0, |b| b.1);
        let within = |q: f64| {
            let rank = (count as f64 * q).ceil() as u64;
            (buckets.iter())
                .find(|(_, n)| *n >= rank)
                .map_or(f64::INFINITY, |b| b.0)
        };
        format!(
            "{count}, p50 <= {} s, p99 <= {} s",
            within(0.5),
            within(0.99)
        )
    }
}

/// The `ok` prepares' cumulative buckets of one `/metrics` text, all drivers together.
fn ok_prepares(text: &str) -> Histogram {
    let mut histogram = Histogram::new();
    for line in text.lines() {
        if !line.starts_with("akri_kubelet_plugin_prepare_seconds_bucket{")
            || !line.contains("result=\"ok\"")
        {
            continue;
        }
        let Some(le) = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let n: u64 = (line.rsplit(' ').next())
            .and_then(|n| n.parse::<f64>().ok())
            .map_or(0, |n| n as u64);
        *histogram.entry(le.to_string()).or_default() += n;
    }
    histogram
}

/// The node's allocatable legacy resource, as the scheduler sees it.
async fn allocatable(nodes: &Api<k8s_openapi::api::core::v1::Node>) -> Option<String> {
    let node = nodes.get(NODE).await.ok()?;
    let allocatable = node.status?.allocatable?;
    allocatable.get(SLOT.0).map(|q| q.0.clone())
}

/// What a pod of the churn asks for besides a claim: one legacy device-plugin slot.
const SLOT: (&str, &str) = ("akri.sh/slots", "1");

/// Pods that start and stop on the node, one round at a time.
struct Churn {
    pods: Api<Pod>,
    busybox: String,
    /// With a DRA claim too.
    dra: bool,
}

/// How long the churn's pods took from creation to running.
#[derive(Default)]
struct Timings {
    claims: Vec<Duration>,
    slots: Vec<Duration>,
}

impl Timings {
    fn add(&mut self, (claim, slot): (Option<Duration>, Duration)) {
        self.claims.extend(claim);
        self.slots.push(slot);
    }

    fn print(self, when: &str) {
        let quantiles = akri_testing::quantiles;
        if !self.claims.is_empty() {
            let claims = quantiles(self.claims);
            eprintln!("pod with a claim, created to running, {when}: {claims}");
        }
        let slots = quantiles(self.slots);
        eprintln!("pod with a legacy slot, created to running, {when}: {slots}");
    }
}

impl Churn {
    /// A pod with a claim (where DRA is served) and one with a legacy slot, both from creation
    /// to running, then deleted and gone; how long each took to run.
    async fn round(&self, name: &str) -> (Option<Duration>, Duration) {
        let claim = async {
            match self.dra {
                true => Some(self.one(&format!("{name}-claim"), json!({}), true).await),
                false => None,
            }
        };
        let slot_pod = format!("{name}-slot");
        let slot = self.one(&slot_pod, json!({ SLOT.0: SLOT.1 }), false);
        tokio::join!(claim, slot)
    }

    async fn one(&self, name: &str, limits: serde_json::Value, claim: bool) -> Duration {
        let (pods, start) = (&self.pods, Instant::now());
        create_pod(pods, name, &self.busybox, limits, claim).await;
        running(pods, name).await;
        let took = start.elapsed();
        pods.delete(name, &DeleteParams::default()).await.unwrap();
        akri_testing::eventually_within(&format!("pod {name} gone"), WAIT, async || {
            pods.get_opt(name).await.ok()?.is_none().then_some(())
        })
        .await;
        took
    }
}

/// A pod of one busybox container that sleeps, with the claim template `one` (`claim`) and
/// `limits`.
async fn create_pod(
    pods: &Api<Pod>,
    name: &str,
    busybox: &str,
    limits: serde_json::Value,
    claim: bool,
) {
    let mut pod = json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": busybox, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "exec sleep 3600"],
                "resources": { "limits": limits },
            }],
        },
    });
    if claim {
        pod["spec"]["resourceClaims"] =
            json!([{ "name": "echo", "resourceClaimTemplateName": "one" }]);
        pod["spec"]["containers"][0]["resources"]["claims"] = json!([{ "name": "echo" }]);
        // The scheduler places it: the claim must be allocated first.
        pod["spec"].as_object_mut().unwrap().remove("nodeName");
    }
    pods.create(&PostParams::default(), &from_json(pod))
        .await
        .unwrap();
}

/// A running pod's identity ([`akri_testing::running_pod`]).
async fn running(pods: &Api<Pod>, name: &str) -> (String, String, i32) {
    akri_testing::running_pod(pods, name, WAIT).await
}

/// The node's slices: UID and pool generation.
async fn published(client: &kube::Client) -> Vec<(String, i64)> {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
        .await
        .unwrap();
    let mut published: Vec<_> = (slices.items.into_iter())
        .map(|s| (s.metadata.uid.unwrap(), s.spec.pool.generation))
        .collect();
    published.sort();
    published
}

/// The kubelet's `/metrics`, through the API server.
async fn kubelet_metrics(client: &kube::Client) -> String {
    let request = http::Request::get(format!("/api/v1/nodes/{NODE}/proxy/metrics"))
        .body(Vec::new())
        .unwrap();
    client.request_text(request).await.unwrap()
}

/// Failed DRA operations as the kubelet counts them: `dra_operations_duration_seconds` with
/// `is_error="true"`, and DRA gRPC calls that did not end OK.
async fn kubelet_failures(client: &kube::Client) -> Vec<String> {
    (kubelet_metrics(client).await.lines())
        .filter(|line| {
            (line.starts_with("dra_operations_duration_seconds_count")
                && line.contains("is_error=\"true\""))
                || (line.starts_with("dra_grpc_operations_duration_seconds_count")
                    && !line.contains("grpc_status_code=\"OK\""))
        })
        .map(String::from)
        .collect()
}

/// The kubelet's PrepareResources histogram (successful ones): count, and how many within
/// each bucket bound (0.1 s and more).
async fn kubelet_prepare(client: &kube::Client) -> String {
    (kubelet_metrics(client).await.lines())
        .filter(|line| {
            line.starts_with("dra_operations_duration_seconds_")
                && line.contains("PrepareResources")
                && !line.contains("Unprepare")
                && line.contains("is_error=\"false\"")
        })
        .filter(|line| {
            !line.contains("_bucket") || line.contains("le=\"0.1\"") || line.contains("le=\"+Inf\"")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Of the successful PrepareResources the kubelet timed (`dra_operations_duration_seconds`),
/// how many in all and how many within `limit` seconds, by the largest bucket bound not above
/// it (which is returned too).
fn kubelet_prepares_within(metrics: &str, limit: f64) -> (u64, u64, f64) {
    let (mut count, mut within, mut bound) = (0, 0, 0.0_f64);
    for line in metrics.lines() {
        let ours = line.contains("=\"PrepareResources\"") && line.contains("is_error=\"false\"");
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        if !ours {
            continue;
        }
        if line.starts_with("dra_operations_duration_seconds_count") {
            count = value as u64;
        } else if let Some(le) = (line.starts_with("dra_operations_duration_seconds_bucket"))
            .then(|| {
                line.split("le=\"")
                    .nth(1)?
                    .split('"')
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
            .flatten()
            && le <= limit
            && le >= bound
        {
            (within, bound) = (value as u64, le);
        }
    }
    (count, within, bound)
}

/// The kubelet's log lines about failed prepares and unprepares, for a failure message (one
/// failed once, in 1 of 5 runs, with nothing kept to say why).
fn failed_calls(node: &akri_testing::RealNode) -> String {
    let log = node.log_tail("kubelet", 1_000_000);
    let lines = log.lines().filter(|l| {
        let call = l.contains("PrepareResources") || l.contains("prepare dynamic resources");
        call && (l.contains("rror") || l.contains("ail"))
    });
    lines.collect::<Vec<_>>().join("\n")
}

/// The previous release's chart (`hack/previous.sh`: the release's tree), its BrokerTemplate
/// CRD describing its spec otherwise: a schema change the upgrade's CRD line must make.
struct PreviousRelease {
    dir: tempfile::TempDir,
    /// Its version, its chart's `version` and `appVersion`: its images' tag.
    version: String,
}

const BROKER_TEMPLATES: &str = "brokertemplates.akri.sh";

impl PreviousRelease {
    fn new(images_tag: &str) -> PreviousRelease {
        let dir = tempfile::tempdir().unwrap();
        let copied = std::process::Command::new("cp")
            .args(["-rL", "_output/previous/charts/akri"])
            .arg(dir.path())
            .current_dir(repo())
            .status()
            .unwrap();
        assert!(
            copied.success(),
            "the previous release's chart (hack/previous.sh)"
        );
        let field = |name: &str| akri_testing::product::chart_field(&dir.path().join("akri"), name);
        let version = field("version").expect("the previous chart's version");
        // The chart's default image tag is its appVersion: the release's images.
        assert_eq!(field("appVersion").as_deref(), Some(version.as_str()));
        assert_eq!(
            version, images_tag,
            "the previous release's chart and images"
        );
        let release = PreviousRelease { dir, version };
        let crd_file = release.path(&format!("crds/{BROKER_TEMPLATES}.yaml"));
        let mut crd: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&crd_file).unwrap()).unwrap();
        *spec_description(&mut crd) = "The previous release's BrokerTemplate spec.".into();
        std::fs::write(&crd_file, serde_yaml::to_string(&crd).unwrap()).unwrap();
        release
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.dir.path().join("akri").join(file)
    }

    /// `helm package` and `helm push` to the registry, as hack/push.sh does a build.
    async fn push(&self, helm: &Helm) {
        let chart = self.path("").display().to_string();
        let out = self.dir.path().display().to_string();
        helm.ok(&["package", &chart, "--destination", &out])
            .await
            .unwrap();
        let package = format!("{out}/akri-{}.tgz", self.version);
        let registry = CHART.trim_end_matches("/akri");
        helm.ok(&["push", &package, registry, "--plain-http"])
            .await
            .unwrap();
    }

    /// How this checkout's BrokerTemplate CRD describes its spec.
    fn current_crd_description() -> serde_yaml::Value {
        let file = repo().join(format!("charts/akri/crds/{BROKER_TEMPLATES}.yaml"));
        let mut crd: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        spec_description(&mut crd).clone()
    }

    /// How the API server's BrokerTemplate CRD describes its spec.
    async fn crd_description(&self, client: &kube::Client) -> serde_yaml::Value {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crd = Api::<CustomResourceDefinition>::all(client.clone())
            .get(BROKER_TEMPLATES)
            .await
            .unwrap();
        let mut crd: serde_yaml::Value = serde_yaml::to_value(&crd).unwrap();
        spec_description(&mut crd).clone()
    }
}

/// The description of `spec` in a CRD's first version's schema.
fn spec_description(crd: &mut serde_yaml::Value) -> &mut serde_yaml::Value {
    &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["description"]
}
