//! The move off a running Akri, as docs/operations.md "Moving off Akri" gives it, on a real
//! node (containerd + the kubelet) with our images and the chart: Akri's v0 Configurations and
//! Instances as Akri's agent leaves them, its device plugins (a stand-in:
//! [`akri_testing::akris_agent`]) and brokers holding slots. The section's commands run as
//! written in their order, except the two that address Akri's own chart (steps 2 and 3: the
//! test drops the stand-in instead). Checked: Akri's brokers keep running with their devices
//! through the switch of agents; each configuration then moves to DRA with no device ever held
//! by a legacy slot and published to DRA at once, and no broker replaced but the moving
//! configuration's; turning legacy mode off at the end replaces nothing either.

use akri_api::v0::{Configuration, Instance};
use akri_testing::product::{Images, fixtures_after, repo, shell_in};
use akri_testing::{ControlPlane, ControlPlaneOptions, RealNode, from_json};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, LogParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The names the section's commands use.
const USERS: &str = "cameras";
const DOCUMENTED: &str = "cams";
/// The second configuration; Akri also ran on a node that is gone, so its name stays in this
/// one's finalizers.
const OTHER: &str = "mics";
const GONE_NODE: &str = "akri-gone";
const NODE: &str = "akri-edge";
const RECLAIM_GRACE_SECONDS: u64 = 5;
const WAIT: Duration = Duration::from_secs(180);

#[tokio::test]
async fn a_cluster_moves_off_akri_as_documented_and_no_device_is_held_twice() {
    let cp = ControlPlane::start(ControlPlaneOptions::with_services())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    Images::pushed().await.unwrap();
    let node = RealNode::start(&cp, NODE).await.expect("real node");
    let busybox = node.busybox_image().unwrap();
    let mut doc = Doc::new(&cp);

    // Akri as it runs: its CRDs, the Configurations and Instances its agent wrote, its device
    // plugins, and a broker of each configuration holding a slot.
    akri_testing::akris_agent::akris_crds(&client).await;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({ "metadata": { "name": USERS } })),
        )
        .await
        .unwrap();
    let mut akri_plugins = Vec::new();
    let mut instances = BTreeMap::new();
    for (config, finalizers) in [(DOCUMENTED, vec![NODE]), (OTHER, vec![GONE_NODE, NODE])] {
        let instance = akri_devices::instance_name(config, "cam0", true, NODE);
        akris_configuration(&client, config, &finalizers, &instance, &busybox).await;
        akri_plugins.push(
            akri_testing::akris_agent::serve_instance(
                &node.device_plugin_dir(),
                &instance,
                2,
                &[1],
                &[("DEBUG_ECHO_DESCRIPTION", "cam0")],
            )
            .unwrap(),
        );
        akris_broker(&client, config, &instance, &busybox).await;
        instances.insert(config, instance);
    }
    let pods = Api::<Pod>::namespaced(client.clone(), USERS);
    let mut brokers = BTreeMap::new();
    for config in [DOCUMENTED, OTHER] {
        let name = format!("{NODE}-{}-pod", instances[config]);
        let output = output(&pods, &name).await;
        assert!(output.contains("DEBUG_ECHO_DESCRIPTION=cam0"), "{output}");
        brokers.insert(config, running(&pods, &name).await);
    }

    // 1. The export.
    doc.run("kubectl get configurations.akri.sh --all-namespaces -o yaml >")
        .await;
    let exported =
        std::fs::read_to_string(doc.dir.path().join("akri-configurations.yaml")).unwrap();
    for config in [DOCUMENTED, OTHER] {
        assert!(
            exported.contains(&format!("name: {config}\n")),
            "{exported}"
        );
    }
    // 2. and 3. Akri's chart: its hook off, then uninstalled. Its agent goes, cleaning nothing.
    doc.skip(
        "helm upgrade akri akri-helm-charts/akri --reuse-values --set cleanupHook.enabled=false",
    );
    doc.skip("helm uninstall akri");
    drop(akri_plugins);
    // 4. Our CRDs over Akri's.
    doc.run("kubectl apply --server-side --force-conflicts -f charts/akri/crds/")
        .await;
    let crd = Api::<CustomResourceDefinition>::all(client.clone())
        .get("instances.akri.sh")
        .await
        .unwrap();
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    let nodes = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["nodes"];
    assert_eq!(nodes["x-kubernetes-list-type"], "set", "{nodes}");
    // 5. The chart in legacy mode.
    doc.run("kubectl apply -f examples/akri-namespace.yaml")
        .await;
    doc.run("helm install akri oci://localhost:5000/akri/charts/akri")
        .await;
    let v0 = Api::<Configuration>::namespaced(client.clone(), USERS);
    let v0_instances = Api::<Instance>::namespaced(client.clone(), USERS);
    for config in [DOCUMENTED, OTHER] {
        let instance = &instances[config];
        akri_testing::eventually_within(&format!("{instance} adopted"), WAIT, async || {
            let i = v0_instances.get(instance).await.ok()?;
            let adopted = i.metadata.finalizers.unwrap_or_default().is_empty()
                && i.metadata.owner_references.unwrap_or_default().is_empty()
                && i.spec.device_usage.len() == 2;
            adopted.then_some(())
        })
        .await;
        let usage = v0_instances.get(instance).await.unwrap().spec.device_usage;
        assert_eq!(
            usage[&akri_devices::slot_device_name(instance, 1)],
            NODE,
            "the broker's slot stays held"
        );
    }
    let released = |config: &'static str, left: Vec<String>| {
        let v0 = v0.clone();
        async move {
            akri_testing::eventually_within(
                &format!("{config}'s finalizers {left:?}"),
                WAIT,
                async || {
                    let finalizers = v0
                        .get(config)
                        .await
                        .ok()?
                        .metadata
                        .finalizers
                        .unwrap_or_default();
                    (finalizers == left).then_some(())
                },
            )
            .await
        }
    };
    released(DOCUMENTED, vec![]).await;
    released(OTHER, vec![GONE_NODE.to_string()]).await;
    doc.run("kubectl patch configurations.akri.sh mics").await;
    released(OTHER, vec![]).await;
    for config in [DOCUMENTED, OTHER] {
        let name = format!("{NODE}-{}-pod", instances[config]);
        assert_eq!(
            running(&pods, &name).await,
            brokers[config],
            "{name} through the switch of agents"
        );
    }

    // 6. One configuration at a time, watched for a device held twice all along.
    let watch = HeldTwice::start(client.clone());
    let moves = [
        doc.take("kubectl get configurations.akri.sh cams"),
        doc.take("kubectl delete configurations.akri.sh cams"),
        doc.take("kubectl delete pods --namespace cameras --selector"),
    ];
    let mut moved = Vec::new();
    for config in [DOCUMENTED, OTHER] {
        // The section's lines for `cams`, for `config`.
        for line in &moves {
            doc.sh(line.replace(DOCUMENTED, config)).await;
        }
        let broker = v1_broker(&pods, config).await;
        let output = output(&pods, &broker).await;
        assert!(
            output.contains("DEBUG_ECHO_DESCRIPTION=cam0"),
            "{broker}: {output}"
        );
        moved.push((broker.clone(), running(&pods, &broker).await));
        for (earlier, seen) in &moved {
            assert_eq!(&running(&pods, earlier).await, seen, "{earlier} replaced");
        }
        for other in [DOCUMENTED, OTHER].into_iter().skip(moved.len()) {
            let name = format!("{NODE}-{}-pod", instances[other]);
            assert_eq!(
                running(&pods, &name).await,
                brokers[other],
                "{name} replaced while {config} moved"
            );
        }
        assert!(
            v0_instances
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .all(|i| i.spec.configuration_name != config)
        );
    }
    let violations = watch.stop().await;
    assert!(
        violations.is_empty(),
        "a device held by a legacy slot and offered to DRA at once: {violations:#?}"
    );

    // 7. Legacy mode off: the plugins restart (the test waits for the rollout), the brokers
    // stay.
    doc.run("helm upgrade akri oci://localhost:5000/akri/charts/akri")
        .await;
    doc.done();
    for (broker, seen) in &moved {
        assert_eq!(
            &running(&pods, broker).await,
            seen,
            "{broker} through the upgrade"
        );
    }
}

/// The section's command lines, run in order from a directory where `charts/` and `examples/`
/// are the repository's, with kubectl, Helm and akri-migrate on the PATH.
struct Doc {
    lines: Vec<String>,
    next: usize,
    dir: tempfile::TempDir,
    tools: Vec<PathBuf>,
    kubeconfig: PathBuf,
    /// Given to the release after the documented `helm install`: the embedded debugEcho
    /// handler's shared devices (the Instances Akri wrote are of shared devices), a short
    /// reclaim grace.
    fixtures: Vec<String>,
}

impl Doc {
    fn new(cp: &ControlPlane) -> Doc {
        let lines = akri_testing::docs::section_lines(
            &repo().join("docs/operations.md"),
            "Moving off Akri",
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        // The lines' relative paths: the chart, the examples, the images' tag.
        for link in ["charts", "examples", "_output"] {
            std::os::unix::fs::symlink(repo().join(link), dir.path().join(link)).unwrap();
        }
        let migrate = repo().join("_output/bin/linux-amd64");
        assert!(
            migrate.join("akri-migrate").is_file(),
            "no akri-migrate in {}: run hack/images.sh",
            migrate.display()
        );
        // The section's tools: kubectl, akri-migrate (and Helm, which the shell adds).
        let tools = vec![
            cp.bins().require("kubectl").unwrap(),
            migrate.join("akri-migrate"),
        ];
        let fixtures = Vec::from([
            "kubeletPlugin.debugEcho.enabled=true".to_string(),
            "kubeletPlugin.debugEcho.shared=true".to_string(),
            format!("legacyDevicePlugin.slotReclaimGraceSeconds={RECLAIM_GRACE_SECONDS}"),
        ]);
        Doc {
            lines,
            next: 0,
            dir,
            tools,
            kubeconfig: cp.kubeconfig().to_path_buf(),
            fixtures,
        }
    }

    /// The next line, which must start with `prefix`.
    fn take(&mut self, prefix: &str) -> String {
        let line = self.lines.get(self.next).cloned().unwrap_or_default();
        assert!(
            line.starts_with(prefix),
            "line {} of the section is {line:?}, want {prefix:?}...",
            self.next
        );
        self.next += 1;
        line
    }

    fn skip(&mut self, prefix: &str) {
        self.take(prefix);
    }

    async fn run(&mut self, prefix: &str) {
        let line = self.take(prefix);
        self.sh(line).await;
    }

    fn done(&self) {
        assert_eq!(
            self.next,
            self.lines.len(),
            "lines left: {:?}",
            &self.lines[self.next..]
        );
    }

    /// Runs `line` as written; after a `helm install`, the test's fixtures as a step of its
    /// own ([`fixtures_after`]).
    async fn sh(&self, line: String) {
        let tools: Vec<&std::path::Path> = self.tools.iter().map(|t| t.as_path()).collect();
        let mut script = line.clone();
        if line.starts_with("helm install ") {
            script = format!("{line}\n{}", fixtures_after(&line, &self.fixtures));
        }
        shell_in(self.dir.path(), &self.kubeconfig, &tools, &script)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("ran: {script}");
    }
}

/// The container every broker runs: it prints the device's variables, then waits.
fn broker_container(busybox: &str, limits: serde_json::Value) -> serde_json::Value {
    json!({
        "name": "broker", "image": busybox, "imagePullPolicy": "Never",
        "command": ["sh", "-c", "env | grep ^DEBUG_ECHO | sort; echo END-OF-OUTPUT; exec sleep 3600"],
        "resources": { "limits": limits },
    })
}

/// A v0 Configuration with a broker per device, and its Instance, as Akri's agent leaves them
/// (its finalizers, the Instance owned by the Configuration, slot 1 held by the node).
async fn akris_configuration(
    client: &kube::Client,
    name: &str,
    finalizers: &[&str],
    instance: &str,
    busybox: &str,
) {
    let mut config = akri_testing::discovery::v0_debug_echo(name, &["cam0"], 2, true);
    config["metadata"]["finalizers"] = json!(finalizers);
    config["spec"]["brokerSpec"] = json!({ "brokerPodSpec": {
        "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
        "containers": [broker_container(busybox, json!({ "{{PLACEHOLDER}}": "1" }))],
    } });
    let config: Configuration = from_json(config);
    let config = Api::<Configuration>::namespaced(client.clone(), USERS)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let held = akri_devices::slot_device_name(instance, 1);
    let written = akri_testing::discovery::akri_written_instance(
        name,
        config.metadata.uid.as_deref(),
        instance,
        NODE,
        &held,
    );
    Api::<Instance>::namespaced(client.clone(), USERS)
        .create(&PostParams::default(), &from_json(written))
        .await
        .unwrap();
}

/// The broker Akri's controller makes for an Instance: labelled as Akri labels it, owned by
/// the Instance, asking for the instance-level resource.
async fn akris_broker(client: &kube::Client, config: &str, instance: &str, busybox: &str) {
    let uid = Api::<Instance>::namespaced(client.clone(), USERS)
        .get(instance)
        .await
        .unwrap()
        .metadata
        .uid;
    let pod: Pod = from_json(json!({
        "metadata": {
            "name": format!("{NODE}-{instance}-pod"),
            "labels": {
                "controller": "akri.sh", "akri.sh/configuration": config,
                "akri.sh/instance": instance, "akri.sh/target-node": NODE,
            },
            "ownerReferences": [{
                "apiVersion": "akri.sh/v0", "kind": "Instance", "name": instance, "uid": uid,
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
            "containers": [broker_container(busybox, json!({ format!("akri.sh/{instance}"): "1" }))],
        },
    }));
    Api::<Pod>::namespaced(client.clone(), USERS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// The container's output once it printed it.
async fn output(pods: &Api<Pod>, pod: &str) -> String {
    akri_testing::eventually_within(&format!("pod {pod}'s output"), WAIT, async || {
        let logs = pods.logs(pod, &LogParams::default()).await.ok()?;
        logs.contains("END-OF-OUTPUT").then_some(logs)
    })
    .await
}

/// A running pod's identity ([`akri_testing::running_pod`]).
async fn running(pods: &Api<Pod>, name: &str) -> (String, String, i32) {
    akri_testing::running_pod(pods, name, WAIT).await
}

/// The broker the broker-controller made for `config`'s device (owned by its BrokerTemplate),
/// once there is one.
async fn v1_broker(pods: &Api<Pod>, config: &str) -> String {
    akri_testing::eventually_within(
        &format!("{config}'s broker from its BrokerTemplate"),
        WAIT,
        async || {
            let list = pods.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|pod| {
                let owners = pod.metadata.owner_references.clone().unwrap_or_default();
                owners
                    .iter()
                    .any(|o| o.kind == "BrokerTemplate" && o.name == config)
                    .then(|| pod.metadata.name.clone().unwrap_or_default())
            })
        },
    )
    .await
}

/// Samples, four times a second, whether a configuration's device is held by a legacy slot
/// (a v0 Instance with a held slot) while the DRA path has it too (a v1 Instance, or a
/// ResourceSlice device of that configuration).
struct HeldTwice {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl HeldTwice {
    fn start(client: kube::Client) -> HeldTwice {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            let instances = Api::<Instance>::all(client.clone());
            let slices = Api::<ResourceSlice>::all(client);
            let mut samples = 0;
            loop {
                if stopped.try_recv().is_ok() {
                    break;
                }
                if let (Ok(instances), Ok(slices)) = (
                    instances.list(&ListParams::default()).await,
                    slices.list(&ListParams::default()).await,
                ) {
                    samples += 1;
                    let slices = serde_json::to_string(&slices.items).unwrap_or_default();
                    for config in [DOCUMENTED, OTHER] {
                        let of = |i: &&Instance| i.spec.configuration_name == config;
                        let legacy = |i: &&Instance| i.metadata.namespace.as_deref() == Some(USERS);
                        let held = instances
                            .items
                            .iter()
                            .filter(of)
                            .filter(legacy)
                            .any(|i| i.spec.device_usage.values().any(|v| !v.is_empty()));
                        let dra = instances.items.iter().filter(of).any(|i| !legacy(&i))
                            || slices.contains(&format!("\"{config}\""));
                        if held && dra {
                            seen.push(format!("{config} at sample {samples}"));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            assert!(samples > 10, "the watch sampled only {samples} times");
            seen
        });
        HeldTwice { stop, task }
    }

    async fn stop(self) -> Vec<String> {
        let _ = self.stop.send(());
        self.task.await.unwrap()
    }
}
