//! The user's side of the demo: apply the debugEcho examples with kubectl, wait for each
//! component to do its part, and gather what a person wants to see.

use crate::cluster::{Cluster, DRIVER, Kubelet, NAMESPACE};
use crate::progress::wait_for;
use crate::report::{Allocation, Installed, InstanceRow, Report, SliceDevice, SliceRow};
use akri_api::v0::Instance;
use k8s_openapi::api::core::v1::{NodeSelector, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use std::path::PathBuf;
use std::time::Duration;

/// The examples the demo applies (and the docs' quickstart uses).
fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/debug-echo")
}

const WAIT: Duration = Duration::from_secs(90);
const CLAIM: &str = "lobby-camera";
const POD: &str = "lobby-broker";
const USER_NAMESPACE: &str = "default";

pub async fn run(cluster: &Cluster) -> anyhow::Result<Report> {
    let examples = examples();
    let file = |name: &str| examples.join(name).display().to_string();
    cluster.kubectl(&["apply", "-f", &file("01-discovery-configuration.yaml")])?;
    cluster.kubectl(&["apply", "-f", &file("02-property-filter.yaml")])?;
    println!(
        "  applied examples/debug-echo/01-discovery-configuration.yaml, 02-property-filter.yaml"
    );

    let client = &cluster.client;
    let instances_api = Api::<Instance>::namespaced(client.clone(), NAMESPACE);
    let instances = wait_for(
        "Instances: lobby seen by both nodes, dock by node-a",
        WAIT,
        async || {
            let rows = instance_rows(&instances_api).await?;
            let seen: Vec<usize> = rows.iter().map(|r| r.nodes.len()).collect();
            Ok((rows.len() == 2 && seen.iter().sum::<usize>() == 3).then_some(rows))
        },
    )
    .await?;
    let classes_api = Api::<DeviceClass>::all(client.clone());
    let classes = wait_for("DeviceClasses echo and echo-lobby", WAIT, async || {
        let names: Vec<String> = classes_api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        Ok(
            (names.iter().any(|n| n == "echo") && names.iter().any(|n| n == "echo-lobby"))
                .then_some(names),
        )
    })
    .await?;
    let slices_api = Api::<ResourceSlice>::all(client.clone());
    let slices = wait_for("ResourceSlices with both devices", WAIT, async || {
        let rows = slice_rows(&slices_api).await?;
        let published = rows.iter().flat_map(|s| &s.devices).count();
        Ok((published >= 2).then_some(rows))
    })
    .await?;

    cluster.kubectl(&["apply", "-f", &file("03-claim-and-pod.yaml")])?;
    println!("  applied examples/debug-echo/03-claim-and-pod.yaml");
    let pods = Api::<Pod>::namespaced(client.clone(), USER_NAMESPACE);
    let node = wait_for("the scheduler binds the pod", WAIT, async || {
        Ok(pods.get(POD).await?.spec.and_then(|s| s.node_name))
    })
    .await?;
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), USER_NAMESPACE);
    let allocation = wait_for("the claim is allocated", WAIT, async || {
        let claim = claims.get(CLAIM).await?;
        let result = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .and_then(|r| r.into_iter().next());
        Ok(result.map(|r| Allocation {
            instance: slices
                .iter()
                .filter(|s| s.pool == r.pool)
                .flat_map(|s| &s.devices)
                .find(|d| d.name == r.device)
                .map(|d| d.instance.clone())
                .unwrap_or_default(),
            driver: r.driver,
            pool: r.pool,
            device: r.device,
        }))
    })
    .await?;

    let demo_node = cluster
        .node(&node)
        .ok_or_else(|| anyhow::anyhow!("the pod was bound to {node}, not a demo node"))?;
    let (cdi_ids, env, container) = match &demo_node.kubelet {
        // The kubelet prepares the claim, containerd applies the CDI spec, the container
        // prints its environment.
        Kubelet::Real(real) => {
            let output = wait_for(&format!("the container runs on {node}"), WAIT, async || {
                let logs = pods.logs(POD, &Default::default()).await.ok();
                Ok(logs.filter(|l| l.contains("DEBUG_ECHO")))
            })
            .await?;
            let env = output
                .lines()
                .filter(|l| l.contains('='))
                .map(str::to_string)
                .collect();
            (cdi_devices(&real.cdi_dir())?, env, true)
        }
        // What the node's kubelet does before starting the container: NodePrepareResources
        // on the plugin, then the runtime resolves the CDI ids.
        Kubelet::Simulated(peer) => {
            let prepared = wait_for(
                &format!("{node}'s kubelet prepares the claim"),
                WAIT,
                async || Ok(Some(peer.prepare(USER_NAMESPACE, POD).await?)),
            )
            .await?;
            let cdi_ids = prepared.get("broker").cloned().unwrap_or_default();
            let edits = peer.cdi_inject(&cdi_ids).await?;
            let env = serde_json::from_value(edits["env"].clone()).unwrap_or_default();
            (cdi_ids, env, false)
        }
    };

    // The plugin that prepared it counts the preparation, and is ready.
    let plugin = demo_node;
    let (ready, _) = plugin.http_get("/readyz").await?;
    let metrics = plugin.http_get("/metrics").await?.1;
    let metric_lines = metrics
        .lines()
        .filter(|l| {
            l.starts_with("akri_kubelet_plugin_prepare_seconds_count")
                || l.starts_with("akri_kubelet_plugin_devices_published")
        })
        .map(str::to_string)
        .collect();

    let installed = match cluster.real {
        true => Some(installed(cluster, &instances).await?),
        false => None,
    };
    let kubectl =
        cluster.kubectl(&["get", "akridc,pf,akrii,resourceslices,resourceclaims", "-A"])?;
    Ok(Report {
        instances,
        classes,
        slices,
        pod: (POD.to_string(), node),
        plugin_ready: ready == 200,
        plugin_metrics: metric_lines,
        claim: (CLAIM.to_string(), allocation),
        cdi_ids,
        env,
        container,
        kubectl,
        installed,
    })
}

/// The chart's pods as they run, then the BrokerTemplate example applied and each Instance's
/// broker Job's output.
async fn installed(cluster: &Cluster, instances: &[InstanceRow]) -> anyhow::Result<Installed> {
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| {
            let label = |key: &str| p.metadata.labels.as_ref().and_then(|l| l.get(key).cloned());
            let status = p.status.unwrap_or_default();
            let ready = status
                .container_statuses
                .as_ref()
                .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c.ready));
            (
                p.metadata.name.unwrap_or_default(),
                label("app.kubernetes.io/component").unwrap_or_default(),
                p.spec.and_then(|s| s.node_name).unwrap_or_default(),
                status.phase.unwrap_or_default(),
                ready,
            )
        })
        .collect();

    let template = examples().join("../brokers/job-per-instance.yaml");
    cluster.kubectl(&["apply", "-f", &template.display().to_string()])?;
    println!("  applied examples/brokers/job-per-instance.yaml");
    let user_pods = Api::<Pod>::namespaced(cluster.client.clone(), USER_NAMESPACE);
    let mut brokers = Vec::new();
    for instance in instances {
        let selector = format!("akri.sh/instance={},job-name", instance.name);
        let output = wait_for(
            &format!("the broker Job of {} prints", instance.name),
            WAIT,
            async || {
                for pod in user_pods
                    .list(&ListParams::default().labels(&selector))
                    .await?
                    .items
                {
                    let name = pod.metadata.name.unwrap_or_default();
                    let succeeded =
                        pod.status.and_then(|s| s.phase).as_deref() == Some("Succeeded");
                    if succeeded {
                        return Ok(Some(user_pods.logs(&name, &Default::default()).await?));
                    }
                }
                Ok(None)
            },
        )
        .await?;
        brokers.push((instance.name.clone(), instance.description.clone(), output));
    }
    let mut unmonitored = Vec::new();
    for component in ["driver-controller", "broker-controller"] {
        let text = component_metrics(cluster, component).await?;
        let missing = akri_testing::monitoring::missing(component, &text)?;
        unmonitored.push((component.to_string(), missing));
    }
    Ok(Installed {
        pods,
        brokers,
        unmonitored,
    })
}

/// The `/metrics` of every running pod of the chart's `component` (only the leading replica
/// of a controller writes and reconciles), through the API server.
async fn component_metrics(cluster: &Cluster, component: &str) -> anyhow::Result<String> {
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), NAMESPACE);
    let label = format!("app.kubernetes.io/component={component}");
    let listed = pods.list(&ListParams::default().labels(&label)).await?;
    let mut text = String::new();
    for pod in listed.items.iter().filter_map(|p| p.metadata.name.as_ref()) {
        let path = format!("/api/v1/namespaces/{NAMESPACE}/pods/{pod}:8080/proxy/metrics");
        let request = http::Request::get(path).body(Vec::new())?;
        text.push_str(&cluster.client.request_text(request).await?);
    }
    Ok(text)
}

/// The CDI devices (`<kind>=<name>`) of the specs in a real node's CDI directory: what the
/// plugin wrote when it prepared the claim, and containerd applied.
fn cdi_devices(dir: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let spec: serde_json::Value = match std::fs::read(entry?.path()) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_default(),
            Err(_) => continue,
        };
        let kind = spec["kind"].as_str().unwrap_or_default();
        for device in spec["devices"].as_array().into_iter().flatten() {
            ids.push(format!(
                "{kind}={}",
                device["name"].as_str().unwrap_or_default()
            ));
        }
    }
    ids.sort();
    Ok(ids)
}

pub async fn instance_rows(api: &Api<Instance>) -> anyhow::Result<Vec<InstanceRow>> {
    let mut rows: Vec<InstanceRow> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|i| {
            let mut nodes = i.spec.nodes.clone();
            nodes.sort();
            InstanceRow {
                name: i.metadata.name.unwrap_or_default(),
                uid: i.metadata.uid.unwrap_or_default(),
                configuration: i.spec.configuration_name,
                shared: i.spec.shared,
                nodes,
                description: i
                    .spec
                    .broker_properties
                    .get("DEBUG_ECHO_DESCRIPTION")
                    .cloned()
                    .unwrap_or_default(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

async fn slice_rows(api: &Api<ResourceSlice>) -> anyhow::Result<Vec<SliceRow>> {
    let mut rows: Vec<SliceRow> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .map(|s| {
            let spec = s.spec;
            SliceRow {
                name: s.metadata.name.unwrap_or_default(),
                pool: spec.pool.name,
                nodes: spec
                    .node_name
                    .clone()
                    .or_else(|| spec.node_selector.as_ref().map(selector_nodes))
                    .or_else(|| spec.all_nodes.unwrap_or(false).then(|| "all nodes".into()))
                    .unwrap_or_else(|| "per device".into()),
                devices: spec
                    .devices
                    .unwrap_or_default()
                    .into_iter()
                    .map(|d| SliceDevice {
                        instance: d
                            .attributes
                            .as_ref()
                            .and_then(|a| a.get(akri_devices::ATTR_INSTANCE))
                            .and_then(|a| a.string.clone())
                            .unwrap_or_default(),
                        nodes: d
                            .node_name
                            .clone()
                            .or_else(|| d.node_selector.as_ref().map(selector_nodes)),
                        name: d.name,
                    })
                    .collect(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(rows)
}

/// The values a node selector names (our writers select on `kubernetes.io/hostname`).
fn selector_nodes(selector: &NodeSelector) -> String {
    let values: Vec<String> = selector
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .flat_map(|e| e.values.iter().flatten().cloned())
        .collect();
    values.join(", ")
}
