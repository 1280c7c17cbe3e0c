//! A cluster for the driver-controller: a real control plane (scheduler and controller-manager
//! included), simulated nodes each running the kubelet-plugin's agent (as the chart's
//! kubelet-plugin identity) with the embedded debugEcho handler, and the controller itself.

#![allow(dead_code, reason = "each test binary uses part of the support")]

use akri_driver_controller::controller::{self, ControllerConfig, SHARED_CONFIGURATION_LABEL};
use akri_driver_controller::metrics::Metrics;
use akri_driver_controller::shared_devices::selected_nodes;
use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceRequestAllocationResult, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

pub const DRIVER: &str = "debugecho.akri.sh";
pub const TIMEOUT: Duration = Duration::from_secs(90);

pub use akri_testing::eventually;

pub use akri_testing::from_json;

/// A full control plane of its own with the akri.sh CRDs, a client and a namespace for
/// Instances; component logs go to the test's output ([`akri_testing::test_logs`]).
pub async fn control_plane() -> (ControlPlane, kube::Client, String) {
    akri_testing::test_logs();
    let cp = ControlPlane::start(ControlPlaneOptions {
        crds: akri_api::crds::all(),
        ..ControlPlaneOptions::full()
    })
    .await
    .expect("control plane");
    let client = cp.client().await.unwrap();
    let namespace = cp.create_namespace("akri").await.unwrap();
    (cp, client, namespace)
}

pub struct Cluster {
    pub cp: ControlPlane,
    pub client: kube::Client,
    pub namespace: String,
    /// What this version's API server keeps (by its gates: [`ControlPlane::capabilities`]).
    pub support: akri_testing::Capabilities,
    pub nodes: Vec<String>,
    pub metrics: Metrics,
    availability: Vec<std::path::PathBuf>,
    agents: Vec<agent::Agent>,
    _dirs: Vec<tempfile::TempDir>,
    controller: tokio::task::JoinHandle<()>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.controller.abort();
    }
}

impl Cluster {
    /// `nodes` simulated nodes whose debugEcho handler registers as `shared` or not, and the
    /// controller. Its own control plane: agents discover every (cluster-scoped)
    /// configuration of their handler.
    pub async fn start(nodes: usize, shared: bool) -> Cluster {
        Self::start_with(nodes, shared, |_| {}).await
    }

    /// [`Cluster::start`] with the controller's configuration adjusted by `adjust`.
    pub async fn start_with(
        nodes: usize,
        shared: bool,
        adjust: impl FnOnce(&mut ControllerConfig),
    ) -> Cluster {
        Self::start_with_agents(nodes, shared, adjust, |_| {}).await
    }

    /// [`Cluster::start_with`], each agent's configuration adjusted by `agent` too.
    pub async fn start_with_agents(
        nodes: usize,
        shared: bool,
        adjust: impl FnOnce(&mut ControllerConfig),
        agent: impl Fn(&mut AgentConfig),
    ) -> Cluster {
        let (cp, client, namespace) = control_plane().await;
        // What the API server must keep on this version (its gates), not what the probe says.
        let support = cp.capabilities();
        // The agents run as the chart's kubelet-plugin identity: no claim is listed or
        // watched, a binding check comes routed by the controller.
        let node_client = akri_testing::rbac::kubelet_plugin_client(&cp, &namespace)
            .await
            .unwrap();
        let mut agents = Vec::new();
        let mut dirs = Vec::new();
        let mut names = Vec::new();
        let mut availability = Vec::new();
        for _ in 0..nodes {
            let name = ControlPlane::unique_name("node");
            cp.create_node(&name).await.unwrap();
            let dir = tempfile::tempdir().unwrap();
            let mut config = AgentConfig::embedded(&name, &namespace, dir.path());
            let echo = config.debug_echo_mut();
            echo.shared = shared;
            availability.push(echo.availability_file.clone());
            agent(&mut config);
            agents.push(
                agent::start(node_client.clone(), config)
                    .await
                    .expect("agent starts"),
            );
            dirs.push(dir);
            names.push(name);
        }
        let metrics = Metrics::default();
        let mut config = ControllerConfig::new(&namespace);
        config.debounce = Duration::from_millis(100);
        adjust(&mut config);
        let controller = tokio::spawn({
            let (client, metrics) = (client.clone(), metrics.clone());
            async move {
                controller::run(client, config, metrics)
                    .await
                    .expect("controller runs")
            }
        });
        Cluster {
            cp,
            client,
            namespace,
            support,
            nodes: names,
            metrics,
            availability,
            agents,
            _dirs: dirs,
            controller,
        }
    }

    /// Each node's debugEcho availability file ("OFFLINE" hides every device).
    pub fn availability_files(&self) -> &[std::path::PathBuf] {
        &self.availability
    }

    /// Waits until node `index`'s agent no longer has `device` (of [`DRIVER`]) from its
    /// handler: what that node's binding check consults. As
    /// `akri_testing::components::wait_reported` does; this suite builds akri-testing without
    /// its components, which would build this crate a second time.
    pub async fn wait_unreported(&self, index: usize, device: &str) {
        let (node, agent) = (&self.nodes[index], &self.agents[index]);
        eventually(
            &format!("{node}'s handler no longer reports {device}"),
            async || {
                agent
                    .devices()
                    .lookup(DRIVER, device)
                    .is_none()
                    .then_some(())
            },
        )
        .await;
    }

    /// A debugEcho DiscoveryConfiguration finding `descriptions`.
    pub async fn discovery(
        &self,
        prefix: &str,
        descriptions: &[&str],
        capacity: i32,
        unique_devices: bool,
    ) -> String {
        let name = ControlPlane::unique_name(prefix);
        let details = format!("descriptions: [{}]", descriptions.join(", "));
        Api::<akri_api::v1::DiscoveryConfiguration>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                    "metadata": { "name": name },
                    "spec": {
                        "discoveryHandler": { "name": "debugEcho", "discoveryDetails": details },
                        "capacity": capacity,
                        "uniqueDevices": unique_devices,
                    },
                })),
            )
            .await
            .unwrap();
        name
    }

    /// Waits until the class exists and `devices` devices of the configuration are published.
    pub async fn wait_published(&self, configuration: &str, devices: i32) {
        let api = Api::<akri_api::v1::DiscoveryConfiguration>::all(self.client.clone());
        eventually(
            &format!("{devices} devices of {configuration} published"),
            async || {
                let status = api.get(configuration).await.ok()?.status?;
                (status.devices_published == devices && status.device_class_name.is_some())
                    .then_some(())
            },
        )
        .await;
    }

    /// The configuration's `Ready` condition (it must have one).
    pub async fn ready_condition(
        &self,
        configuration: &str,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        let status = Api::<akri_api::v1::DiscoveryConfiguration>::all(self.client.clone())
            .get(configuration)
            .await
            .unwrap()
            .status
            .expect("status written");
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == akri_api::v1::CONDITION_READY)
            .expect("a Ready condition")
    }

    /// A pod with one claim of one request: `count` devices of `class`.
    pub async fn pod_claiming(&self, class: &str, count: i64) -> String {
        let name = ControlPlane::unique_name("pod");
        let devices = json!({
            "requests": [{ "name": "req", "exactly": { "deviceClassName": class, "count": count } }],
        });
        Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace)
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "metadata": { "name": name },
                    "spec": { "devices": devices },
                })),
            )
            .await
            .unwrap();
        self.create_pod(json!({
            "metadata": { "name": name },
            "spec": {
                "resourceClaims": [{ "name": "c", "resourceClaimName": name }],
                "containers": [{ "name": "c", "image": "none", "resources": { "claims": [{ "name": "c" }] } }],
            },
        }))
        .await
    }

    pub async fn create_pod(&self, pod: Value) -> String {
        let pod: Pod = from_json(pod);
        let name = pod.metadata.name.clone().unwrap();
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        name
    }

    /// Deletes a pod at once (no kubelet would confirm a graceful deletion) and its claim.
    pub async fn delete_pod(&self, name: &str) {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .delete(name, &now)
            .await
            .unwrap();
        let _ = Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace)
            .delete(name, &now)
            .await;
    }

    /// The node a pod is bound to.
    pub async fn bound_node(&self, pod: &str) -> Option<String> {
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .get(pod)
            .await
            .ok()?
            .spec?
            .node_name
    }

    /// Whether the scheduler reported the pod unschedulable.
    pub async fn unschedulable(&self, pod: &str) -> Option<String> {
        let pod = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .get(pod)
            .await
            .ok()?;
        pod.status?.conditions?.into_iter().find_map(|c| {
            (c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable"))
            .then(|| c.message.unwrap_or_default())
        })
    }

    /// The devices allocated to a claim.
    pub async fn allocated(&self, claim: &str) -> Option<Vec<DeviceRequestAllocationResult>> {
        Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace)
            .get(claim)
            .await
            .ok()?
            .status?
            .allocation?
            .devices?
            .results
    }

    /// Every allocated device result in the namespace, by claim.
    pub async fn all_allocations(&self) -> BTreeMap<String, Vec<DeviceRequestAllocationResult>> {
        Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|claim| {
                let results = claim.status?.allocation?.devices?.results?;
                Some((claim.metadata.name?, results))
            })
            .collect()
    }
}

/// The nodes the published shared devices of Instance `instance` select (each device's own
/// selector, or its slice's); `None` while none of its devices is published.
pub async fn shared_device_nodes(
    client: &kube::Client,
    instance: &str,
) -> Option<BTreeSet<String>> {
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&Default::default())
        .await
        .ok()?
        .items;
    // The Instance's device, or one of its slot devices (`<instance>-<slot>`).
    let of_instance = |device: &str| {
        device == instance
            || device
                .strip_prefix(&format!("{instance}-"))
                .is_some_and(|slot| slot.parse::<u32>().is_ok())
    };
    let mut nodes = BTreeSet::new();
    let mut found = false;
    for slice in &slices {
        for device in slice.spec.devices.iter().flatten() {
            if !of_instance(&device.name) {
                continue;
            }
            assert!(
                slice.spec.node_name.is_none(),
                "shared devices are never in a node's pool: {slice:?}"
            );
            found = true;
            let selector = device
                .node_selector
                .as_ref()
                .or(slice.spec.node_selector.as_ref())?;
            nodes.extend(selected_nodes(selector));
        }
    }
    found.then_some(nodes)
}

/// The shared devices of `configuration` with the effects of their `akri.sh/not-discovered`
/// taints, sorted.
pub async fn shared_device_taints(
    client: &kube::Client,
    configuration: &str,
) -> Vec<(String, Vec<String>)> {
    akri_testing::device_taint_effects(
        &Api::all(client.clone()),
        &ListParams::default().labels(&format!("{SHARED_CONFIGURATION_LABEL}={configuration}")),
        akri_devices::NOT_DISCOVERED_TAINT,
    )
    .await
    .unwrap()
}

pub fn unique(prefix: &str) -> String {
    ControlPlane::unique_name(prefix)
}

/// The Instance a DRA device name belongs to (the device itself, or `<instance>-<slot>`).
pub fn instance_of(device: &str, configuration: &str) -> String {
    let rest = device
        .strip_prefix(&format!("{configuration}-"))
        .expect("a device of the configuration");
    format!("{configuration}-{}", &rest[..6])
}
