//! Publishing a pool of devices as ResourceSlices.
//!
//! The scheduler reads a pool as the set of its slices that carry the pool's highest
//! `generation`, and only trusts the pool once it has seen `resourceSliceCount` of them. So a
//! change is published as a new generation written to every slice of the pool, then surplus
//! slices of older generations are deleted. A pool whose devices did not change is not
//! written at all.
//!
//! The same publisher serves node-local pools (the kubelet plugin: one pool per node and
//! driver, `nodeName` set, owned by the Node so it goes away with it) and cluster-wide pools
//! (a controller: `perDeviceNodeSelection`, each device naming its nodes, or one node selector
//! for the whole pool where the API server lacks per-device selection).

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{Device, ResourcePool, ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The most devices one ResourceSlice may hold (resource.k8s.io/v1 `ResourceSliceMaxDevices`).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Errors of publishing slices.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server did not list the pool's slices.
    #[error("listing the slices of pool {pool}: {cause}")]
    List {
        /// The pool name.
        pool: String,
        /// The API server's error.
        cause: kube::Error,
    },
    /// The API server did not take a slice (server-side apply).
    #[error("writing slice {slice}: {cause}")]
    Apply {
        /// The slice's name.
        slice: String,
        /// The API server's error.
        cause: kube::Error,
    },
    /// A slice the pool no longer needs could not be deleted (one already gone is fine).
    #[error("deleting slice {slice}: {cause}")]
    Delete {
        /// The slice's name.
        slice: String,
        /// The API server's error.
        cause: kube::Error,
    },
    /// The caller gave up waiting for the API server (the publisher itself sets no deadline).
    #[error("publishing timed out")]
    TimedOut,
}

/// A stored slice as a publisher compares it with what it plans. Implemented by
/// [`ResourceSlice`] itself, and by the compact copies a long-lived store may keep instead: a
/// controller's reflector of thousands of devices need not hold each one as a struct (a
/// `Device` with a few attributes and a capacity takes kilobytes).
pub trait StoredSlice {
    /// The slice's name.
    fn name(&self) -> Option<&str>;
    /// Its pool's generation.
    fn generation(&self) -> i64;
    /// Whether it is `want` as far as the scheduler and the publisher care: the same spec,
    /// and at least `want`'s labels (see [`carries_labels`]).
    fn is(&self, want: &ResourceSlice) -> bool;
    /// Its devices.
    fn devices(&self) -> Vec<Device>;
}

impl StoredSlice for ResourceSlice {
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    fn generation(&self) -> i64 {
        self.spec.pool.generation
    }

    fn is(&self, want: &ResourceSlice) -> bool {
        self.spec == want.spec && carries_labels(self.metadata.labels.as_ref(), want)
    }

    fn devices(&self) -> Vec<Device> {
        self.spec.devices.clone().unwrap_or_default()
    }
}

impl<T: StoredSlice + ?Sized> StoredSlice for Arc<T> {
    fn name(&self) -> Option<&str> {
        T::name(self)
    }

    fn generation(&self) -> i64 {
        T::generation(self)
    }

    fn is(&self, want: &ResourceSlice) -> bool {
        T::is(self, want)
    }

    fn devices(&self) -> Vec<Device> {
        T::devices(self)
    }
}

/// `value` as compact JSON: how devices are kept where they are rarely read back.
pub(crate) fn to_json(value: &impl serde::Serialize) -> Box<str> {
    serde_json::to_string(value)
        .unwrap_or_default()
        .into_boxed_str()
}

/// Where a pool's devices are available.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolScope {
    /// On one node; the slices are owned by that Node object.
    Node {
        /// The node's name (the slices' `nodeName`).
        name: String,
        /// The Node object's UID, for the slices' owner reference.
        uid: String,
    },
    /// Each device says where with its own `nodeName`/`nodeSelector`/`allNodes`.
    PerDevice,
    /// Every device of the pool is reachable from the nodes this selector (one term) selects.
    Nodes(NodeSelector),
}

/// What every slice of a pool carries besides its devices.
#[derive(Clone, Debug)]
pub struct PoolTemplate {
    /// The DRA driver name (`spec.driver`).
    pub driver: String,
    /// The pool name (`spec.pool.name`).
    pub pool: String,
    /// Where the pool's devices are available.
    pub scope: PoolScope,
    /// The owner of the slices, so they are garbage-collected with it. Node pools are owned
    /// by their Node whatever this says.
    pub owner: Option<OwnerReference>,
    /// Labels of every slice (none are needed: a pool's slices are found by driver, node and
    /// pool name).
    pub labels: BTreeMap<String, String>,
    /// The kubelet's calls the pool's devices need not (`skipNodeOperations`, e.g.
    /// [`SKIP_ALL_NODE_OPERATIONS`]): a claim whose devices of this driver all skip a call is
    /// not sent to the driver's plugin, so its pods run on nodes without the plugin and get
    /// no CDI edits from it. Only where the API server keeps the field
    /// ([`crate::api_support::ApiSupport::optional_node_operations`]): one that drops it would
    /// make every publish look changed.
    pub skip_node_operations: Vec<String>,
}

/// `skipNodeOperations` value for every node operation (NodePrepareResources and
/// NodeUnprepareResources, and any added later).
pub const SKIP_ALL_NODE_OPERATIONS: &str = "*";

impl PoolTemplate {
    /// A template with no owner and no labels.
    pub fn new(driver: &str, pool: &str, scope: PoolScope) -> Self {
        PoolTemplate {
            driver: driver.to_string(),
            pool: pool.to_string(),
            scope,
            owner: None,
            labels: BTreeMap::new(),
            skip_node_operations: Vec::new(),
        }
    }
}

/// Publishes one pool of one driver.
pub struct SlicePublisher {
    api: Api<ResourceSlice>,
    template: PoolTemplate,
    field_manager: String,
    /// The last generation written: the pool never goes back to an older generation, even
    /// when all its slices were deleted behind our back.
    last_generation: std::sync::atomic::AtomicI64,
    /// Devices in the pool after the last successful publish.
    published_devices: std::sync::atomic::AtomicUsize,
}

/// What one [`SlicePublisher::publish`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// The pool generation now current.
    pub generation: i64,
    /// Slices written (0 when nothing changed).
    pub written: usize,
    /// Slices deleted.
    pub deleted: usize,
}

/// A publish, with what it left stored: for telling its own writes' watch events from
/// others'.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub published: Published,
    /// Each slice written, with the resourceVersion the API server gave it.
    pub written: Vec<(String, String)>,
    /// Each slice deleted (or found gone).
    pub deleted: Vec<String>,
}

impl SlicePublisher {
    /// A publisher writing with server-side apply as `field_manager`.
    pub fn new(
        client: kube::Client,
        driver: &str,
        pool: &str,
        scope: PoolScope,
        field_manager: &str,
    ) -> Self {
        Self::with_template(
            client,
            PoolTemplate::new(driver, pool, scope),
            field_manager,
        )
    }

    /// A publisher of a pool with an owner or extra labels.
    pub fn with_template(
        client: kube::Client,
        template: PoolTemplate,
        field_manager: &str,
    ) -> Self {
        SlicePublisher {
            api: Api::all(client),
            template,
            field_manager: field_manager.to_string(),
            last_generation: 0.into(),
            published_devices: 0.into(),
        }
    }

    /// Changes where the pool's devices are (e.g. a pool-wide node selector that followed the
    /// device's nodes); the next [`publish`](Self::publish) writes it.
    pub fn set_scope(&mut self, scope: PoolScope) {
        self.template.scope = scope;
    }

    /// Changes which of the kubelet's calls the pool's devices skip
    /// ([`PoolTemplate::skip_node_operations`]); the next [`publish`](Self::publish) writes it.
    pub fn set_skip_node_operations(&mut self, operations: Vec<String>) {
        self.template.skip_node_operations = operations;
    }

    /// Makes the pool hold exactly `devices` (in this order), bumping the generation when
    /// anything differs from what is published. Safe to call again at any time, e.g. after a
    /// kubelet restart deleted the node's slices.
    pub async fn publish(&self, devices: &[Device]) -> Result<Published, Error> {
        let existing = self.list().await?;
        self.publish_against(devices, &existing).await
    }

    /// The pool's slices as the API server has them now.
    ///
    /// Found by the fields the API server selects on (`spec.driver`, and `spec.nodeName` for
    /// a node's pool), then by pool name: no label of ours is needed, so slices written by
    /// anyone under this driver and pool name count (and are repaired).
    pub(crate) async fn list(&self) -> Result<Vec<ResourceSlice>, Error> {
        let mut fields = format!("spec.driver={}", self.template.driver);
        if let PoolScope::Node { name, .. } = &self.template.scope {
            fields.push_str(&format!(",spec.nodeName={name}"));
        }
        let mut slices = self
            .api
            .list(&ListParams::default().fields(&fields))
            .await
            .map_err(|cause| Error::List {
                pool: self.template.pool.clone(),
                cause,
            })?
            .items;
        slices.retain(|s| s.spec.pool.name == self.template.pool);
        Ok(slices)
    }

    /// [`publish`](Self::publish) against slices the caller already knows (e.g. from a
    /// reflector store) instead of listing them. A stale `existing` costs at most one
    /// needless new generation: generations still never go backwards.
    pub async fn publish_against<S: StoredSlice>(
        &self,
        devices: &[Device],
        existing: &[S],
    ) -> Result<Published, Error> {
        let outcome = self.publish_tracked(devices, existing).await?;
        Ok(outcome.published)
    }

    /// [`publish_against`](Self::publish_against), telling which slices it wrote (with the
    /// resourceVersion the API server gave each) and which it deleted.
    pub(crate) async fn publish_tracked<S: StoredSlice>(
        &self,
        devices: &[Device],
        existing: &[S],
    ) -> Result<Outcome, Error> {
        let floor = self
            .last_generation
            .load(std::sync::atomic::Ordering::Relaxed);
        let plan = changes(&self.template, devices, existing, floor);
        let mut outcome = Outcome {
            published: Published {
                generation: plan.generation,
                ..Published::default()
            },
            ..Outcome::default()
        };
        let published = &mut outcome.published;
        let params = PatchParams::apply(&self.field_manager).force();
        let writes = plan
            .write
            .then(|| slices(&self.template, devices, plan.generation));
        for slice in writes.into_iter().flatten() {
            let name = slice
                .metadata
                .name
                .clone()
                .expect("planned slices are named");
            let applied = self
                .api
                .patch(&name, &params, &Patch::Apply(&slice))
                .await
                .map_err(|cause| Error::Apply {
                    slice: name.clone(),
                    cause,
                })?;
            published.written += 1;
            let version = applied.metadata.resource_version.unwrap_or_default();
            outcome.written.push((name, version));
        }
        for name in &plan.delete {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    published.deleted += 1;
                    outcome.deleted.push(name.clone());
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    outcome.deleted.push(name.clone());
                }
                Err(cause) => {
                    return Err(Error::Delete {
                        slice: name.clone(),
                        cause,
                    });
                }
            }
        }
        self.last_generation
            .fetch_max(plan.generation, std::sync::atomic::Ordering::Relaxed);
        self.published_devices
            .store(devices.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(outcome)
    }

    /// Devices in the pool after the last successful publish.
    pub fn published_devices(&self) -> usize {
        self.published_devices
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Deletes every slice of the pool (e.g. when the driver stops serving it for good).
    pub async fn unpublish(&self) -> Result<Published, Error> {
        self.publish(&[]).await
    }
}

/// What to write and delete to bring a pool to `devices`.
#[derive(Debug, Default)]
pub struct Plan {
    /// The pool's generation after the plan: the current one if nothing changed, else the
    /// next.
    pub generation: i64,
    /// The slices to write with server-side apply: every slice of the pool at `generation`,
    /// or none if nothing changed.
    pub apply: Vec<ResourceSlice>,
    /// Names of existing slices the pool no longer needs, deleted after the writes.
    pub delete: Vec<String>,
}

/// The devices of one pool's slices that the scheduler uses: those of its newest generation
/// (slices of older ones may linger while a publish is under way).
pub fn current_devices<S: StoredSlice>(slices: &[S]) -> Vec<Device> {
    let newest = slices.iter().map(StoredSlice::generation).max();
    slices
        .iter()
        .filter(|s| Some(s.generation()) == newest)
        .flat_map(StoredSlice::devices)
        .collect()
}

/// Plans the slices of a pool, never going below generation `floor`. Pure, so that the
/// generation rules are unit-tested.
pub fn plan<S: StoredSlice>(
    template: &PoolTemplate,
    devices: &[Device],
    existing: &[S],
    floor: i64,
) -> Plan {
    let changes = changes(template, devices, existing, floor);
    Plan {
        generation: changes.generation,
        apply: if changes.write {
            slices(template, devices, changes.generation).collect()
        } else {
            Vec::new()
        },
        delete: changes.delete,
    }
}

/// What a [`Plan`] is made of, without its slices: a publish builds each slice only as it
/// writes it, so a large pool's devices are never all copied at once.
struct Changes {
    generation: i64,
    /// Whether every slice of the pool is written at `generation`.
    write: bool,
    delete: Vec<String>,
}

fn changes<S: StoredSlice>(
    template: &PoolTemplate,
    devices: &[Device],
    existing: &[S],
    floor: i64,
) -> Changes {
    let current_generation = existing
        .iter()
        .map(StoredSlice::generation)
        .max()
        .unwrap_or(0)
        .max(floor);
    let count = devices.chunks(MAX_DEVICES_PER_SLICE).len();

    // Unchanged: every wanted slice exists at the current generation with the same spec, and
    // nothing else is there. Built one slice at a time, as the writes are.
    let unchanged = existing.len() == count
        && slices(template, devices, current_generation).all(|want| {
            existing
                .iter()
                .any(|s| s.name() == want.metadata.name.as_deref() && s.is(&want))
        });
    if unchanged {
        return Changes {
            generation: current_generation,
            write: false,
            delete: Vec::new(),
        };
    }
    let names: Vec<String> = (0..count)
        .map(|i| slice_name(&template.driver, &template.pool, i))
        .collect();
    let delete = existing
        .iter()
        .filter_map(StoredSlice::name)
        .filter(|name| !names.iter().any(|n| n == name))
        .map(str::to_string)
        .collect();
    Changes {
        generation: current_generation + 1,
        write: true,
        delete,
    }
}

/// The slices of a pool holding `devices` at `generation`, built one by one.
fn slices<'a>(
    template: &'a PoolTemplate,
    devices: &'a [Device],
    generation: i64,
) -> impl Iterator<Item = ResourceSlice> + 'a {
    let chunks = devices.chunks(MAX_DEVICES_PER_SLICE);
    let count = chunks.len();
    chunks.enumerate().map(move |(i, chunk)| {
        let name = slice_name(&template.driver, &template.pool, i);
        slice(template, &name, generation, count, chunk)
    })
}

fn slice(
    template: &PoolTemplate,
    name: &str,
    generation: i64,
    count: usize,
    devices: &[Device],
) -> ResourceSlice {
    let (node_name, node_selector, per_device, owner) = match &template.scope {
        PoolScope::Node { name, uid } => (
            Some(name.clone()),
            None,
            None,
            Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.clone(),
                uid: uid.clone(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
        ),
        PoolScope::PerDevice => (
            None,
            None,
            Some(true),
            template.owner.clone().map(|o| vec![o]),
        ),
        PoolScope::Nodes(selector) => (
            None,
            Some(selector.clone()),
            None,
            template.owner.clone().map(|o| vec![o]),
        ),
    };
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: (!template.labels.is_empty()).then(|| template.labels.clone()),
            owner_references: owner,
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: template.driver.clone(),
            pool: ResourcePool {
                name: template.pool.clone(),
                generation,
                resource_slice_count: count as i64,
            },
            node_name,
            node_selector,
            per_device_node_selection: per_device,
            devices: Some(devices.to_vec()),
            skip_node_operations: (!template.skip_node_operations.is_empty())
                .then(|| template.skip_node_operations.clone()),
            ..ResourceSliceSpec::default()
        },
    }
}

/// `<pool>-<driver>-<index>`, made a valid object name (lower case, at most 253 characters).
pub(crate) fn slice_name(driver: &str, pool: &str, index: usize) -> String {
    let raw = format!("{pool}-{driver}");
    let mut name: String = raw
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let suffix = format!("-{index}");
    name.truncate(253 - suffix.len());
    format!(
        "{}{suffix}",
        name.trim_matches(|c: char| c == '-' || c == '.')
    )
}

/// Whether a slice with `have` labels carries every label of `want`: labels others add are
/// theirs to keep, and must not make the pool look changed (it would be rewritten on every
/// publish).
pub fn carries_labels(have: Option<&BTreeMap<String, String>>, want: &ResourceSlice) -> bool {
    want.metadata
        .labels
        .iter()
        .flatten()
        .all(|(key, value)| have.and_then(|h| h.get(key)) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> Device {
        Device {
            name: name.to_string(),
            ..Device::default()
        }
    }

    fn node() -> PoolScope {
        PoolScope::Node {
            name: "node-a".into(),
            uid: "uid-a".into(),
        }
    }

    fn plan(
        driver: &str,
        pool: &str,
        scope: &PoolScope,
        devices: &[Device],
        existing: &[ResourceSlice],
        floor: i64,
    ) -> Plan {
        super::plan(
            &PoolTemplate::new(driver, pool, scope.clone()),
            devices,
            existing,
            floor,
        )
    }

    #[test]
    fn current_devices_are_those_of_the_newest_generation() {
        let with = |generation: i64, names: &[&str]| ResourceSlice {
            spec: ResourceSliceSpec {
                pool: ResourcePool {
                    generation,
                    ..ResourcePool::default()
                },
                devices: Some(names.iter().map(|n| device(n)).collect()),
                ..ResourceSliceSpec::default()
            },
            ..ResourceSlice::default()
        };
        let names =
            |devices: Vec<Device>| -> Vec<String> { devices.into_iter().map(|d| d.name).collect() };
        let slices = [with(2, &["a"]), with(1, &["a", "old"]), with(2, &["b"])];
        assert_eq!(names(current_devices(&slices)), ["a", "b"]);
        assert!(current_devices::<ResourceSlice>(&[]).is_empty());
    }

    /// What the API server would hold after applying a plan.
    fn applied(plan: &Plan, before: &[ResourceSlice]) -> Vec<ResourceSlice> {
        let mut after: Vec<ResourceSlice> = before
            .iter()
            .filter(|s| !plan.delete.contains(s.metadata.name.as_ref().unwrap()))
            .filter(|s| {
                !plan
                    .apply
                    .iter()
                    .any(|a| a.metadata.name == s.metadata.name)
            })
            .cloned()
            .collect();
        after.extend(plan.apply.iter().cloned());
        after
    }

    #[test]
    fn first_publish_is_generation_one_and_splits_at_128() {
        let devices: Vec<Device> = (0..300).map(|i| device(&format!("d{i}"))).collect();
        let plan = plan("udev.akri.sh", "node-a", &node(), &devices, &[], 0);
        assert_eq!(plan.generation, 1);
        assert_eq!(plan.apply.len(), 3);
        let sizes: Vec<usize> = plan
            .apply
            .iter()
            .map(|s| s.spec.devices.as_ref().unwrap().len())
            .collect();
        assert_eq!(sizes, [128, 128, 44]);
        assert!(
            plan.apply
                .iter()
                .all(|s| s.spec.pool.resource_slice_count == 3)
        );
        assert!(
            plan.apply
                .iter()
                .all(|s| s.spec.node_name.as_deref() == Some("node-a"))
        );
        assert_eq!(
            plan.apply[0].metadata.owner_references.as_ref().unwrap()[0].kind,
            "Node"
        );
    }

    #[test]
    fn unchanged_devices_write_nothing_and_changes_bump_the_generation() {
        let devices = vec![device("a"), device("b")];
        let first = plan("d.akri.sh", "p", &node(), &devices, &[], 0);
        let state = applied(&first, &[]);
        let again = plan("d.akri.sh", "p", &node(), &devices, &state, 0);
        assert!(again.apply.is_empty() && again.delete.is_empty());
        assert_eq!(again.generation, 1);

        let fewer = plan("d.akri.sh", "p", &node(), &devices[..1], &state, 0);
        assert_eq!(fewer.generation, 2);
        assert_eq!(fewer.apply.len(), 1);
        assert!(
            fewer.delete.is_empty(),
            "the single slice is rewritten in place"
        );
    }

    #[test]
    fn shrinking_deletes_surplus_slices_and_empty_pool_deletes_all() {
        let many: Vec<Device> = (0..200).map(|i| device(&format!("d{i}"))).collect();
        let state = applied(
            &plan("d.akri.sh", "p", &PoolScope::PerDevice, &many, &[], 0),
            &[],
        );
        assert_eq!(state.len(), 2);
        assert!(
            state
                .iter()
                .all(|s| s.spec.per_device_node_selection == Some(true)
                    && s.spec.node_name.is_none())
        );
        let shrink = plan(
            "d.akri.sh",
            "p",
            &PoolScope::PerDevice,
            &many[..10],
            &state,
            0,
        );
        assert_eq!(shrink.generation, 2);
        assert_eq!(shrink.delete, vec![slice_name("d.akri.sh", "p", 1)]);
        let gone = plan("d.akri.sh", "p", &PoolScope::PerDevice, &[], &state, 0);
        assert!(gone.apply.is_empty());
        assert_eq!(gone.delete.len(), 2);
    }

    #[test]
    fn a_changed_pool_node_selector_is_a_new_generation() {
        let selector = |node: &str| {
            PoolScope::Nodes(NodeSelector {
                node_selector_terms: vec![k8s_openapi::api::core::v1::NodeSelectorTerm {
                    match_fields: Some(vec![k8s_openapi::api::core::v1::NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.into()]),
                    }]),
                    match_expressions: None,
                }],
            })
        };
        let devices = vec![device("a")];
        let state = applied(
            &plan("d.akri.sh", "p", &selector("n1"), &devices, &[], 0),
            &[],
        );
        assert!(state[0].spec.node_selector.is_some() && state[0].spec.node_name.is_none());
        let same = plan("d.akri.sh", "p", &selector("n1"), &devices, &state, 0);
        assert!(same.apply.is_empty());
        let moved = plan("d.akri.sh", "p", &selector("n2"), &devices, &state, 0);
        assert_eq!(moved.generation, 2);
        assert_eq!(moved.apply.len(), 1);
    }

    #[test]
    fn skipped_node_operations_are_every_slices_and_a_change_is_a_new_generation() {
        let devices: Vec<Device> = (0..130).map(|i| device(&format!("d{i}"))).collect();
        let mut template = PoolTemplate::new("d.akri.sh", "p", PoolScope::PerDevice);
        let state = applied(
            &super::plan(&template, &devices, &[] as &[ResourceSlice], 0),
            &[],
        );
        assert!(state.iter().all(|s| s.spec.skip_node_operations.is_none()));

        template.skip_node_operations = vec![SKIP_ALL_NODE_OPERATIONS.into()];
        let skipping = super::plan(&template, &devices, &state, 0);
        assert_eq!((skipping.generation, skipping.apply.len()), (2, 2));
        assert!(
            skipping
                .apply
                .iter()
                .all(|s| s.spec.skip_node_operations == Some(vec!["*".to_string()]))
        );
        let state = applied(&skipping, &state);
        assert!(super::plan(&template, &devices, &state, 0).apply.is_empty());
    }

    #[test]
    fn names_are_valid_object_names() {
        assert_eq!(
            slice_name("debugEcho.akri.sh", "Node_A", 0),
            "node-a-debugecho.akri.sh-0"
        );
        let long = slice_name(&"x".repeat(300), "p", 12);
        assert!(long.len() <= 253 && long.ends_with("-12"));
    }
}
