//! The reconciler: one pass per DiscoveryConfiguration makes everything the scheduler needs
//! for its devices true at once: its DeviceClass, its shared devices' slices, the DeviceClasses
//! of the PropertyFilters on it, and the status of both.
//!
//! Reconciliation is triggered by the configuration itself, its DeviceClass, its Instances,
//! the slices that hold its devices and the filters that name it, all read from reflector
//! stores, so a pass costs no reads beyond the writes it needs. Nothing acts before every
//! store has been listed once: a pass on a half-filled store would take the Instances not
//! listed yet for gone and unpublish their devices (or a configuration for gone and delete its
//! filters' DeviceClasses).

mod gone_nodes;

use crate::device_class::{self, FILTER_LABEL};
use crate::metrics::Metrics;
use crate::property_filter;
use crate::shared_devices;
use akri_api::v1::{
    CONDITION_DEGRADED, CONDITION_READY, DiscoveryConfiguration,
    INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, Instance, PropertyFilter, PropertyFilterStatus,
    instance_source_selector, set_condition,
};
use akri_devices::{ATTR_CONFIGURATION, Sharing};
use dra_plugin::api_support::ApiSupport;
use dra_plugin::slices::{PoolTemplate, SlicePublisher};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Label on the slices of shared devices: the DiscoveryConfiguration they belong to.
pub const SHARED_CONFIGURATION_LABEL: &str = "akri.sh/shared-configuration";

/// Errors of one reconciliation (retried) or of starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing {kind} {name}: {source}")]
    Write {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("publishing the shared devices of {configuration}: {source}")]
    Slices {
        configuration: String,
        #[source]
        source: dra_plugin::slices::Error,
    },
    #[error("reading {kind} {name}: {source}")]
    Read {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0} has no UID yet")]
    NoUid(String),
    #[error("asking the API server what it supports: {0}")]
    ApiSupport(#[from] dra_plugin::api_support::Error),
}

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// The namespace the kubelet-plugins write Instances to.
    pub instance_namespace: String,
    /// The server-side-apply field manager of every write.
    pub field_manager: String,
    /// What the API server supports; `None` asks it (dry-run probes) at start.
    pub api_support: Option<ApiSupport>,
    /// Forces whether devices use consumable capacity, whatever the API server supports
    /// (`--consumable-capacity on|off`); `None` follows [`Self::api_support`].
    pub consumable_capacity: Option<bool>,
    /// Changes arriving within this window are reconciled together.
    pub debounce: Duration,
}

impl ControllerConfig {
    pub fn new(instance_namespace: &str) -> Self {
        ControllerConfig {
            instance_namespace: instance_namespace.into(),
            field_manager: "akri-driver-controller".into(),
            api_support: None,
            consumable_capacity: None,
            debounce: Duration::from_millis(500),
        }
    }
}

/// What every reconciliation shares.
pub struct Context {
    client: kube::Client,
    config: ControllerConfig,
    support: ApiSupport,
    instances: Store<Instance>,
    slices: Store<ResourceSlice>,
    filters: Store<PropertyFilter>,
    configurations: Store<DiscoveryConfiguration>,
    nodes: Store<PartialObjectMeta<Node>>,
    /// Per configuration, the publishers of its shared pools (they remember generations).
    publishers: Mutex<BTreeMap<String, BTreeMap<String, SlicePublisher>>>,
    metrics: Metrics,
}

/// Runs the controller until its watches end. Asks the API server what it supports first,
/// unless the config says.
pub async fn run(
    client: kube::Client,
    config: ControllerConfig,
    metrics: Metrics,
) -> Result<(), Error> {
    let mut support = match config.api_support {
        Some(support) => support,
        None => ApiSupport::detect(&client).await?,
    };
    if let Some(forced) = config.consumable_capacity {
        support.consumable_capacity = forced;
    }
    tracing::info!(
        consumable_capacity = support.consumable_capacity,
        per_device_node_selection = support.per_device_node_selection,
        extended_resource_name = support.extended_resource_name,
        "API server support"
    );

    let (instances, instance_stream) = akri_runtime::reflect(
        Api::<Instance>::namespaced(client.clone(), &config.instance_namespace),
        watcher::Config::default().labels(&instance_source_selector(
            INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
        )),
    );
    let (slices, slice_stream) = akri_runtime::reflect(
        Api::<ResourceSlice>::all(client.clone()),
        watcher::Config::default(),
    );
    let (filters, filter_stream) = akri_runtime::reflect(
        Api::<PropertyFilter>::all(client.clone()),
        watcher::Config::default(),
    );

    // Nodes, to forget the ones deleted for good; a deletion may concern every configuration.
    let (nodes, writer) = reflector::store();
    let node_deletions = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .filter_map(|event| {
        futures::future::ready(matches!(event, Ok(watcher::Event::Delete(_))).then_some(()))
    });

    let controller = Controller::new(
        Api::<DiscoveryConfiguration>::all(client.clone()),
        watcher::Config::default(),
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        config: config.clone(),
        support,
        instances,
        slices,
        filters,
        configurations: controller.store(),
        nodes,
        publishers: Mutex::default(),
        metrics,
    });
    // Aborted with this future too: a replica that lost leadership must not keep writing.
    let _orphans = AbortOnDrop(tokio::spawn(orphan_filters(ctx.clone())));
    controller
        .owns(
            Api::<DeviceClass>::all(client),
            watcher::Config::default().labels(device_class::CONFIGURATION_LABEL),
        )
        .watches_stream(instance_stream, |instance: Instance| {
            Some(ObjectRef::new(&instance.spec.configuration_name))
        })
        .watches_stream(slice_stream, |slice: ResourceSlice| {
            slice_configurations(&slice)
                .into_iter()
                .map(|c| ObjectRef::new(&c))
        })
        .watches_stream(filter_stream, |filter: PropertyFilter| {
            Some(ObjectRef::new(&filter.spec.discovery_reference.name))
        })
        .reconcile_all_on(node_deletions)
        .with_config(ControllerRuntimeConfig::default().debounce(config.debounce))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconciliation");
            }
        })
        .await;
    Ok(())
}

/// How soon a reconcile that came before the stores were listed looks again.
const STORES_POLL: Duration = Duration::from_millis(200);

/// A spawned task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The configurations whose devices a slice holds (Akri drivers only).
fn slice_configurations(slice: &ResourceSlice) -> BTreeSet<String> {
    if !slice
        .spec
        .driver
        .ends_with(&format!(".{}", akri_devices::DRIVER_DOMAIN))
    {
        return BTreeSet::new();
    }
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .filter_map(|device| device_configuration(device))
        .map(str::to_string)
        .collect()
}

fn device_configuration(device: &k8s_openapi::api::resource::v1::Device) -> Option<&str> {
    device
        .attributes
        .as_ref()?
        .get(ATTR_CONFIGURATION)?
        .string
        .as_deref()
}

fn error_policy(config: Arc<DiscoveryConfiguration>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconciled(false);
    tracing::warn!(configuration = %config.name_any(), %error, "reconciliation failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(
    config: Arc<DiscoveryConfiguration>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if !ctx.stores_ready() {
        // Never act on a partial picture (slices or filters not yet listed would look
        // deleted); look again shortly.
        return Ok(Action::requeue(STORES_POLL));
    }
    let name = config.name_any();
    let driver = akri_devices::driver_name(&config.spec.discovery_handler.name);
    let owner = device_class::owner(config.as_ref()).ok_or_else(|| Error::NoUid(name.clone()))?;

    let class = device_class::for_configuration(
        &name,
        &driver,
        owner.clone(),
        ctx.support.extended_resource_name,
    );
    let class_conflict = ctx.apply_class(&class).await?;

    let instances: Vec<Arc<Instance>> = ctx
        .instances
        .state()
        .into_iter()
        .filter(|i| i.spec.configuration_name == name)
        .collect();
    match ctx.forget_gone_nodes(&config, &instances).await {
        // The Instance and configuration watches bring the result, and another pass.
        Ok(true) => return Ok(Action::requeue(Duration::from_secs(5))),
        Ok(false) => {}
        // Cleaning up after deleted nodes must not hold back the live ones' devices.
        Err(error) => {
            tracing::warn!(configuration = %name, %error, "forgetting deleted nodes failed; retrying on the next pass")
        }
    }
    let shared = ctx
        .publish_shared(&config, &driver, owner, &instances)
        .await?;

    // One filter failing must not keep its siblings or the configuration's status back.
    let mut failed = None;
    for filter in ctx
        .filters
        .state()
        .iter()
        .filter(|f| f.spec.discovery_reference.name == name)
    {
        if let Err(error) = ctx
            .reconcile_filter(filter, Some(&driver), &instances)
            .await
        {
            tracing::warn!(filter = %filter.name_any(), %error, "updating the filter failed");
            failed = Some(error);
        }
    }

    ctx.write_status(&config, &driver, &instances, shared, class_conflict)
        .await?;
    if let Some(error) = failed {
        return Err(error);
    }
    ctx.metrics.reconciled(true);
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Filters whose DiscoveryConfiguration does not exist are never reached by a configuration's
/// reconciliation: look for them now and then.
async fn orphan_filters(ctx: Arc<Context>) {
    while !ctx.stores_ready() {
        tokio::time::sleep(STORES_POLL).await;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(3));
    loop {
        tick.tick().await;
        for filter in ctx.filters.state() {
            let reference = &filter.spec.discovery_reference.name;
            if ctx.configurations.get(&ObjectRef::new(reference)).is_none()
                && let Err(error) = ctx.reconcile_filter(&filter, None, &[]).await
            {
                tracing::warn!(filter = %filter.name_any(), %error, "updating the filter failed");
            }
        }
    }
}

impl Context {
    /// Whether every store has been listed once. Asked without waiting: with one waiter per
    /// pending reconcile, some of 10 reconciles waiting on `Store::wait_until_ready` were
    /// never woken (seen with 10 configurations and 10,000 Instances), so a reconcile that
    /// comes too early is requeued instead.
    fn stores_ready(&self) -> bool {
        use futures::FutureExt;
        let ready = [
            self.instances.wait_until_ready().boxed().now_or_never(),
            self.slices.wait_until_ready().boxed().now_or_never(),
            self.filters.wait_until_ready().boxed().now_or_never(),
            self.configurations
                .wait_until_ready()
                .boxed()
                .now_or_never(),
            self.nodes.wait_until_ready().boxed().now_or_never(),
        ];
        ready.iter().all(|r| matches!(r, Some(Ok(()))))
    }

    fn params(&self) -> PatchParams {
        PatchParams::apply(&self.config.field_manager).force()
    }

    /// Applies one of our DeviceClasses. A class of that name that is not ours (no owner
    /// reference to the object it is for) is left alone: `Some(why)` for the object's status.
    async fn apply_class(&self, class: &DeviceClass) -> Result<Option<String>, Error> {
        let name = class.name_any();
        let api = Api::<DeviceClass>::all(self.client.clone());
        let current = api.get_opt(&name).await.map_err(|source| Error::Read {
            kind: "DeviceClass",
            name: name.clone(),
            source,
        })?;
        if let Some(current) = &current
            && let Some(why) = device_class::foreign(current, class)
        {
            return Ok(Some(why));
        }
        // Only write what differs: a class applied at every pass would be a write per pass.
        if let Some(current) = current
            && current.spec == class.spec
            && current.metadata.owner_references == class.metadata.owner_references
            && class
                .labels()
                .iter()
                .all(|(k, v)| current.labels().get(k) == Some(v))
        {
            return Ok(None);
        }
        api.patch(&name, &self.params(), &Patch::Apply(class))
            .await
            .map_err(|source| Error::Write {
                kind: "DeviceClass",
                name: name.clone(),
                source,
            })?;
        self.metrics.wrote("deviceclass", "apply", 1);
        tracing::info!(class = %name, "applied DeviceClass");
        Ok(None)
    }

    /// Publishes the configuration's shared devices; returns how many devices that is.
    async fn publish_shared(
        &self,
        config: &DiscoveryConfiguration,
        driver: &str,
        owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
        instances: &[Arc<Instance>],
    ) -> Result<usize, Error> {
        let name = config.name_any();
        let sharing = Sharing::for_configuration(
            config.spec.unique_devices,
            self.support.consumable_capacity,
        );
        let refs: Vec<&Instance> = instances.iter().map(|i| i.as_ref()).collect();
        let pools = shared_devices::pools(
            &name,
            config.spec.capacity,
            sharing,
            self.support.per_device_node_selection,
            &refs,
        );
        let ours: Vec<Arc<ResourceSlice>> = self
            .slices
            .state()
            .into_iter()
            .filter(|s| s.labels().get(SHARED_CONFIGURATION_LABEL) == Some(&name))
            .collect();

        // Reconciliations of one configuration never overlap: its publishers are taken out
        // for the pass and put back after.
        let mut publishers = self
            .publishers
            .lock()
            .expect("lock")
            .remove(&name)
            .unwrap_or_default();
        let result = async {
            let mut count = 0;
            for pool in &pools {
                let publisher = publishers.entry(pool.pool.clone()).or_insert_with(|| {
                    let mut template = PoolTemplate::new(driver, &pool.pool, pool.scope.clone());
                    template.owner = Some(owner.clone());
                    template
                        .labels
                        .insert(SHARED_CONFIGURATION_LABEL.into(), name.clone());
                    SlicePublisher::with_template(
                        self.client.clone(),
                        template,
                        &self.config.field_manager,
                    )
                });
                publisher.set_scope(pool.scope.clone());
                let existing: Vec<ResourceSlice> = ours
                    .iter()
                    .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool.pool)
                    .map(|s| (**s).clone())
                    .collect();
                let published = publisher
                    .publish_against(&pool.devices, &existing)
                    .await
                    .map_err(|source| Error::Slices {
                        configuration: name.clone(),
                        source,
                    })?;
                self.metrics
                    .wrote("resourceslice", "apply", published.written as u64);
                self.metrics
                    .wrote("resourceslice", "delete", published.deleted as u64);
                if published.written + published.deleted > 0 {
                    tracing::info!(configuration = %name, pool = %pool.pool, devices = pool.devices.len(), generation = published.generation, "published shared devices");
                }
                count += pool.devices.len();
            }
            // Pools no longer wanted (an Instance gone, or the API server's support changed).
            let wanted: BTreeSet<&str> = pools.iter().map(|p| p.pool.as_str()).collect();
            for slice in ours.iter().filter(|s| !wanted.contains(s.spec.pool.name.as_str())) {
                let slice_name = slice.name_any();
                match Api::<ResourceSlice>::all(self.client.clone())
                    .delete(&slice_name, &DeleteParams::default())
                    .await
                {
                    Ok(_) => self.metrics.wrote("resourceslice", "delete", 1),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(source) => {
                        return Err(Error::Write {
                            kind: "ResourceSlice",
                            name: slice_name,
                            source,
                        });
                    }
                }
                publishers.remove(&slice.spec.pool.name);
            }
            Ok(count)
        }
        .await;
        self.publishers
            .lock()
            .expect("lock")
            .insert(name, publishers);
        let total: usize = self
            .publishers
            .lock()
            .expect("lock")
            .values()
            .flat_map(|p| p.values())
            .map(|p| p.published_devices())
            .sum();
        self.metrics.set_shared_devices(total);
        result
    }

    /// Node-local devices of a configuration as the kubelet-plugins published them (current
    /// generation of each pool only).
    fn local_devices_published(&self, driver: &str, configuration: &str) -> usize {
        let slices: Vec<Arc<ResourceSlice>> = self
            .slices
            .state()
            .into_iter()
            .filter(|s| {
                s.spec.driver == driver && !s.labels().contains_key(SHARED_CONFIGURATION_LABEL)
            })
            .collect();
        let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
        for slice in &slices {
            let generation = newest.entry(slice.spec.pool.name.as_str()).or_default();
            *generation = (*generation).max(slice.spec.pool.generation);
        }
        let mut devices = BTreeSet::new();
        for slice in &slices {
            if newest.get(slice.spec.pool.name.as_str()) != Some(&slice.spec.pool.generation) {
                continue;
            }
            for device in slice.spec.devices.iter().flatten() {
                if device_configuration(device) == Some(configuration) {
                    devices.insert((slice.spec.pool.name.as_str(), device.name.as_str()));
                }
            }
        }
        devices.len()
    }

    async fn write_status(
        &self,
        config: &DiscoveryConfiguration,
        driver: &str,
        instances: &[Arc<Instance>],
        shared_devices: usize,
        class_conflict: Option<String>,
    ) -> Result<(), Error> {
        let name = config.name_any();
        let generation = config.metadata.generation;
        let before = config.status.clone().unwrap_or_default();
        let mut status = before.clone();
        let nodes: BTreeSet<&String> = instances.iter().flat_map(|i| &i.spec.nodes).collect();
        status.observed_generation = generation;
        status.instances = instances.len() as i32;
        status.nodes = nodes.len() as i32;
        status.devices_published =
            (shared_devices + self.local_devices_published(driver, &name)) as i32;
        status.device_class_name = Some(name.clone());
        let extended = if self.support.extended_resource_name {
            format!(
                "; pods may also request {}: N",
                device_class::extended_resource_name(&name)
            )
        } else {
            "; the API server has no DRAExtendedResource, so only ResourceClaims can request its devices".to_string()
        };
        let unique = if config.spec.unique_devices
            && config.spec.capacity > 1
            && !self.support.consumable_capacity
        {
            "; uniqueDevices is not enforced for requests of several devices: without DRAConsumableCapacity each slot is a device of its own and the API server has no distinctAttribute constraint"
        } else {
            ""
        };
        match class_conflict {
            None => {
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    true,
                    "Published",
                    format!(
                        "DeviceClass {name} selects its devices{extended}{unique}; {} Instances on {} nodes, {} devices published",
                        status.instances, status.nodes, status.devices_published
                    ),
                    generation,
                );
            }
            Some(why) => {
                status.device_class_name = None;
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    false,
                    "DeviceClassConflict",
                    format!(
                        "{why}; {} devices published, but no class of Akri's selects them",
                        status.devices_published
                    ),
                    generation,
                );
            }
        }
        let failing: Vec<String> = status
            .discovery_errors
            .iter()
            .map(|e| format!("{}: {}", e.node, e.message))
            .collect();
        if failing.is_empty() {
            set_condition(
                &mut status.conditions,
                CONDITION_DEGRADED,
                false,
                "AsExpected",
                "discovery works on every node that runs it",
                generation,
            );
        } else {
            set_condition(
                &mut status.conditions,
                CONDITION_DEGRADED,
                true,
                "DiscoveryFailing",
                format!(
                    "discovery fails on {} node(s): {}",
                    failing.len(),
                    failing.join("; ")
                ),
                generation,
            );
        }
        if status == before {
            return Ok(());
        }
        // Only our fields: each node owns its own entry of `discoveryErrors`.
        let conditions: Vec<_> = status
            .conditions
            .iter()
            .filter(|c| c.type_ == CONDITION_READY || c.type_ == CONDITION_DEGRADED)
            .collect();
        let patch = serde_json::json!({
            "apiVersion": "akri.sh/v1",
            "kind": "DiscoveryConfiguration",
            "metadata": { "name": name },
            "status": {
                "observedGeneration": status.observed_generation,
                "instances": status.instances,
                "nodes": status.nodes,
                "devicesPublished": status.devices_published,
                "deviceClassName": status.device_class_name,
                "conditions": conditions,
            },
        });
        Api::<DiscoveryConfiguration>::all(self.client.clone())
            .patch_status(&name, &self.params(), &Patch::Apply(&patch))
            .await
            .map_err(|source| Error::Write {
                kind: "DiscoveryConfiguration status",
                name,
                source,
            })?;
        self.metrics.wrote("status", "apply", 1);
        Ok(())
    }

    /// Compiles a filter into its DeviceClass and reports on it. `driver` is `None` when its
    /// DiscoveryConfiguration does not exist.
    async fn reconcile_filter(
        &self,
        filter: &PropertyFilter,
        driver: Option<&str>,
        instances: &[Arc<Instance>],
    ) -> Result<(), Error> {
        let name = filter.name_any();
        let configuration = &filter.spec.discovery_reference.name;
        let generation = filter.metadata.generation;
        let before = filter.status.clone().unwrap_or_default();
        let mut status = PropertyFilterStatus {
            observed_generation: generation,
            conditions: before.conditions.clone(),
            ..PropertyFilterStatus::default()
        };
        let compiled = property_filter::compile(&filter.spec.filters);
        let outcome: Result<(String, &str), (&str, String)> = match (driver, compiled) {
            (None, _) => Err((
                "DiscoveryConfigurationNotFound",
                format!("DiscoveryConfiguration {configuration} does not exist"),
            )),
            (Some(_), _) if self.configurations.get(&ObjectRef::new(&name)).is_some() => Err((
                "NameConflict",
                format!(
                    "a DiscoveryConfiguration is also named {name} and owns the DeviceClass of that name; rename the filter"
                ),
            )),
            (Some(_), Err(error)) => Err(("InvalidFilter", error.to_string())),
            (Some(driver), Ok(expression)) => Ok((expression, driver)),
        };
        let outcome = match outcome {
            Ok((expression, driver)) => {
                let owner =
                    device_class::owner(filter).ok_or_else(|| Error::NoUid(name.clone()))?;
                let class =
                    device_class::for_filter(&name, configuration, driver, &expression, owner);
                match self.apply_class(&class).await {
                    Ok(None) => Ok(expression),
                    Ok(Some(why)) => Err(("DeviceClassConflict", why)),
                    // Refused as invalid (a limit we do not check ourselves): this filter's
                    // problem, not its configuration's.
                    Err(Error::Write {
                        source: kube::Error::Api(status),
                        ..
                    }) if status.code == 422 => Err((
                        "InvalidFilter",
                        format!("the API server refused its DeviceClass: {}", status.message),
                    )),
                    Err(error) => return Err(error),
                }
            }
            Err(error) => Err(error),
        };
        match outcome {
            Ok(expression) => {
                status.matching_devices = instances
                    .iter()
                    .filter(|i| {
                        property_filter::matches(&filter.spec.filters, &i.spec.broker_properties)
                    })
                    .count() as i32;
                status.compiled_expression = Some(expression);
                status.device_class_name = Some(name.clone());
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    true,
                    "Compiled",
                    format!(
                        "claims with deviceClassName {name} get only matching devices of {configuration}; {} match now",
                        status.matching_devices
                    ),
                    generation,
                );
            }
            Err((reason, message)) => {
                // A class compiled from an older, valid spec must not keep allocating.
                self.delete_filter_class(&name).await?;
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    false,
                    reason,
                    message,
                    generation,
                );
            }
        }
        if status == before {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": "akri.sh/v1",
            "kind": "PropertyFilter",
            "metadata": { "name": name },
            "status": status,
        });
        Api::<PropertyFilter>::all(self.client.clone())
            .patch_status(&name, &self.params(), &Patch::Apply(&patch))
            .await
            .map_err(|source| Error::Write {
                kind: "PropertyFilter status",
                name,
                source,
            })?;
        self.metrics.wrote("status", "apply", 1);
        Ok(())
    }

    async fn delete_filter_class(&self, filter: &str) -> Result<(), Error> {
        let api = Api::<DeviceClass>::all(self.client.clone());
        let Some(class) = api.get_opt(filter).await.ok().flatten() else {
            return Ok(());
        };
        let ours = class.labels().get(FILTER_LABEL).map(String::as_str) == Some(filter)
            && class.owner_references().iter().any(|r| {
                r.kind == <PropertyFilter as kube::Resource>::kind(&()) && r.name == filter
            });
        if !ours {
            return Ok(());
        }
        match api.delete(filter, &DeleteParams::default()).await {
            Ok(_) => {
                self.metrics.wrote("deviceclass", "delete", 1);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(Error::Write {
                kind: "DeviceClass",
                name: filter.to_string(),
                source,
            }),
        }
    }
}
