//! The broker-controller's objects on a real API server (garbage collector included) with the
//! driver-controller running beside it: they follow the Instances (written here, as the
//! kubelet-plugins would) and the template, and the status says what happened.

use akri_api::v1::{BrokerTemplate, DiscoveryConfiguration, Instance};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support;

use akri_testing::eventually;

use akri_testing::from_json;

struct Setup {
    _cp: ControlPlane,
    client: kube::Client,
    instances_ns: String,
    apps: String,
    node: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn setup() -> Setup {
    let (cp, client, instances_ns, apps) = support::akri_and_apps(ControlPlaneOptions {
        controller_manager: true,
        ..Default::default()
    })
    .await;
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let tasks = vec![
        support::spawn_driver_controller(&client, &instances_ns),
        support::spawn_broker_controller(&client, &instances_ns).0,
    ];
    Setup {
        _cp: cp,
        client,
        instances_ns,
        apps,
        node,
        tasks,
    }
}

impl Setup {
    async fn discovery(&self, name: &str) {
        Api::<DiscoveryConfiguration>::all(self.client.clone())
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
                    "metadata": { "name": name },
                    "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": "descriptions: []" } },
                })),
            )
            .await
            .unwrap();
    }

    /// An Instance as a kubelet-plugin writes it, for a device of `node`.
    async fn instance(&self, configuration: &str, name: &str, resolution: &str) {
        Api::<Instance>::namespaced(self.client.clone(), &self.instances_ns)
            .create(
                &PostParams::default(),
                &from_json(json!({
                    "apiVersion": "akri.sh/v0", "kind": "Instance",
                    "metadata": { "name": name, "labels": { "akri.sh/configuration-kind": "DiscoveryConfiguration" } },
                    "spec": {
                        "configurationName": configuration, "cdiName": format!("akri.sh/debugecho={name}"),
                        "capacity": 1, "brokerProperties": { "RESOLUTION": resolution },
                        "shared": false, "nodes": [self.node], "deviceUsage": {},
                    },
                })),
            )
            .await
            .unwrap();
    }

    async fn delete_instance(&self, name: &str) {
        Api::<Instance>::namespaced(self.client.clone(), &self.instances_ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    fn templates(&self) -> Api<BrokerTemplate> {
        Api::namespaced(self.client.clone(), &self.apps)
    }

    async fn apply_template(&self, name: &str, spec: Value) {
        self.templates()
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(json!({
                    "apiVersion": "akri.sh/v1", "kind": "BrokerTemplate",
                    "metadata": { "name": name }, "spec": spec,
                })),
            )
            .await
            .unwrap();
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.apps)
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), &self.apps)
    }

    /// Waits until the template's status says `brokers` Instances have all their objects
    /// and `objects` are managed, and returns its Ready condition (status, message).
    async fn status(&self, template: &str, brokers: i32, objects: i32) -> (String, String) {
        eventually(
            &format!("{template}: {brokers} brokers, {objects} objects"),
            async || {
                let t = self.templates().get(template).await.ok()?;
                let status = t.status?;
                let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
                (status.brokers == brokers
                    && status.objects == objects
                    && status.observed_generation == t.metadata.generation)
                    .then(|| (ready.status.clone(), ready.message.clone()))
            },
        )
        .await
    }
}

fn pod_and_service_per_instance() -> Value {
    json!({
        "discoveryReference": { "name": "cams" },
        "instanceBrokerResources": [
            { "apiVersion": "v1", "kind": "Pod", "spec": { "containers": [{
                "name": "broker", "image": "broker:1",
                "env": [{ "name": "RESOLUTION", "value": "$(AKRI_PROPERTY_RESOLUTION)" }],
            }]}},
            { "apiVersion": "v1", "kind": "Service", "metadata": { "name": "$(AKRI_INSTANCE)-svc" },
              "spec": { "selector": { "instance": "$(AKRI_INSTANCE)" }, "ports": [{ "port": 80 }] } },
        ],
        "globalBrokerResources": [
            { "apiVersion": "v1", "kind": "Service", "metadata": { "name": "$(AKRI_CONFIGURATION)-all" },
              "spec": { "selector": { "configuration": "$(AKRI_CONFIGURATION)" }, "ports": [{ "port": 80 }] } },
        ],
    })
}

#[tokio::test]
async fn objects_follow_instances_and_the_template() {
    let s = setup().await;
    s.discovery("cams").await;
    s.instance("cams", "cams-aaaaaa", "1080p").await;
    s.instance("cams", "cams-bbbbbb", "720p").await;
    s.apply_template("cams", pod_and_service_per_instance())
        .await;

    // Per Instance a Pod bound to its claim template, the template, a Service; once a
    // global Service: 7 objects.
    let (ready, message) = s.status("cams", 2, 7).await;
    assert_eq!(ready, "True", "{message}");
    let pod = s.pods().get("cams-aaaaaa-pod").await.unwrap();
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    assert_eq!(spec["containers"][0]["env"][0]["value"], "1080p");
    assert_eq!(
        spec["resourceClaims"][0]["resourceClaimTemplateName"],
        "cams-aaaaaa-cams"
    );
    assert_eq!(
        spec["containers"][0]["resources"]["claims"][0]["name"],
        "akri-device"
    );
    let template = s.templates().get("cams").await.unwrap();
    assert_eq!(
        pod.owner_references()[0].uid,
        template.uid().unwrap(),
        "owned by the BrokerTemplate"
    );
    let claim = Api::<ResourceClaimTemplate>::namespaced(s.client.clone(), &s.apps)
        .get("cams-aaaaaa-cams")
        .await
        .unwrap();
    let claim = serde_json::to_value(&claim.spec).unwrap();
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "cams"
    );
    assert_eq!(
        claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"],
        "device.attributes[\"akri.sh\"].instance == \"cams-aaaaaa\""
    );
    s.services().get("cams-bbbbbb-svc").await.unwrap();
    let global = s.services().get("cams-all").await.unwrap();

    // An Instance gone: its objects go, the others stay.
    let kept_pod = s.pods().get("cams-aaaaaa-pod").await.unwrap().uid();
    s.delete_instance("cams-bbbbbb").await;
    s.status("cams", 1, 4).await;
    for gone in ["cams-bbbbbb-pod"] {
        eventually("the pod of the gone Instance deleted", async || {
            s.pods()
                .get_opt(gone)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    }
    assert!(
        s.services()
            .get_opt("cams-bbbbbb-svc")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        s.pods().get("cams-aaaaaa-pod").await.unwrap().uid(),
        kept_pod
    );

    // The device back: its objects back.
    s.instance("cams", "cams-bbbbbb", "720p").await;
    s.status("cams", 2, 7).await;

    // A broker deleted by hand comes back at once, with nothing else touched (Akri's brokers
    // stayed away until the Configuration changed).
    let deleted = s.services().get("cams-bbbbbb-svc").await.unwrap().uid();
    s.services()
        .delete("cams-bbbbbb-svc", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the Service made again", async || {
        let service = s.services().get_opt("cams-bbbbbb-svc").await.ok()??;
        (service.uid() != deleted).then_some(())
    })
    .await;

    // The template changed: the Service is changed in place (same UID), the Pod, whose spec
    // cannot change, is replaced.
    let service = s.services().get("cams-aaaaaa-svc").await.unwrap();
    let mut changed = pod_and_service_per_instance();
    changed["instanceBrokerResources"][0]["spec"]["containers"][0]["image"] = json!("broker:2");
    changed["instanceBrokerResources"][1]["spec"]["ports"][0]["port"] = json!(8080);
    s.apply_template("cams", changed.clone()).await;
    eventually("the pod replaced with the new image", async || {
        let pod = s.pods().get_opt("cams-aaaaaa-pod").await.unwrap()?;
        (pod.spec?.containers[0].image.as_deref() == Some("broker:2")).then_some(())
    })
    .await;
    let after = s.services().get("cams-aaaaaa-svc").await.unwrap();
    assert_eq!(after.uid(), service.uid(), "the Service is kept");
    assert_eq!(after.spec.unwrap().ports.unwrap()[0].port, 8080);
    assert_eq!(
        s.services().get("cams-all").await.unwrap().uid(),
        global.uid(),
        "an unchanged object is left alone"
    );

    // An object the API server refuses shows in the status; the others are still managed.
    changed["instanceBrokerResources"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "$(AKRI_INSTANCE)-Bad_Name" },
        }));
    s.apply_template("cams", changed).await;
    let (ready, message) = s.status("cams", 0, 7).await;
    assert_eq!(ready, "False");
    assert!(
        message.contains("ConfigMap cams-aaaaaa-Bad_Name")
            && message.contains("a lowercase RFC 1123"),
        "the condition names the object and the API server's message: {message}"
    );
    s.pods().get("cams-aaaaaa-pod").await.unwrap();

    // The template deleted: the garbage collector deletes everything it made.
    s.templates()
        .delete("cams", &DeleteParams::default())
        .await
        .unwrap();
    eventually("nothing left", async || {
        let pods = s.pods().list(&Default::default()).await.ok()?.items.len();
        let services = s
            .services()
            .list(&Default::default())
            .await
            .ok()?
            .items
            .len();
        let claims = Api::<ResourceClaimTemplate>::namespaced(s.client.clone(), &s.apps)
            .list(&Default::default())
            .await
            .ok()?
            .items
            .len();
        (pods + services + claims == 0).then_some(())
    })
    .await;
}
