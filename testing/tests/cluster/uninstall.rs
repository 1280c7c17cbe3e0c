//! docs/operations.md's "Beside Akri" and "Uninstall", their lines run as written with Akri's
//! CRDs and objects present: this project's CRDs and objects go, Akri's stay.

use akri_api::v0::{Configuration, Instance};
use akri_testing::product::{repo, shell};
use akri_testing::{ControlPlane, ControlPlaneOptions, from_json};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use std::collections::BTreeSet;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

/// The akri.sh CRDs the API server has.
async fn akri_crds(client: &kube::Client) -> BTreeSet<String> {
    let list = Api::<CustomResourceDefinition>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    (list.items.into_iter())
        .filter_map(|crd| crd.metadata.name)
        .filter(|name| name.ends_with(".akri.sh"))
        .collect()
}

/// With Akri's CRDs, a Configuration and the Instance its agent wrote present, the Uninstall
/// section's first block (this project's release, objects and CRDs) leaves every one of them;
/// the block for Akri's CRDs keeps them while an object of Akri's is left, and deletes them
/// once none is.
#[tokio::test]
async fn uninstalling_beside_akri_keeps_akris_crds_and_objects() {
    // Its own API server: the blocks delete CRDs, and the namespace needs its controller.
    let cp = ControlPlane::start(ControlPlaneOptions {
        controller_manager: true,
        ..Default::default()
    })
    .await
    .expect("control plane");
    let client = cp.client().await.unwrap();
    let kubeconfig = cp.kubeconfig();
    let kubectl = cp.bins().require("kubectl").unwrap();
    let run = async |script: &str| {
        (shell(kubeconfig, &[&kubectl], script).await).unwrap_or_else(|e| panic!("{e}"))
    };
    let doc = repo().join("docs/operations.md");
    let blocks = akri_testing::docs::section_blocks(&doc, "Uninstall", &["bash"]).unwrap();
    let akris_block = blocks
        .iter()
        .find(|b| b.contains("delete crd configurations.akri.sh"));

    // Akri as it runs: its CRDs, a Configuration, the Instance its agent wrote.
    akri_testing::akris_agent::akris_crds(&client).await;
    let users = cp.create_namespace("cameras").await.unwrap();
    let configurations = Api::<Configuration>::namespaced(client.clone(), &users);
    let instances = Api::<Instance>::namespaced(client.clone(), &users);
    let config: Configuration = from_json(akri_testing::discovery::v0_debug_echo(
        "akris",
        &["cam0"],
        1,
        true,
    ));
    let config = configurations
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let instance = "akris-5ea1ce";
    let written = akri_testing::discovery::akri_written_instance(
        "akris",
        config.metadata.uid.as_deref(),
        instance,
        "edge-1",
        &akri_devices::slot_device_name(instance, 0),
    );
    instances
        .create(&PostParams::default(), &from_json(written))
        .await
        .unwrap();
    let akris: BTreeSet<String> = ["configurations.akri.sh", "instances.akri.sh"]
        .map(String::from)
        .into();

    // This project beside it, as "Beside Akri" gives it (no nodes here: no pod starts), then
    // uninstalled.
    let beside = akri_testing::docs::section_lines(&doc, "Beside Akri").unwrap();
    let install = (beside.iter().find(|l| l.starts_with("helm install")))
        .unwrap_or_else(|| panic!("{beside:?}"));
    // Without the CRD line, Helm's server-side apply of the CRDs meets Akri's chart's fields.
    let refused = (shell(
        kubeconfig,
        &[&kubectl],
        &format!("kubectl apply -f examples/akri-namespace.yaml\n{install}"),
    )
    .await)
        .expect_err("helm install beside Akri without the CRD line");
    assert!(refused.to_string().contains("conflict"), "{refused}");
    run(&beside.join("\n")).await;
    let ours = akri_crds(&client).await;
    assert!(
        ours.contains("discoveryconfigurations.akri.sh") && ours.is_superset(&akris),
        "{ours:?}"
    );
    run(&blocks[0]).await;
    assert_eq!(
        akri_crds(&client).await,
        akris,
        "the uninstall deleted Akri's CRDs, or left one of ours"
    );
    assert!(configurations.get_opt("akris").await.unwrap().is_some());
    assert!(instances.get_opt(instance).await.unwrap().is_some());

    // Akri's CRDs, once Akri is gone: kept while one of its objects is left.
    let akris_block = akris_block.expect("a block that deletes Akri's CRDs once nothing uses them");
    let printed = run(akris_block).await;
    assert!(printed.contains("their CRDs are kept"), "{printed}");
    assert_eq!(akri_crds(&client).await, akris);
    // Akri gone: its agent released its node's finalizer, and its objects are deleted.
    let released = serde_json::json!({ "metadata": { "finalizers": null } });
    instances
        .patch(instance, &PatchParams::default(), &Patch::Merge(released))
        .await
        .unwrap();
    instances
        .delete(instance, &DeleteParams::default())
        .await
        .unwrap();
    configurations
        .delete("akris", &DeleteParams::default())
        .await
        .unwrap();
    akri_testing::eventually_within("Akri's objects deleted", WAIT, async || {
        let configs = configurations.list(&ListParams::default()).await.unwrap();
        let left = instances.list(&ListParams::default()).await.unwrap();
        (configs.items.is_empty() && left.items.is_empty()).then_some(())
    })
    .await;
    run(akris_block).await;
    assert_eq!(akri_crds(&client).await, BTreeSet::new());
}
