//! What the demo shows, and (`--check`) whether it is what the examples should produce.

use crate::cluster::NODES;

pub struct InstanceRow {
    pub name: String,
    pub uid: String,
    pub configuration: String,
    pub shared: bool,
    pub nodes: Vec<String>,
    pub description: String,
}

pub struct SliceRow {
    pub name: String,
    pub pool: String,
    /// The slice's node, node selector values, "all nodes" or "per device".
    pub nodes: String,
    pub devices: Vec<SliceDevice>,
}

pub struct SliceDevice {
    pub name: String,
    /// Its `akri.sh/instance` attribute.
    pub instance: String,
    /// Per-device node selection, where the slice has it.
    pub nodes: Option<String>,
}

pub struct Allocation {
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub instance: String,
}

/// The installed product on real nodes: the chart's pods, and the broker Jobs of the
/// BrokerTemplate example.
pub struct Installed {
    /// (pod, its component label, node, phase, every container ready)
    pub pods: Vec<(String, String, String, String, bool)>,
    /// (Instance, its description, what its broker Job's container printed)
    pub brokers: Vec<(String, String, String)>,
    /// Per controller, the metrics the chart's alerts and dashboard query of it that its
    /// running pod's `/metrics` does not export (the node's components: the upgrade test's).
    pub unmonitored: Vec<(String, Vec<String>)>,
}

pub struct Report {
    pub instances: Vec<InstanceRow>,
    pub classes: Vec<String>,
    pub slices: Vec<SliceRow>,
    /// (pod, node it is bound to)
    pub pod: (String, String),
    /// (claim, its allocation)
    pub claim: (String, Allocation),
    pub cdi_ids: Vec<String>,
    pub env: Vec<String>,
    /// `env` is what the container printed (a real node), not the CDI edits the simulated
    /// kubelet resolved.
    pub container: bool,
    /// `/readyz` of the preparing node's plugin answered 200.
    pub plugin_ready: bool,
    /// Its prepare and published-devices metrics.
    pub plugin_metrics: Vec<String>,
    pub kubectl: String,
    /// Real nodes: what the chart installed, and the brokers.
    pub installed: Option<Installed>,
}

impl Report {
    pub fn print(&self) {
        print!("{}", self.render());
    }

    /// What [`print`](Self::print) prints.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nInstances (one per discovered device; kubelet-plugins write them):"
        );
        for i in &self.instances {
            let _ = writeln!(
                out,
                "  {:<16} configuration={} shared={} nodes=[{}] DEBUG_ECHO_DESCRIPTION={}",
                i.name,
                i.configuration,
                i.shared,
                i.nodes.join(", "),
                i.description
            );
        }
        let _ = writeln!(
            out,
            "\nDeviceClasses (the driver-controller's, one per configuration and filter):"
        );
        for c in &self.classes {
            let _ = writeln!(out, "  {c}");
        }
        let _ = writeln!(out, "\nResourceSlices of {}:", crate::cluster::DRIVER);
        for s in &self.slices {
            let _ = writeln!(out, "  {}  pool={}  nodes: {}", s.name, s.pool, s.nodes);
            for d in &s.devices {
                let nodes = d.nodes.as_deref().map(|n| format!("  nodes: {n}"));
                let _ = writeln!(
                    out,
                    "    device {}  instance={}{}",
                    d.name,
                    d.instance,
                    nodes.unwrap_or_default()
                );
            }
        }
        let (claim, a) = &self.claim;
        let _ = writeln!(
            out,
            "\nResourceClaim default/{claim}: allocated {}/{}/{} (Instance {})",
            a.driver, a.pool, a.device, a.instance
        );
        let (pod, node) = &self.pod;
        let _ = writeln!(out, "Pod default/{pod}: bound to {node}");
        let _ = writeln!(
            out,
            "CDI devices for its container: {}",
            self.cdi_ids.join(", ")
        );
        if self.container {
            let _ = writeln!(out, "What the container printed (kubectl logs {pod}):");
        } else {
            let _ = writeln!(out, "Environment the container gets from CDI:");
        }
        for e in &self.env {
            let _ = writeln!(out, "  {e}");
        }
        let _ = writeln!(
            out,
            "\nThe preparing node's kubelet-plugin: /readyz {}, /metrics:",
            if self.plugin_ready { "ok" } else { "NOT READY" }
        );
        for line in &self.plugin_metrics {
            let _ = writeln!(out, "  {line}");
        }
        if let Some(installed) = &self.installed {
            let _ = writeln!(
                out,
                "\nThe chart's pods (helm install akri from the registry):"
            );
            for (pod, component, node, phase, ready) in &installed.pods {
                let ready = if *ready { "ready" } else { "NOT READY" };
                let _ = writeln!(out, "  {pod:<44} {component:<18} {node:<7} {phase} {ready}");
            }
            let _ = writeln!(
                out,
                "Broker Jobs of examples/brokers/job-per-instance.yaml (one per Instance):"
            );
            for (instance, description, output) in &installed.brokers {
                let _ = writeln!(out, "  {instance} ({description}): {}", output.trim());
            }
        }
        let _ = writeln!(
            out,
            "\n$ kubectl get akridc,pf,akrii,resourceslices,resourceclaims -A"
        );
        out.push_str(&self.kubectl);
        out
    }

    /// What is wrong with the report, against the examples and the demo's two nodes.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut expect = |ok: bool, what: String| {
            if !ok {
                problems.push(what);
            }
        };
        let lobby = akri_devices::instance_name("echo", "lobby", true, "");
        let dock = akri_devices::instance_name("echo", "dock", true, "");
        let all_nodes: Vec<String> = NODES.iter().map(|(n, _)| n.to_string()).collect();
        let nodes_of = |name: &str| {
            self.instances
                .iter()
                .find(|i| i.name == name)
                .map(|i| i.nodes.clone())
        };
        expect(
            self.instances.len() == 2,
            format!("2 Instances expected, got {}", self.instances.len()),
        );
        expect(
            nodes_of(&lobby) == Some(all_nodes.clone()),
            format!(
                "Instance {lobby} (lobby) should be seen by {all_nodes:?}: {:?}",
                nodes_of(&lobby)
            ),
        );
        expect(
            nodes_of(&dock) == Some(vec!["node-a".to_string()]),
            format!(
                "Instance {dock} (dock) should be seen by node-a only: {:?}",
                nodes_of(&dock)
            ),
        );
        for class in ["echo", "echo-lobby"] {
            expect(
                self.classes.iter().any(|c| c == class),
                format!("DeviceClass {class} missing: {:?}", self.classes),
            );
        }
        for instance in [&lobby, &dock] {
            expect(
                self.slices
                    .iter()
                    .flat_map(|s| &s.devices)
                    .any(|d| &d.instance == instance),
                format!("no published device of Instance {instance}"),
            );
        }
        let (_, allocation) = &self.claim;
        expect(
            allocation.instance == lobby,
            format!(
                "the claim should hold a lobby device ({lobby}), got {} ({})",
                allocation.device, allocation.instance
            ),
        );
        expect(
            all_nodes.contains(&self.pod.1),
            format!("the pod is bound to {}, not a demo node", self.pod.1),
        );
        // The device's CDI id, and its metadata file's (KEP-5304).
        // Both in the claim's one spec, of kind akri.sh/debugecho.
        let ours = |id: &&String| id.starts_with("akri.sh/debugecho=");
        let device_ids = (self.cdi_ids.iter())
            .filter(ours)
            .filter(|id| !id.ends_with(".metadata"));
        let metadata_ids = (self.cdi_ids.iter())
            .filter(ours)
            .filter(|id| id.ends_with(".metadata"));
        expect(
            self.cdi_ids.len() == 2 && device_ids.count() == 1 && metadata_ids.count() == 1,
            format!(
                "the device's and its metadata file's CDI ids expected: {:?}",
                self.cdi_ids
            ),
        );
        expect(
            self.env.iter().any(|e| e == "DEBUG_ECHO_DESCRIPTION=lobby"),
            format!("DEBUG_ECHO_DESCRIPTION=lobby missing from {:?}", self.env),
        );
        expect(self.plugin_ready, "the plugin's /readyz is not 200".into());
        let prepared = format!(
            "akri_kubelet_plugin_prepare_seconds_count{{driver=\"{}\",result=\"ok\"}} 1",
            crate::cluster::DRIVER
        );
        expect(
            self.plugin_metrics.contains(&prepared),
            format!("/metrics lacks `{prepared}`: {:?}", self.plugin_metrics),
        );
        if let Some(installed) = &self.installed {
            let running = |component: &str, node: Option<&str>| {
                installed.pods.iter().any(|(_, c, n, phase, ready)| {
                    c == component
                        && node.is_none_or(|node| n == node)
                        && phase == "Running"
                        && *ready
                })
            };
            for node in &all_nodes {
                expect(
                    running("kubelet-plugin", Some(node)),
                    format!(
                        "no ready kubelet-plugin pod on {node}: {:?}",
                        installed.pods
                    ),
                );
            }
            for component in ["driver-controller", "broker-controller"] {
                expect(
                    running(component, None),
                    format!("no ready {component} pod: {:?}", installed.pods),
                );
            }
            for (component, missing) in &installed.unmonitored {
                expect(
                    missing.is_empty(),
                    format!(
                        "the chart's alerts and dashboard query what the {component} does not export: {missing:?}"
                    ),
                );
            }
            for (instance, description) in [(&lobby, "lobby"), (&dock, "dock")] {
                let want = format!("reading {description}");
                expect(
                    installed
                        .brokers
                        .iter()
                        .any(|(i, _, output)| i == instance && output.trim() == want),
                    format!(
                        "the broker Job of {instance} should print `{want}`: {:?}",
                        installed.brokers
                    ),
                );
            }
        }
        for name in ["echo", "echo-lobby", &lobby, &dock, "lobby-camera"] {
            expect(
                self.kubectl.contains(name),
                format!("`kubectl get` does not list {name}"),
            );
        }
        problems
    }
}
