//! The Helm chart (`charts/akri`) with a real Helm (built by `hack/helm.sh`) and a real API
//! server: lint and render with the default and the full values, the schema refusing typos,
//! installs, the RBAC each component's ServiceAccount gets (SubjectAccessReviews), and the
//! admission policies that keep a kubelet-plugin to its own node (a token bound to a pod on
//! that node, as the plugin's own token is).

use akri_testing::ControlPlane;
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use akri_testing::product::{self, repo};

fn chart() -> String {
    repo().join("charts/akri").display().to_string()
}

fn full_values() -> String {
    repo()
        .join("charts/akri/ci/full-values.yaml")
        .display()
        .to_string()
}

use akri_testing::from_json;

/// Helm (`akri_testing::product::Helm`), failing the test (never skipping) when it is missing
/// or a run that must succeed fails.
pub(crate) struct Helm(product::Helm);

impl Helm {
    pub(crate) fn new() -> Helm {
        Helm(product::Helm::new().unwrap())
    }

    async fn run(&self, args: &[&str]) -> product::Run {
        self.0.run(args).await.unwrap()
    }

    /// Runs Helm and returns its stdout, failing the test with its output if it fails.
    async fn ok(&self, args: &[&str]) -> String {
        self.0.ok(args).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// `helm template` as objects.
    pub(crate) async fn template(
        &self,
        release: &str,
        namespace: &str,
        extra: &[&str],
    ) -> Vec<Value> {
        let chart = chart();
        let mut args = vec!["template", release, &chart, "--namespace", namespace];
        args.extend_from_slice(extra);
        parse_manifest(&self.ok(&args).await)
    }
}

/// The objects of a multi-document YAML stream (empty documents left out).
fn parse_manifest(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|document| {
            let value: serde_yaml::Value =
                serde::Deserialize::deserialize(document).expect("Helm renders YAML");
            serde_json::to_value(value).expect("YAML is JSON")
        })
        .filter(|v| !v.is_null())
        .collect()
}

pub(crate) fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {:#?}", names(objects)))
}

pub(crate) fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

pub(crate) fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| format!("{} {}", o["kind"], o["metadata"]["name"]))
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn host_paths(pod: &Value) -> Vec<String> {
    pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn lint_passes_with_default_and_full_values() {
    let helm = Helm::new();
    let chart = chart();
    let full = full_values();
    for args in [
        vec!["lint", "--strict", chart.as_str()],
        vec!["lint", "--strict", chart.as_str(), "-f", full.as_str()],
    ] {
        let out = helm.ok(&args).await;
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
}

#[tokio::test]
async fn template_renders_the_components_with_default_values() {
    let helm = Helm::new();
    let objects = helm.template("akri", "akri-system", &[]).await;

    let daemon_set = find(&objects, "DaemonSet", "akri-kubelet-plugin");
    assert_eq!(
        of_kind(&objects, "DaemonSet").len(),
        1,
        "no discovery handler DaemonSets by default"
    );
    assert_eq!(
        daemon_set["spec"]["updateStrategy"],
        json!({ "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 0, "maxSurge": 1 } }),
        "the new pod serves beside the old one: no node without a plugin"
    );
    let pod = &daemon_set["spec"]["template"]["spec"];
    assert_eq!(
        pod["tolerations"],
        json!([{ "operator": "Exists" }]),
        "tainted edge nodes get their agent"
    );
    // The handlers, enabled with nothing else set: where the agent runs, and OPC UA's default
    // discovery URL (localhost) is the node's.
    let handlers = helm
        .template(
            "akri",
            "akri-system",
            &["--set", "discoveryHandlers.opcua.enabled=true"],
        )
        .await;
    let opcua =
        &find(&handlers, "DaemonSet", "akri-opcua-discovery-handler")["spec"]["template"]["spec"];
    assert_eq!(opcua["tolerations"], json!([{ "operator": "Exists" }]));
    assert_eq!(opcua["hostNetwork"], true);
    assert_eq!(pod["serviceAccountName"], "akri-kubelet-plugin");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        format!("ghcr.io/akri-dra/akri-kubelet-plugin:{}", app_version())
    );
    assert_eq!(container["command"], json!(["akri-kubelet-plugin"]));
    let args = strings(&container["args"]);
    for flag in [
        "--registry-dir=/var/lib/kubelet/plugins_registry",
        "--plugins-dir=/var/lib/kubelet/plugins",
        "--cdi-dir=/var/run/cdi",
        "--device-metadata=true",
        "--binding-conditions=auto",
        "--state-dir=/var/lib/akri-kubelet-plugin",
        "--discovery-socket=/var/lib/akri/agent-registration.sock",
        "--consumable-capacity=auto",
        "--instance-grace-seconds=30",
        "--shared-instance-grace-seconds=300",
        "--startup-wait-seconds=30",
        "--property-namespaces=akri-system",
        "--metrics-address=0.0.0.0:8080",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
    }
    for absent in ["--debug-echo-socket", "--log-json"] {
        assert!(
            !args.iter().any(|a| a.starts_with(absent)),
            "{absent} is opt-in: {args:?}"
        );
    }
    let env = container["env"].as_array().unwrap();
    let node_name = env.iter().find(|e| e["name"] == "NODE_NAME").unwrap();
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    let rust_log = env.iter().find(|e| e["name"] == "RUST_LOG").unwrap();
    assert_eq!(rust_log["value"], "info");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        container["securityContext"],
        json!({
            "runAsUser": 0, "runAsNonRoot": false, "privileged": false,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": { "drop": ["ALL"] }, "seccompProfile": { "type": "RuntimeDefault" },
        })
    );
    let mut paths = host_paths(pod);
    paths.sort();
    assert_eq!(
        paths,
        [
            "/dev",
            "/var/lib/akri",
            "/var/lib/akri-kubelet-plugin",
            "/var/lib/kubelet/plugins",
            "/var/lib/kubelet/plugins_registry",
            "/var/run/cdi",
        ],
        "no udev, device-plugins or pod-resources mounts by default"
    );
    // Each host path is mounted where the flags (and the kubelet) expect it; the host's /dev
    // read-only beside the container's own, where --host-dev says.
    for mount in container["volumeMounts"].as_array().unwrap() {
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        if volume["hostPath"]["path"] == "/dev" {
            assert_eq!(mount["mountPath"], "/host/dev");
            assert_eq!(mount["readOnly"], true);
            assert!(strings(&container["args"]).contains(&"--host-dev=/host/dev".to_string()));
            continue;
        }
        assert_eq!(volume["hostPath"]["path"], mount["mountPath"]);
    }

    let deployment = find(&objects, "Deployment", "akri-driver-controller");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    let container = &pod["containers"][0];
    assert_eq!(
        container["image"],
        format!("ghcr.io/akri-dra/akri-driver-controller:{}", app_version())
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    let args = strings(&container["args"]);
    for flag in [
        "--instance-namespace=akri-system",
        "--lease-name=akri-driver-controller",
        "--metrics-address=0.0.0.0:8080",
        "--debounce-ms=500",
        "--consumable-capacity=auto",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
    }
    let env = strings(
        &container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].clone())
            .collect(),
    );
    assert!(env.contains(&"POD_NAME".into()) && env.contains(&"POD_NAMESPACE".into()));
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");

    for service in [
        "akri-kubelet-plugin-metrics",
        "akri-driver-controller-metrics",
    ] {
        find(&objects, "Service", service);
    }
    // Slices, claim status, Instances, discovery errors, handler Leases, the ConfigMaps
    // nodes read; BrokerTemplates.
    assert_eq!(of_kind(&objects, "ValidatingAdmissionPolicy").len(), 7);
    assert_eq!(
        of_kind(&objects, "ValidatingAdmissionPolicyBinding").len(),
        7
    );
    // Secret and ConfigMap reads only in the release namespace when no propertyNamespaces are
    // listed, and references elsewhere refused on the node.
    let bindings: Vec<_> = of_kind(&objects, "RoleBinding")
        .into_iter()
        .filter(|b| b["metadata"]["name"] == "akri-kubelet-plugin-properties")
        .map(|b| b["metadata"]["namespace"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(bindings, ["akri-system"]);
    // Instances, too, only where the node writes them (legacy off: the release namespace).
    let bindings: Vec<_> = of_kind(&objects, "RoleBinding")
        .into_iter()
        .filter(|b| b["metadata"]["name"] == "akri-kubelet-plugin-instances")
        .map(|b| b["metadata"]["namespace"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(bindings, ["akri-system"]);
    assert!(of_kind(&objects, "ClusterRoleBinding").iter().all(|b| {
        let name = &b["metadata"]["name"];
        name != "akri-kubelet-plugin-properties" && name != "akri-kubelet-plugin-instances"
    }));
    let args = strings(&daemon_set["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert!(
        args.iter()
            .any(|a| a == "--property-namespaces=akri-system"),
        "{args:?}"
    );
    // No Secret by default: the flag says none, and the role grants none.
    assert!(args.iter().any(|a| a == "--property-secrets="), "{args:?}");
    let properties = find(&objects, "ClusterRole", "akri-kubelet-plugin-properties");
    assert_eq!(
        properties["rules"],
        json!([{ "apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"] }])
    );
    for off in ["ServiceMonitor", "DiscoveryConfiguration"] {
        assert!(of_kind(&objects, off).is_empty(), "{off} is opt-in");
    }
    // The broker-controller is on by default: probed on its metrics port, served by a Service.
    let broker = &find(&objects, "Deployment", "akri-broker-controller")["spec"]["template"]["spec"]
        ["containers"][0];
    assert_eq!(broker["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(broker["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(broker["ports"][0]["containerPort"], 8080);
    let args = strings(&broker["args"]);
    for flag in [
        "--lease-name=akri-broker-controller",
        "--metrics-address=0.0.0.0:8080",
    ] {
        assert!(args.contains(&flag.to_string()), "{flag} in {args:?}");
    }
    find(&objects, "Service", "akri-broker-controller-metrics");
    // Nothing lands in a namespace other than the release's (RoleBindings excepted).
    for object in &objects {
        if let Some(ns) = object["metadata"]["namespace"].as_str() {
            assert_eq!(ns, "akri-system", "{}", object["metadata"]["name"]);
        }
    }

    let without = helm
        .template(
            "akri",
            "akri-system",
            &["--set", "admissionPolicy.enabled=false"],
        )
        .await;
    assert!(of_kind(&without, "ValidatingAdmissionPolicy").is_empty());
    assert!(of_kind(&without, "ValidatingAdmissionPolicyBinding").is_empty());

    let without = helm
        .template(
            "akri",
            "akri-system",
            &["--set", "brokerController.enabled=false"],
        )
        .await;
    assert!(
        !names(&without)
            .iter()
            .any(|n| n.contains("broker-controller")),
        "brokerController.enabled=false leaves out the broker-controller and its RBAC"
    );
}

#[tokio::test]
async fn template_renders_every_option_of_the_full_values() {
    let helm = Helm::new();
    let full = full_values();
    let objects = helm.template("edge", "edge-system", &["-f", &full]).await;

    let daemon_set = find(&objects, "DaemonSet", "edge-akri-kubelet-plugin");
    assert_eq!(
        daemon_set["spec"]["updateStrategy"]["rollingUpdate"],
        json!({ "maxUnavailable": "10%", "maxSurge": 0 })
    );
    let pod = &daemon_set["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    for flag in [
        "--cdi-dir=/etc/cdi",
        "--device-metadata=false",
        "--debug-echo-socket=/var/lib/akri/debugEcho.sock",
        "--debug-echo-availability-file=/var/lib/akri/debug-echo-availability.txt",
        "--debug-echo-shared",
        "--embed-handlers=udev,static",
        "--consumable-capacity=on",
        "--property-namespaces=akri-credentials,cameras",
        "--property-secrets=camera-credentials",
        r#"--handler-container-access={"serial":{"deviceNodes":[{"path":"/dev/ttyUSB","writable":true}],"mounts":[{"path":"/var/lib/serial-firmware/"}]}}"#,
        "--metrics-address=[::]:9090",
        "--log-json",
        "--instance-grace-seconds=60",
        "--shared-instance-grace-seconds=120",
        "--max-instances-per-configuration=1024",
        "--legacy-namespaces=cameras",
        "--legacy-broker-property-names=RESOLUTION,FORMAT",
        "--device-taints=on",
        "--vanished-device-grace-seconds=120",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
    }
    assert_eq!(
        container["image"],
        "ghcr.io/akri-dra/akri-kubelet-plugin:0.1.0-rc.1"
    );
    let rust_log = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "RUST_LOG")
        .unwrap();
    assert_eq!(rust_log["value"], "debug");
    let paths = host_paths(pod);
    for path in [
        "/etc/cdi",
        "/run/udev",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
    ] {
        assert!(paths.iter().any(|p| p == path), "{path} missing: {paths:?}");
    }
    let udev = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/run/udev")
        .unwrap();
    assert_eq!(udev["readOnly"], true);
    assert_eq!(
        pod["imagePullSecrets"],
        json!([{ "name": "registry-credentials" }])
    );

    let controller = find(&objects, "Deployment", "edge-akri-driver-controller");
    let container = &controller["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        format!(
            "ghcr.io/akri-dra/akri-driver-controller@sha256:{}",
            "0".repeat(64)
        )
    );
    let args = strings(&container["args"]);
    for flag in [
        "--lease-name=akri-leader",
        // A node frees only its own slots: a gone node's are the driver-controller's.
        "--legacy-namespaces=cameras",
        "--legacy-node-lost-grace-seconds=120",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
    }
    // Shared devices follow the same model as the node-local ones.
    for flag in [
        "--consumable-capacity=on",
        "--device-taints=on",
        "--vanished-device-grace-seconds=120",
        "--node-lost-grace-seconds=90",
    ] {
        assert!(
            strings(&container["args"]).contains(&flag.to_string()),
            "{flag}"
        );
    }
    let lease_rule = find(&objects, "Role", "edge-akri-driver-controller")["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resourceNames"].is_array())
        .unwrap()
        .clone();
    assert_eq!(lease_rule["resourceNames"], json!(["akri-leader"]));

    let broker = find(&objects, "Deployment", "edge-akri-broker-controller");
    assert_eq!(
        broker["spec"]["template"]["spec"]["containers"][0]["image"],
        format!(
            "registry.example.com/akri/broker-controller:{}",
            app_version()
        )
    );
    find(&objects, "ServiceAccount", "edge-akri-broker-controller");
    assert_eq!(
        of_kind(&objects, "ServiceMonitor").len(),
        3 + 4,
        "one per component: the kubelet-plugin, the controllers and the 4 handlers"
    );
    let rule = find(&objects, "PrometheusRule", "edge-akri");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let dashboard = find(&objects, "ConfigMap", "edge-akri-grafana-dashboard");
    assert_eq!(dashboard["metadata"]["namespace"], "monitoring");

    // Secret and ConfigMap reads only in the listed namespaces.
    let bindings: Vec<_> = of_kind(&objects, "RoleBinding")
        .into_iter()
        .filter(|b| b["metadata"]["name"] == "edge-akri-kubelet-plugin-properties")
        .map(|b| b["metadata"]["namespace"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(bindings, ["akri-credentials", "cameras"]);
    assert!(
        of_kind(&objects, "ClusterRoleBinding")
            .iter()
            .all(|b| b["metadata"]["name"] != "edge-akri-kubelet-plugin-properties")
    );

    // The handlers' own DaemonSets: Akri's socket layout in a directory of their own, which
    // the kubelet-plugin makes for the handler's group, which its pod joins; no API access.
    let plugin =
        &find(&objects, "DaemonSet", "edge-akri-kubelet-plugin")["spec"]["template"]["spec"];
    assert_eq!(
        plugin["securityContext"]["supplementalGroups"],
        json!([65532]),
        "the kubelet-plugin reaches non-root handlers through their group"
    );
    let own: Vec<_> = (strings(&plugin["containers"][0]["args"]).into_iter())
        .filter(|a| a.starts_with("--own-handler-directory="))
        .collect();
    assert_eq!(
        own,
        [
            "--own-handler-directory=udev:0",
            "--own-handler-directory=opcua:65532",
            "--own-handler-directory=onvif:65532",
            "--own-handler-directory=debugEcho:65532",
        ]
    );
    let udev = &find(&objects, "DaemonSet", "edge-akri-udev-discovery-handler")["spec"]["template"]
        ["spec"];
    assert_eq!(udev["automountServiceAccountToken"], false);
    assert_eq!(
        udev["serviceAccountName"],
        "edge-akri-udev-discovery-handler"
    );
    assert_eq!(udev["priorityClassName"], "system-node-critical");
    assert_eq!(udev["tolerations"], json!([{ "operator": "Exists" }]));
    let container = &udev["containers"][0];
    assert_eq!(
        container["image"],
        format!(
            "ghcr.io/akri-dra/akri-udev-discovery-handler:{}",
            app_version()
        )
    );
    assert_eq!(
        strings(&container["args"]),
        [
            "--handlers-dir=/var/lib/akri",
            "--udev-data=/run/udev/data",
            "--rescan-seconds=60",
            "--log-json",
            "--health-address=[::]:8091",
        ]
    );
    // Ready once registered with the kubelet-plugin, on a port of its own per handler (the
    // node's, with hostNetwork).
    assert_eq!(
        (
            &container["readinessProbe"]["httpGet"]["path"],
            &container["livenessProbe"]["httpGet"]["path"],
            &container["ports"][0]["containerPort"],
        ),
        (&json!("/readyz"), &json!("/healthz"), &json!(8091))
    );
    assert_eq!(container["env"][0]["value"], "debug");
    assert_eq!(host_paths(udev), ["/var/lib/akri/udev", "/run/udev"]);
    assert_eq!(
        container["volumeMounts"][0],
        json!({ "name": "own-directory", "mountPath": "/var/lib/akri" })
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    assert_eq!(container["securityContext"]["runAsUser"], 0, "udev: root");
    // OPC UA: its rescan, a writable emptyDir for the client's trust lists, and (asked for
    // here) the node's network, where Akri's default discovery URL finds an LDS on the node.
    // ONVIF: the node's network by default, for WS-Discovery's multicast.
    for (handler, args, tmp) in [
        (
            "opcua",
            vec![
                "--handlers-dir=/var/lib/akri",
                "--rescan-seconds=30",
                "--pki-dir=/tmp/akri-opcua-pki",
                "--log-json",
                "--health-address=[::]:8092",
            ],
            true,
        ),
        (
            "onvif",
            vec![
                "--handlers-dir=/var/lib/akri",
                "--rescan-seconds=20",
                "--log-json",
                "--health-address=[::]:8093",
            ],
            false,
        ),
    ] {
        let pod = &find(
            &objects,
            "DaemonSet",
            &format!("edge-akri-{handler}-discovery-handler"),
        )["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false, "{handler}");
        assert_eq!(pod["hostNetwork"], true, "{handler}");
        assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet", "{handler}");
        let container = &pod["containers"][0];
        assert_eq!(
            container["image"],
            format!(
                "ghcr.io/akri-dra/akri-{handler}-discovery-handler:{}",
                app_version()
            )
        );
        assert_eq!(strings(&container["args"]), args, "{handler}");
        assert_eq!(
            host_paths(pod),
            [format!("/var/lib/akri/{handler}")],
            "{handler}"
        );
        let security = &container["securityContext"];
        assert_eq!(
            (&security["runAsUser"], &security["runAsGroup"]),
            (&json!(65532), &json!(65532)),
            "{handler}"
        );
        assert_eq!(security["runAsNonRoot"], true, "{handler}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{handler}");
        let mounts_tmp = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/tmp");
        assert_eq!(mounts_tmp, tmp, "{handler}: /tmp");
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"],
            json!(["ALL"]),
            "{handler}"
        );
    }
    let echo = &find(
        &objects,
        "DaemonSet",
        "edge-akri-debug-echo-discovery-handler",
    )["spec"]["template"]["spec"];
    let container = &echo["containers"][0];
    assert_eq!(
        container["image"],
        "ghcr.io/akri-dra/akri-debug-echo-discovery-handler:0.1.0-rc.1"
    );
    assert!(strings(&container["args"]).contains(&"--shared".to_string()));
    assert_eq!(
        find(
            &objects,
            "ServiceAccount",
            "edge-akri-debug-echo-discovery-handler"
        )["automountServiceAccountToken"],
        false
    );
    assert!(
        of_kind(&objects, "RoleBinding")
            .iter()
            .chain(of_kind(&objects, "ClusterRoleBinding").iter())
            .all(|b| !b["subjects"].to_string().contains("discovery-handler")),
        "no RBAC for handlers"
    );

    let configurations = of_kind(&objects, "DiscoveryConfiguration");
    let handlers: Vec<_> = configurations
        .iter()
        .map(|c| c["spec"]["discoveryHandler"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(handlers, ["debugEcho", "udev", "opcua", "onvif"]);
    let debug_echo = find(&objects, "DiscoveryConfiguration", "akri-debug-echo");
    let details: Value = serde_yaml::from_str(
        debug_echo["spec"]["discoveryHandler"]["discoveryDetails"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(details, json!({ "descriptions": ["lobby", "dock"] }));
    assert_eq!(debug_echo["spec"]["capacity"], 2);
    assert_eq!(
        debug_echo["spec"]["discoveryHandler"]["discoveryProperties"][1]["valueFrom"]["secretKeyRef"]
            ["namespace"],
        "akri-credentials"
    );
    assert_eq!(
        find(&objects, "DiscoveryConfiguration", "akri-opcua")["spec"]["uniqueDevices"],
        false
    );
}

/// `legacyDevicePlugin.slotReclaimGraceSeconds: 0` (reclaim a slot as soon as no container
/// is behind it) reaches the plugin as 0, not as the default 300 (it did, through `| default`).
#[tokio::test]
async fn a_zero_slot_reclaim_grace_stays_zero() {
    let helm = Helm::new();
    for (value, want) in [("0", "0"), ("45", "45")] {
        let objects = helm
            .template(
                "akri",
                "akri",
                &[
                    "--set",
                    "legacyDevicePlugin.enabled=true",
                    "--set",
                    &format!("legacyDevicePlugin.slotReclaimGraceSeconds={value}"),
                ],
            )
            .await;
        let daemon_set = find(&objects, "DaemonSet", "akri-kubelet-plugin");
        let args = strings(&daemon_set["spec"]["template"]["spec"]["containers"][0]["args"]);
        let flag = format!("--slot-reclaim-grace-seconds={want}");
        assert!(args.contains(&flag), "{flag} missing: {args:?}");
    }
}

/// `dra: off` (a cluster without DRA, rendered offline) renders the legacy device plugins
/// and the driver-controller freeing gone nodes' slots: no other DRA component, no
/// DiscoveryConfiguration, no ResourceSlice policy, both told `--dra=off`; without legacy mode it refuses, saying what to set. (On a real 1.33 API server
/// `auto` does the same: `legacy_only`.)
#[tokio::test]
async fn dra_off_renders_only_the_legacy_device_plugins_and_refuses_without_them() {
    let helm = Helm::new();
    let objects = helm
        .template(
            "akri",
            "akri",
            &[
                "--set",
                "dra=off",
                "--set",
                "legacyDevicePlugin.enabled=true",
            ],
        )
        .await;
    assert!(
        of_kind(&objects, "DiscoveryConfiguration").is_empty(),
        "{:?}",
        names(&objects)
    );
    // One Deployment: the driver-controller, only to free deleted and lost nodes' slots.
    let deployments = of_kind(&objects, "Deployment");
    assert_eq!(deployments.len(), 1, "{:?}", names(&objects));
    let controller = find(&objects, "Deployment", "akri-driver-controller");
    let args = strings(&controller["spec"]["template"]["spec"]["containers"][0]["args"]);
    for flag in [
        "--dra=off",
        "--legacy-namespaces=akri",
        "--legacy-node-lost-grace-seconds=300",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
    }
    let rules = find(&objects, "ClusterRole", "akri-driver-controller")["rules"].clone();
    assert_eq!(
        rules,
        json!([{ "apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"] }]),
        "without DRA the driver-controller reads Nodes only, cluster-wide"
    );
    let policies: Vec<&str> = of_kind(&objects, "ValidatingAdmissionPolicy")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        policies,
        [
            "akri-kubelet-plugin-instances",
            "akri-kubelet-plugin-configurations",
            "akri-kubelet-plugin-discovery-errors"
        ]
    );
    let daemon_set = find(&objects, "DaemonSet", "akri-kubelet-plugin");
    let args = strings(&daemon_set["spec"]["template"]["spec"]["containers"][0]["args"]);
    for flag in ["--dra=off", "--legacy-device-plugins"] {
        assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
    }
    let default = helm.template("akri", "akri", &[]).await;
    let args = strings(
        &find(&default, "DaemonSet", "akri-kubelet-plugin")["spec"]["template"]["spec"]["containers"]
            [0]["args"],
    );
    assert!(!args.iter().any(|a| a.starts_with("--dra")), "{args:?}");

    let chart = chart();
    let run = helm
        .run(&["template", "akri", &chart, "--set", "dra=off"])
        .await;
    assert!(!run.success);
    assert!(
        run.stderr
            .contains("dra=off leaves only the legacy device plugins, which are off: set legacyDevicePlugin.enabled=true"),
        "{}",
        run.stderr
    );
}

/// One value names every image: a user with a private registry sets `image.registry` and
/// `image.tag` (and maybe `image.pullPolicy`) once, not per component; a component's digest
/// still pins it.
#[tokio::test]
async fn image_registry_and_tag_name_every_component_image() {
    let helm = Helm::new();
    let full = full_values();
    let objects = helm
        .template(
            "akri",
            "akri",
            &[
                "-f",
                &full,
                "--set",
                "image.registry=localhost:5000/akri",
                "--set",
                "image.tag=9.9.9-abc1234",
                "--set",
                "image.pullPolicy=Never",
            ],
        )
        .await;
    let mut images = Vec::new();
    for object in &objects {
        let containers = &object["spec"]["template"]["spec"]["containers"];
        for container in containers.as_array().into_iter().flatten() {
            let image = container["image"].as_str().unwrap().to_string();
            assert_eq!(container["imagePullPolicy"], "Never", "{image}");
            images.push(image);
        }
    }
    images.sort();
    images.dedup();
    // Every component of the full values: the kubelet-plugin, both controllers, the four
    // discovery handlers.
    assert_eq!(images.len(), 7, "{images:?}");
    for image in &images {
        // The full values pin the driver-controller by digest, which wins over any tag.
        let name = match image.split_once('@') {
            Some((name, digest)) => {
                assert!(digest.starts_with("sha256:"), "{image}");
                name
            }
            None => {
                let (name, tag) = image.rsplit_once(':').unwrap();
                assert_eq!(tag, "9.9.9-abc1234", "{image}");
                name
            }
        };
        // The full values name the broker-controller's whole image in its repository (an
        // empty registry): that stays as it is.
        assert!(
            name.starts_with("localhost:5000/akri/akri-")
                || name == "registry.example.com/akri/broker-controller",
            "{image}"
        );
    }

    let pinned = format!("sha256:{}", "a".repeat(64));
    let objects = helm
        .template(
            "akri",
            "akri",
            &[
                "--set",
                "image.registry=localhost:5000/akri",
                "--set",
                &format!("driverController.image.digest={pinned}"),
            ],
        )
        .await;
    let controller = find(&objects, "Deployment", "akri-driver-controller");
    assert_eq!(
        controller["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("localhost:5000/akri/akri-driver-controller@{pinned}")
    );
}

#[tokio::test]
async fn the_schema_refuses_typos_and_bad_values() {
    let helm = Helm::new();
    let chart = chart();
    // (--set, where the schema says it fails, and the unknown key if it is one)
    for (set, at, unknown) in [
        ("kubeletPlugin.imag=x", "/kubeletPlugin", Some("imag")),
        (
            "kubeletPlugin.image.tags=x",
            "/kubeletPlugin/image",
            Some("tags"),
        ),
        (
            "driverController.replica=3",
            "/driverController",
            Some("replica"),
        ),
        (
            "metrics.serviceMonitor.enable=true",
            "/metrics/serviceMonitor",
            Some("enable"),
        ),
        (
            "discoveryConfigurations.debugEcho.discoveryDetails.description[0]=x",
            "/discoveryConfigurations/debugEcho/discoveryDetails",
            Some("description"),
        ),
        (
            "discoveryConfigurations.zeroconf.enabled=true",
            "/discoveryConfigurations",
            Some("zeroconf"),
        ),
        (
            "kubeletPlugin.resources.request.cpu=1",
            "/kubeletPlugin/resources",
            Some("request"),
        ),
        (
            "kubeletPlugin.securityContext.capabilities.ad[0]=NET_ADMIN",
            "/kubeletPlugin/securityContext/capabilities",
            Some("ad"),
        ),
        (
            "driverController.affinity.nodeAfinity.x=y",
            "/driverController/affinity",
            Some("nodeAfinity"),
        ),
        ("consumableCapacity=maybe", "/consumableCapacity", None),
        ("logFormat=xml", "/logFormat", None),
        (
            "driverController.image.pullPolicy=Sometimes",
            "/driverController/image/pullPolicy",
            None,
        ),
        (
            "discoveryConfigurations.onvif.name=Not_A_Label",
            "/discoveryConfigurations/onvif/name",
            None,
        ),
        (
            "discoveryConfigurations.debugEcho.capacity=0",
            "/discoveryConfigurations/debugEcho/capacity",
            None,
        ),
        (
            "propertyNamespaces[0]=Bad_Namespace",
            "/propertyNamespaces/0",
            None,
        ),
    ] {
        let run = helm.run(&["template", "akri", &chart, "--set", set]).await;
        assert!(!run.success, "--set {set} was accepted:\n{}", run.stdout);
        let expected = match unknown {
            Some(key) => format!("at '{at}': additional properties '{key}' not allowed"),
            None => format!("at '{at}': "),
        };
        assert!(
            run.stderr
                .contains("don't meet the specifications of the schema")
                && run.stderr.contains(&expected),
            "--set {set}: expected a schema error with {expected:?}:\n{}",
            run.stderr
        );
    }
}

// ---------------------------------------------------------------------------------------
// Installed into a real API server.

/// Two releases in one control plane: `akri` with the default values, and `edge` with the
/// full values (ServiceMonitors off: the control plane has no prometheus-operator CRDs).
struct Installed {
    default_ns: String,
    full_ns: String,
    /// The full values' propertyNamespaces.
    property_ns: [&'static str; 2],
    /// A namespace with nothing of ours in it.
    other_ns: String,
}

async fn installed() -> &'static Installed {
    static INSTALLED: OnceCell<Installed> = OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let cp = ControlPlane::shared_api_server()
                .await
                .expect("control plane starts");
            let client = cp.client().await.unwrap();
            let property_ns = ["akri-credentials", "cameras"];
            for ns in property_ns {
                Api::<Namespace>::all(client.clone())
                    .create(
                        &PostParams::default(),
                        &from_json(json!({ "metadata": { "name": ns } })),
                    )
                    .await
                    .unwrap();
            }
            let other_ns = cp.create_namespace("elsewhere").await.unwrap();
            let default_ns = ControlPlane::unique_name("akri-system");
            let full_ns = ControlPlane::unique_name("edge-system");
            let helm = Helm::new();
            let kubeconfig = cp.kubeconfig().display().to_string();
            let chart = chart();
            let full = full_values();
            let start = std::time::Instant::now();
            helm.ok(&[
                "install",
                "akri",
                &chart,
                "--namespace",
                &default_ns,
                "--create-namespace",
                "--kubeconfig",
                &kubeconfig,
            ])
            .await;
            helm.ok(&[
                "install",
                "edge",
                &chart,
                "--namespace",
                &full_ns,
                "--create-namespace",
                "--kubeconfig",
                &kubeconfig,
                "-f",
                &full,
                // No prometheus-operator CRDs here, and no `monitoring` namespace.
                "--set",
                "metrics.serviceMonitor.enabled=false",
                "--set",
                "metrics.prometheusRule.enabled=false",
                "--set",
                "metrics.grafanaDashboard.namespace=",
            ])
            .await;
            eprintln!(
                "two helm installs on Kubernetes {} in {:?}",
                cp.bins().version(),
                start.elapsed()
            );
            Installed {
                default_ns,
                full_ns,
                property_ns,
                other_ns,
            }
        })
        .await
}

#[tokio::test]
async fn install_creates_every_object_of_both_releases() {
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let helm = Helm::new();
    let kubeconfig = cp.kubeconfig().display().to_string();
    // akri: 3 ServiceAccounts, 6 ClusterRoles and their bindings (the Secret reads and the
    // kubelet-plugin's Instances by a RoleBinding in the release namespace), 3 Roles (the
    // kubelet-plugin's, of what the driver-controller hands the nodes, included) and their
    // bindings, 3 Services, the DaemonSet, 2 Deployments, 7 admission policies and their
    // bindings. edge: the Secret reads bound by 2 RoleBindings instead of a
    // ClusterRoleBinding, the broker kinds by a RoleBinding in one namespace, 4
    // DiscoveryConfigurations, 4 discovery handlers' DaemonSets, ServiceAccounts and metrics
    // Services, legacy mode's Configuration admission policy and its binding, the
    // driver-controller's Role and RoleBinding in the legacy namespace (gone nodes' slots),
    // the kubelet-plugin's Instances bound there too, and the Grafana dashboard's ConfigMap.
    for (release, ns, expected) in [
        ("akri", &installed.default_ns, 41),
        ("edge", &installed.full_ns, 64),
    ] {
        let status: Value = serde_json::from_str(
            &helm
                .ok(&[
                    "status",
                    release,
                    "-n",
                    ns,
                    "--kubeconfig",
                    &kubeconfig,
                    "-o",
                    "json",
                ])
                .await,
        )
        .unwrap();
        assert_eq!(status["info"]["status"], "deployed", "{status:#}");
        let manifest = parse_manifest(
            &helm
                .ok(&[
                    "get",
                    "manifest",
                    release,
                    "-n",
                    ns,
                    "--kubeconfig",
                    &kubeconfig,
                ])
                .await,
        );
        assert_eq!(
            manifest.len(),
            expected,
            "objects of {release}: {:#?}",
            names(&manifest)
        );
        for object in &manifest {
            let (group, version) = match object["apiVersion"].as_str().unwrap().split_once('/') {
                Some((group, version)) => (group, version),
                None => ("", object["apiVersion"].as_str().unwrap()),
            };
            let gvk = GroupVersionKind::gvk(group, version, object["kind"].as_str().unwrap());
            let (resource, capabilities) = kube::discovery::pinned_kind(&client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{gvk:?} is not served: {e}"));
            let name = object["metadata"]["name"].as_str().unwrap();
            let api: Api<DynamicObject> =
                if capabilities.scope == kube::discovery::Scope::Namespaced {
                    let object_ns = object["metadata"]["namespace"].as_str().unwrap_or(ns);
                    Api::namespaced_with(client.clone(), object_ns, &resource)
                } else {
                    Api::all_with(client.clone(), &resource)
                };
            api.get(name)
                .await
                .unwrap_or_else(|e| panic!("{} {name} of {release}: {e}", object["kind"]));
        }
    }
}

#[tokio::test]
async fn the_kubelet_plugin_cluster_role_is_the_documented_one() {
    let installed = installed().await;
    let client = ControlPlane::shared_api_server()
        .await
        .unwrap()
        .client()
        .await
        .unwrap();
    // The edge release runs the legacy device plugins.
    for (role, legacy) in [
        ("akri-kubelet-plugin", false),
        ("edge-akri-kubelet-plugin", true),
    ] {
        let role = Api::<ClusterRole>::all(client.clone())
            .get(role)
            .await
            .unwrap();
        assert_eq!(
            serde_json::to_value(role.rules.unwrap()).unwrap(),
            akri_testing::rbac::kubelet_plugin_rules_with(legacy),
            "the chart and akri_testing::rbac (which the plugin's tests run under) must agree"
        );
        let instances = Api::<ClusterRole>::all(client.clone())
            .get(&format!("{}-instances", role.metadata.name.unwrap()))
            .await
            .unwrap();
        assert_eq!(
            serde_json::to_value(instances.rules.unwrap()).unwrap(),
            akri_testing::rbac::kubelet_plugin_instance_rules(),
            "the chart and akri_testing::rbac must agree on the Instances' rules"
        );
    }
    for (plugin, ns) in [
        ("akri-kubelet-plugin", &installed.default_ns),
        ("edge-akri-kubelet-plugin", &installed.full_ns),
    ] {
        let role = Api::<Role>::namespaced(client.clone(), ns)
            .get(&format!("{plugin}-from-driver-controller"))
            .await
            .unwrap();
        assert_eq!(
            serde_json::to_value(role.rules.unwrap()).unwrap(),
            akri_testing::rbac::kubelet_plugin_namespace_rules(),
            "the chart and akri_testing::rbac must agree on the release namespace's rules"
        );
    }
}

/// The chart's `appVersion`, as charts/akri/Chart.yaml says it: the images' default tag.
fn app_version() -> String {
    product::chart_field(&repo().join("charts/akri"), "appVersion").expect("an appVersion")
}

/// What each component needs (read from its code and the README), and a selection of what
/// it must not have, checked in the `edge` release (full values: propertyNamespaces listed,
/// broker-controller on in the second of them only, which is also the one legacy namespace
/// (the driver-controller frees gone nodes' slots there), Lease `akri-leader`). One row: component, verb,
/// `group/resource[/subresource]` (`core` for the core group), where (`cluster`: cluster-scoped
/// or every namespace; `release`: the release namespace; `property`: a listed
/// propertyNamespace; `other`: any other namespace), object name or `-`, and `yes` or `no`.
const RBAC: &str = "
kubelet-plugin     get     core/nodes                                cluster   -             yes
kubelet-plugin     list    core/nodes                                cluster   -             no
kubelet-plugin     update  core/nodes                                cluster   -             no
kubelet-plugin     list    akri.sh/discoveryconfigurations           cluster   -             no
kubelet-plugin     watch   akri.sh/discoveryconfigurations           cluster   -             no
kubelet-plugin     patch   akri.sh/discoveryconfigurations/status    cluster   -             yes
kubelet-plugin     patch   akri.sh/discoveryconfigurations           cluster   -             no
kubelet-plugin     delete  akri.sh/discoveryconfigurations           cluster   -             no
kubelet-plugin     list    akri.sh/configurations                    cluster   -             yes
kubelet-plugin     watch   akri.sh/configurations                    cluster   -             yes
kubelet-plugin     patch   akri.sh/configurations                    cluster   -             yes
kubelet-plugin     update  akri.sh/configurations                    cluster   -             no
kubelet-plugin     delete  akri.sh/configurations                    cluster   -             no
kubelet-plugin     create  akri.sh/instances                         release   -             yes
kubelet-plugin     patch   akri.sh/instances                         release   -             yes
kubelet-plugin     delete  akri.sh/instances                         release   -             yes
kubelet-plugin     list    akri.sh/instances                         release   -             yes
kubelet-plugin     update  akri.sh/instances                         release   -             no
kubelet-plugin     watch   akri.sh/instances                         property  -             yes
kubelet-plugin     patch   akri.sh/instances                         property  -             yes
kubelet-plugin     list    akri.sh/instances                         other     -             no
kubelet-plugin     watch   akri.sh/instances                         other     -             no
kubelet-plugin     patch   akri.sh/instances                         other     -             no
kubelet-plugin     list    akri.sh/propertyfilters                   cluster   -             no
kubelet-plugin     create  resource.k8s.io/resourceslices            cluster   -             yes
kubelet-plugin     patch   resource.k8s.io/resourceslices            cluster   -             yes
kubelet-plugin     delete  resource.k8s.io/resourceslices            cluster   -             yes
kubelet-plugin     watch   resource.k8s.io/resourceslices            cluster   -             yes
kubelet-plugin     get     resource.k8s.io/resourceclaims            other     -             yes
kubelet-plugin     list    resource.k8s.io/resourceclaims            other     -             no
kubelet-plugin     watch   resource.k8s.io/resourceclaims            other     -             no
kubelet-plugin     list    resource.k8s.io/resourceclaims            cluster   -             no
kubelet-plugin     watch   core/configmaps                           release   -             yes
kubelet-plugin     patch   core/configmaps                           release   -             no
kubelet-plugin     patch   resource.k8s.io/resourceclaims/status     other     -             yes
kubelet-plugin     update  resource.k8s.io/resourceclaims/status     other     -             no
kubelet-plugin     associated-node:patch resource.k8s.io/resourceclaims/driver other - yes
kubelet-plugin     arbitrary-node:patch resource.k8s.io/resourceclaims/driver other - yes
kubelet-plugin     patch   resource.k8s.io/resourceclaims            other     -             no
kubelet-plugin     create  resource.k8s.io/deviceclasses             cluster   -             no
kubelet-plugin     delete  resource.k8s.io/deviceclasses             cluster   -             no
kubelet-plugin     create  events.k8s.io/events                      other     -             yes
kubelet-plugin     patch   events.k8s.io/events                      other     -             yes
kubelet-plugin     get     core/pods                                 other     -             no
kubelet-plugin     update  core/pods                                 other     -             no
kubelet-plugin     list    core/secrets                              property  -             no
kubelet-plugin     watch   core/secrets                              property  -             no
kubelet-plugin     list    core/secrets                              property  camera-credentials  yes
kubelet-plugin     watch   core/secrets                              property  camera-credentials  yes
kubelet-plugin     get     core/secrets                              property  camera-credentials  yes
kubelet-plugin     list    core/secrets                              property  other-credentials  no
kubelet-plugin     get     core/secrets                              property  other-credentials  no
kubelet-plugin     list    core/configmaps                           property  -             yes
kubelet-plugin     watch   core/configmaps                           property  -             yes
kubelet-plugin     get     core/secrets                              property  -             no
kubelet-plugin     create  core/secrets                              property  -             no
kubelet-plugin     list    core/secrets                              cluster   -             no
kubelet-plugin     list    core/secrets                              other     -             no
kubelet-plugin     watch   core/secrets                              other     -             no
kubelet-plugin     get     core/secrets                              other     -             no
kubelet-plugin     list    core/configmaps                           other     -             no
kubelet-plugin     create  core/serviceaccounts/token                release   -             no
kubelet-plugin     get     coordination.k8s.io/leases                release   -             no
kubelet-plugin     create  coordination.k8s.io/leases                release   -             yes
kubelet-plugin     patch   coordination.k8s.io/leases                release   -             yes
kubelet-plugin     delete  coordination.k8s.io/leases                release   -             no
kubelet-plugin     create  coordination.k8s.io/leases                other     -             no
driver-controller  list    coordination.k8s.io/leases                release   -             yes
driver-controller  watch   coordination.k8s.io/leases                release   -             yes
driver-controller  list    coordination.k8s.io/leases                other     -             no
driver-controller  watch   akri.sh/discoveryconfigurations           cluster   -             yes
driver-controller  patch   akri.sh/discoveryconfigurations/status    cluster   -             yes
driver-controller  patch   akri.sh/discoveryconfigurations           cluster   -             no
driver-controller  delete  akri.sh/discoveryconfigurations           cluster   -             no
driver-controller  list    akri.sh/propertyfilters                   cluster   -             yes
driver-controller  patch   akri.sh/propertyfilters/status            cluster   -             yes
driver-controller  update  akri.sh/propertyfilters                   cluster   -             no
driver-controller  watch   akri.sh/instances                         release   -             yes
driver-controller  patch   akri.sh/instances                         release   -             yes
driver-controller  delete  akri.sh/instances                         release   -             yes
driver-controller  create  akri.sh/instances                         release   -             no
driver-controller  update  akri.sh/instances                         release   -             no
driver-controller  list    akri.sh/instances                         other     -             no
driver-controller  patch   akri.sh/instances                         other     -             no
driver-controller  watch   akri.sh/instances                         property  -             yes
driver-controller  patch   akri.sh/instances                         property  -             yes
driver-controller  delete  akri.sh/instances                         property  -             no
driver-controller  update  akri.sh/instances                         property  -             no
driver-controller  create  resource.k8s.io/deviceclasses             cluster   -             yes
driver-controller  patch   resource.k8s.io/deviceclasses             cluster   -             yes
driver-controller  delete  resource.k8s.io/deviceclasses             cluster   -             yes
driver-controller  watch   resource.k8s.io/deviceclasses             cluster   -             yes
driver-controller  create  resource.k8s.io/resourceslices            cluster   -             yes
driver-controller  patch   resource.k8s.io/resourceslices            cluster   -             yes
driver-controller  delete  resource.k8s.io/resourceslices            cluster   -             yes
driver-controller  list    resource.k8s.io/resourceslices            cluster   -             yes
driver-controller  list    resource.k8s.io/resourceclaims            other     -             yes
driver-controller  watch   core/configmaps                           release   -             yes
driver-controller  create  core/configmaps                           release   -             yes
driver-controller  patch   core/configmaps                           release   -             yes
driver-controller  delete  core/configmaps                           release   -             yes
driver-controller  patch   core/configmaps                           other     -             no
driver-controller  watch   resource.k8s.io/resourceclaims            other     -             yes
driver-controller  get     resource.k8s.io/resourceclaims            other     -             no
driver-controller  patch   resource.k8s.io/resourceclaims/status     other     -             no
driver-controller  create  events.k8s.io/events                      other     -             yes
driver-controller  patch   events.k8s.io/events                      other     -             yes
driver-controller  get     core/nodes                                cluster   -             yes
driver-controller  watch   core/nodes                                cluster   -             yes
driver-controller  update  core/nodes                                cluster   -             no
driver-controller  delete  core/nodes                                cluster   -             no
driver-controller  create  coordination.k8s.io/leases                release   -             yes
driver-controller  get     coordination.k8s.io/leases                release   akri-leader   yes
driver-controller  update  coordination.k8s.io/leases                release   akri-leader   yes
driver-controller  update  coordination.k8s.io/leases                release   someone-else  no
driver-controller  delete  coordination.k8s.io/leases                release   akri-leader   no
driver-controller  create  coordination.k8s.io/leases                other     -             no
driver-controller  update  coordination.k8s.io/leases                other     akri-leader   no
driver-controller  get     core/secrets                              release   -             no
driver-controller  get     core/secrets                              property  -             no
driver-controller  get     core/configmaps                           other     -             no
driver-controller  list    core/pods                                 cluster   -             no
broker-controller  list    akri.sh/brokertemplates                   other     -             yes
broker-controller  watch   akri.sh/discoveryconfigurations           cluster   -             yes
broker-controller  list    akri.sh/instances                         release   -             yes
broker-controller  list    akri.sh/instances                         other     -             no
broker-controller  patch   akri.sh/instances                         release   -             no
broker-controller  create  akri.sh/instances                         release   -             no
broker-controller  update  akri.sh/brokertemplates                   other     -             no
broker-controller  patch   akri.sh/brokertemplates/status            other     -             yes
broker-controller  patch   apps/deployments                          property  -             yes
broker-controller  patch   apps/deployments                          other     -             no
broker-controller  delete  core/pods                                 property  -             yes
broker-controller  watch   core/pods                                 property  -             yes
broker-controller  delete  core/pods                                 other     -             no
broker-controller  watch   core/pods                                 cluster   -             no
broker-controller  create  resource.k8s.io/resourceclaimtemplates    property  -             yes
broker-controller  create  resource.k8s.io/resourceclaimtemplates    other     -             no
broker-controller  create  resource.k8s.io/resourceclaims            other     -             no
broker-controller  create  core/secrets                              other     -             no
broker-controller  get     core/secrets                              release   -             no
broker-controller  update  coordination.k8s.io/leases                release   edge-akri-broker-controller  yes
broker-controller  update  coordination.k8s.io/leases                release   akri-leader   no
";

/// The same for the `akri` release (default values): no propertyNamespaces and no
/// propertySecrets, so ConfigMaps in the release namespace and no Secret at all, not even
/// Helm's release record by its name; the Leases under their default names; the
/// broker-controller on.
const RBAC_DEFAULT_VALUES: &str = "
kubelet-plugin     list    core/secrets                              release   -             no
kubelet-plugin     watch   core/secrets                              release   -             no
kubelet-plugin     list    core/secrets                              release   sh.helm.release.v1.akri.v1  no
kubelet-plugin     get     core/secrets                              release   sh.helm.release.v1.akri.v1  no
kubelet-plugin     watch   core/configmaps                           release   -             yes
kubelet-plugin     get     core/secrets                              other     -             no
kubelet-plugin     get     core/configmaps                           other     -             no
kubelet-plugin     list    core/secrets                              cluster   -             no
kubelet-plugin     list    core/configmaps                           other     -             no
kubelet-plugin     watch   core/secrets                              other     -             no
kubelet-plugin     list    akri.sh/configurations                    cluster   -             no
kubelet-plugin     patch   akri.sh/configurations                    cluster   -             no
driver-controller  update  coordination.k8s.io/leases                release   akri-driver-controller  yes
broker-controller  list    akri.sh/brokertemplates                   cluster   -             yes
broker-controller  watch   core/pods                                 cluster   -             yes
broker-controller  patch   apps/deployments                          other     -             yes
broker-controller  patch   akri.sh/instances                         release   -             no
broker-controller  update  coordination.k8s.io/leases                release   akri-broker-controller  yes
";

/// Checks every row of `table` for the ServiceAccounts of `release` (installed in
/// `release_ns`); returns the rows that do not hold.
async fn check_rbac(
    client: &kube::Client,
    table: &str,
    release: &str,
    release_ns: &str,
    installed: &Installed,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for row in table.lines().filter(|l| !l.trim().is_empty()) {
        let [component, verb, resource, place, name, expected] = row
            .split_whitespace()
            .collect::<Vec<_>>()
            .try_into()
            .unwrap_or_else(|_| panic!("six columns: {row}"));
        let (group, resource) = resource.split_once('/').expect("group/resource");
        let group = if group == "core" { "" } else { group };
        let (resource, subresource) = match resource.split_once('/') {
            Some((resource, sub)) => (resource, Some(sub)),
            None => (resource, None),
        };
        let namespace = match place {
            "cluster" => None,
            "release" => Some(release_ns),
            "property" => Some(installed.property_ns[1]),
            "other" => Some(installed.other_ns.as_str()),
            _ => panic!("unknown place in {row}"),
        };
        let review: SubjectAccessReview = from_json(json!({
            "spec": {
                "user": format!("system:serviceaccount:{release_ns}:{release}-{component}"),
                "groups": [
                    "system:serviceaccounts",
                    format!("system:serviceaccounts:{release_ns}"),
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace,
                    "name": (name != "-").then_some(name),
                },
            }
        }));
        let allowed = Api::<SubjectAccessReview>::all(client.clone())
            .create(&PostParams::default(), &review)
            .await
            .unwrap()
            .status
            .unwrap()
            .allowed;
        if allowed != (expected == "yes") {
            wrong.push(format!("{release}: {}", row.trim()));
        }
    }
    wrong
}

#[tokio::test]
async fn each_service_account_has_what_its_component_needs_and_no_more() {
    let installed = installed().await;
    let client = ControlPlane::shared_api_server()
        .await
        .unwrap()
        .client()
        .await
        .unwrap();
    let mut wrong = check_rbac(&client, RBAC, "edge-akri", &installed.full_ns, installed).await;
    wrong.extend(
        check_rbac(
            &client,
            RBAC_DEFAULT_VALUES,
            "akri",
            &installed.default_ns,
            installed,
        )
        .await,
    );
    assert!(
        wrong.is_empty(),
        "these rows do not hold (component, verb, resource, where, name, expected):\n{}",
        wrong.join("\n")
    );
}

/// A node's token reads the Secrets the chart's propertySecrets names, by name, and no other:
/// no list of a property namespace (it returned every Secret there, issue 52), not Helm's
/// release record in the release namespace, not another Secret by name.
#[tokio::test]
async fn a_node_reads_the_named_property_secrets_and_lists_no_namespace() {
    use k8s_openapi::api::core::v1::Secret;
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let admin = cp.client().await.unwrap();
    let cameras = installed.property_ns[1];
    for name in ["camera-credentials", "other-credentials"] {
        let secret: Secret = from_json(json!({
            "metadata": { "name": name }, "stringData": { "password": "x" },
        }));
        match Api::<Secret>::namespaced(admin.clone(), cameras)
            .create(&PostParams::default(), &secret)
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let forbidden = |result: Result<_, kube::Error>, what: &str| match result {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("{what}: {:?}", other.map(|_: ()| ())),
    };
    // The edge release lists camera-credentials; the akri release (default values) none.
    let edge = plugin_client_of(
        "edge-akri-kubelet-plugin",
        cp,
        &installed.full_ns,
        Some("node-s"),
    )
    .await;
    let secrets = Api::<Secret>::namespaced(edge.clone(), cameras);
    let by_name = kube::api::ListParams::default().fields("metadata.name=camera-credentials");
    assert_eq!(secrets.list(&by_name).await.unwrap().items.len(), 1);
    secrets.get("camera-credentials").await.unwrap();
    forbidden(
        secrets.list(&Default::default()).await.map(drop),
        "a list of the namespace",
    );
    forbidden(
        secrets.get("other-credentials").await.map(drop),
        "another Secret by name",
    );
    let other = kube::api::ListParams::default().fields("metadata.name=other-credentials");
    forbidden(
        secrets.list(&other).await.map(drop),
        "another Secret by a field selector",
    );
    let akri = plugin_client_on(cp, &installed.default_ns, Some("node-s")).await;
    let release = Api::<Secret>::namespaced(akri, &installed.default_ns);
    forbidden(
        release.list(&Default::default()).await.map(drop),
        "the release namespace",
    );
    forbidden(
        release.get("sh.helm.release.v1.akri.v1").await.map(drop),
        "Helm's release record",
    );
}

// ---------------------------------------------------------------------------------------
// The admission policies, with the token a kubelet-plugin pod on a node would have.

/// A client holding a token of the release's kubelet-plugin ServiceAccount: bound to a pod on
/// `node` (the pod is only an object: nothing runs it), as a DaemonSet pod's token is, or
/// bound to nothing when `node` is `None`.
async fn plugin_client_on(cp: &ControlPlane, ns: &str, node: Option<&str>) -> kube::Client {
    plugin_client_of("akri-kubelet-plugin", cp, ns, node).await
}

/// A client with a token of the kubelet-plugin ServiceAccount `sa` in `ns`, bound to a pod on
/// `node` (as a DaemonSet pod's token is) or to nothing.
async fn plugin_client_of(
    sa: &str,
    cp: &ControlPlane,
    ns: &str,
    node: Option<&str>,
) -> kube::Client {
    let admin = cp.client().await.unwrap();
    let mut spec = json!({ "audiences": [], "expirationSeconds": 600 });
    if let Some(node) = node {
        let pod: Pod = Api::<Pod>::namespaced(admin.clone(), ns)
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "metadata": { "name": format!("kubelet-plugin-{node}") },
                    "spec": {
                        "serviceAccountName": sa,
                        "nodeName": node,
                        "containers": [{ "name": "plugin", "image": "ghcr.io/akri-dra/akri-kubelet-plugin:0.1.0" }],
                    },
                })),
            )
            .await
            .unwrap();
        spec["boundObjectRef"] = json!({
            "apiVersion": "v1", "kind": "Pod",
            "name": pod.metadata.name, "uid": pod.metadata.uid,
        });
    }
    let token: TokenRequest = Api::<ServiceAccount>::namespaced(admin, ns)
        .create_subresource(
            "token",
            sa,
            &PostParams::default(),
            &from_json::<TokenRequest>(json!({ "spec": spec })),
        )
        .await
        .unwrap();
    let mut config = cp.client_config().await.unwrap();
    config.auth_info = from_json(json!({ "token": token.status.unwrap().token }));
    kube::Client::try_from(config).unwrap()
}

fn slice(name: &str, node: Option<&str>) -> ResourceSlice {
    let mut spec = json!({
        "driver": "debugecho.akri.sh",
        "pool": { "name": name, "generation": 1, "resourceSliceCount": 1 },
        "devices": [],
    });
    match node {
        Some(node) => spec["nodeName"] = json!(node),
        None => spec["allNodes"] = json!(true),
    }
    from_json(json!({ "metadata": { "name": name }, "spec": spec }))
}

/// Asserts a refusal by a policy: 403 with `message` in it.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, message: &str) {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status.message.contains("ValidatingAdmissionPolicy")
                    && status.message.contains(message),
                "expected a policy refusal with {message:?}, got: {}",
                status.message
            );
        }
        other => panic!("expected a refusal with {message:?}, got {other:?}"),
    }
}

fn instances(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("akri.sh", "v0", "Instance"),
        "instances",
    );
    Api::namespaced_with(client.clone(), ns, &resource)
}

fn configurations(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("akri.sh", "v1", "DiscoveryConfiguration"),
        "discoveryconfigurations",
    );
    Api::all_with(client.clone(), &resource)
}

/// The kubelet-plugin's field manager on `node` (akri_devices::node_field_manager).
fn node_manager(node: &str) -> PatchParams {
    PatchParams::apply(&format!("akri-kubelet-plugin/{node}")).force()
}

#[tokio::test]
async fn the_admission_policy_keeps_a_kubelet_plugin_to_its_own_node() {
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let admin = cp.client().await.unwrap();
    let ns = installed.default_ns.as_str();
    let node_a = ControlPlane::unique_name("node-a");
    let node_b = ControlPlane::unique_name("node-b");
    cp.create_node(&node_a).await.unwrap();
    cp.create_node(&node_b).await.unwrap();
    let plugin = plugin_client_on(cp, ns, Some(&node_a)).await;
    // The policies take effect a moment after the install created them: until a slice of
    // another node is refused (one a probe writes, then deletes, while they are not).
    let probes = Api::<ResourceSlice>::all(plugin.clone());
    let probe = format!("{node_b}-probe");
    akri_testing::eventually_within(
        "the ResourceSlice policy active",
        std::time::Duration::from_secs(30),
        async || match probes
            .create(&PostParams::default(), &slice(&probe, Some(&node_b)))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 => Some(()),
            _ => {
                let _ = probes.delete(&probe, &DeleteParams::default()).await;
                None
            }
        },
    )
    .await;

    // The token carries the node, as a DaemonSet pod's token does.
    let review: SelfSubjectReview = Api::all(plugin.clone())
        .create(&PostParams::default(), &from_json(json!({})))
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{ns}:akri-kubelet-plugin").as_str())
    );
    assert_eq!(
        user.extra.unwrap()["authentication.kubernetes.io/node-name"],
        [node_a.as_str()]
    );

    // ResourceSlices: its own node's only.
    let slices = Api::<ResourceSlice>::all(plugin.clone());
    let admin_slices = Api::<ResourceSlice>::all(admin.clone());
    let own = format!("{node_a}-slice");
    let foreign = format!("{node_b}-slice");
    slices
        .create(&PostParams::default(), &slice(&own, Some(&node_a)))
        .await
        .expect("a slice of its own node");
    refused(
        slices
            .create(&PostParams::default(), &slice(&foreign, Some(&node_b)))
            .await,
        &format!("may not write ResourceSlices of node '{node_b}'"),
    );
    refused(
        slices
            .create(
                &PostParams::default(),
                &slice(&format!("{node_a}-all"), None),
            )
            .await,
        "may not write ResourceSlices of no single node",
    );
    admin_slices
        .create(&PostParams::default(), &slice(&foreign, Some(&node_b)))
        .await
        .unwrap();
    let label = json!({ "metadata": { "labels": { "touched": "yes" } } });
    refused(
        slices
            .patch(&foreign, &PatchParams::default(), &Patch::Merge(&label))
            .await,
        &format!("node '{node_b}'"),
    );
    refused(
        slices.delete(&foreign, &DeleteParams::default()).await,
        &format!("node '{node_b}'"),
    );
    slices
        .patch(&own, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("its own slice");
    slices
        .delete(&own, &DeleteParams::default())
        .await
        .expect("its own slice");
    // A token bound to no pod (so to no node) writes nothing.
    let unbound = plugin_client_on(cp, ns, None).await;
    refused(
        Api::<ResourceSlice>::all(unbound)
            .create(
                &PostParams::default(),
                &slice(&format!("{node_a}-unbound"), Some(&node_a)),
            )
            .await,
        "no node association found for this user",
    );
    // The capability probe (a dry-run cluster-wide slice) passes, with the admin's answer.
    assert_eq!(
        dra_plugin::api_support::consumable_capacity(&plugin)
            .await
            .expect("the probe is not refused"),
        dra_plugin::api_support::consumable_capacity(&admin)
            .await
            .unwrap()
    );

    // Instances: its own entry of spec.nodes only.
    let plugin_instances = instances(&plugin, ns);
    let admin_instances = instances(&admin, ns);
    let instance = |name: &str, nodes: &[&str]| -> DynamicObject {
        from_json(json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance",
            "metadata": { "name": name },
            "spec": {
                "configurationName": "cameras", "cdiName": format!("akri.sh/debugecho={name}"),
                "capacity": 1, "shared": true, "nodes": nodes,
            },
        }))
    };
    let shared = ControlPlane::unique_name("shared");
    admin_instances
        .create(&PostParams::default(), &instance(&shared, &[&node_b]))
        .await
        .unwrap();
    // Joined as the plugin joins: with its node's label, by which it watches its Instances;
    // never with another node's (which would send that node this node's events).
    let node_label = |node: &str| format!("{node}.nodes.akri.sh/instance");
    let with_labels = |mut instance: DynamicObject, nodes: &[&str]| {
        let mut labels = std::collections::BTreeMap::from([(
            "akri.sh/nodes-labelled".to_string(),
            "true".to_string(),
        )]);
        labels.extend(nodes.iter().map(|n| (node_label(n), "true".to_string())));
        instance.metadata.labels = Some(labels);
        instance
    };
    refused(
        plugin_instances
            .patch(
                &shared,
                &node_manager(&node_a),
                &Patch::Apply(with_labels(
                    instance(&shared, &[&node_a]),
                    &[&node_a, &node_b],
                )),
            )
            .await,
        &format!(
            "may set only its own node's label ({}) on an Instance, not: {}",
            node_label(&node_a),
            node_label(&node_b)
        ),
    );
    let joined = plugin_instances
        .patch(
            &shared,
            &node_manager(&node_a),
            &Patch::Apply(with_labels(instance(&shared, &[&node_a]), &[&node_a])),
        )
        .await
        .expect("adding its own node, and its label");
    assert_eq!(
        strings(&joined.data["spec"]["nodes"]),
        [node_b.as_str(), node_a.as_str()]
    );
    assert_eq!(
        joined.metadata.labels.as_ref().unwrap()[&node_label(&node_a)],
        "true"
    );
    refused(
        plugin_instances
            .patch(
                &shared,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "nodes": [node_a] } })),
            )
            .await,
        &format!("other nodes before: [{node_b}], after: []"),
    );
    refused(
        plugin_instances
            .delete(&shared, &DeleteParams::default())
            .await,
        "may change only its own entry of an Instance's spec.nodes",
    );
    // Giving its entry up, as the plugin does when it stops seeing a shared device.
    let nothing =
        json!({ "apiVersion": "akri.sh/v0", "kind": "Instance", "metadata": { "name": shared } });
    let left = plugin_instances
        .patch(&shared, &node_manager(&node_a), &Patch::Apply(&nothing))
        .await
        .expect("removing its own node");
    assert_eq!(strings(&left.data["spec"]["nodes"]), [node_b.as_str()]);
    assert!(
        !left
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(&node_label(&node_a)),
        "its label left with it"
    );
    refused(
        plugin_instances
            .create(
                &PostParams::default(),
                &instance(&ControlPlane::unique_name("forged"), &[&node_b]),
            )
            .await,
        &format!("after: [{node_b}]"),
    );
    // An Instance of nobody, which nothing would delete and which a namespace's legacy path
    // counted as its own (issue 52): refused, labelled as the legacy path's or not.
    for labels in [
        json!({}),
        json!({ "akri.sh/configuration-kind": "Configuration" }),
    ] {
        let mut nobodys = instance(&ControlPlane::unique_name("nobodys"), &[]);
        nobodys.metadata.labels = Some(serde_json::from_value(labels).unwrap());
        refused(
            plugin_instances
                .create(&PostParams::default(), &nobodys)
                .await,
            &format!("on node '{node_a}' may create only Instances that name its own node"),
        );
    }
    let local = ControlPlane::unique_name("local");
    refused(
        plugin_instances
            .patch(
                &local,
                &node_manager(&node_a),
                &Patch::Apply(with_labels(instance(&local, &[&node_a]), &[&node_b])),
            )
            .await,
        &format!("not: {}", node_label(&node_b)),
    );
    plugin_instances
        .patch(
            &local,
            &node_manager(&node_a),
            &Patch::Apply(instance(&local, &[&node_a])),
        )
        .await
        .expect("an Instance only it sees");
    plugin_instances
        .delete(&local, &DeleteParams::default())
        .await
        .expect("deleting an Instance only it sees");

    // status.discoveryErrors: its own entry only, and nothing else of the status.
    let plugin_configs = configurations(&plugin);
    let admin_configs = configurations(&admin);
    let config = ControlPlane::unique_name("policy");
    admin_configs
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                "metadata": { "name": config },
                "spec": { "discoveryHandler": { "name": "debugEcho" } },
            })),
        )
        .await
        .unwrap();
    let entry = |node: &str, message: &str| {
        json!({
            "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
            "metadata": { "name": config },
            "status": { "discoveryErrors": [{ "node": node, "message": message }] },
        })
    };
    // The first status anyone writes (its counts are defaulted on the way in).
    plugin_configs
        .patch_status(
            &config,
            &node_manager(&node_a),
            &Patch::Apply(entry(&node_a, "a fails")),
        )
        .await
        .expect("its own entry, first in the status");
    admin_configs
        .patch_status(
            &config,
            &node_manager(&node_b),
            &Patch::Apply(entry(&node_b, "b fails")),
        )
        .await
        .unwrap();
    plugin_configs
        .patch_status(
            &config,
            &node_manager(&node_a),
            &Patch::Apply(entry(&node_a, "a still fails")),
        )
        .await
        .expect("its own entry, next to another node's");
    refused(
        plugin_configs
            .patch_status(
                &config,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "discoveryErrors": [
                    { "node": node_a, "message": "a still fails" },
                    { "node": node_b, "message": "forged" },
                ] } })),
            )
            .await,
        "may write only its own entry of status.discoveryErrors",
    );
    refused(
        plugin_configs
            .patch_status(
                &config,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "conditions": [{
                    "type": "Ready", "status": "True", "reason": "Forged", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }] } })),
            )
            .await,
        "may write only status.discoveryErrors",
    );
    let status = admin_configs.get(&config).await.unwrap().data["status"].clone();
    assert_eq!(
        status["discoveryErrors"],
        json!([
            { "node": node_a, "message": "a still fails" },
            { "node": node_b, "message": "b fails" },
        ])
    );

    // Its handler Lease: its own, as the agent writes it, and nothing else of the Leases.
    use akri_devices::handlers::{lease, lease_name};
    use k8s_openapi::api::coordination::v1::Lease;
    let leases = Api::<Lease>::namespaced(plugin.clone(), ns);
    let handlers = std::collections::BTreeSet::from(["debugEcho".to_string()]);
    let apply = |node: &str| {
        let (name, lease) = (lease_name(node), lease(node, &handlers));
        let leases = leases.clone();
        let params = node_manager(&node_a);
        async move { leases.patch(&name, &params, &Patch::Apply(&lease)).await }
    };
    apply(&node_a).await.expect("its own handler Lease");
    let not_own =
        format!("may write only its own node's handler Lease (akri-node-..., held by '{node_a}')");
    refused(apply(&node_b).await, &not_own);
    Api::<Lease>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &lease(&node_b, &handlers))
        .await
        .unwrap();
    let taken = Patch::Merge(json!({ "spec": { "holderIdentity": node_a } }));
    refused(
        leases
            .patch(&lease_name(&node_b), &PatchParams::default(), &taken)
            .await,
        &not_own,
    );
    // The driver-controller's leader Lease, held by this node, is not a handler Lease.
    let mut leader = lease(&node_a, &handlers);
    leader.metadata.name = Some("akri-driver-controller".into());
    refused(
        leases.create(&PostParams::default(), &leader).await,
        &format!("{not_own}, not akri-driver-controller"),
    );
}

#[tokio::test]
async fn a_legacy_plugin_may_only_remove_its_own_node_from_a_configurations_finalizers() {
    use akri_api::v0::Configuration;
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let admin = cp.client().await.unwrap();
    let node_a = ControlPlane::unique_name("node-a");
    let node_b = ControlPlane::unique_name("node-b");
    cp.create_node(&node_a).await.unwrap();
    // The full values' release runs in legacy mode.
    let sa = "edge-akri-kubelet-plugin";
    let plugin = plugin_client_of(sa, cp, &installed.full_ns, Some(&node_a)).await;
    let ns = installed.other_ns.as_str();
    let admin_v0 = Api::<Configuration>::namespaced(admin.clone(), ns);
    let plugin_v0 = Api::<Configuration>::namespaced(plugin.clone(), ns);
    // As Akri's agents leave a Configuration: each node's name in its finalizers.
    let name = ControlPlane::unique_name("akri-left");
    let mut config: Configuration = from_json(akri_testing::discovery::v0_debug_echo(
        &name,
        &["cam"],
        1,
        true,
    ));
    let params = PatchParams::default();
    // An admission policy takes effect a moment after it is created: until a throwaway
    // Configuration's label change is refused, the release's policy is not active yet.
    let mut throwaway = config.clone();
    throwaway.metadata.name = Some(format!("{name}-probe"));
    admin_v0
        .create(&PostParams::default(), &throwaway)
        .await
        .unwrap();
    // Each probe writes a new value: a patch that changes nothing passes any policy.
    let probes = std::sync::atomic::AtomicUsize::new(0);
    akri_testing::eventually_within(
        "the Configuration policy active",
        std::time::Duration::from_secs(30),
        async || {
            let n = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let label =
                Patch::Merge(json!({ "metadata": { "labels": { "probe": n.to_string() } } }));
            let probe = plugin_v0
                .patch(&format!("{name}-probe"), &params, &label)
                .await;
            matches!(probe, Err(kube::Error::Api(s)) if s.code == 403).then_some(())
        },
    )
    .await;
    config.metadata.finalizers = Some(vec![node_b.clone(), node_a.clone()]);
    admin_v0
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let json_patch = |ops: serde_json::Value| Patch::<()>::Json(from_json(ops));
    let finalizers = |value: &[&str]| {
        json_patch(json!([{ "op": "replace", "path": "/metadata/finalizers", "value": value }]))
    };
    let only_own = format!("may only remove '{node_a}' from a Configuration's finalizers");
    for refused_patch in [
        finalizers(&[]),
        finalizers(&[&node_b, &node_a, "x"]),
        json_patch(json!([{ "op": "replace", "path": "/spec/capacity", "value": 5 }])),
        json_patch(
            json!([{ "op": "add", "path": "/metadata/labels", "value": { "touched": "yes" } }]),
        ),
    ] {
        refused(
            plugin_v0.patch(&name, &params, &refused_patch).await,
            &only_own,
        );
    }
    let released = plugin_v0
        .patch(&name, &params, &finalizers(&[&node_b]))
        .await
        .expect("its own node's finalizer");
    assert_eq!(released.metadata.finalizers, Some(vec![node_b.clone()]));
    assert_eq!(released.spec.capacity, 1);
    // The default values' release is not in legacy mode: no patch right at all.
    let plain = plugin_client_on(cp, &installed.default_ns, Some(&node_a)).await;
    let forbidden = Api::<Configuration>::namespaced(plain, ns)
        .patch(&name, &params, &finalizers(&[]))
        .await;
    assert!(
        matches!(&forbidden, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("cannot patch resource")),
        "{forbidden:?}"
    );
    admin_v0
        .patch(&name, &params, &finalizers(&[]))
        .await
        .unwrap();
}

/// The `helm` lines of the docs' ```sh blocks, per file (absolute path).
fn documented_helm_commands() -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for c in akri_testing::docs::documented(&repo(), "helm").unwrap() {
        let file = repo().join(&c.file).display().to_string();
        match out.last_mut() {
            Some((last, commands)) if *last == file => commands.push(c.command),
            _ => out.push((file, vec![c.command])),
        }
    }
    out
}

/// Every `helm` command the docs show works as written (from the repository root) against a
/// real API server; the quickstart's install runs the embedded debugEcho as its `--set` says.
#[tokio::test]
async fn the_documented_helm_commands_work() {
    // Its own API server: the commands install release `akri` into namespace `akri`.
    let cp = ControlPlane::start(akri_testing::ControlPlaneOptions::default())
        .await
        .expect("control plane starts");
    let client = cp.client().await.unwrap();
    let kubeconfig = cp.kubeconfig().display().to_string();
    let helm = Helm::new();
    let documented = documented_helm_commands();
    let files: Vec<&str> = documented.iter().map(|(f, _)| f.as_str()).collect();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("/README.md") && !f.contains("charts"))
            && files.iter().any(|f| f.ends_with("charts/akri/README.md")),
        "the quickstarts' helm lines are found: {files:?}"
    );
    for (file, commands) in &documented {
        let mut releases = Vec::new();
        for command in commands {
            let words: Vec<&str> = command.split_whitespace().collect();
            (product::shell(cp.kubeconfig(), &[], command).await).unwrap_or_else(|e| panic!("{e}"));
            if words[1] == "install" {
                releases.push((words[2].to_string(), namespace_of(&words)));
            }
        }
        for (release, namespace) in &releases {
            let daemon_set =
                Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), namespace)
                    .get(&format!("{release}-kubelet-plugin"))
                    .await
                    .unwrap_or_else(|e| panic!("{file}: the kubelet-plugin DaemonSet: {e}"));
            let args = daemon_set.spec.template.spec.unwrap().containers[0]
                .args
                .clone()
                .unwrap_or_default();
            assert!(
                args.iter().any(|a| a.starts_with("--debug-echo-socket")),
                "{file}: the quickstart enables the embedded debugEcho: {args:?}"
            );
            // The next file's commands install the same release again.
            helm.ok(&[
                "uninstall",
                release,
                "--namespace",
                namespace,
                "--wait",
                "--kubeconfig",
                &kubeconfig,
            ])
            .await;
        }
    }
}

/// The `--namespace` of a helm command line (`default` without one).
fn namespace_of(words: &[&str]) -> String {
    words
        .windows(2)
        .find(|w| w[0] == "--namespace" || w[0] == "-n")
        .map_or("default".to_string(), |w| w[1].to_string())
}

/// What docs/distributions.md tells a k0s, MicroK8s or OpenShift user to set does what it says
/// there: every `--set` line renders (with release `akri` in namespace `akri`, as the docs'
/// commands use), a kubelet directory moves every kubelet path of the kubelet-plugin and
/// leaves none at the default, the SELinux type joins the chart's securityContext without
/// dropping a field of it, and the ServiceAccount the OpenShift SCC command names is the
/// kubelet-plugin's.
#[tokio::test]
async fn the_distribution_settings_render_what_the_docs_say() {
    let helm = Helm::new();
    let doc = std::fs::read_to_string(repo().join("docs/distributions.md")).unwrap();
    let sets: Vec<&str> = doc
        .split('`')
        .filter_map(|code| code.strip_prefix("--set "))
        .collect();
    assert!(
        sets.iter()
            .any(|s| s.starts_with("kubeletPlugin.kubeletDir="))
            && sets.iter().any(|s| s.contains("seLinuxOptions")),
        "the docs' --set lines are found: {sets:?}"
    );
    let plugin_of = |objects: &[Value]| {
        find(objects, "DaemonSet", "akri-kubelet-plugin")["spec"]["template"]["spec"].clone()
    };
    let default = plugin_of(&helm.template("akri", "akri", &[]).await);
    let default_paths = host_paths(&default);
    assert!(
        default_paths
            .iter()
            .any(|p| p.starts_with("/var/lib/kubelet/")),
        "{default_paths:?}"
    );

    for set in &sets {
        let pod = plugin_of(&helm.template("akri", "akri", &["--set", set]).await);
        let (key, value) = set.split_once('=').unwrap();
        match key {
            "kubeletPlugin.kubeletDir" => {
                let paths = host_paths(&pod);
                let moved: Vec<String> = default_paths
                    .iter()
                    .map(|p| match p.strip_prefix("/var/lib/kubelet") {
                        Some(rest) => format!("{value}{rest}"),
                        None => p.clone(),
                    })
                    .collect();
                assert_eq!(
                    paths, moved,
                    "{set}: the kubelet's host paths move, the rest stay"
                );
                let args = strings(&pod["containers"][0]["args"]);
                assert!(
                    args.contains(&format!("--registry-dir={value}/plugins_registry"))
                        && !args.iter().any(|a| a.contains("=/var/lib/kubelet/")),
                    "{set}: {args:?}"
                );
            }
            "kubeletPlugin.securityContext.seLinuxOptions.type" => {
                let mut want = default["containers"][0]["securityContext"].clone();
                want["seLinuxOptions"] = json!({ "type": value });
                assert_eq!(pod["containers"][0]["securityContext"], want, "{set}");
            }
            _ => panic!("docs/distributions.md sets {set}, which this test does not know"),
        }
    }

    let scc = doc
        .lines()
        .find(|l| l.contains("oc adm policy add-scc-to-user privileged"))
        .expect("the OpenShift SCC command");
    let account = scc
        .split(" -z ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    assert_eq!(
        default["serviceAccountName"], account,
        "the SCC command names the kubelet-plugin's ServiceAccount: {scc}"
    );
}

/// Where a cluster enforces Pod Security `baseline` (Talos, hardened kubeadm), the real API
/// server refuses the kubelet-plugin's pod in an unlabelled namespace, with the message
/// docs/distributions.md quotes, and admits it in a namespace labelled as
/// `examples/akri-namespace.yaml` labels `akri` (server-side dry runs of the DaemonSet's pod).
#[tokio::test]
async fn baseline_pod_security_refuses_the_plugin_and_the_example_namespace_admits_it() {
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let client = cp.client().await.unwrap();
    let helm = Helm::new();
    let example: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("examples/akri-namespace.yaml")).unwrap(),
    )
    .unwrap();
    let doc = std::fs::read_to_string(repo().join("docs/distributions.md")).unwrap();
    for (prefix, labels, refused_with) in [
        (
            "baseline",
            json!({ "pod-security.kubernetes.io/enforce": "baseline" }),
            Some("violates PodSecurity \"baseline"),
        ),
        ("labelled", example["metadata"]["labels"].clone(), None),
    ] {
        let ns = ControlPlane::unique_name(prefix);
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &from_json(json!({ "metadata": { "name": ns, "labels": labels } })),
            )
            .await
            .unwrap();
        let objects = helm.template("akri", &ns, &[]).await;
        let template = &find(&objects, "DaemonSet", "akri-kubelet-plugin")["spec"]["template"];
        let account = template["spec"]["serviceAccountName"].as_str().unwrap();
        Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .create(
                &PostParams::default(),
                &from_json(json!({ "metadata": { "name": account } })),
            )
            .await
            .unwrap();
        let pod: Pod = from_json(json!({
            "metadata": { "name": "kubelet-plugin", "labels": template["metadata"]["labels"] },
            "spec": template["spec"],
        }));
        let created = Api::<Pod>::namespaced(client.clone(), &ns)
            .create(
                &PostParams {
                    dry_run: true,
                    ..Default::default()
                },
                &pod,
            )
            .await;
        match refused_with {
            Some(message) => {
                let error = created
                    .expect_err("baseline refuses the kubelet-plugin")
                    .to_string();
                assert!(error.contains(message), "{error}");
                assert!(
                    doc.contains(message),
                    "docs/distributions.md quotes the refusal ({message}): {error}"
                );
            }
            None => {
                created.unwrap_or_else(|e| panic!("{labels}: the pod is refused: {e}"));
            }
        }
    }
}

/// Retries `write` (a write the policy `name` refuses) until the policy refuses it: a policy
/// takes effect a moment after the install created it.
async fn policy_active<T>(name: &str, write: impl AsyncFn() -> Result<T, kube::Error>) {
    akri_testing::eventually_within(
        &format!("the {name} policy active"),
        std::time::Duration::from_secs(30),
        async || match write().await {
            Err(kube::Error::Api(s)) if s.code == 403 => Some(()),
            _ => None,
        },
    )
    .await;
}

/// What the plugin's own claim-status writer (`dra_plugin::device_status`) answers, as the API
/// server's answer.
async fn write_device_status(
    plugin: &kube::Client,
    claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    driver: &str,
    devices: &[(&str, &str)],
) -> Result<(), kube::Error> {
    write_device_status_saying(plugin, claim, driver, devices, "cameras").await
}

/// [`write_device_status`] with `configuration` in each entry's data.
async fn write_device_status_saying(
    plugin: &kube::Client,
    claim: &k8s_openapi::api::resource::v1::ResourceClaim,
    driver: &str,
    devices: &[(&str, &str)],
    configuration: &str,
) -> Result<(), kube::Error> {
    use dra_plugin::device_status::{self, DeviceStatus};
    let target = device_status::Claim {
        namespace: claim.metadata.namespace.as_deref().unwrap(),
        name: claim.metadata.name.as_deref().unwrap(),
        uid: claim.metadata.uid.as_deref().unwrap(),
    };
    let devices: Vec<DeviceStatus> = devices
        .iter()
        .map(|(pool, device)| DeviceStatus {
            pool: pool.to_string(),
            device: device.to_string(),
            data: Some(json!({ "configuration": configuration })),
            ..DeviceStatus::default()
        })
        .collect();
    match device_status::apply(plugin, target, driver, &devices).await {
        Ok(()) => Ok(()),
        Err(device_status::Error::Apply { cause, .. }) => Err(cause),
    }
}

/// A ResourceClaim in `ns` allocated these (driver, pool, device) results, on the nodes
/// `selector` (an allocation's node selector) selects, as the scheduler leaves it.
async fn allocated_claim(
    admin: &kube::Client,
    ns: &str,
    results: &[(&str, &str, &str)],
    selector: Value,
) -> k8s_openapi::api::resource::v1::ResourceClaim {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let claims = Api::<ResourceClaim>::namespaced(admin.clone(), ns);
    let name = ControlPlane::unique_name("claim");
    claims
        .create(
            &PostParams::default(),
            &from_json(json!({
                "metadata": { "name": name },
                "spec": { "devices": { "requests": [{
                    "name": "req",
                    "exactly": { "deviceClassName": "akri", "count": results.len() },
                }] } },
            })),
        )
        .await
        .unwrap();
    let results: Vec<Value> = results
        .iter()
        .map(|(driver, pool, device)| {
            json!({ "request": "req", "driver": driver, "pool": pool, "device": device })
        })
        .collect();
    claims
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "allocation": {
                "devices": { "results": results },
                "nodeSelector": selector,
            } } })),
        )
        .await
        .unwrap()
}

fn named_nodes(key: &str, nodes: &[&str], fields: bool) -> Value {
    let requirement = json!([{ "key": key, "operator": "In", "values": nodes }]);
    let term = if fields {
        json!({ "matchFields": requirement })
    } else {
        json!({ "matchExpressions": requirement })
    };
    json!({ "nodeSelectorTerms": [term] })
}

/// The entries of a claim's status.devices, as (driver, pool, device).
async fn device_entries(
    admin: &kube::Client,
    ns: &str,
    name: &str,
) -> Vec<(String, String, String)> {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    Api::<ResourceClaim>::namespaced(admin.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.devices)
        .unwrap_or_default()
        .into_iter()
        .map(|d| (d.driver, d.pool, d.device))
        .collect()
}

/// Asserts that a change of a claim's allocation or reservedFor is refused: by the API
/// server itself where it authorizes them (`resourceclaims/binding`, 1.36 and later; a 422
/// naming it), otherwise by the chart's policy.
#[track_caller]
fn binding_refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, message: &str) {
    match result {
        Err(kube::Error::Api(status))
            if status.code == 422 && status.message.contains("resourceclaims/binding") => {}
        other => refused(other, message),
    }
}

/// A claim's status.devices entries are its drivers': a kubelet-plugin writes those of Akri
/// devices allocated to the claim, on claims allocated to its node (a local device's selector
/// names the node, a shared device's the nodes that reach it), and never the allocation or
/// reservedFor. On 1.34 nothing else stops it: its RBAC lets it patch every claim's status.
#[tokio::test]
async fn the_admission_policy_lets_a_kubelet_plugin_write_only_its_devices_claim_status() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let admin = cp.client().await.unwrap();
    let ns = installed.default_ns.as_str();
    let claims_ns = installed.other_ns.as_str();
    let [a, b, c] = ["node-a", "node-b", "node-c"].map(ControlPlane::unique_name);
    for node in [&a, &b, &c] {
        cp.create_node(node).await.unwrap();
    }
    let plugin_a = plugin_client_on(cp, ns, Some(&a)).await;
    let plugin_b = plugin_client_on(cp, ns, Some(&b)).await;
    let plugin_c = plugin_client_on(cp, ns, Some(&c)).await;
    let ours = "debugecho.akri.sh";

    // A node-local device of node a, beside another driver's device.
    let local = allocated_claim(
        &admin,
        claims_ns,
        &[(ours, &a, "cam-0"), ("gpu.example.com", &a, "gpu-0")],
        named_nodes("metadata.name", &[&a], true),
    )
    .await;
    let local_name = local.metadata.name.clone().unwrap();
    policy_active("ResourceClaim", async || {
        write_device_status(&plugin_b, &local, ours, &[(&a, "cam-0")]).await
    })
    .await;
    write_device_status(&plugin_a, &local, ours, &[(&a, "cam-0")])
        .await
        .expect("its own driver's entry of a claim allocated to its node");
    assert_eq!(
        device_entries(&admin, claims_ns, &local_name).await,
        [(ours.to_string(), a.clone(), "cam-0".to_string())]
    );
    // Another node's plugin writing something else (writing what is there changes nothing).
    refused(
        write_device_status_saying(&plugin_b, &local, ours, &[(&a, "cam-0")], "forged").await,
        &format!("on node '{b}' may write status.devices only of claims allocated to its own node"),
    );
    refused(
        write_device_status(&plugin_a, &local, "gpu.example.com", &[(&a, "gpu-0")]).await,
        &format!("allocated to the claim, not gpu.example.com/{a}/gpu-0"),
    );
    // The scheduler's and the kubelet's fields.
    let claims = Api::<ResourceClaim>::namespaced(plugin_a.clone(), claims_ns);
    binding_refused(
        claims
            .patch_status(
                &local_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "reservedFor": [{
                    "resource": "pods", "name": "forged", "uid": "8c2b7d4e-0000-4000-8000-000000000001",
                }] } })),
            )
            .await,
        "may not change a ResourceClaim's status.allocation or status.reservedFor",
    );
    let unprepared = allocated_claim(
        &admin,
        claims_ns,
        &[(ours, &a, "cam-1")],
        named_nodes("metadata.name", &[&a], true),
    )
    .await;
    binding_refused(
        claims
            .patch_status(
                unprepared.metadata.name.as_deref().unwrap(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "allocation": null } })),
            )
            .await,
        "may not change a ResourceClaim's status.allocation or status.reservedFor",
    );
    // Unprepared: its entries go again.
    write_device_status(&plugin_a, &local, ours, &[])
        .await
        .expect("removing its own entries");
    assert_eq!(device_entries(&admin, claims_ns, &local_name).await, []);

    // A shared device, allocated for the nodes that reach it (a and b, by hostname label).
    let shared = allocated_claim(
        &admin,
        claims_ns,
        &[(ours, "shared-cameras", "cam-7")],
        named_nodes("kubernetes.io/hostname", &[&a, &b], false),
    )
    .await;
    write_device_status(&plugin_b, &shared, ours, &[("shared-cameras", "cam-7")])
        .await
        .expect("a shared device's entry from a node that reaches it");
    refused(
        write_device_status_saying(
            &plugin_c,
            &shared,
            ours,
            &[("shared-cameras", "cam-7")],
            "forged",
        )
        .await,
        &format!("on node '{c}' may write status.devices only of claims allocated to its own node"),
    );
}

/// An Instance another node sees: a plugin joins it only if it is shared, never changes what
/// names the device or selects its brokers, changes its properties only if it reaches the
/// device, takes slots only for itself and frees only its own; the driver-controller frees
/// another node's (a gone node's).
#[tokio::test]
async fn the_admission_policy_keeps_a_kubelet_plugin_off_what_other_nodes_devices_hold() {
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let admin = cp.client().await.unwrap();
    let ns = installed.default_ns.as_str();
    let [a, b] = ["node-a", "node-b"].map(ControlPlane::unique_name);
    for node in [&a, &b] {
        cp.create_node(node).await.unwrap();
    }
    let plugin = instances(&plugin_client_on(cp, ns, Some(&a)).await, ns);
    let admin_instances = instances(&admin, ns);
    let name = ControlPlane::unique_name("cam");
    let slot = |i: usize| format!("{name}-{i}");
    let instance = |nodes: &[&str], shared: bool| -> DynamicObject {
        from_json(json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance",
            "metadata": { "name": name, "labels": { "akri.sh/source": "Configuration" } },
            "spec": {
                "configurationName": "cameras", "cdiName": format!("akri.sh/debugecho={name}"),
                "capacity": 3, "shared": shared, "nodes": nodes,
                "brokerProperties": { "IP": "10.0.0.1" },
            },
        }))
    };
    let mut held = instance(&[&b], true);
    held.data["spec"]["deviceUsage"] =
        json!({ slot(0): b, slot(1): "", slot(2): format!("C:0:{b}") });
    held.metadata.finalizers = Some(vec![a.clone(), b.clone()]);
    admin_instances
        .create(&PostParams::default(), &held)
        .await
        .unwrap();
    let (to, named) = (&plugin, &name);
    let merge = |patch: Value| async move {
        to.patch(named, &PatchParams::default(), &Patch::Merge(patch))
            .await
    };
    let usage = |slot: String, value: String| {
        Patch::<()>::Json(
            serde_json::from_value(json!([
                { "op": "replace", "path": format!("/spec/deviceUsage/{slot}"), "value": value },
            ]))
            .unwrap(),
        )
    };
    let properties = json!({ "spec": { "brokerProperties": { "IP": "10.6.6.6" } } });
    policy_active("Instance", async || merge(properties.clone()).await).await;

    // A node that does not reach it touches nothing of it.
    refused(
        merge(properties.clone()).await,
        "may change the properties and capacity only of Instances its node reaches",
    );
    refused(
        merge(json!({ "spec": { "capacity": 9 } })).await,
        "may change the properties and capacity only of Instances its node reaches",
    );
    refused(
        merge(json!({ "metadata": { "labels": { "akri.sh/source": "forged" } } })).await,
        "may not change the configuration, CDI name, sharing",
    );
    refused(
        plugin
            .patch(&name, &PatchParams::default(), &usage(slot(1), a.clone()))
            .await,
        &format!("refused: {} ( -> {a})", slot(1)),
    );
    refused(
        plugin
            .patch(
                &name,
                &PatchParams::default(),
                &usage(slot(0), String::new()),
            )
            .await,
        &format!("refused: {} ({b} -> )", slot(0)),
    );

    // Joining it and rewriting what the other node serves in the same write, then leaving
    // (issue 52): refused; a node changes the properties only of a device it reached already.
    let mut rewriting = instance(&[&a], true);
    rewriting.data["spec"]["brokerProperties"] = json!({ "IP": "10.6.6.6" });
    refused(
        plugin
            .patch(&name, &node_manager(&a), &Patch::Apply(&rewriting))
            .await,
        "and not in the write that joins or leaves one",
    );
    // Joining it, as the plugin does (server-side apply of its own entry).
    plugin
        .patch(
            &name,
            &node_manager(&a),
            &Patch::Apply(instance(&[&a], true)),
        )
        .await
        .expect("joining a shared Instance");
    // Now it reaches the device: its slots and the device's properties.
    plugin
        .patch(&name, &PatchParams::default(), &usage(slot(1), a.clone()))
        .await
        .expect("taking a free slot for itself");
    plugin
        .patch(
            &name,
            &PatchParams::default(),
            &usage(slot(1), format!("C:3:{a}")),
        )
        .await
        .expect("its own slot, now Configuration level");
    refused(
        plugin
            .patch(&name, &PatchParams::default(), &usage(slot(0), a.clone()))
            .await,
        &format!("refused: {} ({b} -> {a})", slot(0)),
    );
    refused(
        plugin
            .patch(&name, &PatchParams::default(), &usage(slot(1), b.clone()))
            .await,
        &format!("refused: {} (C:3:{a} -> {b})", slot(1)),
    );
    // Another node's slot, even of a device it reaches (issue 52: a node that joined freed
    // the slot another node's container held): a gone node's slots are the controller's.
    refused(
        plugin
            .patch(
                &name,
                &PatchParams::default(),
                &usage(slot(2), String::new()),
            )
            .await,
        &format!("refused: {} (C:0:{b} -> )", slot(2)),
    );
    // The driver-controller's identity frees it (what it does once node-b is gone:
    // driver-controller/src/legacy_slots.rs), by the JSON patch it writes.
    let controller = instances(
        &plugin_client_of("akri-driver-controller", cp, ns, None).await,
        ns,
    );
    let held = akri_api::v0::DeviceUsage::configuration("0", b.as_str()).unwrap();
    let free = akri_api::v0::DeviceUsage::Free;
    controller
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(akri_api::v0::slot_patch([(
                    slot(2).as_str(),
                    &held,
                    &free,
                )]))
                .unwrap(),
            ),
        )
        .await
        .expect("the driver-controller frees a gone node's slot");
    refused(
        merge(json!({ "spec": { "deviceUsage": { slot(1): null } } })).await,
        &format!("refused: {} (C:3:{a} -> none)", slot(1)),
    );
    merge(properties.clone())
        .await
        .expect("the properties of a device it reaches");
    refused(
        merge(json!({ "spec": { "configurationName": "other" } })).await,
        "may not change the configuration, CDI name, sharing",
    );
    // Akri's agent's finalizers: its own node's only.
    refused(
        merge(json!({ "metadata": { "finalizers": [a] } })).await,
        "may not change the configuration, CDI name, sharing",
    );
    merge(json!({ "metadata": { "finalizers": [b] } }))
        .await
        .expect("releasing its own node's finalizer");
    let stored = admin_instances.get(&name).await.unwrap();
    assert_eq!(
        stored.data["spec"]["deviceUsage"],
        json!({ slot(0): b, slot(1): format!("C:3:{a}"), slot(2): "" })
    );
    assert_eq!(
        strings(&stored.data["spec"]["nodes"]),
        [b.as_str(), a.as_str()]
    );

    // A local device is one node's: nobody joins it.
    let local = ControlPlane::unique_name("usb");
    let mut usb = instance(&[&b], false);
    usb.metadata.name = Some(local.clone());
    admin_instances
        .create(&PostParams::default(), &usb)
        .await
        .unwrap();
    usb.data["spec"]["nodes"] = json!([a]);
    usb.metadata.finalizers = None;
    refused(
        plugin
            .patch(&local, &node_manager(&a), &Patch::Apply(&usb))
            .await,
        "may join only shared Instances",
    );
}

/// A BrokerTemplate's objects are made with the broker-controller's rights: the chart's policy
/// admits one only from a user who may create what it makes, in its namespace.
#[tokio::test]
async fn a_broker_template_is_admitted_only_from_a_user_who_may_create_what_it_makes() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let admin = cp.client().await.unwrap();
    let ns = installed.other_ns.as_str();
    let user = ControlPlane::unique_name("alice");
    // The user may write BrokerTemplates and Services in the namespace, nothing else.
    let grant = async |name: &str, rules: Value| {
        Api::<Role>::namespaced(admin.clone(), ns)
            .create(
                &PostParams::default(),
                &from_json(json!({ "metadata": { "name": name }, "rules": rules })),
            )
            .await
            .unwrap();
        Api::<RoleBinding>::namespaced(admin.clone(), ns)
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "metadata": { "name": name },
                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
                    "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
                })),
            )
            .await
            .unwrap();
    };
    grant(
        &format!("{user}-templates"),
        json!([
            { "apiGroups": ["akri.sh"], "resources": ["brokertemplates"], "verbs": ["create", "get", "patch"] },
            { "apiGroups": [""], "resources": ["services"], "verbs": ["create"] },
        ]),
    )
    .await;
    let mut config = cp.client_config().await.unwrap();
    config.auth_info.impersonate = Some(user.clone());
    let templates = Api::<DynamicObject>::namespaced_with(
        kube::Client::try_from(config).unwrap(),
        ns,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("akri.sh", "v1", "BrokerTemplate"),
            "brokertemplates",
        ),
    );
    let template = |name: &str, kinds: &[(&str, &str)]| -> DynamicObject {
        let resources: Vec<Value> = kinds
            .iter()
            .map(|(api_version, kind)| json!({ "apiVersion": api_version, "kind": kind, "spec": {} }))
            .collect();
        from_json(json!({
            "apiVersion": "akri.sh/v1", "kind": "BrokerTemplate",
            "metadata": { "name": name },
            "spec": { "discoveryReference": { "name": "cams" }, "instanceBrokerResources": resources },
        }))
    };
    let create = async |t: DynamicObject| templates.create(&PostParams::default(), &t).await;
    policy_active("BrokerTemplate", async || {
        let probe = template(&ControlPlane::unique_name("probe"), &[("v1", "Pod")]);
        create(probe).await
    })
    .await;

    create(template("services", &[("v1", "Service")]))
        .await
        .expect("a Service, which the user may create");
    refused(
        create(template(
            "pods",
            &[("v1", "Pod"), ("apps/v1", "Deployment")],
        ))
        .await,
        &format!("{user} may not create deployments in namespace {ns}"),
    );
    refused(
        templates
            .patch(
                "services",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "instanceBrokerResources": [
                    { "apiVersion": "batch/v1", "kind": "Job", "spec": {} },
                ] } })),
            )
            .await,
        &format!("{user} may not create jobs in namespace {ns}"),
    );
    grant(
        &format!("{user}-pods"),
        json!([
            { "apiGroups": [""], "resources": ["pods"], "verbs": ["create"] },
            { "apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"] },
        ]),
    )
    .await;
    // The workloads allowed, the device claims they get not yet.
    akri_testing::eventually("only the claims refused", async || {
        let pods = template("pods", &[("v1", "Pod"), ("apps/v1", "Deployment")]);
        match create(pods).await {
            Err(kube::Error::Api(s)) => (s.message)
                .contains(&format!("{user} may not in namespace {ns}"))
                .then_some(()),
            _ => None,
        }
    })
    .await;
    // Given the rights, the same template is admitted.
    grant(
        &format!("{user}-claims"),
        json!([
            { "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["create"] },
        ]),
    )
    .await;
    akri_testing::eventually("the template admitted with the rights", async || {
        create(template(
            "pods",
            &[("v1", "Pod"), ("apps/v1", "Deployment")],
        ))
        .await
        .ok()
    })
    .await;
}

/// Every node trusts the ConfigMaps it reads in the release namespace: the configurations'
/// mirrors, their marker, and its binding checks. RBAC cannot narrow `create` to names, and the
/// broker-controller may write ConfigMaps in every namespace (brokerController.namespaces
/// empty, the default): the policy leaves those ConfigMaps to the driver-controller, so a
/// broker-controller that is taken over cannot feed every node a forged configuration, or take
/// one away.
#[tokio::test]
async fn only_the_driver_controller_writes_the_config_maps_nodes_read() {
    use akri_api::v1::spec_mirror::{MIRRORED_MARKER, SPEC_MIRROR_LABEL, config_map_name};
    use k8s_openapi::api::core::v1::ConfigMap;
    let installed = installed().await;
    let cp = ControlPlane::shared_api_server().await.unwrap();
    let ns = &installed.default_ns;
    let brokers: Api<ConfigMap> = Api::namespaced(
        plugin_client_of("akri-broker-controller", cp, ns, None).await,
        ns,
    );
    let controller: Api<ConfigMap> = Api::namespaced(
        plugin_client_of("akri-driver-controller", cp, ns, None).await,
        ns,
    );
    let config_map = |name: &str, mirror_label: bool| -> ConfigMap {
        let mut meta = json!({ "name": name });
        if mirror_label {
            meta["labels"] = json!({ SPEC_MIRROR_LABEL: "true" });
        }
        from_json(json!({ "metadata": meta, "data": { "configuration.json": "{}" } }))
    };
    let post = PostParams::default();
    let not_controller = "is not the driver-controller";
    // A write let through before the policy took effect is undone.
    policy_active("node-inputs", async || {
        let probe = "binding-checks-probe";
        let created = brokers.create(&post, &config_map(probe, false)).await;
        if created.is_ok() {
            brokers.delete(probe, &DeleteParams::default()).await?;
        }
        created
    })
    .await;

    let mirror = config_map_name("cameras");
    let checks = akri_devices::binding::checks_config_map("node-a");
    for (name, labelled) in [
        (MIRRORED_MARKER, false),
        (mirror.as_str(), false),
        (checks.as_str(), false),
        ("looks-harmless", true),
    ] {
        refused(
            brokers.create(&post, &config_map(name, labelled)).await,
            not_controller,
        );
    }
    // Its own ConfigMaps are the broker-controller's to write, but not to turn into a mirror.
    brokers
        .create(&post, &config_map("broker-settings", false))
        .await
        .expect("the broker-controller writes ConfigMaps nodes do not read");
    let label = Patch::Merge(json!({ "metadata": { "labels": { SPEC_MIRROR_LABEL: "true" } } }));
    refused(
        brokers
            .patch("broker-settings", &PatchParams::default(), &label)
            .await,
        not_controller,
    );
    brokers
        .delete("broker-settings", &DeleteParams::default())
        .await
        .unwrap();

    // What the driver-controller wrote, the broker-controller can neither change nor delete.
    for name in [&mirror, &checks] {
        controller
            .create(&post, &config_map(name, name == &mirror))
            .await
            .expect("the driver-controller writes what nodes read");
        let forged = Patch::Merge(json!({ "data": { "configuration.json": "forged" } }));
        refused(
            brokers.patch(name, &PatchParams::default(), &forged).await,
            not_controller,
        );
        refused(
            brokers.delete(name, &DeleteParams::default()).await,
            not_controller,
        );
        controller
            .patch(name, &PatchParams::default(), &forged)
            .await
            .expect("the driver-controller rewrites it");
        controller
            .delete(name, &DeleteParams::default())
            .await
            .expect("the driver-controller deletes it");
    }
}

/// The Quickstart's registry and push lines are the ones the demo and CI run, word for word:
/// what they install is what a user who copies the Quickstart pushed.
#[test]
fn the_quickstarts_registry_lines_are_what_the_demo_and_ci_run() {
    let blocks = akri_testing::docs::section_blocks(
        &repo().join("README.md"),
        "Quickstart on a real cluster",
        &["sh"],
    )
    .unwrap();
    let lines: Vec<&str> = (blocks.iter().flat_map(|b| b.lines()))
        .filter(|l| l.starts_with("hack/"))
        .collect();
    assert_eq!(
        lines,
        [
            "hack/registry.sh start",
            "hack/push.sh localhost:5000/akri --plain-http"
        ],
        "{blocks:?}"
    );
    for script in ["hack/demo.sh", "hack/test.sh"] {
        let text = std::fs::read_to_string(repo().join(script)).unwrap();
        for line in &lines {
            assert!(
                text.lines().map(str::trim).any(|l| l == *line
                    || l.starts_with(&format!("{line} "))
                    || l.contains(&format!("$({line} "))),
                "{script} does not run {line:?} as written"
            );
        }
    }
}
