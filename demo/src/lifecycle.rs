//! After the install, with `--check` on real nodes: what a user does next with the product.
//! `helm upgrade` to a rebuilt image with a changed value rolls every component while the
//! example pod keeps its device and nothing published changes; then the uninstall of
//! `docs/operations.md` (its `bash` blocks, run as written) leaves nothing behind.

use crate::chart::{self, Images, RELEASE};
use crate::cluster::{Cluster, DRIVER, EXAMPLE_IMAGE, Kubelet, NAMESPACE};
use crate::progress::{step, wait_for};
use akri_api::v0::Instance;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
const USER_NAMESPACE: &str = "default";
/// The example pod, which must keep running through the upgrade.
const EXAMPLE_POD: &str = "lobby-broker";
/// A pod made after the upgrade: the new plugins prepare.
const AFTER: &str = "after-upgrade";

/// What the cluster had published: (ResourceSlice name, generation) and (Instance, uid,
/// nodes). An upgrade that changes nothing that was right leaves both as they were.
#[derive(Debug, PartialEq)]
struct Published {
    slices: BTreeMap<String, i64>,
    instances: BTreeMap<String, (String, Vec<String>)>,
}

async fn published(cluster: &Cluster) -> anyhow::Result<Published> {
    let slices = Api::<ResourceSlice>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .map(|s| {
            (
                s.metadata.name.unwrap_or_default(),
                s.metadata.generation.unwrap_or_default(),
            )
        })
        .collect();
    let api = Api::<Instance>::namespaced(cluster.client.clone(), NAMESPACE);
    let instances = crate::flow::instance_rows(&api)
        .await?
        .into_iter()
        .map(|i| (i.name, (i.uid, i.nodes)))
        .collect();
    Ok(Published { slices, instances })
}

/// The example container's id and restart count.
async fn example_container(pods: &Api<Pod>) -> anyhow::Result<(String, i32)> {
    let pod = pods.get(EXAMPLE_POD).await?;
    let status = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .ok_or_else(|| anyhow::anyhow!("{EXAMPLE_POD} has no container status"))?;
    Ok((
        status.container_id.unwrap_or_default(),
        status.restart_count,
    ))
}

/// `helm upgrade` to the same images under a new tag (a rebuild, as far as the nodes can
/// tell) and a changed value; what is wrong afterwards.
pub async fn upgrade(cluster: &Cluster, images: &Images) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    let chart_pods = Api::<Pod>::namespaced(cluster.client.clone(), NAMESPACE);
    let user_pods = Api::<Pod>::namespaced(cluster.client.clone(), USER_NAMESPACE);
    // The brokers (of the examples and of the docs' commands) hold every camera's capacity;
    // the pod made after the upgrade needs one.
    cluster.kubectl(&[
        "delete",
        "brokertemplates",
        "--all",
        "--all-namespaces",
        "--wait",
    ])?;
    let brokers = ListParams::default().labels("akri.sh/target-node");
    wait_for(
        "the BrokerTemplates' pods gone (capacity for a new pod)",
        WAIT,
        async || {
            Ok(user_pods
                .list(&brokers)
                .await?
                .items
                .is_empty()
                .then_some(()))
        },
    )
    .await?;
    let before_pods: Vec<String> = chart_pods
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.uid)
        .collect();
    let before_example = example_container(&user_pods).await?;
    let before = published(cluster).await?;

    let tag = format!("{}-rebuilt", images.tag);
    step(
        &format!("our images pushed again as {tag}"),
        images.push_as(&tag),
    )
    .await?;
    step(
        &format!(
            "helm upgrade (CRDs first, as docs/operations.md says), image.tag={tag}, logLevel=debug"
        ),
        async {
            cluster.kubectl(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &chart::repo().join("charts/akri/crds").display().to_string(),
            ])?;
            chart::helm(
                cluster.cp.kubeconfig(),
                &[
                    "upgrade",
                    RELEASE,
                    "charts/akri",
                    "--namespace",
                    NAMESPACE,
                    "--reset-then-reuse-values",
                    "--set",
                    &format!("image.tag={tag}"),
                    "--set",
                    "logLevel=debug",
                    "--wait",
                    "--timeout",
                    "3m",
                ],
            )
            .await
        },
    )
    .await?;
    let pods = wait_for(
        "every component's pod replaced and ready",
        WAIT,
        async || {
            let pods = chart_pods.list(&ListParams::default()).await?.items;
            let done = pods.iter().all(|p| {
                let new = !before_pods.contains(p.metadata.uid.as_ref().expect("a uid"));
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|c| c.iter().all(|c| c.ready));
                new && ready
            });
            Ok(done.then_some(pods))
        },
    )
    .await?;
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let container = &pod.spec.as_ref().expect("a spec").containers[0];
        let image = container.image.clone().unwrap_or_default();
        if !image.ends_with(&format!(":{tag}")) {
            problems.push(format!(
                "{name} runs {image} after the upgrade, not tag {tag}"
            ));
        }
        let level = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "RUST_LOG")
            .and_then(|e| e.value.clone());
        if level.as_deref() != Some("debug") {
            problems.push(format!(
                "{name} has RUST_LOG {level:?} after the upgrade, not debug"
            ));
        }
        let plugin = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/component"))
            .is_some_and(|c| c == "kubelet-plugin");
        if plugin {
            wait_for(
                &format!("{name} is registered by its kubelet"),
                WAIT,
                async || {
                    let logs = chart_pods.logs(&name, &Default::default()).await?;
                    Ok(logs.contains("registered with the kubelet").then_some(()))
                },
            )
            .await?;
        }
    }

    // A pod made now is prepared by the new plugins.
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": { "name": AFTER },
        "spec": { "devices": { "requests": [{ "name": "camera", "exactly": { "deviceClassName": "echo" } }] } },
    }))?;
    Api::<ResourceClaim>::namespaced(cluster.client.clone(), USER_NAMESPACE)
        .create(&PostParams::default(), &claim)
        .await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": AFTER },
        "spec": {
            "resourceClaims": [{ "name": "camera", "resourceClaimName": AFTER }],
            "containers": [{
                "name": "broker",
                "image": EXAMPLE_IMAGE,
                "command": ["sh", "-c", "env | grep DEBUG_ECHO; sleep infinity"],
                "resources": { "claims": [{ "name": "camera" }] },
            }],
        },
    }))?;
    user_pods.create(&PostParams::default(), &pod).await?;
    let printed = wait_for(
        &format!("{AFTER}'s container prints its device"),
        WAIT,
        async || {
            let logs = user_pods.logs(AFTER, &Default::default()).await.ok();
            Ok(logs.filter(|l| l.contains("DEBUG_ECHO_DESCRIPTION=")))
        },
    )
    .await?;
    println!("  {AFTER} printed: {}", printed.trim());

    let after_example = example_container(&user_pods).await?;
    if after_example != before_example {
        problems.push(format!("{EXAMPLE_POD}'s container changed in the upgrade: {before_example:?} -> {after_example:?}"));
    }
    let phase = user_pods
        .get(EXAMPLE_POD)
        .await?
        .status
        .and_then(|s| s.phase);
    if phase.as_deref() != Some("Running") {
        problems.push(format!("{EXAMPLE_POD} is {phase:?} after the upgrade"));
    }
    let after = published(cluster).await?;
    if after != before {
        problems.push(format!(
            "the upgrade changed what was published: {before:?} -> {after:?}"
        ));
    }
    println!(
        "  upgrade: {} pods replaced, {EXAMPLE_POD} kept container {}, {} slices and {} Instances unchanged",
        pods.len(),
        after_example
            .0
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .get(..12)
            .unwrap_or_default(),
        after.slices.len(),
        after.instances.len()
    );
    Ok(problems)
}

/// The `bash` blocks of `docs/operations.md`'s "Uninstall" section: the cluster's, the one for
/// Akri's CRDs (the demo runs no Akri), and each node's.
fn uninstall_blocks() -> anyhow::Result<[String; 3]> {
    let doc = chart::repo().join("docs/operations.md");
    let blocks = akri_testing::docs::section_blocks(&doc, "Uninstall", &["bash"])?;
    blocks.try_into().map_err(|blocks| {
        anyhow::anyhow!(
            "want the cluster's, Akri's CRDs' and the node's bash blocks in Uninstall: {blocks:?}"
        )
    })
}

/// The workloads deleted, then the docs' uninstall run as written; what is left.
pub async fn uninstall(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let [cluster_block, akris_crds_block, node_block] = uninstall_blocks()?;
    // Their containers (`sleep` under `sh`) ignore SIGTERM: a short grace period.
    let examples = chart::repo().join("examples/debug-echo/03-claim-and-pod.yaml");
    let examples = examples.display().to_string();
    cluster.kubectl(&["delete", "-f", &examples, "--grace-period=1", "--wait"])?;
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), USER_NAMESPACE);
    pods.delete(AFTER, &DeleteParams::default().grace_period(1))
        .await?;
    Api::<ResourceClaim>::namespaced(cluster.client.clone(), USER_NAMESPACE)
        .delete(AFTER, &DeleteParams::default())
        .await?;
    wait_for("the example workloads deleted", WAIT, async || {
        Ok(pods.get_opt(AFTER).await?.is_none().then_some(()))
    })
    .await?;
    step(
        "docs/operations.md, Uninstall: the cluster's commands",
        chart::shell(cluster.cp.kubeconfig(), &[&cluster.kubectl], &cluster_block),
    )
    .await?;
    step(
        "docs/operations.md, Uninstall: Akri's CRDs, none of its objects being left",
        chart::shell(
            cluster.cp.kubeconfig(),
            &[&cluster.kubectl],
            &akris_crds_block,
        ),
    )
    .await?;
    step(
        "docs/operations.md, Uninstall: each node's command",
        async {
            for node in &cluster.nodes {
                if let Kubelet::Real(real) = &node.kubelet {
                    real.host_shell(&format!("set -e\n{}", node_block))?;
                }
            }
            anyhow::Ok(())
        },
    )
    .await?;
    let left = wait_for(
        "nothing of Akri left on the nodes and in the cluster",
        Duration::from_secs(60),
        async || {
            let left = leftovers(cluster).await?;
            Ok(left.is_empty().then_some(()))
        },
    )
    .await;
    match left {
        Ok(()) => {
            println!("  uninstall: nothing of Akri is left on the nodes or in the cluster");
            Ok(Vec::new())
        }
        Err(_) => Ok(leftovers(cluster)
            .await?
            .into_iter()
            .map(|l| format!("left after the uninstall: {l}"))
            .collect()),
    }
}

/// What of Akri is still on the nodes and in the cluster.
async fn leftovers(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let mut left = Vec::new();
    // The kubelet's own files in the directories it shares with plugins.
    let kubelets_own = ["kubelet.sock", "kubelet_internal_checkpoint", "DEPRECATION"];
    for node in &cluster.nodes {
        if let Kubelet::Real(real) = &node.kubelet {
            let found = real.host_shell(
                "find /var/lib/akri-kubelet-plugin /var/lib/akri /var/run/cdi /var/lib/kubelet/plugins /var/lib/kubelet/plugins_registry /var/lib/kubelet/device-plugins -mindepth 0 2>/dev/null; true",
            )?;
            for path in found.lines() {
                let name = path.rsplit('/').next().unwrap_or_default();
                let kept_directory = [
                    "/var/run/cdi",
                    "/var/lib/kubelet/plugins",
                    "/var/lib/kubelet/plugins_registry",
                    "/var/lib/kubelet/device-plugins",
                ]
                .contains(&path);
                if !kept_directory && !kubelets_own.contains(&name) {
                    left.push(format!("{}: {path}", node.name));
                }
            }
        }
    }
    let get =
        |kind: &str| cluster.kubectl(&["get", kind, "-A", "-o", "name", "--ignore-not-found"]);
    for line in get("customresourcedefinitions")?.lines() {
        if line.ends_with(".akri.sh") {
            left.push(line.to_string());
        }
    }
    for line in get("deviceclasses")?.lines() {
        left.push(line.to_string());
    }
    for slice in Api::<ResourceSlice>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await?
        .items
    {
        if slice.spec.driver.ends_with("akri.sh") {
            left.push(format!(
                "resourceslice {} of {}",
                slice.metadata.name.unwrap_or_default(),
                slice.spec.driver
            ));
        }
    }
    let release = format!("app.kubernetes.io/instance={RELEASE}");
    for kind in [
        "clusterroles",
        "clusterrolebindings",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ] {
        let names = cluster.kubectl(&["get", kind, "-l", &release, "-o", "name"])?;
        left.extend(names.lines().map(str::to_string));
    }
    if !cluster
        .kubectl(&[
            "get",
            "namespace",
            NAMESPACE,
            "-o",
            "name",
            "--ignore-not-found",
        ])?
        .trim()
        .is_empty()
    {
        left.push(format!("namespace/{NAMESPACE}"));
    }
    Ok(left)
}
