//! The broker-controller's objects on a real API server (garbage collector included) with the
//! driver-controller running beside it: they follow the Instances (written here, as the
//! kubelet-plugins would) and the template, and the status says what happened.

use akri_api::v1::{BrokerTemplate, DiscoveryConfiguration, Instance};
use akri_testing::monitoring::Alert;
use akri_testing::{ControlPlane, ControlPlaneOptions, SlowLists};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

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
    /// The broker-controller's metrics, as its `/metrics` serves them.
    metrics: akri_broker_controller::metrics::Metrics,
}

impl Drop for Setup {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn setup() -> Setup {
    setup_serving(false).await
}

/// With `only_apps`, the broker-controller serves the apps namespace only (`--namespaces`).
async fn setup_serving(only_apps: bool) -> Setup {
    setup_with(only_apps, SlowLists::new()).await
}

/// [`setup_serving`], the broker-controller's LISTs slowed by `lists`.
async fn setup_with(only_apps: bool, lists: SlowLists) -> Setup {
    let (cp, client, instances_ns, apps) = support::akri_and_apps(ControlPlaneOptions {
        controller_manager: true,
        ..Default::default()
    })
    .await;
    let node = ControlPlane::unique_name("node");
    cp.create_node(&node).await.unwrap();
    let served = [apps.as_str()];
    let broker_client = lists.client(cp.client_config().await.unwrap()).unwrap();
    let (brokers, metrics) = support::spawn_broker_controller_serving(
        &broker_client,
        &instances_ns,
        only_apps.then_some(&served[..]),
    );
    let tasks = vec![
        support::spawn_driver_controller(&client, &instances_ns),
        brokers,
    ];
    Setup {
        _cp: cp,
        client,
        instances_ns,
        apps,
        node,
        tasks,
        metrics,
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
        self.apply_template_in(&self.templates(), name, spec).await
    }

    async fn apply_template_in(&self, templates: &Api<BrokerTemplate>, name: &str, spec: Value) {
        templates
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

/// Templates whose reconciles begin before the broker-controller has listed its Instances
/// are each reconciled once it has. (Each reconcile awaited kube's
/// `Store::wait_until_ready`, which wakes only the last of its waiters: the others waited
/// for ever and their templates never got a status. It failed CI twice through
/// `a_template_outside_the_served_namespaces_makes_nothing_and_says_why`, whose two
/// templates race: 4 of about 160 runs here, 4 to 6 at once.)
#[tokio::test]
async fn templates_reconciled_before_the_stores_are_listed_each_get_their_objects() {
    const TEMPLATES: usize = 4;
    // Long enough for every template below to be waiting when the Instances are listed.
    let lists = SlowLists::new().delay("instances", Duration::from_secs(5));
    let s = setup_with(false, lists).await;
    let names: Vec<String> = (0..TEMPLATES).map(|i| format!("cams-{i}")).collect();
    for name in &names {
        let mut spec = pod_and_service_per_instance();
        spec["discoveryReference"]["name"] = json!(name);
        s.apply_template(name, spec).await;
    }
    for (i, name) in names.iter().enumerate() {
        s.discovery(name).await;
        s.instance(name, &format!("{name}-{i:06}"), "1080p").await;
    }
    for name in &names {
        let (ready, message) = s.status(name, 1, 4).await;
        assert_eq!(ready, "True", "{name}: {message}");
    }
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
    let scrape = || [("broker-controller", s.metrics.encode())];
    let alert = Alert::named("AkriBrokerObjectsRefused").silent(&scrape());
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
    // One pass does both, in no set order: the Pod may be replaced before the Service changes.
    let after = eventually("the Service changed in place", async || {
        let after = s.services().get("cams-aaaaaa-svc").await.ok()?;
        (after.spec.as_ref()?.ports.as_ref()?[0].port == 8080).then_some(after)
    })
    .await;
    assert_eq!(after.uid(), service.uid(), "the Service is kept");
    assert_eq!(
        s.services().get("cams-all").await.unwrap().uid(),
        global.uid(),
        "an unchanged object is left alone"
    );

    // An object the API server refuses shows in the status; the others are still managed.
    let alert = alert.silent(&scrape());
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
    // What the chart's alert of refused broker objects is about.
    (alert.pending(&scrape(), &[&[]])).check();

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

/// Someone else's object of a name the template renders is never taken over (nor deleted
/// with the template): the status names it. An Instance whose objects cannot be rendered
/// for a moment (a property gone) keeps them as they are; nothing is pruned until a definite
/// change.
#[tokio::test]
async fn what_the_template_did_not_make_is_left_alone_and_a_passing_gap_prunes_nothing() {
    let s = setup().await;
    s.discovery("cams").await;
    s.instance("cams", "cams-aaaaaa", "1080p").await;
    s.instance("cams", "cams-bbbbbb", "720p").await;
    // A user's Service, of the name the template will render for cams-bbbbbb.
    let users: Service = from_json(json!({
        "metadata": { "name": "cams-bbbbbb-svc", "labels": { "owner": "user" } },
        "spec": { "selector": { "app": "mine" }, "ports": [{ "port": 9000 }] },
    }));
    let users = s
        .services()
        .create(&PostParams::default(), &users)
        .await
        .unwrap();
    s.apply_template("cams", pod_and_service_per_instance())
        .await;
    // Everything else made: cams-aaaaaa's 3 objects, cams-bbbbbb's Pod and claim template,
    // the global Service.
    let (ready, message) = s.status("cams", 1, 6).await;
    assert_eq!(ready, "False");
    assert!(
        message.contains(
            "Service cams-bbbbbb-svc: a Service of that name exists that this template did not make"
        ),
        "the status names the object in the way: {message}"
    );
    let after = s.services().get("cams-bbbbbb-svc").await.unwrap();
    assert_eq!(after.uid(), users.uid());
    assert_eq!(
        after.metadata.labels, users.metadata.labels,
        "not labelled as ours"
    );
    assert!(
        after.metadata.owner_references.is_none(),
        "not owned by the template"
    );
    assert_eq!(after.spec.unwrap().ports.unwrap()[0].port, 9000);

    // A property the template needs gone from cams-aaaaaa (a handler's report in flux): its
    // objects stay as they are until it is back or the Instance goes.
    let pod = s.pods().get("cams-aaaaaa-pod").await.unwrap().uid();
    Api::<Instance>::namespaced(s.client.clone(), &s.instances_ns)
        .patch(
            "cams-aaaaaa",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "brokerProperties": { "RESOLUTION": null } } })),
        )
        .await
        .unwrap();
    // Managed now: its claim template and Service (they render), cams-bbbbbb's two, the
    // global Service; its Pod is kept, not managed.
    let (_, message) = s.status("cams", 0, 5).await;
    assert!(message.contains("RESOLUTION"), "{message}");
    assert_eq!(s.pods().get("cams-aaaaaa-pod").await.unwrap().uid(), pod);
    s.services().get("cams-aaaaaa-svc").await.unwrap();
    // The Instance gone: a definite change, its objects go.
    s.delete_instance("cams-aaaaaa").await;
    eventually("the gone Instance's pod deleted", async || {
        s.pods()
            .get_opt("cams-aaaaaa-pod")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // The template deleted: the user's Service stays.
    s.templates()
        .delete("cams", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the template's objects gone", async || {
        s.pods()
            .get_opt("cams-bbbbbb-pod")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        s.services().get("cams-bbbbbb-svc").await.unwrap().uid(),
        users.uid()
    );
}

/// A broker Pod that failed (evicted) is made again; a Job that finished is not run again
/// when its `ttlSecondsAfterFinished` removed it.
#[tokio::test]
async fn a_failed_broker_pod_is_replaced_and_a_finished_job_is_not_run_again() {
    use k8s_openapi::api::batch::v1::Job;
    let s = setup().await;
    s.discovery("cams").await;
    s.instance("cams", "cams-aaaaaa", "1080p").await;
    let mut spec = pod_and_service_per_instance();
    spec["globalBrokerResources"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "metadata": { "name": "$(AKRI_CONFIGURATION)-setup" },
        "spec": { "ttlSecondsAfterFinished": 0, "template": { "spec": {
            "restartPolicy": "Never", "containers": [{ "name": "setup", "image": "setup:1" }],
        }}},
    }]);
    s.apply_template("cams", spec).await;
    s.status("cams", 1, 4).await;

    // Evicted, as the kubelet reports it.
    let first = s.pods().get("cams-aaaaaa-pod").await.unwrap().uid();
    s.pods()
        .patch_status(
            "cams-aaaaaa-pod",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": {
                "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
            } })),
        )
        .await
        .unwrap();
    eventually("the evicted broker pod replaced", async || {
        let pod = s.pods().get_opt("cams-aaaaaa-pod").await.ok()??;
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        (pod.uid() != first && phase.as_deref() != Some("Failed")).then_some(())
    })
    .await;

    // The Job's pod succeeds (the controller-manager's Job controller then completes the
    // Job, and its TTL controller deletes it).
    let jobs = Api::<Job>::namespaced(s.client.clone(), &s.apps);
    let job_pod = eventually("the Job's pod", async || {
        let pods = s
            .pods()
            .list(
                &kube::api::ListParams::default().labels("batch.kubernetes.io/job-name=cams-setup"),
            )
            .await
            .ok()?;
        pods.items.into_iter().next()
    })
    .await;
    s.pods()
        .patch_status(
            &job_pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "phase": "Succeeded" } })),
        )
        .await
        .unwrap();
    eventually("the finished Job removed by its TTL", async || {
        jobs.get_opt("cams-setup")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    eventually("the finished Job in the template's status", async || {
        let status = s.templates().get("cams").await.ok()?.status?;
        status
            .finished_jobs
            .iter()
            .any(|j| j.starts_with("cams-setup "))
            .then_some(())
    })
    .await;
    // Passes come on every change of the template's Pods and Jobs; one more, and still no Job.
    s.instance("cams", "cams-bbbbbb", "720p").await;
    s.status("cams", 2, 6).await;
    assert!(
        jobs.get_opt("cams-setup").await.unwrap().is_none(),
        "the finished Job ran again"
    );
}

/// A broker-controller that serves some namespaces (the chart's `brokerController.namespaces`)
/// makes nothing for a template elsewhere, and says so in its status.
#[tokio::test]
async fn a_template_outside_the_served_namespaces_makes_nothing_and_says_why() {
    use k8s_openapi::api::core::v1::Namespace;
    let s = setup_serving(true).await;
    s.discovery("cams").await;
    s.instance("cams", "cams-aaaaaa", "1080p").await;
    let elsewhere = ControlPlane::unique_name("elsewhere");
    Api::<Namespace>::all(s.client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({ "metadata": { "name": elsewhere } })),
        )
        .await
        .unwrap();
    let foreign = Api::<BrokerTemplate>::namespaced(s.client.clone(), &elsewhere);
    s.apply_template_in(&foreign, "cams", pod_and_service_per_instance())
        .await;
    s.apply_template("cams", pod_and_service_per_instance())
        .await;
    s.status("cams", 1, 4).await;
    let condition = eventually("the foreign template's status", async || {
        let status = foreign.get("cams").await.ok()?.status?;
        status.conditions.into_iter().find(|c| c.type_ == "Ready")
    })
    .await;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "NamespaceNotServed")
    );
    assert!(
        condition
            .message
            .contains(&format!("only in the namespaces [{}]", s.apps))
            && condition.message.contains(&format!("not in {elsewhere}")),
        "{}",
        condition.message
    );
    let pods = Api::<Pod>::namespaced(s.client.clone(), &elsewhere);
    let services = Api::<Service>::namespaced(s.client.clone(), &elsewhere);
    assert!(
        pods.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        services
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}
