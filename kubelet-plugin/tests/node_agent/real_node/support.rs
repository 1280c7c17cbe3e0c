//! One real node (containerd + kubelet) with the agent next to it, on a control plane of its
//! own (every agent discovers every configuration of its handlers), and the `fixture`
//! discovery handler: an external handler, speaking Akri's protocol, whose one device carries
//! properties, a mount and a device node, as udev devices do.

use akri_discovery_handler::{DeviceLists, Discover, Served};
use akri_kubelet_plugin::agent::{self, AgentConfig};
use akri_kubelet_plugin::discovery::{Endpoint, RegisteredHandler, handler};
use akri_kubelet_plugin::legacy::LegacyOptions;
use akri_proto::discovery::v0 as proto;
use akri_testing::{ControlPlane, ControlPlaneOptions, RealNode, from_json};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The fixture handler's name, as configurations name it.
pub const FIXTURE: &str = "fixture";
/// What the fixture device's mount shows inside a container, and where.
pub const GREETING: &str = "hello from the host";
pub const MOUNT_PATH: &str = "/fixture";
/// Where the fixture device's node (the host's /dev/null) appears inside a container.
pub const DEVICE_PATH: &str = "/dev/fixture-null";

pub struct Cluster {
    pub client: kube::Client,
    pub ns: String,
    pub node: RealNode,
    registration: PathBuf,
    // Field order is drop order: the agent and handler before the node, the control plane
    // last.
    agent: Option<(agent::Agent, FixtureHandler)>,
    dir: tempfile::TempDir,
    cp: ControlPlane,
}

impl Cluster {
    /// A control plane, the real node, the agent (DRA, the legacy device plugins and the
    /// embedded udev handler) and the fixture handler registered with it.
    pub async fn start() -> Cluster {
        let mut cluster = Self::without_agent().await;
        cluster.start_agent(|_| {}).await;
        cluster
    }

    /// A control plane with Akri's CRDs and the real node; no agent yet.
    pub async fn without_agent() -> Cluster {
        Self::without_agent_on(ControlPlaneOptions::full()).await
    }

    /// [`without_agent`](Self::without_agent) on a control plane started with `options`.
    pub async fn without_agent_on(options: ControlPlaneOptions) -> Cluster {
        let cp = ControlPlane::start(options).await.expect("control plane");
        cp.install_crds(&akri_api::crds::all()).await.unwrap();
        let client = cp.client().await.unwrap();
        let ns = cp.create_namespace("real").await.unwrap();
        // Where the driver-controller mirrors the configurations; the tests that run it run
        // it beside this (both write the same).
        akri_testing::components::spawn_spec_mirror(&client, &ns);
        let name = ControlPlane::unique_name("real");
        let node = RealNode::start(&cp, &name).await.expect("real node");
        let dir = tempfile::tempdir().unwrap();
        let registration = AgentConfig::embedded(&name, &ns, dir.path()).discovery_socket;
        Cluster {
            client,
            ns,
            node,
            registration,
            agent: None,
            dir,
            cp,
        }
    }

    /// Starts the agent (its configuration adjusted by `adjust`) and registers the fixture
    /// handler with it.
    pub async fn start_agent(&mut self, adjust: impl FnOnce(&mut AgentConfig)) {
        let node = &self.node;
        let mut config = AgentConfig::embedded(node.node_name(), &self.ns, self.dir.path())
            .kubelet_dirs(node.registry_dir(), node.plugins_dir(), node.cdi_dir());
        config.embedded_handlers = vec![akri_kubelet_plugin::embedded::Embedded::Udev];
        config.legacy = Some(LegacyOptions {
            device_plugin_dir: node.device_plugin_dir(),
            pod_resources_socket: Some(node.pod_resources_socket()),
            reclaim_grace: Duration::from_secs(5),
            reclaim_interval: Duration::from_secs(1),
            namespaces: [self.ns.clone()].into(),
            broker_property_names: ["RESOLUTION".to_string()].into(),
        });
        // The fixture's mount (a directory under the temporary directory) and device node
        // (the host's /dev/null), allowed as an operator allows a handler kind's.
        let temporary = format!("{}/", std::env::temp_dir().display());
        config.handler_access.insert(
            FIXTURE.into(),
            from_json(json!({
                "deviceNodes": [{ "path": "/dev/null", "writable": true }],
                "mounts": [{ "path": temporary }],
                "environment": ["FIXTURE_SERIAL", "FIXTURE_MODEL"],
            })),
        );
        adjust(&mut config);
        let agent = agent::start(self.client.clone(), config)
            .await
            .expect("agent starts");
        let fixture = FixtureHandler::serve(self.dir.path()).await;
        let socket = fixture.socket.clone();
        self.agent = Some((agent, fixture));
        self.register_handler(FIXTURE, &socket, false).await;
    }

    /// Serves and registers another external handler, `name`, reporting `devices`, until the
    /// returned value is dropped.
    pub async fn external_handler(&self, name: &str, devices: Vec<proto::Device>) -> Served {
        let socket = self.dir.path().join(format!("{name}.sock"));
        let served = Served::start(Fixture(devices), &socket).unwrap();
        self.register_handler(name, &socket, false).await;
        served
    }

    /// Registers an external handler serving on `socket` with the agent, as any handler does.
    pub async fn register_handler(&self, name: &str, socket: &Path, shared: bool) {
        let registered = RegisteredHandler {
            name: name.into(),
            endpoint: Endpoint::Uds(socket.to_path_buf()),
            shared,
        };
        handler::register(&self.registration, &registered)
            .await
            .expect("the agent takes the handler");
    }

    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates a pod of one busybox container running `script` (then sleeping), with
    /// `spec` merged into its pod spec and `container` into its container.
    pub async fn pod(&self, name: &str, script: &str, spec: Value, container: Value) {
        let mut container_json = json!({
            "name": "main",
            "image": self.node.busybox_image().unwrap(),
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", format!("{script}\necho END-OF-OUTPUT\nexec sleep 3600")],
        });
        merge(&mut container_json, container);
        let mut pod = json!({
            "metadata": { "name": name },
            "spec": {
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "containers": [container_json],
            },
        });
        merge(&mut pod["spec"], spec);
        self.pods()
            .create(&PostParams::default(), &from_json(pod))
            .await
            .unwrap();
    }

    /// The pod's output once its script has finished (the line `END-OF-OUTPUT`).
    pub async fn output(&self, pod: &str) -> String {
        let pods = self.pods();
        self.node
            .eventually(
                &format!("pod {pod}'s output"),
                Duration::from_secs(90),
                async || {
                    let logs = pods.logs(pod, &LogParams::default()).await.ok()?;
                    logs.contains("END-OF-OUTPUT").then_some(logs)
                },
            )
            .await
    }

    /// Deletes a pod and waits until it is gone (the kubelet has stopped it and released
    /// its resources).
    pub async fn delete_pod(&self, pod: &str) {
        let pods = self.pods();
        pods.delete(pod, &DeleteParams::default()).await.unwrap();
        self.node
            .eventually(
                &format!("pod {pod} gone"),
                Duration::from_secs(60),
                async || pods.get_opt(pod).await.ok()?.is_none().then_some(()),
            )
            .await;
    }

    /// The CDI spec files in the directory containerd reads.
    pub fn cdi_specs(&self) -> Vec<PathBuf> {
        let mut specs: Vec<PathBuf> = std::fs::read_dir(self.node.cdi_dir())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json" || e == "yaml"))
            .collect();
        specs.sort();
        specs
    }
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (into, from) if !from.is_null() => *into = from,
        _ => {}
    }
}

/// The `fixture` discovery handler: one device, `fixture-0`, whatever the details say.
pub struct FixtureHandler {
    socket: PathBuf,
    _served: Served,
    _host: tempfile::TempDir,
}

impl FixtureHandler {
    async fn serve(dir: &Path) -> FixtureHandler {
        let host = tempfile::tempdir().unwrap();
        std::fs::write(host.path().join("greeting"), GREETING).unwrap();
        let device = proto::Device {
            id: "fixture-0".into(),
            properties: [
                ("FIXTURE_SERIAL".to_string(), "SN-0042".to_string()),
                ("FIXTURE_MODEL".to_string(), "bench rig".to_string()),
            ]
            .into(),
            mounts: vec![proto::Mount {
                container_path: MOUNT_PATH.into(),
                host_path: host.path().display().to_string(),
                read_only: true,
            }],
            device_specs: vec![proto::DeviceSpec {
                container_path: DEVICE_PATH.into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            }],
        };
        let socket = dir.join("fixture.sock");
        let served = Served::start(Fixture(vec![device]), &socket).unwrap();
        FixtureHandler {
            socket,
            _served: served,
            _host: host,
        }
    }
}

/// A handler reporting these devices, whatever the details say.
struct Fixture(Vec<proto::Device>);

impl Discover for Fixture {
    fn start(
        &self,
        _: proto::DiscoverRequest,
        mut lists: DeviceLists,
    ) -> Result<(), tonic::Status> {
        let devices = self.0.clone();
        tokio::spawn(async move {
            lists.send(devices).await;
            // The stream stays open: closing it would tell the agent the handler is gone.
            lists.closed().await;
        });
        Ok(())
    }
}
