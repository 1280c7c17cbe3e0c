//! Publishing a configuration's shared devices ([`crate::shared_devices`] says what they are),
//! and keeping one whose Instance lost its last node while a claim holds it: published with
//! the `akri.sh/not-discovered` taint, `NoSchedule` at once and `NoExecute` after the grace, so
//! the device-taint eviction controller evicts its pods and they are replaced on a device that
//! exists ([`dra_plugin::vanished`]); it leaves when no claim holds it. A node-local device is
//! kept so by its node's kubelet-plugin; a shared one has no node to do it, so it is done here.

use super::{Context, Error, SHARED_CONFIGURATION_LABEL, SliceView};
use crate::shared_devices::{self, SharedPool};
use akri_api::v1::NodeOperations;
use akri_api::v1::{DiscoveryConfiguration, Instance};
use akri_devices::Sharing;
use dra_plugin::slices::{PoolScope, PoolTemplate, SKIP_ALL_NODE_OPERATIONS, SlicePublisher};
use dra_plugin::vanished::VanishedDevices;
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams};
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One shared pool as this process publishes it.
pub(super) struct SharedPoolState {
    publisher: SlicePublisher,
    /// Its devices that vanished while claims hold them.
    vanished: VanishedDevices,
}

/// What a publishing pass did.
pub(super) struct PublishedShared {
    /// Devices published, vanished held ones included.
    pub devices: usize,
    /// When a vanished device's taint turns `NoExecute`: publish again then.
    pub next_change: Option<Timestamp>,
}

impl Context {
    /// Publishes the configuration's shared devices.
    pub(super) async fn publish_shared(
        &self,
        config: &DiscoveryConfiguration,
        driver: &str,
        owner: OwnerReference,
        instances: &[Arc<Instance>],
    ) -> Result<PublishedShared, Error> {
        let name = config.name_any();
        let sharing = Sharing::for_configuration(
            config.spec.unique_devices,
            self.support.consumable_capacity,
        );
        let refs: Vec<&Instance> = instances.iter().map(|i| i.as_ref()).collect();
        let skip = self.skips_node_operations(config);
        let offered = (config.spec.shared_devices.as_ref())
            .and_then(|shared| shared.node_selector.as_ref())
            .filter(|_| skip)
            .map(shared_devices::label_selector);
        let mut pools = shared_devices::pools(
            &name,
            config.spec.capacity,
            sharing,
            self.support.per_device_node_selection,
            &refs,
            &self.lost_nodes(),
            offered.as_ref(),
        );
        // A binding check is a kubelet-plugin's, which a node need not run when the devices
        // skip the node's operations. Not on a device several claims share through consumable
        // capacity: see `checked_at_binding`.
        if self.support.binding_conditions && !skip {
            for device in pools.iter_mut().flat_map(|p| p.devices.iter_mut()) {
                if checked_at_binding(device) {
                    akri_devices::with_binding_check(device);
                }
            }
        }
        let ours: Vec<Arc<SliceView>> = self
            .slices
            .state()
            .into_iter()
            .filter(|s| s.labels().get(SHARED_CONFIGURATION_LABEL) == Some(&name))
            .collect();
        let reported: BTreeSet<String> = pools.iter().map(|p| p.pool.clone()).collect();
        // A published pool no Instance reports any more (pool-wide node selection: its
        // Instance is gone) may hold held devices: it is planned empty, where it was.
        for slice in &ours {
            if !pools.iter().any(|p| p.pool == slice.pool) {
                pools.push(SharedPool {
                    pool: slice.pool.clone(),
                    scope: stored_scope(slice),
                    devices: Vec::new(),
                });
            }
        }
        let held = self.held_devices(driver);
        let nothing = BTreeSet::new();
        let now = Timestamp::now();

        // Reconciliations of one configuration never overlap: its pools are taken out for the
        // pass and put back after.
        let mut states = self
            .shared_pools
            .lock()
            .expect("lock")
            .remove(&name)
            .unwrap_or_default();
        let result = async {
            let mut published = PublishedShared {
                devices: 0,
                next_change: None,
            };
            let mut wanted: BTreeSet<String> = BTreeSet::new();
            // Each pool's devices are moved into its plan: a copy would be one more of each.
            for pool in pools {
                let existing: Vec<Arc<SliceView>> = ours
                    .iter()
                    .filter(|s| s.driver == driver && s.pool == pool.pool)
                    .cloned()
                    .collect();
                let state = states
                    .entry(pool.pool.clone())
                    .or_insert_with(|| self.pool_state(driver, &name, &pool, &owner, &existing));
                let plan = state.vanished.plan(
                    pool.devices,
                    held.get(&pool.pool).unwrap_or(&nothing),
                    now,
                );
                for device in &plan.newly_vanished {
                    self.announce_vanished(config, driver, device);
                }
                if let Some(at) = plan.next_change {
                    published.next_change =
                        Some(published.next_change.map_or(at, |t: Timestamp| t.min(at)));
                }
                // An empty pool the Instances still ask for (per-device selection: the
                // configuration's) publishes nothing, which unpublishes it.
                let keep = reported.contains(&pool.pool) || !plan.devices.is_empty();
                if !keep {
                    continue;
                }
                wanted.insert(pool.pool.clone());
                state.publisher.set_scope(pool.scope.clone());
                state.publisher.set_skip_node_operations(if skip {
                    vec![SKIP_ALL_NODE_OPERATIONS.into()]
                } else {
                    Vec::new()
                });
                let written = state
                    .publisher
                    .publish_against(&plan.devices, &existing)
                    .await
                    .map_err(|cause| Error::Slices {
                        configuration: name.clone(),
                        cause,
                    })?;
                self.metrics
                    .wrote("resourceslice", "apply", written.written as u64);
                self.metrics
                    .wrote("resourceslice", "delete", written.deleted as u64);
                if written.written + written.deleted > 0 {
                    tracing::info!(configuration = %name, pool = %pool.pool, devices = plan.devices.len(), generation = written.generation, "published shared devices");
                }
                published.devices += plan.devices.len();
            }
            // Pools no longer wanted (an Instance gone and nothing held, or the API server's
            // support changed).
            for slice in ours.iter().filter(|s| !wanted.contains(&s.pool)) {
                let slice_name = slice.name_any();
                match Api::<ResourceSlice>::all(self.client.clone())
                    .delete(&slice_name, &DeleteParams::default())
                    .await
                {
                    Ok(_) => self.metrics.wrote("resourceslice", "delete", 1),
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(cause) => {
                        return Err(Error::Write {
                            kind: "ResourceSlice",
                            name: slice_name,
                            cause,
                        });
                    }
                }
            }
            states.retain(|pool, _| wanted.contains(pool));
            let mut keeping = self.keeping_vanished.lock().expect("lock");
            if states.values().any(|s| s.vanished.any_vanished()) {
                keeping.insert(name.clone());
            } else {
                keeping.remove(&name);
            }
            Ok(published)
        }
        .await;
        self.shared_pools.lock().expect("lock").insert(name, states);
        let total: usize = self
            .shared_pools
            .lock()
            .expect("lock")
            .values()
            .flat_map(|p| p.values())
            .map(|p| p.publisher.published_devices())
            .sum();
        self.metrics.set_shared_devices(total);
        result
    }

    /// Whether the configuration's shared devices are published with `skipNodeOperations`: it
    /// asks for it, and the API server keeps the field (else they are prepared as usual, and
    /// the configuration's status says why).
    pub(super) fn skips_node_operations(&self, config: &DiscoveryConfiguration) -> bool {
        self.support.optional_node_operations && asks_to_skip(config)
    }

    /// A pool met for the first time by this process: its publisher, and its vanished
    /// devices as a previous process left them in `existing` (the taints and their times).
    fn pool_state(
        &self,
        driver: &str,
        configuration: &str,
        pool: &SharedPool,
        owner: &OwnerReference,
        existing: &[Arc<SliceView>],
    ) -> SharedPoolState {
        let mut template = PoolTemplate::new(driver, &pool.pool, pool.scope.clone());
        template.owner = Some(owner.clone());
        template
            .labels
            .insert(SHARED_CONFIGURATION_LABEL.into(), configuration.to_string());
        let mut vanished = VanishedDevices::new(
            akri_devices::NOT_DISCOVERED_TAINT,
            self.config.vanished_grace,
            self.support.device_taints,
        );
        vanished.seed(dra_plugin::slices::current_devices(existing));
        SharedPoolState {
            publisher: SlicePublisher::with_template(
                self.client.clone(),
                template,
                &self.config.field_manager,
            ),
            vanished,
        }
    }

    /// The devices of `driver` that allocated claims hold, by pool. Allocated, not only
    /// prepared: a shared device's claim may be allocated to a pod not started yet, and must
    /// not be scheduled onto a device that is gone either.
    fn held_devices(&self, driver: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut held: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for claim in self.claims.state() {
            for result in allocation_results(&claim) {
                if result.driver == driver {
                    held.entry(result.pool.clone())
                        .or_default()
                        .insert(result.device.clone());
                }
            }
        }
        held
    }

    /// Logs, and records a Warning Event on the configuration, that a held shared device
    /// lost its last node.
    fn announce_vanished(&self, config: &DiscoveryConfiguration, driver: &str, device: &str) {
        let taints = self.support.device_taints;
        let (reason, note) = akri_devices::vanished_while_held(
            driver,
            device,
            "is seen by no node any more",
            taints,
        );
        tracing::warn!(configuration = %config.name_any(), %driver, %device, device_taints = taints, "a held shared device vanished");
        let reporter = kube::runtime::events::Reporter {
            controller: self.config.field_manager.clone(),
            instance: None,
        };
        tokio::spawn(akri_runtime::warn_event(
            self.client.clone(),
            reporter,
            config.object_ref(&()),
            reason,
            note,
        ));
    }
}

fn allocation_results(
    claim: &ResourceClaim,
) -> impl Iterator<Item = &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult> {
    claim
        .status
        .iter()
        .flat_map(|s| &s.allocation)
        .flat_map(|a| &a.devices)
        .flat_map(|d| d.results.iter().flatten())
}

/// Where a stored shared pool's devices are: its slices' node selector, or each device's own.
fn stored_scope(slice: &SliceView) -> PoolScope {
    match &slice.node_selector {
        Some(selector) => PoolScope::Nodes(selector.clone()),
        None => PoolScope::PerDevice,
    }
}

/// Whether the configuration asks for its shared devices to skip the node's operations.
pub(super) fn asks_to_skip(config: &DiscoveryConfiguration) -> bool {
    config
        .spec
        .shared_devices
        .as_ref()
        .is_some_and(|shared| shared.node_operations == NodeOperations::Skip)
}

/// Whether a shared device waits at binding for its node's check. Not one that several claims
/// share through consumable capacity (`allowMultipleAllocations`): while a claim waits for its
/// binding check, the scheduler (seen in Kubernetes 1.37.2) counts the slots it took twice,
/// once as allocated and once as in flight, and a pod of another node that it tries then finds
/// the device full. When the wait ends nothing tells the scheduler to try that pod again, so
/// it waits for its periodic retry of unschedulable pods, five minutes. Two brokers of one
/// camera on two nodes would meet exactly that.
pub(super) fn checked_at_binding(device: &Device) -> bool {
    device.allow_multiple_allocations != Some(true)
}
