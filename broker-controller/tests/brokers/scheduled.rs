//! Brokers end to end on real Kubernetes: two simulated nodes (kubelet peer + the node agent
//! with debugEcho), the driver-controller, the broker-controller, the real scheduler and
//! controller-manager. Each broker pod's claim is allocated to its own Instance, the pod lands
//! on a node that reaches the device, and the kubelet prepares it with that device's
//! properties; a Job per Instance runs once.

use akri_api::v1::{BrokerTemplate, DiscoveryConfiguration, Instance};
use akri_broker_controller::metrics::Metrics;
use akri_testing::{ControlPlane, ControlPlaneOptions, from_json, metric};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::support;
use support::SimNode;

const DRIVER: &str = "debugecho.akri.sh";

use akri_testing::{EVENTUALLY, eventually};

/// Two nodes whose debugEcho handlers register as shared, each hiding the descriptions in
/// `offline[i]` (so a device is seen by one node or by both), and both controllers.
struct Cluster {
    cp: ControlPlane,
    client: kube::Client,
    akri: String,
    apps: String,
    nodes: Vec<SimNode>,
    driver: tokio::task::JoinHandle<()>,
    brokers: tokio::task::JoinHandle<()>,
    metrics: Metrics,
    /// The device each node does not see.
    offline: [String; 2],
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.driver.abort();
        self.brokers.abort();
    }
}

impl Cluster {
    async fn start(offline: [&str; 2]) -> Cluster {
        Self::start_with(offline, Duration::ZERO).await
    }

    /// With Instances of shared devices outliving their disappearance by `shared_grace`.
    async fn start_with(offline: [&str; 2], shared_grace: Duration) -> Cluster {
        let (cp, client, akri, apps) = support::akri_and_apps(ControlPlaneOptions::full()).await;
        let mut nodes = Vec::new();
        for hidden in offline {
            let node = support::start_node(&cp, &client, &akri, |config, _| {
                std::fs::write(&config.debug_echo_mut().availability_file, hidden).unwrap();
                config.instance_grace.shared = shared_grace;
                // A pass at rest every 2 s (30 s in the product): tests wait for passes.
                config.resync = Duration::from_secs(2);
            })
            .await;
            nodes.push(node);
        }
        let driver = support::spawn_driver_controller(&client, &akri);
        let (brokers, metrics) = support::spawn_broker_controller(&client, &akri);
        Cluster {
            cp,
            client,
            akri,
            apps,
            nodes,
            driver,
            brokers,
            metrics,
            offline: offline.map(String::from),
        }
    }

    /// A fresh broker-controller process in place of the running one, its requests under
    /// user agent `agent` (the API server's audit log names it).
    async fn restart_brokers(&mut self, agent: &str) {
        self.brokers.abort();
        let client = self.cp.client_with_agent(agent).await.unwrap();
        (self.brokers, self.metrics) = support::spawn_broker_controller(&client, &self.akri);
    }

    /// A debugEcho DiscoveryConfiguration; waits for its Instances, each with every node that
    /// sees its device (a shared Instance's second node can join after it exists), and
    /// returns the nodes reaching each one.
    async fn discovery(&self, name: &str, descriptions: &str) -> BTreeMap<String, Vec<String>> {
        Api::<DiscoveryConfiguration>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                    "metadata": { "name": name },
                    "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": format!("descriptions: [{descriptions}]") }, "capacity": 2 },
                })),
            )
            .await
            .unwrap();
        let described: Vec<&str> = descriptions.split(',').map(str::trim).collect();
        // Each node sees every device but the one its availability file hides.
        let entries: usize = (described.iter())
            .map(|d| self.offline.iter().filter(|hidden| hidden != d).count())
            .sum();
        support::instances(&self.client, &self.akri, name, |found| {
            found.len() == described.len() && found.values().map(Vec::len).sum::<usize>() == entries
        })
        .await
    }

    fn instances(&self) -> Api<Instance> {
        Api::namespaced(self.client.clone(), &self.akri)
    }

    /// Applies a BrokerTemplate of `examples/brokers/` in the apps namespace; returns its name.
    async fn apply_example(&self, file: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/brokers")
            .join(file);
        let mut template: Value =
            serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        template["metadata"]["namespace"] = json!(self.apps);
        let name = template["metadata"]["name"].as_str().unwrap().to_string();
        Api::<BrokerTemplate>::namespaced(self.client.clone(), &self.apps)
            .patch(&name, &PatchParams::apply("test"), &Patch::Apply(template))
            .await
            .unwrap();
        name
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.apps)
    }

    fn node(&self, name: &str) -> &SimNode {
        self.nodes.iter().find(|n| n.name == name).unwrap()
    }

    /// Waits for `pod` to be bound and its claim allocated; returns its node and the
    /// `akri.sh/instance` of the allocated device.
    async fn bound_with_device(&self, pod: &str) -> (String, String) {
        let pods = self.pods();
        let bound = akri_testing::bound_pod(&self.client, &self.apps, pod, EVENTUALLY).await;
        let node = bound.spec.and_then(|s| s.node_name).unwrap();
        let claim = eventually(&format!("{pod}'s claim"), async || {
            pods.get(pod)
                .await
                .ok()?
                .status?
                .resource_claim_statuses?
                .into_iter()
                .find_map(|s| s.resource_claim_name)
        })
        .await;
        let claim = Api::<ResourceClaim>::namespaced(self.client.clone(), &self.apps)
            .get(&claim)
            .await
            .unwrap();
        let status = claim.status.unwrap_or_default();
        let results = status
            .allocation
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        assert_eq!(results.len(), 1, "{pod}: one device");
        // Where the API server serves binding conditions (1.37), the shared device waited
        // for its node's check before the pod was bound.
        if results[0].binding_conditions.is_some() {
            let reachable = status.devices.iter().flatten().any(|d| {
                d.device == results[0].device
                    && d.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == akri_devices::BINDING_CONDITION && c.status == "True")
            });
            assert!(reachable, "{pod} bound before its node's binding check");
        }
        let slices = Api::<ResourceSlice>::all(self.client.clone())
            .list(&Default::default())
            .await
            .unwrap();
        let device = slices
            .items
            .iter()
            .filter(|s| s.spec.driver == DRIVER && s.spec.pool.name == results[0].pool)
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .find(|d| d.name == results[0].device)
            .expect("the allocated device is published");
        let instance = device.attributes.unwrap()[akri_devices::ATTR_INSTANCE]
            .string
            .clone()
            .unwrap();
        (node, instance)
    }

    /// What the pod's node's kubelet does before starting it: prepares its claim. Asserts
    /// that the container `broker` gets the description of `instance` through CDI.
    async fn assert_prepared_with(&self, node: &str, pod: &str, instance: &str) {
        let peer = &self.node(node).peer;
        let containers = peer.prepare(&self.apps, pod).await.expect("prepared");
        let edits = peer
            .cdi_inject(&containers["broker"])
            .await
            .expect("CDI resolves");
        let env: Vec<String> = serde_json::from_value(edits["env"].clone()).unwrap();
        let description = self
            .instances()
            .get(instance)
            .await
            .unwrap()
            .spec
            .broker_properties["DEBUG_ECHO_DESCRIPTION"]
            .clone();
        assert!(
            env.contains(&format!("DEBUG_ECHO_DESCRIPTION={description}")),
            "{pod}: {env:?}"
        );
    }

    /// A counter of the running broker-controller (0 until it has a sample).
    fn counted(&self, series: &str) -> f64 {
        metric(&self.metrics.encode(), series).unwrap_or(0.0)
    }
}

/// Akri's `brokerPodSpec` on a shared device, as shipped in `examples/brokers/pod-per-node.yaml`:
/// a Pod per Instance per node that sees it (one claim each, so at most `capacity` of them),
/// a Service per Instance and one for the configuration.
#[tokio::test]
async fn each_broker_is_scheduled_with_its_own_device() {
    // cam-a only on node 0, cam-b only on node 1, cam-shared on both (capacity 2).
    let c = Cluster::start(["cam-b", "cam-a"]).await;
    let reach = c.discovery("echo", "cam-a, cam-b, cam-shared").await;
    let shared = reach
        .iter()
        .find(|(_, nodes)| nodes.len() == 2)
        .map(|(i, _)| i.clone())
        .expect("cam-shared is seen by both nodes");
    assert_eq!(
        reach.values().filter(|n| n.len() == 1).count(),
        2,
        "the other cameras by one node each: {reach:?}"
    );
    c.apply_example("pod-per-node.yaml").await;

    let services = Api::<Service>::namespaced(c.client.clone(), &c.apps);
    eventually("the configuration's Service", async || {
        services.get_opt("echo-svc").await.ok()?
    })
    .await;
    let mut brokers = 0;
    for (instance, nodes) in &reach {
        for pinned in nodes {
            let pod = format!("{pinned}-{instance}-pod");
            brokers += 1;
            // Bound to its own node (the device reachable there), its claim allocated to its
            // own Instance: both pods of cam-shared hold one of its 2 slots.
            let (node, allocated) = c.bound_with_device(&pod).await;
            assert_eq!(&node, pinned, "{pod} runs on the node it is made for");
            assert_eq!(&allocated, instance, "{pod} got another device");
            // The kubelet prepares it: the CDI env carries that camera's description.
            c.assert_prepared_with(&node, &pod, instance).await;
            let labels = c.pods().get(&pod).await.unwrap().labels().clone();
            assert_eq!(labels["akri.sh/instance"], *instance, "Akri's labels");
            assert_eq!(labels["akri.sh/target-node"], *pinned);
        }
        let service = services.get(&format!("{instance}-svc")).await.unwrap();
        assert_eq!(
            service.spec.unwrap().selector.unwrap()["akri.sh/instance"],
            *instance
        );
    }
    assert_eq!(
        brokers, 4,
        "one pod for each camera's node, two for {shared}"
    );
    let pods = c.pods().list(&ListParams::default()).await.unwrap();
    assert_eq!(pods.items.len(), brokers, "no other pods");

    // cam-b unplugged (node 1 no longer sees it): its Instance goes, and with it its broker
    // and Service; the others are left alone.
    let only_on = |node: &SimNode| {
        reach
            .iter()
            .find(|(_, nodes)| **nodes == [node.name.clone()])
            .map(|(i, _)| i.clone())
            .unwrap()
    };
    let (cam_a, cam_b) = (only_on(&c.nodes[0]), only_on(&c.nodes[1]));
    let kept = format!("{}-{cam_a}-pod", c.nodes[0].name);
    let kept_uid = c.pods().get(&kept).await.unwrap().uid();
    let gone = format!("{}-{cam_b}-pod", c.nodes[1].name);
    let gone_uid = c.pods().get(&gone).await.unwrap().uid();
    std::fs::write(&c.nodes[1].availability, "cam-a\ncam-b\n").unwrap();
    eventually("cam-b's broker being deleted", async || {
        let pod = c.pods().get_opt(&gone).await.ok()?;
        pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
    eventually("cam-b's Service deleted", async || {
        services
            .get_opt(&format!("{cam_b}-svc"))
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    // The kubelet stops the container and removes the pod (this test plays it).
    let _ = c
        .pods()
        .delete(
            &gone,
            &kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
    assert_eq!(c.pods().get(&kept).await.unwrap().uid(), kept_uid);

    // Plugged in again: a new broker, scheduled with the camera again.
    std::fs::write(&c.nodes[1].availability, "cam-a\n").unwrap();
    eventually("cam-b's broker made again", async || {
        let pod = c.pods().get_opt(&gone).await.ok()??;
        (pod.uid() != gone_uid && pod.metadata.deletion_timestamp.is_none()).then_some(())
    })
    .await;
    let (node, allocated) = c.bound_with_device(&gone).await;
    assert_eq!(
        (node.as_str(), allocated.as_str()),
        (c.nodes[1].name.as_str(), cam_b.as_str())
    );
    services.get(&format!("{cam_b}-svc")).await.unwrap();
}

/// Akri's `brokerJobSpec`, as shipped in `examples/brokers/job-per-instance.yaml`: a Job per
/// Instance runs to completion once, and is neither recreated when it finishes nor when the
/// controller restarts.
#[tokio::test]
async fn a_job_per_instance_runs_once() {
    let mut c = Cluster::start(["", ""]).await;
    let reach = c.discovery("echo", "sensor0, sensor1").await;
    c.apply_example("job-per-instance.yaml").await;

    let jobs = Api::<Job>::namespaced(c.client.clone(), &c.apps);
    let pods = c.pods();
    let mut uids = BTreeMap::new();
    for instance in reach.keys() {
        let job = format!("{instance}-job");
        let pod = eventually(&format!("the pod of {job}"), async || {
            let list = pods
                .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
                .await
                .ok()?;
            list.items.first().map(|p| p.name_any())
        })
        .await;
        let (node, allocated) = c.bound_with_device(&pod).await;
        assert_eq!(&allocated, instance, "{pod} got another device");
        c.assert_prepared_with(&node, &pod, instance).await;
        // The container runs and exits 0 (this test plays the container runtime); the kubelet
        // unprepares the claim and reports the pod done.
        c.node(&node).peer.unprepare(&c.apps, &pod).await.unwrap();
        pods.patch_status(
            &pod,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "phase": "Succeeded",
            }})),
        )
        .await
        .unwrap();
        let uid = eventually(&format!("{job} complete"), async || {
            let job = jobs.get(&job).await.ok()?;
            let complete = job
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True");
            complete.then(|| job.uid().unwrap())
        })
        .await;
        uids.insert(job, uid);
    }

    // The running controller has recorded every finished Job in the template's status.
    let templates = Api::<akri_api::v1::BrokerTemplate>::namespaced(c.client.clone(), &c.apps);
    eventually("every finished Job in the status", async || {
        let list = templates.list(&ListParams::default()).await.ok()?;
        let finished = (list.items.iter())
            .filter_map(|t| t.status.as_ref())
            .map(|s| s.finished_jobs.len())
            .sum::<usize>();
        (finished == uids.len()).then_some(())
    })
    .await;
    // A fresh controller looks at everything again and writes nothing: the completed Jobs
    // stay as they are. Counted by the API server (its audit log), not by the controller.
    let writes = c.counted("akri_broker_controller_object_writes_total{result=\"apply\"}");
    c.restart_brokers("restarted-broker-controller").await;
    eventually("the restarted controller reconciles", async || {
        (c.counted("akri_broker_controller_reconciles_total{result=\"ok\"}") > 0.0).then_some(())
    })
    .await;
    // The template's reconcile is done, and so what it wrote is audited (a write is logged
    // before it is answered).
    let rewritten: Vec<_> = (c.cp.audited_writes().unwrap().into_iter())
        .filter(|w| w.user_agent == "restarted-broker-controller")
        .collect();
    assert!(
        rewritten.is_empty(),
        "the restarted controller wrote (before the restart it had applied {writes}): {rewritten:#?}"
    );
    for (job, uid) in &uids {
        let live = jobs.get(job).await.unwrap();
        assert_eq!(live.uid().as_ref(), Some(uid), "{job} was recreated");
        assert_eq!(live.status.unwrap().succeeded, Some(1), "{job} ran once");
    }
    let pods = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        pods.items.len(),
        uids.len(),
        "one pod per Job, none started again"
    );
    assert!(
        pods.items
            .iter()
            .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
    );
}

/// An IP camera rebooting (60-120 s in the field) is gone from discovery for a while: within
/// the shared-device grace (Akri's 300 s; 20 s here) its Instance stays, so its broker pod and
/// Service are not redeployed; gone for good, they go once the grace is over.
#[tokio::test]
async fn a_camera_rebooting_within_the_shared_grace_keeps_its_brokers() {
    let grace = Duration::from_secs(20);
    let c = Cluster::start_with(["", "cam"], grace).await;
    let reach = c.discovery("echo", "cam").await;
    let (instance, nodes) = reach.iter().next().expect("one camera");
    assert_eq!(nodes, &[c.nodes[0].name.clone()]);
    c.apply_example("pod-per-node.yaml").await;
    let pod = format!("{}-{instance}-pod", c.nodes[0].name);
    c.bound_with_device(&pod).await;
    let services = Api::<Service>::namespaced(c.client.clone(), &c.apps);
    let service = format!("{instance}-svc");
    let uids = async || {
        let pod = c.pods().get_opt(&pod).await.unwrap();
        let service = services.get_opt(&service).await.unwrap();
        let instance = c.instances().get_opt(instance).await.unwrap();
        let live = |deleting: Option<_>| deleting.is_none();
        (
            pod.filter(|p| live(p.metadata.deletion_timestamp.clone()))
                .map(|p| p.uid()),
            service.map(|s| s.uid()),
            instance.map(|i| i.uid()),
        )
    };
    let before = uids().await;
    assert!(
        before.0.is_some() && before.1.is_some() && before.2.is_some(),
        "{before:?}"
    );

    // The reboot: 8 s offline, checked every second, then back.
    std::fs::write(&c.nodes[0].availability, "cam\n").unwrap();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(uids().await, before, "during the reboot");
    }
    std::fs::write(&c.nodes[0].availability, "").unwrap();
    // Back: the node's agent hears it from its handler and has a whole pass after that.
    let node = &c.nodes[0];
    let driver = akri_devices::driver_name("debugEcho");
    support::wait_reported(&node.agent, (&driver, instance), true).await;
    node.whole_pass().await;
    assert_eq!(uids().await, before, "after the reboot");

    // Gone for good: the Instance, and with it the broker and its Service, leave after the
    // grace and not before.
    std::fs::write(&c.nodes[0].availability, "cam\n").unwrap();
    let gone_at = std::time::Instant::now();
    eventually(
        "the Instance, its broker and its Service gone",
        async || (uids().await == (None, None, None)).then_some(()),
    )
    .await;
    assert!(
        gone_at.elapsed() >= grace,
        "gone after {:?}, before the grace ({grace:?})",
        gone_at.elapsed()
    );
}

/// A BrokerTemplate on devices listed by hand (the `static` handler, embedded): a broker Pod
/// per Instance, bound to the node the device is listed for, its claim allocated that device,
/// and the kubelet's prepare handing the container the listed property.
#[tokio::test]
async fn brokers_work_on_devices_listed_by_hand() {
    let (cp, client, akri, apps) = support::akri_and_apps(ControlPlaneOptions::full()).await;
    let node = support::start_node(&cp, &client, &akri, |config, _| {
        (config.embedded_handlers).push(akri_kubelet_plugin::embedded::Embedded::Static);
    })
    .await;
    let _driver = akri_runtime::AbortOnDrop(support::spawn_driver_controller(&client, &akri));
    let _brokers = akri_runtime::AbortOnDrop(support::spawn_broker_controller(&client, &akri).0);
    let details = format!(
        "devices:\n- {{id: plc, nodes: [{}], properties: {{PLC_ADDRESS: '10.1.3.7:502'}}}}\n",
        node.name
    );
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": "line-3" },
                "spec": { "discoveryHandler": { "name": "static", "discoveryDetails": details } },
            })),
        )
        .await
        .unwrap();
    let found = support::instances(&client, &akri, "line-3", |found| found.len() == 1).await;
    let instance = found.keys().next().unwrap().clone();
    Api::<BrokerTemplate>::namespaced(client.clone(), &apps)
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "BrokerTemplate",
                "metadata": { "name": "plc-brokers" },
                "spec": {
                    "discoveryReference": { "name": "line-3" },
                    "instanceBrokerResources": [{
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": { "name": "$(AKRI_INSTANCE)-pod" },
                        "spec": { "containers": [{
                            "name": "broker", "image": "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
                            "command": ["sh", "-c", "env | grep PLC_; sleep infinity"],
                        }] },
                    }],
                },
            })),
        )
        .await
        .unwrap();
    let pod = format!("{instance}-pod");
    let bound = akri_testing::bound_pod(&client, &apps, &pod, EVENTUALLY).await;
    assert_eq!(
        bound.spec.and_then(|s| s.node_name),
        Some(node.name.clone())
    );
    let containers = node.peer.prepare(&apps, &pod).await.expect("prepared");
    let edits = (node.peer.cdi_inject(&containers["broker"]))
        .await
        .expect("CDI resolves");
    let env: Vec<String> = serde_json::from_value(edits["env"].clone()).unwrap();
    assert!(
        env.contains(&"PLC_ADDRESS=10.1.3.7:502".to_string()),
        "{env:?}"
    );
}
