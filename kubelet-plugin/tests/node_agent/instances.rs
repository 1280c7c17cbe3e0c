//! Instances written by several nodes on a real kube-apiserver: each node owns its entry of
//! `nodes` (server-side apply, one field manager per node); the last node to lose a shared
//! device deletes the Instance, after the grace period.

use akri_kubelet_plugin::discovery::DiscoveredDevice;
use akri_kubelet_plugin::instance_plan::Grace;
use akri_kubelet_plugin::instances::InstanceWriter;
use akri_kubelet_plugin::node_devices::KnownDevice;
use akri_testing::ControlPlane;
use kube::api::Api;
use std::time::Duration;

/// A client of this binary's API server, with the CRDs, and a fresh namespace.
async fn namespace(prefix: &str) -> (kube::Client, String) {
    let cp = ControlPlane::shared_api_server()
        .await
        .expect("control plane");
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace(prefix).await.unwrap();
    (cp.client().await.unwrap(), ns)
}

#[tokio::test]
async fn shared_instances_follow_their_nodes() {
    let (client, ns) = namespace("instances").await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);

    let camera = KnownDevice {
        configuration: "cams".into(),
        instance: akri_devices::instance_name("cams", "rtsp://10.0.0.7/stream", true, ""),
        device: DiscoveredDevice {
            id: "rtsp://10.0.0.7/stream".into(),
            properties: [(
                "ONVIF_DEVICE_IP_ADDRESS".to_string(),
                "10.0.0.7".to_string(),
            )]
            .into(),
            ..DiscoveredDevice::default()
        },
    };
    let grace = Grace::uniform(Duration::from_millis(500));
    let mut a = InstanceWriter::new(client.clone(), &ns, "node-a", grace);
    let mut b = InstanceWriter::new(client.clone(), &ns, "node-b", grace);
    let seen = vec![(camera.clone(), 2, true)];
    a.sync(&seen, None).await.unwrap();
    b.sync(&seen, None).await.unwrap();
    let nodes = |i: &akri_api::v0::Instance| {
        let mut nodes = i.spec.nodes.clone();
        nodes.sort();
        nodes
    };
    let instance = instances.get(&camera.instance).await.unwrap();
    assert_eq!(
        nodes(&instance),
        ["node-a", "node-b"],
        "both nodes own their entry"
    );
    assert_eq!(instance.spec.capacity, 2);
    assert!(instance.spec.shared);

    // Node A stops seeing the camera: nothing changes within the grace period, then A leaves.
    a.sync(&[], None).await.unwrap();
    assert!(a.pending());
    assert_eq!(
        nodes(&instances.get(&camera.instance).await.unwrap()),
        ["node-a", "node-b"]
    );
    tokio::time::sleep(grace.unshared).await;
    a.sync(&[], None).await.unwrap();
    assert_eq!(
        nodes(&instances.get(&camera.instance).await.unwrap()),
        ["node-b"]
    );

    // Node B, the last one, deletes the Instance after its grace period.
    b.sync(&[], None).await.unwrap();
    tokio::time::sleep(grace.unshared).await;
    b.sync(&[], None).await.unwrap();
    assert!(
        instances.get_opt(&camera.instance).await.unwrap().is_none(),
        "the last node deleted it"
    );
}

/// Node names may have 253 characters; field managers may have 128. A node with the longest
/// name still writes its Instances (and two such nodes still own separate entries).
#[tokio::test]
async fn nodes_with_the_longest_names_write_instances() {
    let (client, ns) = namespace("long-names").await;
    let long = |last: char| format!("{}.{}{last}", "n".repeat(63), "m".repeat(188));
    let (node_a, node_b) = (long('a'), long('b'));
    assert_eq!(node_a.len(), 253);
    let camera = KnownDevice {
        configuration: "cams".into(),
        instance: akri_devices::instance_name("cams", "rtsp://10.0.0.8/s", true, ""),
        device: DiscoveredDevice {
            id: "rtsp://10.0.0.8/s".into(),
            ..DiscoveredDevice::default()
        },
    };
    let seen = vec![(camera.clone(), 1, true)];
    for node in [&node_a, &node_b] {
        InstanceWriter::new(client.clone(), &ns, node, Grace::uniform(Duration::ZERO))
            .sync(&seen, None)
            .await
            .expect("the field manager is valid (kube-rs checks the API server's 128-byte limit before sending)");
    }
    let instance = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns)
        .get(&camera.instance)
        .await
        .unwrap();
    assert_eq!(instance.spec.nodes.len(), 2, "{:?}", instance.spec.nodes);
}

/// A device with more properties than DRA allows attributes: its slice is accepted (the
/// attributes that fit), and its Instance names the properties left out.
#[tokio::test]
async fn a_device_with_too_many_properties_is_published() {
    let (client, ns) = namespace("many-props").await;
    let properties: std::collections::BTreeMap<String, String> = (0..40)
        .map(|i| (format!("PROP_{i:02}"), format!("v{i}")))
        .collect();
    let camera = KnownDevice {
        configuration: "cams".into(),
        instance: akri_devices::instance_name("cams", "many", false, "node-p"),
        device: DiscoveredDevice {
            id: "many".into(),
            properties: properties.clone(),
            ..DiscoveredDevice::default()
        },
    };
    let devices = akri_devices::devices(
        &akri_devices::InstanceDevice {
            instance: &camera.instance,
            configuration: "cams",
            capacity: 2,
            properties: &properties,
        },
        akri_devices::Sharing::ConsumableCapacity,
    );
    let slice: k8s_openapi::api::resource::v1::ResourceSlice =
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": ControlPlane::unique_name("many") },
            "spec": { "driver": "debugecho.akri.sh", "nodeName": "node-p",
                      "pool": { "name": "node-p", "generation": 1, "resourceSliceCount": 1 },
                      "devices": devices },
        }))
        .unwrap();
    Api::<k8s_openapi::api::resource::v1::ResourceSlice>::all(client.clone())
        .create(&Default::default(), &slice)
        .await
        .expect("the API server takes the device");

    InstanceWriter::new(
        client.clone(),
        &ns,
        "node-p",
        Grace::uniform(Duration::ZERO),
    )
    .sync(&[(camera.clone(), 2, false)], None)
    .await
    .unwrap();
    let instance = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns)
        .get(&camera.instance)
        .await
        .unwrap();
    let left_out =
        instance.metadata.annotations.unwrap()[akri_devices::UNPUBLISHED_PROPERTIES].clone();
    assert_eq!(
        left_out.split(',').count(),
        40 - akri_devices::MAX_PROPERTY_ATTRIBUTES
    );
    assert!(left_out.contains("PROP_39"), "{left_out}");
    assert_eq!(
        instance.spec.broker_properties.len(),
        40,
        "brokers still get every property"
    );
}

/// One Instance the API server refuses (a device with a 4 MB property: over the API server's
/// 3 MB request limit) is reported with why, and the node's other Instances are written all
/// the same, those after it included.
#[tokio::test]
async fn a_refused_instance_leaves_the_other_writes_alone() {
    let (client, ns) = namespace("refused").await;
    let device = |configuration: &str, id: &str, value: String| KnownDevice {
        configuration: configuration.into(),
        instance: akri_devices::instance_name(configuration, id, false, "node-r"),
        device: DiscoveredDevice {
            id: id.into(),
            properties: [("DESCRIPTION".to_string(), value)].into(),
            ..DiscoveredDevice::default()
        },
    };
    // The refused device is written first.
    let known = vec![
        (device("cams", "huge", "x".repeat(4 << 20)), 1, false),
        (device("cams", "small", "ok".into()), 1, false),
        (device("mics", "mic", "ok".into()), 1, false),
    ];
    let mut writer = InstanceWriter::new(
        client.clone(),
        &ns,
        "node-r",
        Grace::uniform(Duration::ZERO),
    );
    let synced = writer
        .sync(&known, None)
        .await
        .expect("a refusal is not an outage");
    let message = &synced.refused["cams"];
    assert!(
        message.contains(&known[0].0.instance) && message.contains("too large"),
        "{message}"
    );
    assert_eq!(synced.refused.len(), 1, "{:?}", synced.refused);
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    for (seen, _, _) in &known[1..] {
        instances
            .get(&seen.instance)
            .await
            .unwrap_or_else(|e| panic!("{} not written: {e}", seen.instance));
    }
    // Once the device is back within bounds its Instance is written and the refusal clears.
    let mut fixed = known.clone();
    fixed[0].0.device.properties = [("DESCRIPTION".to_string(), "ok".to_string())].into();
    let synced = writer.sync(&fixed, None).await.unwrap();
    assert!(synced.refused.is_empty(), "{:?}", synced.refused);
    instances.get(&fixed[0].0.instance).await.unwrap();
}

/// The writer knows what is stored from a watch, not a read per pass: an Instance deleted or
/// edited behind its back is written again by a later pass, once the watch has told it.
#[tokio::test]
async fn an_instance_deleted_or_edited_behind_its_back_is_written_again() {
    let (client, ns) = namespace("instances").await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let device = KnownDevice {
        configuration: "echo".into(),
        instance: akri_devices::instance_name("echo", "lobby", false, "node-a"),
        device: DiscoveredDevice {
            id: "lobby".into(),
            ..DiscoveredDevice::default()
        },
    };
    let mut writer = InstanceWriter::new(
        client.clone(),
        &ns,
        "node-a",
        Grace::uniform(Duration::ZERO),
    );
    let known = vec![(device.clone(), 1, false)];
    writer.sync(&known, None).await.unwrap();
    assert!(instances.get_opt(&device.instance).await.unwrap().is_some());

    // Passes until the watch has told the writer (a bounded wait, not a timing assertion).
    async fn passes_until<T>(
        writer: &mut InstanceWriter,
        known: &[(KnownDevice, i32, bool)],
        what: &str,
        mut done: impl AsyncFnMut() -> Option<T>,
    ) -> T {
        for _ in 0..80 {
            writer.sync(known, None).await.unwrap();
            if let Some(value) = done().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("{what}: not so after 20 s of passes");
    }

    instances
        .delete(&device.instance, &Default::default())
        .await
        .unwrap();
    passes_until(
        &mut writer,
        &known,
        "the deleted Instance written again",
        async || instances.get_opt(&device.instance).await.unwrap(),
    )
    .await;

    let edit = serde_json::json!({ "spec": { "capacity": 5 } });
    instances
        .patch(
            &device.instance,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&edit),
        )
        .await
        .unwrap();
    passes_until(
        &mut writer,
        &known,
        "the edited Instance written back",
        async || {
            let capacity = instances.get(&device.instance).await.unwrap().spec.capacity;
            (capacity == 1).then_some(())
        },
    )
    .await;
}

/// Two nodes' unshared devices whose Akri names collide (6 hex digits: about one pair in 5 at
/// 2,500 devices; seen in the 50-node bench): the node that wrote the Instance first keeps it,
/// the other gives the name up (its entry withdrawn at once) and names its device otherwise,
/// so no Instance of an unshared device ever lists two nodes.
#[tokio::test]
async fn an_unshared_device_never_joins_another_nodes_instance_of_that_name() {
    let (client, ns) = namespace("collide").await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    // Two ids, one per node, with one Akri name: a birthday search over 2 x 20,000 names.
    let names_a: std::collections::BTreeMap<String, String> = (0..20000)
        .map(|i| {
            let id = format!("a-{i}");
            (
                akri_devices::instance_name("cams", &id, false, "node-a"),
                id,
            )
        })
        .collect();
    let (name, id_a, id_b) = (0..20000)
        .find_map(|i| {
            let id = format!("b-{i}");
            let name = akri_devices::instance_name("cams", &id, false, "node-b");
            names_a.get(&name).map(|a| (name, a.clone(), id))
        })
        .expect("a collision among 400 million pairs of 16 million names");
    let device = |id: &str| KnownDevice {
        configuration: "cams".into(),
        instance: name.clone(),
        device: DiscoveredDevice {
            id: id.into(),
            properties: [("ID".to_string(), id.to_string())].into(),
            ..DiscoveredDevice::default()
        },
    };
    let grace = Grace::uniform(Duration::from_secs(300));
    let mut a = InstanceWriter::new(client.clone(), &ns, "node-a", grace);
    let mut b = InstanceWriter::new(client.clone(), &ns, "node-b", grace);
    let contested_a = (a.sync(&[(device(&id_a), 1, false)], None).await.unwrap()).contested;
    let contested_b = (b.sync(&[(device(&id_b), 1, false)], None).await.unwrap()).contested;
    assert!(contested_a.is_empty(), "{contested_a:?}");
    assert_eq!(
        contested_b,
        std::slice::from_ref(&name),
        "node-b learns the name is taken"
    );
    let stored = instances.get(&name).await.unwrap();
    assert_eq!(stored.spec.nodes, ["node-a"], "node-b has no entry");
    assert_eq!(stored.spec.broker_properties["ID"], id_a);
    // Node-a writing again keeps it, unchanged.
    assert!(
        a.sync(&[(device(&id_a), 1, false)], None)
            .await
            .unwrap()
            .contested
            .is_empty()
    );
    assert_eq!(
        instances
            .get(&name)
            .await
            .unwrap()
            .metadata
            .resource_version,
        stored.metadata.resource_version
    );
}

/// The same through two node agents: one node renames its device, and each device has an
/// Instance of its own, naming its node alone, which stays unchanged at rest.
#[tokio::test]
async fn two_agents_whose_device_names_collide_keep_an_instance_each() {
    use akri_testing::components::SimNode;
    use akri_testing::{ControlPlaneOptions, eventually};
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("collide").await.unwrap();
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    // A pass at rest every second (30 s in the product): "at rest" below waits for passes.
    let a = SimNode::start(&cp, &client, &ns, |c, _| c.resync = Duration::from_secs(1)).await;
    let b = SimNode::start(&cp, &client, &ns, |c, _| c.resync = Duration::from_secs(1)).await;
    let names_a: std::collections::BTreeMap<String, String> = (0..20000)
        .map(|i| {
            let id = format!("a{i}");
            (akri_devices::instance_name("cams", &id, false, &a.name), id)
        })
        .collect();
    let (name, id_a, id_b) = (0..20000)
        .find_map(|i| {
            let id = format!("b{i}");
            let name = akri_devices::instance_name("cams", &id, false, &b.name);
            names_a.get(&name).map(|a| (name, a.clone(), id))
        })
        .expect("a collision among 400 million pairs of 16 million names");
    // Each node sees its own device only.
    std::fs::write(&a.availability, format!("{id_b}\n")).unwrap();
    std::fs::write(&b.availability, format!("{id_a}\n")).unwrap();
    let config: akri_api::v1::DiscoveryConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": "cams" },
        "spec": { "discoveryHandler": {
            "name": "debugEcho",
            "discoveryDetails": format!("descriptions: [{id_a}, {id_b}]"),
        } },
    }))
    .unwrap();
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(&Default::default(), &config)
        .await
        .unwrap();

    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let owners = || async {
        let list = instances.list(&Default::default()).await.ok()?;
        let owners: std::collections::BTreeMap<String, (Vec<String>, String)> = (list.items)
            .into_iter()
            .map(|i| {
                let id = i.spec.broker_properties["DEBUG_ECHO_DESCRIPTION"].clone();
                let version = i.metadata.resource_version.clone().unwrap_or_default();
                (id, (i.spec.nodes, version))
            })
            .collect();
        Some(owners)
    };
    let settled = eventually("an Instance per device, each naming its node", async || {
        let owners = owners().await?;
        let one_each = owners.len() == 2
            && owners[&id_a].0 == [a.name.clone()]
            && owners[&id_b].0 == [b.name.clone()];
        one_each.then_some(owners)
    })
    .await;
    assert!(
        instances.get_opt(&name).await.unwrap().is_some(),
        "one of them keeps the Akri name {name}"
    );
    // At rest (a whole pass of each agent, each applying what it sees): unchanged.
    a.whole_pass().await;
    b.whole_pass().await;
    assert_eq!(owners().await.unwrap(), settled);
}

/// A node watches only the Instances that name it, by its label: another node's devices coming
/// and going, unshared or shared, send it no event. Counted by the API server
/// (`apiserver_watch_events_total` of Instances) on a control plane where this node's agent is
/// the only watcher of Instances; an edit of its own Instance, counted once, shows that the
/// count is of its watch and that every earlier event was sent (one watch sends in order).
#[tokio::test]
async fn a_node_hears_nothing_of_other_nodes_instances() {
    use akri_api::v1::{
        INSTANCE_NODES_LABELLED, INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, INSTANCE_SOURCE_LABEL,
        instance_node_label,
    };
    use akri_testing::components::SimNode;
    use akri_testing::{ControlPlaneOptions, eventually};
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client().await.unwrap();
    cp.install_crds(&akri_api::crds::all()).await.unwrap();
    let ns = cp.create_namespace("quiet").await.unwrap();
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    let a = SimNode::start(&cp, &client, &ns, |_, _| {}).await;
    let config: akri_api::v1::DiscoveryConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": "cams" },
        "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: [cam-a]" } },
    }))
    .unwrap();
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let own = akri_devices::instance_name("cams", "cam-a", false, &a.name);
    eventually("node a's Instance", async || {
        instances.get_opt(&own).await.ok()?
    })
    .await;

    let sent =
        async || -> f64 { (akri_testing::watch_events_sent(&client, "instances").await).unwrap() };
    let before = sent().await;
    // Node b's devices: 10 unshared and 10 shared Instances, labelled as node b labels them,
    // of node a's configuration (a shared one node a could join, were it to see the device).
    let node_b = "node-b";
    for i in 0..20 {
        let instance: akri_api::v0::Instance = serde_json::from_value(serde_json::json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance",
            "metadata": { "name": format!("b-{i}"), "labels": {
                INSTANCE_SOURCE_LABEL: INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
                INSTANCE_NODES_LABELLED: "true",
                instance_node_label(node_b).unwrap(): "true",
            } },
            "spec": {
                "configurationName": "cams", "cdiName": format!("akri.sh/debugecho=b-{i}"),
                "capacity": 1, "shared": i % 2 == 0, "nodes": [node_b],
            },
        }))
        .unwrap();
        instances
            .create(&PostParams::default(), &instance)
            .await
            .unwrap();
        instances
            .patch(
                &format!("b-{i}"),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "capacity": 2 } })),
            )
            .await
            .unwrap();
        instances
            .delete(&format!("b-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    // Then one edit of node a's own Instance (an annotation it does not set: no write back).
    let heard =
        akri_testing::watch_events_through_edit(&client, &instances, &own, "instances", before)
            .await;
    assert_eq!(
        heard,
        1.0,
        "node a's watch was sent {heard} events: its own Instance's edit and {} of node b's 60 writes",
        heard - 1.0
    );
}

/// Instances written before nodes labelled theirs (by the version before an upgrade) are in
/// no watch of a node's label: the node adopts those that name it, labels the ones it still
/// sees and, after the grace, removes the ones it no longer does, as it would have.
#[tokio::test]
async fn instances_written_before_nodes_labelled_theirs_are_adopted() {
    use akri_api::v1::{INSTANCE_NODES_LABELLED, instance_node_label};
    use kube::api::PostParams;
    let (client, ns) = namespace("adopt").await;
    let instances = Api::<akri_api::v0::Instance>::namespaced(client.clone(), &ns);
    let device = |name: &str| KnownDevice {
        configuration: "cams".into(),
        instance: name.into(),
        device: DiscoveredDevice {
            id: name.into(),
            ..DiscoveredDevice::default()
        },
    };
    let grace = Grace::uniform(Duration::from_millis(300));
    // As the version before labels wrote them: the path's label only.
    for (name, node) in [("kept", "node-a"), ("gone", "node-a"), ("bs", "node-b")] {
        let instance: akri_api::v0::Instance = serde_json::from_value(serde_json::json!({
            "apiVersion": "akri.sh/v0", "kind": "Instance",
            "metadata": { "name": name, "labels": {
                akri_api::v1::INSTANCE_SOURCE_LABEL:
                    akri_api::v1::INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
            } },
            "spec": {
                "configurationName": "cams", "cdiName": format!("akri.sh={name}"),
                "capacity": 1, "shared": false, "nodes": [node],
            },
        }))
        .unwrap();
        instances
            .create(&PostParams::default(), &instance)
            .await
            .unwrap();
    }

    let mut a = InstanceWriter::new(client.clone(), &ns, "node-a", grace);
    let seen = vec![(device("kept"), 1, false)];
    a.sync(&seen, None).await.unwrap();
    let labels = instances
        .get("kept")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(labels[&instance_node_label("node-a").unwrap()], "true");
    assert_eq!(labels[INSTANCE_NODES_LABELLED], "true");
    assert!(
        a.pending(),
        "the device it no longer sees waits for its grace"
    );
    tokio::time::sleep(grace.unshared).await;
    a.sync(&seen, None).await.unwrap();
    assert!(
        instances.get_opt("gone").await.unwrap().is_none(),
        "removed"
    );
    assert_eq!(
        instances.get("bs").await.unwrap().spec.nodes,
        ["node-b"],
        "another node's is not node a's to adopt"
    );
}
