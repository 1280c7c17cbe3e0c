//! The reconciler: for each BrokerTemplate, what its objects should be now (from the stores of
//! Instances and DiscoveryConfigurations), applied under one field manager, what is no longer
//! wanted deleted, and a status that says what happened.
//!
//! Ownership: every object is owned by its BrokerTemplate (same namespace), so deleting the
//! template lets the garbage collector delete everything it made. Instances live in the
//! driver's namespace and cannot own objects in another one, so an Instance that goes is
//! handled here: its objects are no longer wanted and are deleted. Only objects carrying the
//! template's UID label are ever deleted, and only after the stores were listed, so nothing
//! of anyone else's, and nothing while the controller does not yet know what exists, goes.

use crate::apply::{Applier, Kept, Outcome};
use crate::desired::{self, Desired};
use crate::metrics::Metrics;
use akri_api::v1::{
    BrokerTemplate, BrokerTemplateStatus, DiscoveryConfiguration,
    INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, Instance, instance_source_selector,
};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The field manager of everything the broker-controller applies.
pub const FIELD_MANAGER: &str = "akri-broker-controller";

/// Errors that stop a reconciliation (it is retried); refused objects are not errors but
/// status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("BrokerTemplate {0} has no namespace or UID")]
    Incomplete(String),
    #[error("writing the status of BrokerTemplate {name}: {cause}")]
    Status { name: String, cause: kube::Error },
}

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Where the kubelet-plugins write Instances.
    pub instance_namespace: String,
    /// Changes within this window are reconciled together.
    pub debounce: Duration,
    /// How often every template is looked at again without a change (a broker object of a
    /// kind the controller does not watch, deleted by hand, comes back by then).
    pub resync: Duration,
    /// The namespaces whose BrokerTemplates it serves (where it may write); `None`: all.
    /// A template elsewhere gets only a status that says so.
    pub namespaces: Option<BTreeSet<String>>,
}

impl ControllerConfig {
    pub fn new(instance_namespace: &str) -> Self {
        ControllerConfig {
            instance_namespace: instance_namespace.to_string(),
            debounce: Duration::from_millis(500),
            resync: Duration::from_secs(300),
            namespaces: None,
        }
    }
}

struct Context {
    client: kube::Client,
    config: ControllerConfig,
    instances: Store<Instance>,
    configurations: Store<DiscoveryConfiguration>,
    applier: Applier,
    metrics: Metrics,
    finished_jobs: FinishedJobs,
}

/// Jobs the watch saw finished, by template UID, until a pass keeps them in the template's
/// status: a Job whose `ttlSecondsAfterFinished` is 0 is gone before a pass lists it, but the
/// watch's last sight of it says it finished.
type FinishedJobs = Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>;

/// Runs until the watches end (they do not, short of the task being dropped).
pub async fn run(client: kube::Client, config: ControllerConfig, metrics: Metrics) {
    let (instances, instance_stream) = akri_runtime::reflect(
        Api::<Instance>::namespaced(client.clone(), &config.instance_namespace),
        watcher::Config::default().labels(&instance_source_selector(
            INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
        )),
    );
    let (configurations, configuration_stream) = akri_runtime::reflect(
        Api::<DiscoveryConfiguration>::all(client.clone()),
        watcher::Config::default(),
    );

    let controller = Controller::new(
        Api::<BrokerTemplate>::all(client.clone()),
        watcher::Config::default(),
    );
    let templates = controller.store();
    let for_instance = templates.clone();
    let ctx = Arc::new(Context {
        client: client.clone(),
        config: config.clone(),
        instances,
        configurations,
        applier: Applier::new(client.clone(), FIELD_MANAGER),
        metrics,
        finished_jobs: FinishedJobs::default(),
    });
    // The brokers the controller made are watched where it can (the common kinds), so one
    // that is deleted or finishes is seen at once; other kinds are looked at on resync.
    let owned = watcher::Config::default().labels(crate::render::TEMPLATE_UID_LABEL);
    // Where it serves only some namespaces, it may read only there.
    let served: Vec<Option<String>> = match &config.namespaces {
        Some(namespaces) => namespaces.iter().cloned().map(Some).collect(),
        None => vec![None],
    };
    let mut controller = controller;
    for namespace in served {
        let jobs =
            watcher(api::<Job>(&client, namespace.as_deref()), owned.clone()).touched_objects();
        let seen = ctx.finished_jobs.clone();
        controller = controller
            .owns(api::<Pod>(&client, namespace.as_deref()), owned.clone())
            .owns(api::<Service>(&client, namespace.as_deref()), owned.clone())
            .watches_stream(jobs, move |job: Job| {
                if let Some((uid, key)) = crate::apply::finished_job(&job) {
                    seen.lock()
                        .expect("finished jobs")
                        .entry(uid)
                        .or_default()
                        .insert(key);
                }
                owner_template(&job)
            });
    }
    controller
        .watches_stream(instance_stream, move |i: Instance| {
            templates_of(&for_instance, &i.spec.configuration_name)
        })
        .watches_stream(configuration_stream, move |c: DiscoveryConfiguration| {
            templates_of(&templates, &c.name_any())
        })
        .with_config(ControllerRuntimeConfig::default().debounce(config.debounce))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconciliation");
            }
        })
        .await;
}

/// The BrokerTemplate that owns `object`, if one does.
fn owner_template(object: &impl Resource) -> Option<ObjectRef<BrokerTemplate>> {
    let namespace = object.meta().namespace.as_deref()?;
    object
        .owner_references()
        .iter()
        .find(|o| o.kind == "BrokerTemplate" && o.api_version.starts_with("akri.sh/"))
        .map(|o| ObjectRef::new(&o.name).within(namespace))
}

/// `K`s in `namespace`, or in all namespaces.
fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}

/// The BrokerTemplates of a DiscoveryConfiguration.
fn templates_of(
    templates: &Store<BrokerTemplate>,
    configuration: &str,
) -> Vec<ObjectRef<BrokerTemplate>> {
    templates
        .state()
        .into_iter()
        .filter(|t| t.spec.discovery_reference.name == configuration)
        .map(|t| ObjectRef::from_obj(&*t))
        .collect()
}

fn error_policy(template: Arc<BrokerTemplate>, error: &Error, _: Arc<Context>) -> Action {
    tracing::warn!(template = %template.name_any(), %error, "reconciliation failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(template: Arc<BrokerTemplate>, ctx: Arc<Context>) -> Result<Action, Error> {
    // Nothing is decided before both stores are listed: an empty store is not an empty cluster.
    if !(akri_runtime::listed(&ctx.instances) && akri_runtime::listed(&ctx.configurations)) {
        return Ok(Action::requeue(akri_runtime::LISTED_POLL));
    }
    let result = converge(template, &ctx).await;
    ctx.metrics.reconciled(result.is_ok());
    result
}

async fn converge(template: Arc<BrokerTemplate>, ctx: &Context) -> Result<Action, Error> {
    if template.meta().deletion_timestamp.is_some() {
        // The garbage collector deletes what the template owns.
        return Ok(Action::await_change());
    }
    let (Some(namespace), Some(uid)) = (template.namespace(), template.uid()) else {
        return Err(Error::Incomplete(template.name_any()));
    };
    if let Some(served) = &ctx.config.namespaces
        && !served.contains(&namespace)
    {
        let served: Vec<&str> = served.iter().map(String::as_str).collect();
        let message = format!(
            "the broker-controller makes brokers only in the namespaces [{}] (the chart's brokerController.namespaces), not in {namespace}",
            served.join(", ")
        );
        let previous = template.status.clone().unwrap_or_default();
        let status = BrokerTemplateStatus {
            observed_generation: template.meta().generation,
            conditions: vec![keep_transition_time(
                condition(false, "NamespaceNotServed", message),
                &previous.conditions,
            )],
            ..Default::default()
        };
        write_status(ctx, &template, &namespace, &previous, status).await?;
        return Ok(Action::await_change());
    }
    let configuration_name = &template.spec.discovery_reference.name;
    let configuration = ctx.configurations.get(&ObjectRef::new(configuration_name));
    let instances: Vec<Arc<Instance>> = ctx
        .instances
        .state()
        .into_iter()
        .filter(|i| &i.spec.configuration_name == configuration_name)
        .collect();
    let device_class = configuration
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.device_class_name.clone());
    let owner = crate::render::Owner {
        name: &template.name_any(),
        uid: &uid,
        namespace: &namespace,
    };
    let desired: Desired = desired::desired(
        &template.spec,
        configuration_name,
        device_class.as_deref(),
        &instances,
        &owner,
    );
    let previous = template.status.clone().unwrap_or_default();
    // The Jobs the watch saw finish: taken now, kept in the status below (or given back if
    // that fails).
    let seen = (ctx.finished_jobs.lock().expect("finished jobs"))
        .remove(&uid)
        .unwrap_or_default();
    let mut finished_jobs: BTreeSet<String> = previous.finished_jobs.iter().cloned().collect();
    finished_jobs.extend(seen.iter().cloned());
    // What could not be rendered this time is kept as it is: only a definite change (an
    // Instance gone, the template changed) deletes.
    let kept = Kept {
        instances: &desired.failed_instances,
        globals: desired.failed_globals,
        finished_jobs: &finished_jobs,
    };
    let outcome: Outcome = ctx
        .applier
        .converge(
            &namespace,
            &uid,
            &desired.objects,
            &previous.managed_kinds,
            kept,
        )
        .await;
    ctx.metrics.applied(&outcome);

    let mut problems: Vec<String> = desired.errors.clone();
    problems.extend(
        outcome
            .refused
            .iter()
            .map(|(object, message)| format!("{object}: {message}")),
    );
    let failed_instances: BTreeSet<&str> = desired
        .failed_instances
        .iter()
        .map(String::as_str)
        .chain(outcome.refused_instances.iter().map(String::as_str))
        .collect();
    let brokers = instances
        .iter()
        .filter(|i| !failed_instances.contains(i.name_any().as_str()))
        .count();
    let ready = if configuration.is_none() {
        condition(
            false,
            "DiscoveryConfigurationMissing",
            format!("DiscoveryConfiguration {configuration_name} does not exist"),
        )
    } else if problems.is_empty() {
        condition(
            true,
            "Applied",
            format!(
                "{} objects for {} Instances",
                outcome.managed,
                instances.len()
            ),
        )
    } else {
        condition(false, "ObjectsRefused", summarize(&problems))
    };
    let status = BrokerTemplateStatus {
        observed_generation: template.meta().generation,
        brokers: brokers as i32,
        objects: outcome.managed as i32,
        managed_kinds: outcome.kinds.clone(),
        finished_jobs: outcome.finished_jobs.iter().cloned().collect(),
        conditions: vec![keep_transition_time(ready, &previous.conditions)],
    };
    if let Err(error) = write_status(ctx, &template, &namespace, &previous, status).await {
        let mut finished = ctx.finished_jobs.lock().expect("finished jobs");
        finished.entry(uid.clone()).or_default().extend(seen);
        return Err(error);
    }
    Ok(if outcome.retry_soon || desired.waiting {
        Action::requeue(Duration::from_secs(2))
    } else if let Some(after) = outcome.retry_after {
        Action::requeue(after.min(ctx.config.resync))
    } else {
        Action::requeue(ctx.config.resync)
    })
}

/// Writes `status` unless it is what the template has.
async fn write_status(
    ctx: &Context,
    template: &BrokerTemplate,
    namespace: &str,
    previous: &BrokerTemplateStatus,
    status: BrokerTemplateStatus,
) -> Result<(), Error> {
    if &status == previous {
        return Ok(());
    }
    Api::<BrokerTemplate>::namespaced(ctx.client.clone(), namespace)
        .patch_status(
            &template.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "akri.sh/v1",
                "kind": "BrokerTemplate",
                "status": status,
            })),
        )
        .await
        .map_err(|cause| Error::Status {
            name: template.name_any(),
            cause,
        })?;
    Ok(())
}

/// The first problems, one per line, and how many more there are (a condition message
/// stays readable and far below the API server's 32 KiB limit).
fn summarize(problems: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut message: String = problems
        .iter()
        .take(SHOWN)
        .map(|p| p.chars().take(500).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n");
    if problems.len() > SHOWN {
        message.push_str(&format!("\n… and {} more", problems.len() - SHOWN));
    }
    message
}

fn condition(ok: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    }
}

/// Keeps the previous transition time when the condition's status did not change, so that
/// an unchanged status is not rewritten.
fn keep_transition_time(mut new: Condition, previous: &[Condition]) -> Condition {
    if let Some(old) = previous.iter().find(|c| c.type_ == new.type_)
        && old.status == new.status
    {
        new.last_transition_time = old.last_transition_time.clone();
    }
    new
}
