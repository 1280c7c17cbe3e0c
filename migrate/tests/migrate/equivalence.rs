//! A v0 Configuration with brokers, served on the legacy path and then migrated to v1, on a
//! simulated cluster (full control plane, two nodes of kubelet peer + node agent serving v0
//! and v1, both controllers): the same Instances, the same broker objects per Instance and
//! per configuration, and the same device properties in each broker's environment.
//!
//! v0 brokers are what Akri's controller makes (its names, labels and one Pod per node of an
//! Instance, its `{{PLACEHOLDER}}` replaced by `akri.sh/<instance>`): that controller is not
//! ours, so the test makes them as it does; the kubelet's device manager then admits each one
//! through our legacy device plugins, which is where a v0 broker's environment comes from. On
//! v1, everything is ours: `akri-migrate --from-cluster --apply`, the broker-controller, the
//! scheduler, and the kubelet's DRA manager preparing each broker (its environment: CDI plus
//! the container's own).

use akri_api::v0::Configuration;
use akri_kubelet_plugin::legacy::LegacyOptions;
use akri_testing::{ControlPlaneOptions, from_json};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use akri_testing::components::{self as support, SimNode};

const CONFIGURATION: &str = "echo";

use akri_testing::{EVENTUALLY, eventually};

/// Per Instance: its broker objects (`<kind>/<name>`, names with the node) and, per broker
/// Pod, the environment its container gets from the device and the configuration.
type Brokers = BTreeMap<String, (Vec<String>, BTreeMap<String, BTreeMap<String, String>>)>;

fn v0_configuration() -> Value {
    json!({
        "apiVersion": "akri.sh/v0", "kind": "Configuration",
        "metadata": { "name": CONFIGURATION },
        "spec": {
            "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [cam-a, cam-b]" },
            "capacity": 2,
            "brokerProperties": { "RESOLUTION": "1080p" },
            "brokerSpec": { "brokerPodSpec": { "containers": [{
                "name": "broker", "image": "registry.k8s.io/e2e-test-images/busybox:1.36.1-1",
                "command": ["sh", "-c", "env; sleep infinity"],
                "resources": { "limits": { "{{PLACEHOLDER}}": "1" } },
            }]}},
            "instanceServiceSpec": { "ports": [{ "name": "grpc", "port": 80, "targetPort": 8083 }] },
            "configurationServiceSpec": { "ports": [{ "name": "grpc", "port": 80, "targetPort": 8083 }] },
        },
    })
}

#[tokio::test]
async fn a_migrated_configuration_deploys_the_same_brokers_with_the_same_environment() {
    let (cp, client, akri, apps) = support::akri_and_apps(ControlPlaneOptions::full()).await;
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let node = SimNode::start(&cp, &client, &akri, |config, peer| {
            config.debug_echo_mut().shared = true;
            config.legacy = Some(LegacyOptions {
                device_plugin_dir: peer.device_plugin_dir(),
                pod_resources_socket: Some(peer.pod_resources_socket()),
                // The v1 configuration is held back until the v0 one's slots are freed
                // (kubelet_plugin::same_name): soon after Akri's brokers go.
                reclaim_grace: Duration::from_secs(1),
                reclaim_interval: Duration::from_secs(1),
                // The operator lists the namespace of the v0 Configuration.
                namespaces: [apps.clone()].into(),
                broker_property_names: ["RESOLUTION".to_string()].into(),
            });
        })
        .await
        .registered()
        .await;
        nodes.push(node);
    }
    let _driver = support::spawn_driver_controller(&client, &akri);
    let _brokers = support::spawn_broker_controller(&client, &akri);

    // v0: the Configuration on the legacy path, and Akri's controller's brokers.
    Api::<Configuration>::namespaced(client.clone(), &apps)
        .create(&PostParams::default(), &from_json(v0_configuration()))
        .await
        .unwrap();
    let v0_instances = instances(&client, &apps, 2).await;
    let mut v0 = Brokers::new();
    let pods = Api::<Pod>::namespaced(client.clone(), &apps);
    let services = Api::<Service>::namespaced(client.clone(), &apps);
    for (instance, reach) in &v0_instances {
        let mut environments = BTreeMap::new();
        for node_name in reach {
            let node = nodes.iter().find(|n| &n.name == node_name).unwrap();
            let pod = akris_broker_pod(instance, node_name);
            let pod_name = pod.name_any();
            pods.create(&PostParams::default(), &pod).await.unwrap();
            let resource = format!("akri.sh/{instance}");
            eventually(
                &format!("{resource} registered on {node_name}"),
                async || {
                    let devices = node.peer.allocatable_devices().await.ok()?;
                    // A slot the other node's broker holds is not healthy here.
                    (!devices.get(&resource)?.is_empty()).then_some(())
                },
            )
            .await;
            let options = node
                .peer
                .allocate(&apps, &pod_name, "broker")
                .await
                .unwrap();
            let env: BTreeMap<String, String> =
                serde_json::from_value(options["envs"].clone()).unwrap();
            environments.insert(pod_name, env);
        }
        services
            .create(
                &PostParams::default(),
                &from_json(akris_service(
                    &format!("{instance}-svc"),
                    "akri.sh/instance",
                    instance,
                )),
            )
            .await
            .unwrap();
        v0.insert(
            instance.clone(),
            (objects(&client, &apps, instance).await, environments),
        );
    }
    services
        .create(
            &PostParams::default(),
            &from_json(akris_service(
                "echo-svc",
                "akri.sh/configuration",
                CONFIGURATION,
            )),
        )
        .await
        .unwrap();
    let v0_global = services.get_opt("echo-svc").await.unwrap().is_some();

    // The move: Akri's brokers go, the Configuration is migrated from the cluster and applied.
    for (objects, environments) in v0.values() {
        for pod in environments.keys() {
            let node = nodes.iter().find(|n| pod.starts_with(&n.name)).unwrap();
            node.peer.release(&apps, pod).await.unwrap();
        }
        for object in objects {
            let (kind, name) = object.split_once('/').unwrap();
            let force = DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            match kind {
                "Pod" => drop(pods.delete(name, &force).await.unwrap()),
                _ => drop(services.delete(name, &force).await.unwrap()),
            }
        }
    }
    services
        .delete("echo-svc", &DeleteParams::default())
        .await
        .unwrap();
    for (objects, _) in v0.values() {
        for object in objects.iter().filter(|o| o.starts_with("Pod/")) {
            let name = &object["Pod/".len()..];
            eventually(&format!("{name} gone"), async || {
                pods.get_opt(name).await.ok()?.is_none().then_some(())
            })
            .await;
        }
    }
    let kubeconfig = cp.kubeconfig().to_path_buf();
    let migrate = tokio::task::spawn_blocking({
        let apps = apps.clone();
        move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_akri-migrate"))
                .args(["--from-cluster", "-n", &apps, "--apply"])
                .env("KUBECONFIG", &kubeconfig)
                .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")))
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert_eq!(
        migrate.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    Api::<Configuration>::namespaced(client.clone(), &apps)
        .delete(CONFIGURATION, &DeleteParams::default())
        .await
        .unwrap();

    // v1: the same Instances, found by the DRA path, and the broker-controller's brokers.
    let v1_instances = instances(&client, &akri, 2).await;
    assert_eq!(
        v1_instances, v0_instances,
        "the same Instance names, reached from the same nodes"
    );
    let mut v1 = Brokers::new();
    for (instance, reach) in &v1_instances {
        let mut environments = BTreeMap::new();
        for node_name in reach {
            let pod_name = format!("{node_name}-{instance}-pod");
            let pod = akri_testing::bound_pod(&client, &apps, &pod_name, EVENTUALLY).await;
            let claimed = async || {
                let pod = pods.get_opt(&pod_name).await.ok()??;
                let statuses = pod.status?.resource_claim_statuses?;
                statuses.first()?.resource_claim_name.clone()
            };
            eventually(&format!("{pod_name}'s claim"), claimed).await;
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let bound = (node.unwrap(), pod);
            assert_eq!(&bound.0, node_name, "{pod_name} runs on its node");
            let node = nodes.iter().find(|n| &n.name == node_name).unwrap();
            let containers = node.peer.prepare(&apps, &pod_name).await.expect("prepared");
            let edits = node
                .peer
                .cdi_inject(&containers["broker"])
                .await
                .expect("CDI resolves");
            let mut env: BTreeMap<String, String> =
                serde_json::from_value::<Vec<String>>(edits["env"].clone())
                    .unwrap()
                    .into_iter()
                    .filter_map(|e| {
                        e.split_once('=')
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                    })
                    .collect();
            let container = &bound.1.spec.unwrap().containers[0];
            for var in container.env.iter().flatten() {
                env.insert(var.name.clone(), var.value.clone().unwrap_or_default());
            }
            environments.insert(pod_name, env);
        }
        let objects = eventually(&format!("{instance}'s Service"), async || {
            let found = objects(&client, &apps, instance).await;
            found
                .iter()
                .any(|o| o.starts_with("Service/"))
                .then_some(found)
        })
        .await;
        v1.insert(instance.clone(), (objects, environments));
    }
    let v1_global = eventually("the configuration's Service", async || {
        services.get_opt("echo-svc").await.ok()?
    })
    .await;
    assert!(v0_global, "v0 had the configuration's Service");
    assert_eq!(
        v1_global.spec.unwrap().selector.unwrap()["akri.sh/configuration"],
        CONFIGURATION
    );

    for (instance, (v0_objects, v0_env)) in &v0 {
        let (v1_objects, v1_env) = &v1[instance];
        assert_eq!(
            v1_objects, v0_objects,
            "{instance}: the same broker objects"
        );
        assert_eq!(
            v1_env.keys().collect::<Vec<_>>(),
            v0_env.keys().collect::<Vec<_>>(),
            "{instance}: the same broker Pods"
        );
        for (pod, env) in v1_env {
            let before = &v0_env[pod];
            assert_eq!(
                env.get("RESOLUTION").map(String::as_str),
                Some("1080p"),
                "{pod}: the Configuration's brokerProperties"
            );
            assert!(env.contains_key("DEBUG_ECHO_DESCRIPTION"), "{pod}: {env:?}");
            for (key, value) in env {
                assert_eq!(
                    before.get(key),
                    Some(value),
                    "{pod}: {key} differs: v0 {before:?}, v1 {env:?}"
                );
            }
            // v0 also gave each property suffixed with the Instance id (several devices in one
            // container); every other v0 variable is in v1's environment.
            let suffix = instance.rsplit('-').next().unwrap().to_uppercase();
            for key in before.keys() {
                let base = key.strip_suffix(&format!("_{suffix}")).unwrap_or(key);
                assert!(
                    env.contains_key(base),
                    "{pod}: v0's {key} has no v1 counterpart: {env:?}"
                );
            }
        }
    }
}

/// The Instances of the configuration in `namespace` once there are `count`, each reached
/// by both nodes: name -> nodes.
async fn instances(
    client: &kube::Client,
    namespace: &str,
    count: usize,
) -> BTreeMap<String, Vec<String>> {
    support::instances(client, namespace, CONFIGURATION, |found| {
        found.len() == count && found.values().all(|n| n.len() == 2)
    })
    .await
}

/// `Pod/<name>` and `Service/<name>` labelled for `instance`, sorted.
async fn objects(client: &kube::Client, namespace: &str, instance: &str) -> Vec<String> {
    let selector = ListParams::default().labels(&format!("akri.sh/instance={instance}"));
    let mut found: Vec<String> = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&selector)
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| format!("Pod/{}", p.name_any()))
        .collect();
    found.extend(
        Api::<Service>::namespaced(client.clone(), namespace)
            .list(&selector)
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| format!("Service/{}", s.name_any())),
    );
    found.sort();
    found
}

/// The broker Pod Akri's controller makes for `instance` on `node`: its name and labels, the
/// brokerPodSpec with the placeholder replaced by the Instance's resource.
fn akris_broker_pod(instance: &str, node: &str) -> Pod {
    let mut spec = v0_configuration()["spec"]["brokerSpec"]["brokerPodSpec"].clone();
    spec["containers"][0]["resources"]["limits"] = json!({ format!("akri.sh/{instance}"): "1" });
    spec["nodeName"] = json!(node);
    let name = format!("{node}-{instance}-pod");
    from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": {
            "app": name, "controller": "akri.sh", "akri.sh/configuration": CONFIGURATION,
            "akri.sh/instance": instance, "akri.sh/target-node": node,
        }},
        "spec": spec,
    }))
}

/// A Service as Akri's controller makes it: the spec given, selecting Akri's labels.
fn akris_service(name: &str, label: &str, value: &str) -> Value {
    let mut spec = v0_configuration()["spec"]["instanceServiceSpec"].clone();
    spec["selector"] = json!({ "controller": "akri.sh", label: value });
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "labels": { "app": name, "controller": "akri.sh", label: value } },
        "spec": spec,
    })
}
