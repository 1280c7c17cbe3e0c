//! Devices reaching real containers: the real scheduler, the real kubelet (DRA manager and
//! device manager), containerd applying CDI edits and the device plugin's Allocate answer,
//! runc starting busybox. What the container prints is what these tests check.

mod support;

use akri_testing::components::SimNode;
use akri_testing::{ControlPlane, ControlPlaneOptions, LoopDevice, from_json};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;
use support::{Cluster, DEVICE_PATH, FIXTURE, GREETING, MOUNT_PATH};

/// What each test container prints about its devices: the handlers' properties in its
/// environment, the fixture's mount and device node.
fn report() -> String {
    format!(
        "env | grep -E '^(DEBUG_ECHO|FIXTURE|RESOLUTION)' | sort\n\
         cat {MOUNT_PATH}/greeting 2>/dev/null && echo\n\
         stat -c 'device %n: %F %t:%T' {DEVICE_PATH} 2>/dev/null\n\
         true"
    )
}

/// The lines a container holding the fixture device prints.
fn fixture_lines() -> Vec<String> {
    vec![
        "FIXTURE_MODEL=bench rig".into(),
        "FIXTURE_SERIAL=SN-0042".into(),
        GREETING.into(),
        format!("device {DEVICE_PATH}: character special file 1:3"),
    ]
}

fn assert_shows(output: &str, expected: &[String]) {
    for line in expected {
        assert!(
            output.lines().any(|l| l == line),
            "the container does not show {line:?}; it printed:\n{output}"
        );
    }
}

impl Cluster {
    /// A DiscoveryConfiguration of `handler` with `details`, its DeviceClass (the
    /// driver-controller's job, written here as it writes it) and a ResourceClaimTemplate
    /// `<name>` asking for one of its devices.
    async fn dra_configuration(&self, name: &str, handler: &str, details: &str) {
        (self.dra_configuration_allowing(name, handler, details, serde_json::Value::Null)).await;
    }

    /// [`Cluster::dra_configuration`], whose devices may bring what `access` (its
    /// `containerAccess`, as an administrator writes it) allows.
    async fn dra_configuration_allowing(
        &self,
        name: &str,
        handler: &str,
        details: &str,
        access: serde_json::Value,
    ) {
        (self.create_configuration(name, handler, details, json!([]), access)).await;
        let class: DeviceClass = from_json(json!({
            "metadata": { "name": name },
            "spec": { "selectors": [{ "cel": { "expression": format!(
                "device.attributes['akri.sh'].configuration == '{name}'"
            ) } }] },
        }));
        Api::<DeviceClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        self.claim_template(name).await;
    }

    /// A DiscoveryConfiguration `name` of `handler` with `details`, `properties` and
    /// `access` (its `containerAccess`, if not null).
    async fn create_configuration(
        &self,
        name: &str,
        handler: &str,
        details: &str,
        properties: serde_json::Value,
        access: serde_json::Value,
    ) {
        let mut spec = json!({ "discoveryHandler": {
            "name": handler, "discoveryDetails": details, "discoveryProperties": properties,
        } });
        if !access.is_null() {
            spec["containerAccess"] = access;
        }
        let configuration: akri_api::v1::DiscoveryConfiguration = from_json(json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": name },
            "spec": spec,
        }));
        Api::<akri_api::v1::DiscoveryConfiguration>::all(self.client.clone())
            .create(&PostParams::default(), &configuration)
            .await
            .unwrap();
    }

    /// A ResourceClaimTemplate `name` asking for one device of DeviceClass `name`.
    async fn claim_template(&self, name: &str) {
        let template: ResourceClaimTemplate = from_json(json!({
            "metadata": { "name": name },
            "spec": { "spec": { "devices": { "requests": [
                { "name": "device", "exactly": { "deviceClassName": name } },
            ] } } },
        }));
        Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
    }

    /// A pod whose container holds one claim from each template in `templates`.
    async fn claiming_pod(&self, name: &str, templates: &[&str]) {
        let claims: Vec<_> = templates
            .iter()
            .map(|t| json!({ "name": t, "resourceClaimTemplateName": t }))
            .collect();
        let uses: Vec<_> = templates.iter().map(|t| json!({ "name": t })).collect();
        self.pod(
            name,
            &report(),
            json!({ "resourceClaims": claims }),
            json!({ "resources": { "claims": uses } }),
        )
        .await;
    }

    /// The ONVIF handler, external (its own socket, registered like Akri's), rescanning every
    /// second; served until the returned value is dropped.
    async fn onvif_handler(&self) -> (akri_discovery_handler::Served, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("onvif.sock");
        let onvif = akri_onvif::Onvif {
            rescan: Duration::from_secs(1),
            ..Default::default()
        };
        let served = akri_discovery_handler::Served::start(onvif, &socket).unwrap();
        self.register_handler("onvif", &socket, true).await;
        (served, dir)
    }

    /// A pod whose container holds one claim from template `template` and runs `script`.
    async fn script_pod(&self, name: &str, template: &str, script: &str) {
        self.pod(
            name,
            script,
            json!({ "resourceClaims": [{ "name": template, "resourceClaimTemplateName": template }] }),
            json!({ "resources": { "claims": [{ "name": template }] } }),
        )
        .await;
    }

    /// A DiscoveryConfiguration of the shared handler `handler` (with `properties` as its
    /// discoveryProperties), and a ResourceClaimTemplate `<name>` for one of its devices once
    /// the driver-controller (see [`Cluster::driver_controller`]) has made its DeviceClass.
    async fn shared_configuration(
        &self,
        name: &str,
        handler: &str,
        details: &str,
        properties: serde_json::Value,
    ) {
        (self.create_configuration(name, handler, details, properties, serde_json::Value::Null))
            .await;
        let classes = Api::<DeviceClass>::all(self.client.clone());
        self.node
            .eventually(
                "the driver-controller's DeviceClass",
                Duration::from_secs(30),
                async || classes.get_opt(name).await.ok()?.map(|_| ()),
            )
            .await;
        self.claim_template(name).await;
    }

    /// The driver-controller, in this process: shared devices are its to publish. Runs until
    /// the returned handle is dropped.
    fn driver_controller(&self) -> AbortOnDrop {
        let client = self.client.clone();
        let mut config = akri_driver_controller::controller::ControllerConfig::new(&self.ns);
        // Binding conditions where the API server keeps them (opt-in in the product).
        config.binding_conditions = None;
        AbortOnDrop(tokio::spawn(async move {
            let _ =
                akri_driver_controller::controller::run(client, config, Default::default()).await;
        }))
    }

    /// A v0 Configuration of the fixture handler, served as device plugins; returns its
    /// configuration-level resource once the node offers it.
    async fn legacy_configuration(&self) -> String {
        let config = ControlPlane::unique_name("legacy");
        let configuration: akri_api::v0::Configuration = from_json(json!({
            "apiVersion": "akri.sh/v0", "kind": "Configuration",
            "metadata": { "name": config },
            "spec": {
                "discoveryHandler": { "name": FIXTURE, "discoveryDetails": "{}" },
                "capacity": 2,
                "brokerProperties": { "RESOLUTION": "1080p" },
            },
        }));
        Api::<akri_api::v0::Configuration>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &configuration)
            .await
            .unwrap();
        let resource = format!("akri.sh/{config}");
        self.wait_allocatable(&resource).await;
        resource
    }

    async fn wait_allocatable(&self, resource: &str) {
        let nodes = Api::<Node>::all(self.client.clone());
        self.node
            .eventually(
                &format!("{resource} allocatable on the node"),
                Duration::from_secs(60),
                async || {
                    let node = nodes.get(self.node.node_name()).await.ok()?;
                    let allocatable = node.status?.allocatable?;
                    (allocatable.get(resource)?.0 != "0").then_some(())
                },
            )
            .await;
    }

    /// A pod whose container asks for one `resource` (a device plugin's).
    async fn legacy_pod(&self, name: &str, resource: &str) {
        self.pod(
            name,
            &report(),
            json!({}),
            json!({ "resources": { "limits": { resource: "1" } } }),
        )
        .await;
    }

    async fn node_of(&self, pod: &str) -> String {
        self.pods()
            .get(pod)
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .expect("a pod with output is bound")
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `(container id, restart count)` of a pod's one container.
async fn container(pods: &Api<Pod>, pod: &str) -> (String, i32) {
    // The kubelet reports the container's id a moment after the container has started (and
    // printed): wait for it.
    akri_testing::eventually_within(
        &format!("pod {pod}'s container id"),
        Duration::from_secs(30),
        async || {
            let status = pods.get(pod).await.ok()?.status?;
            let container = status.container_statuses?.into_iter().next()?;
            let id = container.container_id.filter(|id| !id.is_empty())?;
            Some((id, container.restart_count))
        },
    )
    .await
}

#[tokio::test]
async fn a_claimed_device_reaches_the_container_through_cdi_shows_in_the_claim_and_leaves_with_the_pod()
 {
    let c = Cluster::start().await;
    let echo = ControlPlane::unique_name("echo");
    let fixture = ControlPlane::unique_name("fixture");
    c.dra_configuration(&echo, "debugEcho", "descriptions: [lobby]")
        .await;
    c.dra_configuration(&fixture, FIXTURE, "{}").await;
    assert!(c.cdi_specs().is_empty(), "no claim prepared yet");

    c.claiming_pod("broker", &[&echo, &fixture]).await;
    let output = c.output("broker").await;
    assert_eq!(
        c.node_of("broker").await,
        c.node.node_name(),
        "scheduled onto the real node"
    );
    let mut expected = fixture_lines();
    expected.push("DEBUG_ECHO_DESCRIPTION=lobby".into());
    assert_shows(&output, &expected);
    let specs = c.cdi_specs();
    assert!(
        !specs.is_empty(),
        "containerd got the devices from CDI specs"
    );

    // Each claim's status shows its device: the driver's entry, with Instance and properties.
    let claims = Api::<ResourceClaim>::namespaced(c.client.clone(), &c.ns);
    let pod = c.pods().get("broker").await.unwrap();
    let claim_names: Vec<String> = (pod.status.unwrap().resource_claim_statuses)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|status| status.resource_claim_name)
        .collect();
    // Written off the kubelet's path, right after prepare.
    let shown = c
        .node
        .eventually(
            "both drivers' entries in the claims' status",
            Duration::from_secs(30),
            async || {
                let mut shown = std::collections::BTreeMap::new();
                for name in &claim_names {
                    let claim = claims.get(name).await.ok()?;
                    for entry in claim.status?.devices.unwrap_or_default() {
                        let data = entry.data.expect("the entry has data").0;
                        assert_eq!(data["instance"], entry.device, "{data}");
                        shown.insert(entry.driver, data["properties"].clone());
                    }
                }
                (shown.len() == 2).then_some(shown)
            },
        )
        .await;
    assert_eq!(
        shown["debugecho.akri.sh"]["DEBUG_ECHO_DESCRIPTION"], "lobby",
        "{shown:?}"
    );
    assert_eq!(
        shown["fixture.akri.sh"]["FIXTURE_SERIAL"], "SN-0042",
        "{shown:?}"
    );

    c.delete_pod("broker").await;
    c.node
        .eventually(
            "the claims' CDI specs removed",
            Duration::from_secs(30),
            async || specs.iter().all(|s| !s.exists()).then_some(()),
        )
        .await;
    assert!(c.cdi_specs().is_empty(), "{:?}", c.cdi_specs());
}

/// A handler that reports more than its configuration allows into containers (a read-write
/// mount of the host's `/`, `LD_PRELOAD`, a shell function, the host's memory through
/// `/dev/char/1:1` and `/dev//mem`): each such device is refused on the node, the
/// configuration's status says why, and its other device reaches a container with nothing of
/// the refused ones, its device node with the permissions its prefix allows even where the
/// handler asked for none (CDI's empty means `rwm`).
#[tokio::test]
async fn a_device_bringing_more_than_its_configuration_allows_is_refused_and_its_sibling_served() {
    let c = Cluster::start().await;
    let device = |id: &str| akri_proto::discovery::v0::Device {
        id: id.into(),
        properties: [("ROGUE_ID".to_string(), id.to_string())].into(),
        ..Default::default()
    };
    let node = |host: &str| akri_proto::discovery::v0::DeviceSpec {
        container_path: DEVICE_PATH.into(),
        host_path: host.into(),
        permissions: String::new(),
    };
    // /dev/fuse: a device no container has by default (unlike /dev/null, which runc's
    // default rules open to every container), so the permissions are the CDI spec's.
    let mut served = device("rogue-0");
    served.device_specs.push(node("/dev/fuse"));
    let mut rooted = device("rogue-rooted");
    rooted.mounts.push(akri_proto::discovery::v0::Mount {
        container_path: "/host".into(),
        host_path: "/".into(),
        read_only: false,
    });
    let mut preloading = device("rogue-preloading");
    (preloading.properties).insert("LD_PRELOAD".into(), "/tmp/evil.so".into());
    let mut function = device("rogue-function");
    (function.properties).insert("BASH_FUNC_ls%%".into(), "() { id; }".into());
    let mut memory = device("rogue-memory");
    memory.device_specs.push(node("/dev/char/1:1"));
    let mut spelled = device("rogue-spelled");
    spelled.device_specs.push(node("/dev//mem"));
    let devices = vec![served, rooted, preloading, function, memory, spelled];
    let _rogue = c.external_handler("rogue", devices).await;
    let rogue = ControlPlane::unique_name("rogue");
    // What an administrator allows: its one property, /dev/fuse read-only, no mounts.
    let access = json!({ "environment": ["ROGUE_ID"], "deviceNodes": [{ "path": "/dev/fuse" }] });
    (c.dra_configuration_allowing(&rogue, "rogue", "{}", access)).await;

    let configurations = Api::<akri_api::v1::DiscoveryConfiguration>::all(c.client.clone());
    let said = c
        .node
        .eventually(
            "the refusal in the configuration's status",
            Duration::from_secs(60),
            async || {
                let status = configurations.get(&rogue).await.ok()?.status?;
                let entry =
                    (status.discovery_errors.into_iter()).find(|e| e.node == c.node.node_name())?;
                Some(entry.message)
            },
        )
        .await;
    let unnamed =
        "is not a known property of handler kind rogue and not in containerAccess.environment";
    // The first three by id are named (whatever this host's /dev has of 1:1, it is refused),
    // the rooted and the spelled one counted.
    for refused in [
        format!("device rogue-function refused: environment variable \"BASH_FUNC_ls%%\" {unnamed}"),
        "device rogue-memory refused: device node /dev/char/1:1".to_string(),
        format!("device rogue-preloading refused: environment variable \"LD_PRELOAD\" {unnamed}"),
        "and 2 more".to_string(),
    ] {
        assert!(said.contains(&refused), "{refused:?} not in {said}");
    }
    // The status names the first three; the other two are refused with them (one report):
    // the node publishes one device.
    let slices = Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(c.client.clone());
    let published = c
        .node
        .eventually(
            "the rogue handler's slice",
            Duration::from_secs(30),
            async || {
                let list = slices.list(&Default::default()).await.ok()?;
                let devices: Vec<String> = (list.items.iter())
                    .filter(|s| s.spec.driver == "rogue.akri.sh")
                    .flat_map(|s| s.spec.devices.iter().flatten())
                    .map(|d| d.name.clone())
                    .collect();
                (!devices.is_empty()).then_some(devices)
            },
        )
        .await;
    assert_eq!(published.len(), 1, "{published:?}");

    // The one device published is the one a claim gets, its node read-only.
    let script = format!(
        "env | grep -E '^(ROGUE_ID|LD_PRELOAD|BASH_FUNC.*)=' | sort\n\
         test -e /host/etc && echo host mounted\n\
         (exec 3< {DEVICE_PATH}) && echo device readable\n\
         (exec 3<> {DEVICE_PATH}) 2>/dev/null && echo device written || echo device not written\n\
         true"
    );
    c.script_pod("rogue-broker", &rogue, &script).await;
    let output = c.output("rogue-broker").await;
    assert_shows(
        &output,
        &[
            "ROGUE_ID=rogue-0".to_string(),
            "device readable".to_string(),
            "device not written".to_string(),
        ],
    );
    assert!(
        !output.contains("LD_PRELOAD")
            && !output.contains("BASH_FUNC")
            && !output.contains("host mounted"),
        "{output}"
    );
}

#[tokio::test]
async fn a_device_plugin_slot_reaches_the_container_with_the_allocate_answer() {
    let c = Cluster::start().await;
    let resource = c.legacy_configuration().await;
    c.legacy_pod("legacy", &resource).await;
    let output = c.output("legacy").await;
    let mut expected = fixture_lines();
    expected.push("RESOLUTION=1080p".into());
    assert_shows(&output, &expected);
}

#[tokio::test]
async fn a_running_pod_survives_kubelet_and_containerd_restarts_and_new_pods_still_get_devices() {
    let mut c = Cluster::start().await;
    let echo = ControlPlane::unique_name("echo");
    c.dra_configuration(&echo, "debugEcho", "descriptions: [one, two]")
        .await;
    let resource = c.legacy_configuration().await;
    c.claiming_pod("first", &[&echo]).await;
    let first = c.output("first").await;
    assert!(first.contains("DEBUG_ECHO_DESCRIPTION="), "{first}");
    let pods = c.pods();
    // The log can be read before the kubelet posts the container's ID in the pod's status.
    let before = c
        .node
        .eventually(
            "the first container's ID",
            Duration::from_secs(30),
            async || {
                let (id, restarts) = container(&pods, "first").await;
                (!id.is_empty()).then_some((id, restarts))
            },
        )
        .await;

    c.node.restart_kubelet().await.unwrap();
    c.node.restart_containerd().await.unwrap();
    c.node.restart_kubelet().await.unwrap();

    // The second pod needs the plugin registered with the new kubelet and containerd serving.
    c.claiming_pod("second", &[&echo]).await;
    let second = c.output("second").await;
    let description = |output: &str| {
        output
            .lines()
            .find_map(|l| l.strip_prefix("DEBUG_ECHO_DESCRIPTION="))
            .map(str::to_string)
    };
    assert!(description(&second).is_some(), "{second}");
    assert_ne!(
        description(&first),
        description(&second),
        "two devices, one each"
    );

    // The new kubelet emptied its device-plugin directory; the plugins registered again.
    c.wait_allocatable(&resource).await;
    c.legacy_pod("legacy", &resource).await;
    assert_shows(&c.output("legacy").await, &fixture_lines());

    assert_eq!(
        container(&pods, "first").await,
        before,
        "the first pod's container was never restarted or replaced"
    );
    let phase = pods.get("first").await.unwrap().status.unwrap().phase;
    assert_eq!(phase.as_deref(), Some("Running"));
    assert_eq!(
        c.output("first").await,
        first,
        "its process is the one that started"
    );
}

/// `stat -c '%t:%T'` of a block device: its major and minor numbers in hex.
fn hex_numbers(kernel_name: &str) -> String {
    let dev = std::fs::read_to_string(format!("/sys/class/block/{kernel_name}/dev")).unwrap();
    let (major, minor) = dev.trim().split_once(':').unwrap();
    let hex = |n: &str| format!("{:x}", n.parse::<u32>().unwrap());
    format!("{}:{}", hex(major), hex(minor))
}

#[tokio::test]
async fn a_udev_device_and_its_partition_reach_the_container_with_akris_properties_and_leave_when_detached()
 {
    let c = Cluster::start().await;
    let mut disk = LoopDevice::new();
    let device = disk.attach();
    let name = LoopDevice::kernel_name(&device).to_string();
    let devpath = format!("/devices/virtual/block/{name}");
    let config = ControlPlane::unique_name("disk");
    // The disk and (through its parent's attribute) its partition, grouped as one device.
    let details = format!(
        "udevRules:\n- '{}'\n- 'KERNEL==\"{name}p*\", ATTRS{{loop/backing_file}}==\"{}\"'\ngroupRecursive: true\n",
        disk.udev_rule(),
        disk.image().display(),
    );
    // Disks are the host's data: an administrator allows block devices by name.
    let disks = json!({
        "deviceNodes": [{ "path": "/dev/loop", "writable": true }], "blockDevices": true,
    });
    (c.dra_configuration_allowing(&config, "udev", &details, disks)).await;
    // The same rules under the udev default: a namespace user's rules that match a disk
    // bring no disk into a container (issue 52), and the status says why.
    let raw = ControlPlane::unique_name("raw");
    c.dra_configuration(&raw, "udev", &details).await;
    let script = format!(
        "env | grep '^UDEV_' | sort\n\
         stat -c 'device %n: %F %t:%T' {device} {device}p1\n\
         true"
    );
    c.script_pod("disk", &config, &script).await;
    // A configuration with a rule that selects nothing usable: its status says why on this
    // node, the good one is not disturbed, and fixing the rule clears the error.
    let bad = ControlPlane::unique_name("bad");
    c.dra_configuration(&bad, "udev", "udevRules: ['NAME==\"x\"']")
        .await;
    let configs = Api::<akri_api::v1::DiscoveryConfiguration>::all(c.client.clone());
    let error_of = async |config: &str| {
        let status = configs.get(config).await.ok()?.status?;
        status
            .discovery_errors
            .into_iter()
            .find(|e| e.node == c.node.node_name())
            .map(|e| e.message)
    };
    let message = c
        .node
        .eventually(
            "the bad rule's error in the status",
            Duration::from_secs(30),
            async || error_of(&bad).await,
        )
        .await;
    assert!(
        message.contains("udev discovery details") && message.contains("NAME is not supported"),
        "{message}"
    );
    let refused = c
        .node
        .eventually(
            "the raw disk's refusal in the status",
            Duration::from_secs(30),
            async || error_of(&raw).await,
        )
        .await;
    assert!(
        refused.contains(&format!(
            "device node {device} is a block device, and containerAccess.blockDevices is not set"
        )),
        "{refused}"
    );
    let output = c.output("disk").await;
    assert_shows(
        &output,
        &[
            format!("UDEV_DEVNODE_0={device}"),
            format!("UDEV_DEVNODE_1={device}p1"),
            format!("UDEV_DEVPATH={devpath}"),
            format!("device {device}: block special file {}", hex_numbers(&name)),
            format!(
                "device {device}p1: block special file {}",
                hex_numbers(&format!("{name}p1"))
            ),
        ],
    );

    assert_eq!(
        error_of(&config).await,
        None,
        "the good configuration has no error"
    );
    configs
        .patch(
            &bad,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({ "spec": { "discoveryHandler": {
                "discoveryDetails": "udevRules: ['KERNEL==\"null\"']",
            } } })),
        )
        .await
        .unwrap();
    c.node
        .eventually(
            "the fixed rule's error cleared",
            Duration::from_secs(30),
            async || error_of(&bad).await.is_none().then_some(()),
        )
        .await;

    // Pulled: once its pod is gone, the device leaves the node (its Instance deleted).
    c.delete_pod("disk").await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(c.client.clone(), &c.ns);
    let held = async || {
        instances
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .any(|i| i.spec.broker_properties.get("UDEV_DEVPATH") == Some(&devpath))
            .then_some(())
    };
    assert!(held().await.is_some(), "the disk's Instance exists");
    disk.detach();
    c.node
        .eventually(
            "the detached disk's Instance gone",
            Duration::from_secs(30),
            async || held().await.is_none().then_some(()),
        )
        .await;
}

#[tokio::test]
async fn an_opcua_server_behind_a_discovery_server_reaches_a_container_as_a_shared_device() {
    let c = Cluster::start().await;
    let _controller = c.driver_controller();
    // The OPC UA handler, external (its own socket, registered like Akri's), and real
    // servers: a discovery server and one registered with it.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("opcua.sock");
    let opcua = akri_opcua::Opcua {
        rescan: Duration::from_secs(1),
        finder: akri_opcua::Finder {
            pki_dir: dir.path().join("pki"),
            ..Default::default()
        },
    };
    let _served = akri_discovery_handler::Served::start(opcua, &socket).unwrap();
    c.register_handler("opcua", &socket, true).await;
    let (lds, boiler) = (
        akri_testing::free_port().unwrap(),
        akri_testing::free_port().unwrap(),
    );
    let peer = |name: &str, port: u16, extra: &[&str]| {
        let mut args = vec![
            "--port".to_string(),
            port.to_string(),
            "--name".into(),
            name.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        akri_testing::peers::Peer::start(name, "opcua_server.py", &args).unwrap()
    };
    let _lds = peer("LDS", lds, &["--type", "discovery"]);
    let lds_url = format!("opc.tcp://127.0.0.1:{lds}/");
    let _boiler = peer("Boiler", boiler, &["--register-to", &lds_url]);

    let config = ControlPlane::unique_name("opcua");
    let details = format!("opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: ['{lds_url}']\n");
    c.shared_configuration(&config, "opcua", &details, json!([]))
        .await;
    c.script_pod("opcua", &config, "env | grep '^OPCUA_' | sort")
        .await;
    let output = c.output("opcua").await;
    assert_shows(
        &output,
        &[
            format!("OPCUA_DISCOVERY_URL=opc.tcp://127.0.0.1:{boiler}/"),
            "OPCUA_APPLICATION_NAME=Boiler".to_string(),
            "OPCUA_APPLICATION_URI=urn:akri-test:Boiler".to_string(),
        ],
    );
}

/// A serial port no handler finds, listed by hand (the `static` handler, embedded): the
/// container gets the node's device node and the listed property, with no
/// `containerAccess` (the configuration's own list is what it may bring); a device listed
/// for another node is not this node's.
#[tokio::test]
async fn a_serial_port_listed_by_hand_reaches_the_container() {
    let mut c = Cluster::without_agent().await;
    c.start_agent(|config| {
        (config.embedded_handlers).push(akri_kubelet_plugin::embedded::Embedded::Static)
    })
    .await;
    let _controller = c.driver_controller();
    let config = ControlPlane::unique_name("serial");
    // A serial port's device node (major 4, minor 64: ttyS0's numbers), made for the test so
    // that it does not depend on this machine's hardware, and removed after it.
    let serial = DeviceNode::make(&format!("/dev/{config}"), 4, 64);
    let path = &serial.0;
    let node = c.node.node_name();
    let details = format!(
        "devices:\n\
         - {{id: scale, nodes: [{node}], properties: {{BAUD: '9600'}}, deviceNodes: [{path}]}}\n\
         - {{id: elsewhere, nodes: [another-node], properties: {{BAUD: '115200'}}}}\n"
    );
    c.shared_configuration(&config, "static", &details, json!([]))
        .await;
    c.script_pod(
        "serial",
        &config,
        &format!("env | grep '^BAUD'; stat -c 'device %n: %F %t:%T' {path}"),
    )
    .await;
    let output = c.output("serial").await;
    assert_shows(
        &output,
        &[
            "BAUD=9600".to_string(),
            format!("device {path}: character special file 4:40"),
        ],
    );
    assert!(!output.contains("115200"), "{output}");
}

/// A character device node the test makes (`mknod`), removed when dropped.
struct DeviceNode(String);

impl DeviceNode {
    fn make(path: &str, major: u32, minor: u32) -> DeviceNode {
        let made = std::process::Command::new("mknod")
            .args([path, "c", &major.to_string(), &minor.to_string()])
            .status()
            .expect("run mknod");
        assert!(
            made.success(),
            "mknod {path} (the real node's tests run as root)"
        );
        DeviceNode(path.to_string())
    }
}

impl Drop for DeviceNode {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A camera with WS-Discovery off, listed in the configuration by its device service: a pod
/// on the real node gets it with what its device service says, as a camera found by probes.
#[tokio::test]
async fn an_onvif_camera_that_ignores_probes_reaches_a_container_where_it_is_listed() {
    let c = Cluster::start().await;
    let _controller = c.driver_controller();
    let _handler = c.onvif_handler().await;
    let uuid = "7e57ca4e-0000-4000-8000-0000000051e7";
    let port = akri_testing::free_port().unwrap();
    let _camera = akri_testing::peers::Peer::start(
        "quiet-camera",
        "onvif_camera.py",
        &[
            "--port",
            &port.to_string(),
            "--uuid",
            uuid,
            "--ip",
            "10.20.30.41",
            "--mac",
            "00:0a:0b:0c:0d:0f",
            "--ignore-probes",
        ]
        .map(String::from),
    )
    .unwrap();
    let url = format!(
        "http://{}:{port}/onvif/device_service",
        akri_testing::peers::multicast_source()
    );
    let config = ControlPlane::unique_name("quiet");
    // The uuid filter keeps other tests' cameras out; this one answers no probe anyway.
    let details = format!(
        "uuids: {{items: [{uuid}]}}\ncameras:\n- deviceServiceUrl: {url}\n  uuid: {uuid}\n"
    );
    c.shared_configuration(&config, "onvif", &details, json!([]))
        .await;
    c.script_pod("quiet", &config, "env | grep '^ONVIF_' | sort")
        .await;
    let output = c.output("quiet").await;
    assert_shows(
        &output,
        &[
            format!("ONVIF_DEVICE_SERVICE_URL={url}"),
            format!("ONVIF_DEVICE_UUID={uuid}"),
            "ONVIF_DEVICE_IP_ADDRESS=10.20.30.41".to_string(),
            "ONVIF_DEVICE_MAC_ADDRESS=00:0a:0b:0c:0d:0f".to_string(),
            format!("ONVIF_STREAM_URI=rtsp://10.20.30.41:554/{uuid}/main"),
        ],
    );
}

#[tokio::test]
async fn an_onvif_camera_reaches_a_container_with_what_its_credential_from_a_secret_reveals() {
    const PASSWORD: &str = "from-a-secret-only";
    let c = Cluster::start().await;
    let _controller = c.driver_controller();
    let _handler = c.onvif_handler().await;
    // A real WS-Discovery camera whose device service wants the credential.
    let uuid = "7e57ca4e-0000-4000-8000-00000000e2e0";
    let port = akri_testing::free_port().unwrap();
    let _camera = akri_testing::peers::Peer::start(
        "camera",
        "onvif_camera.py",
        &[
            "--port",
            &port.to_string(),
            "--uuid",
            uuid,
            "--scope",
            "onvif://www.onvif.org/location/gate",
            "--ip",
            "10.20.30.40",
            "--mac",
            "00:0a:0b:0c:0d:0e",
            "--username",
            "admin",
            "--password",
            PASSWORD,
        ]
        .map(String::from),
    )
    .unwrap();
    let secret: k8s_openapi::api::core::v1::Secret = from_json(json!({
        "metadata": { "name": "camera-credentials" },
        "stringData": { "username": "admin", "password": PASSWORD },
    }));
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let reference = |key: &str| {
        json!({ "secretKeyRef": {
        "name": "camera-credentials", "namespace": c.ns, "key": key,
    } })
    };
    let properties = json!([
        { "name": format!("username_{uuid}"), "valueFrom": reference("username") },
        { "name": format!("password_{uuid}"), "valueFrom": reference("password") },
    ]);
    let config = ControlPlane::unique_name("onvif");
    let details = format!(
        "uuids: {{items: [{uuid}]}}\nscopes: {{items: ['onvif://www.onvif.org/location/gate']}}\n"
    );
    c.shared_configuration(&config, "onvif", &details, properties)
        .await;
    // The device metadata file (KEP-5304) at the standard path: a template's claim is named
    // by the pod's entry (`<config>`), then the request (`device`), then the driver.
    let metadata_file = format!(
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/{config}/device/onvif.akri.sh-metadata.json"
    );
    c.script_pod(
        "camera",
        &config,
        &format!("env | grep '^ONVIF_' | sort\necho METADATA\ncat {metadata_file}"),
    )
    .await;
    let output = c.output("camera").await;
    assert_shows(
        &output,
        &[
            format!(
                "ONVIF_DEVICE_SERVICE_URL=http://{}:{port}/onvif/device_service",
                akri_testing::peers::multicast_source()
            ),
            format!("ONVIF_DEVICE_UUID={uuid}"),
            "ONVIF_DEVICE_IP_ADDRESS=10.20.30.40".to_string(),
            "ONVIF_DEVICE_MAC_ADDRESS=00:0a:0b:0c:0d:0e".to_string(),
            format!("ONVIF_STREAM_URI=rtsp://10.20.30.40:554/{uuid}/main"),
        ],
    );
    assert!(!output.contains(PASSWORD), "{output}");
    // Bound only once this node connected to the camera's device service (binding
    // conditions, where the API server keeps them: 1.36 and later).
    let pod = c.pods().get("camera").await.unwrap();
    let claim_name = (pod.status.unwrap().resource_claim_statuses)
        .unwrap_or_default()
        .into_iter()
        .find_map(|s| s.resource_claim_name)
        .expect("the pod's claim");
    let claim = Api::<ResourceClaim>::namespaced(c.client.clone(), &c.ns)
        .get(&claim_name)
        .await
        .unwrap();
    // Whether this version's API server must keep binding conditions (its gates, not our
    // probe).
    let served = c.control_plane().capabilities().binding_conditions;
    let conditions: Vec<_> = (claim.status.and_then(|s| s.devices).unwrap_or_default())
        .into_iter()
        .flat_map(|d| d.conditions.unwrap_or_default())
        .filter(|c| c.type_ == akri_devices::BINDING_CONDITION)
        .map(|c| (c.status, c.reason))
        .collect();
    let expected = match served {
        true => vec![("True".to_string(), "Connected".to_string())],
        false => Vec::new(),
    };
    assert_eq!(conditions, expected);
    let (_, metadata) = output.split_once("METADATA\n").expect("the script ran");
    let metadata = metadata.split("END-OF-OUTPUT").next().unwrap();
    let newest: serde_json::Value = serde_json::Deserializer::from_str(metadata)
        .into_iter()
        .next()
        .expect("the file holds an object")
        .unwrap_or_else(|e| panic!("{e}: {metadata}"));
    assert_eq!(newest["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    let device = &newest["requests"][0]["devices"][0];
    assert_eq!(device["driver"], "onvif.akri.sh", "{newest}");
    let attributes = &device["attributes"];
    assert_eq!(
        attributes["akri.sh/configuration"]["string"],
        config.as_str()
    );
    assert_eq!(
        attributes["property.akri.sh/ONVIF_DEVICE_IP_ADDRESS"]["string"], "10.20.30.40",
        "{newest}"
    );
    assert_eq!(
        attributes["property.akri.sh/ONVIF_DEVICE_MAC_ADDRESS"]["string"],
        "00:0a:0b:0c:0d:0e"
    );
    // The credential is nowhere in what the cluster stores about the device.
    let instances = Api::<akri_api::v0::Instance>::namespaced(c.client.clone(), &c.ns)
        .list(&Default::default())
        .await
        .unwrap();
    let configuration = Api::<akri_api::v1::DiscoveryConfiguration>::all(c.client.clone())
        .get(&config)
        .await
        .unwrap();
    let stored = format!(
        "{}{}",
        serde_json::to_string(&instances.items).unwrap(),
        serde_json::to_string(&configuration.status).unwrap()
    );
    assert!(
        stored.contains("10.20.30.40"),
        "the Instance is there: {stored}"
    );
    assert!(!stored.contains(PASSWORD), "{stored}");
}

/// The switch of agents on a node that ran Akri: a broker that Akri's device plugin gave a
/// slot keeps running with its device while Akri's agent goes and ours takes over (the
/// Instance Akri wrote adopted, its slot still held, not reclaimed while the container
/// runs); the kubelet, whose checkpoint holds that slot, gives a new pod the other one, and
/// refuses a third.
#[tokio::test]
async fn a_pod_holding_akris_slot_keeps_its_device_through_the_switch_of_agents() {
    let mut c = Cluster::without_agent().await;
    let node = c.node.node_name().to_string();
    let config = ControlPlane::unique_name("cam");
    let configuration: akri_api::v0::Configuration = from_json(
        akri_testing::discovery::v0_debug_echo(&config, &["cam0"], 2, true),
    );
    let configuration = Api::<akri_api::v0::Configuration>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    let instance = akri_devices::instance_name(&config, "cam0", true, &node);
    let held = akri_devices::slot_device_name(&instance, 1);
    // What Akri's agent wrote: its finalizer, owned by the Configuration, the freed slot's
    // key dropped, slot 1 the broker's.
    let akris: akri_api::v0::Instance =
        akri_testing::from_json(akri_testing::discovery::akri_written_instance(
            &config,
            configuration.metadata.uid.as_deref(),
            &instance,
            &node,
            &held,
        ));
    let instances = Api::<akri_api::v0::Instance>::namespaced(c.client.clone(), &c.ns);
    instances
        .create(&PostParams::default(), &akris)
        .await
        .unwrap();
    let resource = format!("akri.sh/{instance}");
    let akri = akri_testing::akris_agent::serve_instance(
        &c.node.device_plugin_dir(),
        &instance,
        2,
        &[1],
        &[("DEBUG_ECHO_DESCRIPTION", "cam0")],
    )
    .unwrap();
    c.wait_allocatable(&resource).await;
    c.legacy_pod("broker", &resource).await;
    let first = c.output("broker").await;
    assert!(first.contains("DEBUG_ECHO_DESCRIPTION=cam0"), "{first}");
    let pods = c.pods();
    let before = container(&pods, "broker").await;

    // Akri's agent goes (uninstalled: nothing cleans up), ours starts.
    drop(akri);
    c.start_agent(|config| config.debug_echo_mut().shared = true)
        .await;
    let adopted = c
        .node
        .eventually(
            "the Instance adopted",
            Duration::from_secs(60),
            async || {
                let i = instances.get(&instance).await.ok()?;
                let released = i.metadata.finalizers.clone().unwrap_or_default().is_empty()
                    && i.metadata
                        .owner_references
                        .clone()
                        .unwrap_or_default()
                        .is_empty();
                (released && i.spec.device_usage.len() == 2).then_some(i)
            },
        )
        .await;
    assert_eq!(adopted.spec.device_usage[&held], node, "the broker's slot");

    // A new pod gets the other slot; a third finds none.
    c.legacy_pod("second", &resource).await;
    let output = c.output("second").await;
    assert!(output.contains("DEBUG_ECHO_DESCRIPTION=cam0"), "{output}");
    let usage = instances.get(&instance).await.unwrap().spec.device_usage;
    assert!(usage.values().all(|v| *v == node), "{usage:?}");
    c.legacy_pod("third", &resource).await;
    c.node
        .eventually(
            "the third pod unschedulable",
            Duration::from_secs(60),
            async || {
                let conditions = pods.get("third").await.ok()?.status?.conditions?;
                conditions
                    .iter()
                    .any(|c| {
                        c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                    })
                    .then_some(())
            },
        )
        .await;

    // Past the reclaim grace (5 s) the broker still holds its slot, unchanged.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        instances.get(&instance).await.unwrap().spec.device_usage[&held],
        node
    );
    assert_eq!(
        container(&pods, "broker").await,
        before,
        "the broker untouched"
    );
    assert_eq!(c.output("broker").await, first, "its output as it was");
}

/// Optional node operations (KEP-5945; DRAOptionalNodeOperations, alpha in 1.37, on here where
/// the binaries know it): a configuration's shared devices skip the node's operations and are
/// offered by label. Another node (simulated) discovers them; the real node, whose kubelet has
/// no plugin of ours, gets a pod with one: the kubelet calls no plugin, so the pod runs with
/// none of the device's variables, and it is deleted without an unprepare. Where the API
/// server drops `skipNodeOperations` (1.34) the slices do not carry it, the devices stay on
/// the node that discovers them, and the configuration's status says so.
#[tokio::test]
async fn a_shared_device_that_skips_node_operations_serves_a_pod_on_a_node_without_the_plugin() {
    let gate = "DRAOptionalNodeOperations";
    let c =
        Cluster::without_agent_on(ControlPlaneOptions::full().feature_gate_if_known(gate, true))
            .await;
    let gated = (c.control_plane().feature_gates().split(',')).any(|g| g == format!("{gate}=true"));
    let gateway = SimNode::start(c.control_plane(), &c.client, &c.ns, |config, _| {
        config.debug_echo_mut().shared = true;
    })
    .await;
    let _controller = c.driver_controller();
    let nodes = Api::<Node>::all(c.client.clone());
    nodes
        .patch(
            c.node.node_name(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "network": "cameras" } } })),
        )
        .await
        .unwrap();
    let config = ControlPlane::unique_name("skip");
    let configuration: akri_api::v1::DiscoveryConfiguration = from_json(json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": config },
        "spec": {
            "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [door]" },
            "sharedDevices": { "nodeOperations": "Skip", "nodeSelector": { "network": "cameras" } },
        },
    }));
    let configurations = Api::<akri_api::v1::DiscoveryConfiguration>::all(c.client.clone());
    configurations
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    let slices = Api::<ResourceSlice>::all(c.client.clone());
    let published = c
        .node
        .eventually(
            "the shared device published",
            Duration::from_secs(60),
            async || {
                let list = slices.list(&Default::default()).await.ok()?.items;
                let ours: Vec<ResourceSlice> = (list.into_iter())
                    .filter(|s| s.labels().values().any(|v| *v == config))
                    .filter(|s| s.spec.devices.as_ref().is_some_and(|d| !d.is_empty()))
                    .collect();
                (!ours.is_empty()).then_some(ours)
            },
        )
        .await;
    let ready = c
        .node
        .eventually(
            "the configuration's Ready condition",
            Duration::from_secs(30),
            async || {
                let status = configurations.get(&config).await.ok()?.status?;
                let ready = status.conditions.into_iter().find(|c| c.type_ == "Ready")?;
                (ready.status == "True").then_some(ready)
            },
        )
        .await;
    if !gated {
        // As the user guide quotes it ("Optional node operations").
        assert!(
            ready.message.contains("sharedDevices.nodeOperations is Skip, but the API server has no optional node operations (DRAOptionalNodeOperations), so the kubelet-plugin prepares its shared devices as usual, on the nodes that discover them"),
            "{ready:?}"
        );
        for slice in &published {
            assert_eq!(slice.spec.skip_node_operations, None, "{slice:?}");
            let selector = serde_json::to_string(&slice.spec).unwrap();
            assert!(selector.contains(&gateway.name), "{selector}");
            assert!(!selector.contains("cameras"), "{selector}");
        }
        return;
    }
    assert!(
        ready
            .message
            .contains("claims of its shared devices skip the kubelet-plugin (skipNodeOperations)"),
        "{ready:?}"
    );
    for slice in &published {
        assert_eq!(
            slice.spec.skip_node_operations.as_deref(),
            Some(&["*".to_string()][..]),
            "{slice:?}"
        );
    }
    let declared = (nodes.get(c.node.node_name()).await.unwrap().status)
        .and_then(|s| s.declared_features)
        .unwrap_or_default();
    assert!(
        declared.iter().any(|f| f == gate),
        "the kubelet declares the feature, which the scheduler requires: {declared:?}"
    );

    c.claim_template(&config).await;
    c.script_pod(
        "skipper",
        &config,
        "env | grep '^DEBUG_ECHO_' || echo NO-DEVICE-VARIABLES",
    )
    .await;
    let output = c.output("skipper").await;
    assert_eq!(c.node_of("skipper").await, c.node.node_name());
    assert!(output.contains("NO-DEVICE-VARIABLES"), "{output}");
    let pod = c.pods().get("skipper").await.unwrap();
    let claim = (pod.status.and_then(|s| s.resource_claim_statuses))
        .and_then(|s| s.into_iter().next()?.resource_claim_name)
        .expect("the pod's claim");
    let claim = Api::<ResourceClaim>::namespaced(c.client.clone(), &c.ns)
        .get(&claim)
        .await
        .unwrap();
    let results = (claim.status.and_then(|s| s.allocation))
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(
        results[0].skip_node_operations.as_deref(),
        Some(&["*".to_string()][..])
    );
    assert!(c.cdi_specs().is_empty(), "no plugin wrote a CDI spec");
    // No plugin to unprepare: the pod still goes.
    c.delete_pod("skipper").await;
}
