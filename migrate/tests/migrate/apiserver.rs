//! The migration's output on a real kube-apiserver with the v1 CRDs: everything the golden
//! inputs migrate to passes a server-side dry run (which stores nothing), `--apply` stores
//! it, a second run changes nothing, a run after a partial apply completes it, an existing
//! DiscoveryConfiguration of someone else's is not overwritten; rewritten workloads' claim
//! templates are valid; reading from the cluster gives what reading the files gives.

use akri_api::v1::{BrokerTemplate, DiscoveryConfiguration};
use akri_testing::ControlPlane;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::process::Output;

use crate::common;
use common::{listing, repo, stderr};

async fn cluster() -> &'static ControlPlane {
    let cp = ControlPlane::shared_api_server()
        .await
        .expect("control plane starts");
    cp.install_crds(&akri_api::crds::all()).await.expect("CRDs");
    cp
}

fn migrate(cp: &ControlPlane, args: &[&str]) -> Output {
    common::migrate(args, Some(cp.kubeconfig()))
}

/// The golden inputs: Akri's examples and our own shapes, the lossy one too.
fn inputs() -> Vec<String> {
    let mut inputs: Vec<String> = ["api/tests/fixtures/v0", "migrate/tests/fixtures/v0"]
        .iter()
        .flat_map(|dir| {
            std::fs::read_dir(repo().join(dir))
                .unwrap()
                .map(move |e| format!("{dir}/{}", e.unwrap().file_name().to_string_lossy()))
        })
        .filter(|f| f.ends_with(".yaml") && !f.contains("/instance-"))
        .collect();
    inputs.push("migrate/tests/fixtures/lossy/lossy.yaml".into());
    inputs.sort();
    inputs
}

async fn ensure_namespace(client: &kube::Client, name: &str) {
    let namespace: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await;
    // No controller-manager here: the account pods are admitted under is made by hand.
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": "default" } })).unwrap();
    let _ = Api::<ServiceAccount>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &account)
        .await;
}

/// `name -> resourceVersion` of every migrated DiscoveryConfiguration and BrokerTemplate.
async fn stored(client: &kube::Client) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let migrated = |o: &kube::api::ObjectMeta| {
        o.annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("akri.sh/migrated-from"))
    };
    for dc in Api::<DiscoveryConfiguration>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        if migrated(&dc.metadata) {
            found.insert(
                format!("dc/{}", dc.name_any()),
                dc.resource_version().unwrap(),
            );
        }
    }
    for bt in Api::<BrokerTemplate>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
    {
        if migrated(&bt.metadata) {
            found.insert(
                format!("bt/{}/{}", bt.namespace().unwrap(), bt.name_any()),
                bt.resource_version().unwrap(),
            );
        }
    }
    found
}

#[tokio::test]
async fn migrated_objects_pass_a_server_dry_run_and_apply_completes_idempotently() {
    let cp = cluster().await;
    let client = cp.client().await.unwrap();
    for ns in [
        "factory",
        "factory-line-a",
        "factory-line-b",
        "lab",
        "plant",
        "prod",
        "security",
    ] {
        ensure_namespace(&client, ns).await;
    }
    let inputs = inputs();
    let mut args: Vec<&str> = inputs.iter().map(String::as_str).collect();
    args.extend(["--allow-lossy", "--apply"]);

    let dry = migrate(cp, &[args.as_slice(), &["--dry-run=server"]].concat());
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert!(stored(&client).await.is_empty(), "a dry run stores nothing");

    let said = |output: &Output| String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        said(&dry).contains(
            "discoveryconfiguration.akri.sh/cams-lab serverside-applied (server dry run)\n"
        ),
        "{}",
        said(&dry)
    );
    let applied = migrate(cp, &args);
    assert_eq!(applied.status.code(), Some(0), "{}", stderr(&applied));
    // As kubectl says it: a line per object.
    let lines: Vec<String> = said(&applied).lines().map(String::from).collect();
    assert!(
        lines.contains(&"discoveryconfiguration.akri.sh/cams-lab serverside-applied".into())
            && lines.contains(&"brokertemplate.akri.sh/sensor-hubs serverside-applied".into()),
        "{lines:#?}"
    );
    let first = stored(&client).await;
    assert_eq!(
        first.keys().filter(|k| k.starts_with("dc/")).count(),
        22,
        "{first:#?}"
    );
    assert_eq!(
        lines.len(),
        first.len(),
        "one line per object stored: {lines:#?}"
    );
    assert!(
        first.contains_key("dc/cams-lab") && first.contains_key("bt/factory/sensor-hubs"),
        "{first:#?}"
    );
    let template = Api::<BrokerTemplate>::namespaced(client.clone(), "plant")
        .get("plc-audit")
        .await
        .unwrap();
    assert_eq!(template.spec.discovery_reference.name, "plc-audit");

    let again = migrate(cp, &args);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(
        stored(&client).await,
        first,
        "a second apply changes nothing"
    );

    // A partial apply: one DiscoveryConfiguration and one BrokerTemplate missing.
    Api::<DiscoveryConfiguration>::all(client.clone())
        .delete("fpga-pool", &DeleteParams::default())
        .await
        .unwrap();
    Api::<BrokerTemplate>::namespaced(client.clone(), "factory")
        .delete("sensor-hubs", &DeleteParams::default())
        .await
        .unwrap();
    let completed = migrate(cp, &args);
    assert_eq!(completed.status.code(), Some(0), "{}", stderr(&completed));
    let now = stored(&client).await;
    assert_eq!(
        now.keys().collect::<Vec<_>>(),
        first.keys().collect::<Vec<_>>(),
        "completed"
    );

    // Someone else's DiscoveryConfiguration of the same name is left alone.
    let theirs: DiscoveryConfiguration = serde_json::from_value(json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": "hand-made" },
        "spec": { "discoveryHandler": { "name": "udev" } },
    }))
    .unwrap();
    Api::<DiscoveryConfiguration>::all(client.clone())
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hand-made.yaml");
    std::fs::write(&file, "apiVersion: akri.sh/v0\nkind: Configuration\nmetadata: {name: hand-made}\nspec: {discoveryHandler: {name: onvif}}\n").unwrap();
    let refused = migrate(cp, &[file.to_str().unwrap(), "--apply"]);
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(
            "DiscoveryConfiguration hand-made exists and was not migrated from default/hand-made"
        ),
        "{}",
        stderr(&refused)
    );
    let kept = Api::<DiscoveryConfiguration>::all(client.clone())
        .get("hand-made")
        .await
        .unwrap();
    assert_eq!(kept.spec.discovery_handler.name, "udev");
}

#[tokio::test]
async fn rewritten_workloads_and_their_claim_templates_are_valid() {
    let cp = cluster().await;
    let client = cp.client().await.unwrap();
    ensure_namespace(&client, "lab").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("same-name.yaml");
    std::fs::copy(
        repo().join("migrate/tests/fixtures/v0/same-name.yaml"),
        &file,
    )
    .unwrap();
    let output = migrate(cp, &[file.to_str().unwrap(), "--rewrite-workloads"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = std::fs::read_to_string(&file).unwrap();
    let mut checked = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let object: Value = serde::Deserialize::deserialize(document).unwrap();
        let (api_version, kind) = (
            object["apiVersion"].as_str().unwrap(),
            object["kind"].as_str().unwrap(),
        );
        if api_version.starts_with("akri.sh/") {
            continue;
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "lab", &resource);
        let params = PatchParams {
            dry_run: true,
            ..PatchParams::apply("test")
        };
        let name = object["metadata"]["name"].as_str().unwrap().to_string();
        api.patch(&name, &params, &Patch::Apply(&object))
            .await
            .unwrap_or_else(|e| panic!("{kind} {name}: {e}"));
        checked.push(kind.to_string());
    }
    assert_eq!(
        checked,
        [
            "Deployment",
            "ResourceClaimTemplate",
            "Pod",
            "ResourceClaimTemplate"
        ]
    );
}

#[tokio::test]
async fn reading_the_cluster_gives_what_reading_the_files_gives() {
    let cp = cluster().await;
    let client = cp.client().await.unwrap();
    let ns = cp.create_namespace("v0").await.unwrap();
    let files = [
        "api/tests/fixtures/v0/configuration-onvif-video.yaml",
        "api/tests/fixtures/v0/helm-opcua.yaml",
        "migrate/tests/fixtures/v0/custom-handler.yaml",
    ];
    let configurations = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("akri.sh", "v0", "Configuration"),
        "configurations",
    );
    for file in files {
        let object: Value =
            serde_yaml::from_str(&std::fs::read_to_string(repo().join(file)).unwrap()).unwrap();
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &configurations)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
    let deployment: Value = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "reader" },
        "spec": {
            "selector": { "matchLabels": { "app": "reader" } },
            "template": { "metadata": { "labels": { "app": "reader" } }, "spec": { "containers": [
                { "name": "r", "image": "reader", "resources": { "limits": { "akri.sh/fpga-pool": "2" } } },
            ]}},
        },
    });
    let deployments = ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "Deployment"));
    Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &deployments)
        .create(
            &PostParams::default(),
            &serde_json::from_value(deployment).unwrap(),
        )
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let from_cluster = dir.path().join("cluster");
    let from_files = dir.path().join("files");
    let read = migrate(
        cp,
        &[
            "--from-cluster",
            "-n",
            &ns,
            "--output-dir",
            from_cluster.to_str().unwrap(),
        ],
    );
    assert_eq!(read.status.code(), Some(0), "{}", stderr(&read));
    assert!(
        stderr(&read).contains(&format!("(Deployment {ns}/reader)"))
            && stderr(&read).contains("requests akri.sh/fpga-pool: 2"),
        "{}",
        stderr(&read)
    );
    let mut args: Vec<&str> = files.to_vec();
    args.extend(["-n", &ns, "--output-dir", from_files.to_str().unwrap()]);
    let read_files = migrate(cp, &args);
    assert_eq!(read_files.status.code(), Some(0), "{}", stderr(&read_files));
    let cluster_files = listing(&from_cluster);
    assert_eq!(cluster_files.len(), 3);
    assert_eq!(cluster_files, listing(&from_files));
}
