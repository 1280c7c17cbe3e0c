//! The reconciler: one pass per DiscoveryConfiguration makes everything the scheduler needs
//! for its devices true at once: its DeviceClass, its shared devices' slices, the DeviceClasses
//! of the PropertyFilters on it, and the status of both.
//!
//! Reconciliation is triggered by the configuration itself, its DeviceClass, its Instances,
//! the slices that hold its devices and the filters that name it, all read from reflector
//! stores. The one read of a pass is a GET of each DeviceClass it would apply (the
//! configuration's and its filters'): a class of that name may be someone else's, without our
//! label, which the watch of our classes does not see; at rest that is one GET per class every
//! 5 minutes (`RESYNC`). Nothing acts before every
//! store has been listed once: a pass on a half-filled store would take the Instances not
//! listed yet for gone and unpublish their devices (or a configuration for gone and delete its
//! filters' DeviceClasses).

mod binding_routes;
mod filters;
mod gone_nodes;
mod handlers;
mod lost_nodes;
mod shared;
mod stores;

use stores::{SliceView, slim_claim, slim_instance};

use crate::device_class;
use crate::legacy_slots::{LegacySlotsConfig, slim_node};
use crate::metrics::Metrics;
use akri_api::v1::{
    CONDITION_DEGRADED, CONDITION_READY, DiscoveryConfiguration,
    INSTANCE_SOURCE_DISCOVERY_CONFIGURATION, Instance, PropertyFilter, instance_source_selector,
    set_condition,
};
use akri_devices::{ATTR_CONFIGURATION, Sharing};
use akri_runtime::AbortOnDrop;
use dra_plugin::api_support::ApiSupport;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
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
    #[error("writing {kind} {name}: {cause}")]
    Write {
        kind: &'static str,
        name: String,
        cause: kube::Error,
    },
    #[error("publishing the shared devices of {configuration}: {cause}")]
    Slices {
        configuration: String,
        cause: dra_plugin::slices::Error,
    },
    #[error("reading {kind} {name}: {cause}")]
    Read {
        kind: &'static str,
        name: String,
        cause: kube::Error,
    },
    #[error("{0} has no UID yet")]
    NoUid(String),
    #[error("asking the API server what it supports: {0}")]
    ApiSupport(dra_plugin::api_support::Error),
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
    /// Forces whether the API server keeps device taints (`--device-taints on|off`); `None`
    /// follows [`Self::api_support`].
    pub device_taints: Option<bool>,
    /// Forces whether shared devices are published with binding conditions
    /// (`--binding-conditions on|off`); `None` follows [`Self::api_support`].
    pub binding_conditions: Option<bool>,
    /// How long a shared device that lost its last node while a claim holds it stays
    /// `NoSchedule`-tainted before the taint turns `NoExecute` ([`dra_plugin::vanished`]).
    pub vanished_grace: Duration,
    /// How long a node may stay not Ready before its shared devices are no longer offered
    /// there ([`akri_devices::node_lost`]).
    pub node_lost_grace: Duration,
    /// Changes arriving within this window are reconciled together.
    pub debounce: Duration,
    /// Whether the cluster serves DRA: without it (`--dra=off`, a legacy-only cluster) only
    /// [`Self::legacy_slots`] runs.
    pub dra: bool,
    /// The legacy path's slots of gone nodes ([`crate::legacy_slots`]).
    pub legacy_slots: LegacySlotsConfig,
}

impl ControllerConfig {
    pub fn new(instance_namespace: &str) -> Self {
        ControllerConfig {
            instance_namespace: instance_namespace.into(),
            field_manager: "akri-driver-controller".into(),
            api_support: None,
            consumable_capacity: None,
            device_taints: None,
            binding_conditions: None,
            vanished_grace: Duration::from_secs(300),
            node_lost_grace: Duration::from_secs(300),
            debounce: Duration::from_millis(500),
            dra: true,
            legacy_slots: LegacySlotsConfig::default(),
        }
    }
}

/// What every reconciliation shares.
pub struct Context {
    client: kube::Client,
    config: ControllerConfig,
    support: ApiSupport,
    instances: Store<Instance>,
    /// Every ResourceSlice, compact (see [`stores`]).
    slices: Store<SliceView>,
    filters: Store<PropertyFilter>,
    configurations: Store<DiscoveryConfiguration>,
    nodes: Store<Node>,
    /// Allocated claims: what holds a shared device that lost its last node.
    claims: Store<ResourceClaim>,
    /// The nodes' handler Leases: which discovery handlers each node has ([`handlers`]).
    handler_leases: Store<Lease>,
    /// Which time each claim waits for a binding check (`binding_routes.rs`).
    binding_rounds: binding_routes::Rounds,
    /// The configurations that keep a vanished device while claims hold it: a released
    /// claim no longer names the device it held, so any claim change looks at these again.
    keeping_vanished: Arc<Mutex<BTreeSet<String>>>,
    /// Per configuration, its shared pools (their publishers remember generations).
    shared_pools: Mutex<BTreeMap<String, BTreeMap<String, shared::SharedPoolState>>>,
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
        None => ApiSupport::detect(&client)
            .await
            .map_err(Error::ApiSupport)?,
    };
    if let Some(forced) = config.consumable_capacity {
        support.consumable_capacity = forced;
    }
    if let Some(forced) = config.device_taints {
        support.device_taints = forced;
    }
    if let Some(forced) = config.binding_conditions {
        support.binding_conditions = forced;
    }
    tracing::info!(
        consumable_capacity = support.consumable_capacity,
        per_device_node_selection = support.per_device_node_selection,
        extended_resource_name = support.extended_resource_name,
        device_taints = support.device_taints,
        binding_conditions = support.binding_conditions,
        optional_node_operations = support.optional_node_operations,
        "API server support"
    );

    let (instances, instance_stream) = akri_runtime::reflect_as(
        Api::<Instance>::namespaced(client.clone(), &config.instance_namespace),
        watcher::Config::default().labels(&instance_source_selector(
            INSTANCE_SOURCE_DISCOVERY_CONFIGURATION,
        )),
        slim_instance,
    );
    let (slices, slice_stream) = akri_runtime::reflect_as(
        Api::<ResourceSlice>::all(client.clone()),
        watcher::Config::default(),
        SliceView::from,
    );
    let (filters, filter_stream) = akri_runtime::reflect(
        Api::<PropertyFilter>::all(client.clone()),
        watcher::Config::default(),
    );
    let (claims, claim_stream) = akri_runtime::reflect_as(
        Api::<ResourceClaim>::all(client.clone()),
        watcher::Config::default(),
        slim_claim,
    );

    // The nodes' handler Leases; a change may concern every configuration (handlers.rs).
    let (handler_leases, lease_stream) = akri_runtime::reflect(
        Api::<Lease>::namespaced(client.clone(), &config.instance_namespace),
        watcher::Config::default().labels(akri_devices::handlers::HANDLERS_LABEL),
    );
    let lease_changes = lease_stream.map(|_| ());

    // Nodes, to forget the ones deleted for good and leave lost ones out of shared devices'
    // node selection; a deletion may concern every configuration. Only their names and
    // Ready conditions are kept (images alone are most of a Node's size).
    let (nodes, writer) = reflector::store();
    let node_deletions = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(|node| *node = slim_node(std::mem::take(node)))
        .reflect(writer)
        .filter_map(|event| {
            futures::future::ready(matches!(event, Ok(watcher::Event::Delete(_))).then_some(()))
        });
    // So are the nodes that become lost or come back (lost_nodes.rs).
    let (lost_changed, lost_changes) = futures::channel::mpsc::channel(1);
    // A claim's change may route a binding check to its node (binding_routes.rs).
    let (routes_changed, routes_changes) = futures::channel::mpsc::channel(1);

    // One watch of the configurations, for the reconciler and the spec mirrors: each of its
    // events (a deletion too) tells the mirror writer to look again.
    let (configurations, writer) = reflector::store();
    let (mirror_changed, mirror_changes) = futures::channel::mpsc::channel(1);
    let configuration_stream = watcher(
        Api::<DiscoveryConfiguration>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .inspect(move |_| {
        let _ = mirror_changed.clone().try_send(());
    })
    .applied_objects();
    let controller = Controller::for_stream(configuration_stream, configurations);
    let ctx = Arc::new(Context {
        client: client.clone(),
        config: config.clone(),
        support,
        instances,
        slices,
        filters,
        configurations: controller.store(),
        nodes,
        claims,
        handler_leases,
        binding_rounds: binding_routes::Rounds::default(),
        keeping_vanished: Arc::default(),
        shared_pools: Mutex::default(),
        metrics,
    });
    // Aborted with this future too: a replica that lost leadership must not keep writing.
    let _orphans = AbortOnDrop(tokio::spawn(filters::orphan_filters(ctx.clone())));
    let _lost = AbortOnDrop(tokio::spawn(lost_nodes::watch(ctx.clone(), lost_changed)));
    let _routes = AbortOnDrop(tokio::spawn(binding_routes::route(
        ctx.clone(),
        routes_changes,
    )));
    let _mirror = AbortOnDrop(tokio::spawn(crate::spec_mirror::keep(
        controller.store(),
        mirror_changes,
        client.clone(),
        config.instance_namespace.clone(),
        config.field_manager.clone(),
        ctx.metrics.clone(),
    )));
    let keeping_vanished = ctx.keeping_vanished.clone();
    let binding_rounds = ctx.binding_rounds.clone();
    controller
        .owns(
            Api::<DeviceClass>::all(client),
            watcher::Config::default().labels(device_class::CONFIGURATION_LABEL),
        )
        .watches_stream(instance_stream, |instance: Instance| {
            Some(ObjectRef::new(&instance.spec.configuration_name))
        })
        .watches_stream(slice_stream, |slice: SliceView| {
            slice_configurations(&slice)
                .into_iter()
                .map(|c| ObjectRef::new(&c))
        })
        .watches_stream(filter_stream, |filter: PropertyFilter| {
            Some(ObjectRef::new(&filter.spec.discovery_reference.name))
        })
        // A released claim may let a vanished shared device go; an allocated one may wait
        // for its node's binding check (full: a routing is pending already).
        .watches_stream(claim_stream, move |claim: ResourceClaim| {
            // Every event, before the store takes the next: the routing reads the store once
            // per burst and would miss a claim that stopped waiting and waits again.
            binding_rounds.note(&claim);
            let _ = routes_changed.clone().try_send(());
            let keeping = keeping_vanished.lock().expect("lock").clone();
            keeping.into_iter().map(|c| ObjectRef::new(&c))
        })
        .reconcile_all_on(futures::stream::select_all([
            node_deletions.boxed(),
            lost_changes.boxed(),
            lease_changes.boxed(),
        ]))
        // Two configurations at a time: a pass holds several transient copies of its
        // configuration's devices (planned slices, the vanished plan), and ten passes at once
        // made the heap's peak, which the allocator keeps, three times the stores' size.
        .with_config(
            ControllerRuntimeConfig::default()
                .debounce(config.debounce)
                .concurrency(RECONCILE_CONCURRENCY),
        )
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconciliation");
            }
        })
        .await;
    Ok(())
}

/// How many configurations are reconciled at once.
const RECONCILE_CONCURRENCY: u16 = 2;

/// How often a configuration is reconciled without any change.
const RESYNC: Duration = Duration::from_secs(300);

/// The configurations whose devices a slice holds (Akri drivers only).
fn slice_configurations(slice: &SliceView) -> BTreeSet<String> {
    slice
        .devices
        .iter()
        .filter_map(|(_, configuration)| configuration.clone())
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
        return Ok(Action::requeue(akri_runtime::LISTED_POLL));
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

    ctx.write_status(&config, &driver, &instances, shared.devices, class_conflict)
        .await?;
    if let Some(error) = failed {
        return Err(error);
    }
    ctx.metrics.reconciled(true);
    // Again when a vanished device's taint turns NoExecute (a second late: its time is in
    // whole seconds), else now and then.
    let next = shared
        .next_change
        .and_then(|at| {
            let wait = at.duration_since(k8s_openapi::jiff::Timestamp::now());
            Duration::try_from(wait).ok()
        })
        .map_or(RESYNC, |wait| (wait + Duration::from_secs(1)).min(RESYNC));
    Ok(Action::requeue(next))
}

impl Context {
    /// Whether every store has been listed once ([`akri_runtime::listed`]).
    fn stores_ready(&self) -> bool {
        use akri_runtime::listed;
        listed(&self.instances)
            && listed(&self.slices)
            && listed(&self.filters)
            && listed(&self.configurations)
            && listed(&self.nodes)
            && listed(&self.claims)
            && listed(&self.handler_leases)
    }

    /// Returns once every store has been listed: where the background tasks begin. (Asked
    /// every [`akri_runtime::LISTED_POLL`], never awaited: kube wakes only one waiter.)
    async fn stores_listed(&self) {
        while !self.stores_ready() {
            tokio::time::sleep(akri_runtime::LISTED_POLL).await;
        }
    }

    fn params(&self) -> PatchParams {
        PatchParams::apply(&self.config.field_manager).force()
    }

    /// Applies one of our DeviceClasses. A class of that name that is not ours (no owner
    /// reference to the object it is for) is left alone: `Some(why)` for the object's status.
    async fn apply_class(&self, class: &DeviceClass) -> Result<Option<String>, Error> {
        let name = class.name_any();
        let api = Api::<DeviceClass>::all(self.client.clone());
        let current = api.get_opt(&name).await.map_err(|cause| Error::Read {
            kind: "DeviceClass",
            name: name.clone(),
            cause,
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
            .map_err(|cause| Error::Write {
                kind: "DeviceClass",
                name: name.clone(),
                cause,
            })?;
        self.metrics.wrote("deviceclass", "apply", 1);
        tracing::info!(class = %name, "applied DeviceClass");
        Ok(None)
    }

    /// Node-local devices of a configuration as the kubelet-plugins published them (current
    /// generation of each pool only).
    fn local_devices_published(&self, driver: &str, configuration: &str) -> usize {
        let slices: Vec<Arc<SliceView>> = self
            .slices
            .state()
            .into_iter()
            .filter(|s| s.driver == driver && !s.labels().contains_key(SHARED_CONFIGURATION_LABEL))
            .collect();
        let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
        for slice in &slices {
            let generation = newest.entry(slice.pool.as_str()).or_default();
            *generation = (*generation).max(slice.generation);
        }
        let mut devices = BTreeSet::new();
        for slice in &slices {
            if newest.get(slice.pool.as_str()) != Some(&slice.generation) {
                continue;
            }
            for (device, of) in &slice.devices {
                if of.as_deref() == Some(configuration) {
                    devices.insert((slice.pool.as_str(), device.as_str()));
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
        let taints = if self.support.device_taints {
            ""
        } else {
            "; the API server has no device taints (DRADeviceTaints), so a device that vanishes while a claim holds it leaves its slice at once and the pods that hold it are not evicted"
        };
        let any_shared = instances.iter().any(|i| i.spec.shared);
        let skip = self.skips_node_operations(config);
        let node_operations = match (any_shared, shared::asks_to_skip(config), skip) {
            (true, true, true) => {
                "; claims of its shared devices skip the kubelet-plugin (skipNodeOperations): their pods may run on nodes without it, and their containers get no environment variables or device metadata from it"
            }
            (true, true, false) => {
                "; sharedDevices.nodeOperations is Skip, but the API server has no optional node operations (DRAOptionalNodeOperations), so the kubelet-plugin prepares its shared devices as usual, on the nodes that discover them"
            }
            _ => "",
        };
        // Shared through consumable capacity: no binding check (`shared::checked_at_binding`).
        let multiple = config.spec.capacity > 1
            && Sharing::for_configuration(
                config.spec.unique_devices,
                self.support.consumable_capacity,
            ) == Sharing::ConsumableCapacity;
        let binding = match (
            any_shared && !skip,
            self.support.binding_conditions,
            multiple,
        ) {
            (true, true, false) => {
                "; a pod is bound to the node chosen for a shared device only once that node's kubelet-plugin has found the device answers from there (binding condition akri.sh/Reachable)"
            }
            (true, true, true) => {
                "; its shared devices are not checked from the chosen node at binding: several claims share each of them through consumable capacity, and the scheduler counts the slots of a claim waiting for its check twice, so another node's pod could wait five minutes (capacity 1 or uniqueDevices: false devices are checked)"
            }
            (true, false, _) => {
                "; the API server has no binding conditions (DRADeviceBindingConditions), so a pod may be bound to a node that lists a shared device but cannot reach it just then"
            }
            (false, _, _) => "",
        };
        let missing_handler = handlers::missing_handler(
            &config.spec.discovery_handler.name,
            status.instances,
            &self.node_handlers(),
        );
        match (class_conflict, missing_handler) {
            (None, Some(why)) => {
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    false,
                    "NoDiscoveryHandler",
                    format!("{why}: nothing can be discovered for it"),
                    generation,
                );
            }
            (None, None) => {
                set_condition(
                    &mut status.conditions,
                    CONDITION_READY,
                    true,
                    "Published",
                    format!(
                        "DeviceClass {name} selects its devices{extended}{unique}{taints}{binding}{node_operations}; {} Instances on {} nodes, {} devices published",
                        status.instances, status.nodes, status.devices_published
                    ),
                    generation,
                );
            }
            (Some(why), _) => {
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
            .map_err(|cause| Error::Write {
                kind: "DiscoveryConfiguration status",
                name,
                cause,
            })?;
        self.metrics.wrote("status", "apply", 1);
        Ok(())
    }
}
