//! What the controller's stores keep of each object: what reconciling reads, not the object.
//! Every Kubernetes map allocates a whole B-tree node however few its entries, and a `Device`
//! with its attribute and capacity maps takes kilobytes: with 10,000 shared devices and
//! Instances the whole objects were most of the controller's memory.
//!
//! A ResourceSlice is kept as a [`SliceView`]: enough to find its configurations, count
//! node-local devices and compare a shared pool with what a pass plans (10,000 devices held as
//! `ResourceSlice`s were 53 MB of the heap; as JSON, a tenth).

use super::device_configuration;
use akri_api::v1::Instance;
use dra_plugin::slices::{StoredSlice, carries_labels};
use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, AllocationResult, Device, DeviceAllocationResult, ResourceClaim,
    ResourceClaimStatus, ResourceSlice, ResourceSliceSpec,
};
use kube::api::ObjectMeta;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// A stored ResourceSlice, compact. Slices of drivers other than Akri's keep only their
/// identity: nothing here reads them.
#[derive(Clone, Debug)]
pub struct SliceView {
    /// Name, labels, UID and resource version only.
    metadata: ObjectMeta,
    pub driver: String,
    pub pool: String,
    pub generation: i64,
    /// The pool-wide node selector, if any.
    pub node_selector: Option<NodeSelector>,
    /// Each device's name and its configuration (the `configuration` attribute).
    pub devices: Vec<(String, Option<String>)>,
    /// The whole spec as JSON: what a pass's planned slice is compared with, and where a
    /// pool's devices are read back from when a process meets the pool.
    spec: Box<str>,
}

impl From<ResourceSlice> for SliceView {
    fn from(slice: ResourceSlice) -> Self {
        let ours = is_akri_driver(&slice.spec.driver);
        let metadata = ObjectMeta {
            name: slice.metadata.name,
            uid: slice.metadata.uid,
            resource_version: slice.metadata.resource_version,
            labels: slice.metadata.labels,
            ..ObjectMeta::default()
        };
        let (devices, spec) = if ours {
            let devices = slice
                .spec
                .devices
                .iter()
                .flatten()
                .map(|d| (d.name.clone(), device_configuration(d).map(str::to_string)))
                .collect();
            (devices, json(&slice.spec))
        } else {
            (Vec::new(), Box::default())
        };
        SliceView {
            metadata,
            driver: slice.spec.driver,
            pool: slice.spec.pool.name,
            generation: slice.spec.pool.generation,
            node_selector: slice.spec.node_selector,
            devices,
            spec,
        }
    }
}

/// Read as the ResourceSlice it views (the controller runtime's watches ask for it).
impl<'de> serde::Deserialize<'de> for SliceView {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ResourceSlice::deserialize(deserializer).map(SliceView::from)
    }
}

/// Whether `driver` is one of Akri's (`<handler>.akri.sh`).
pub fn is_akri_driver(driver: &str) -> bool {
    driver.ends_with(&format!(".{}", akri_devices::DRIVER_DOMAIN))
}

fn json(spec: &ResourceSliceSpec) -> Box<str> {
    serde_json::to_string(spec)
        .unwrap_or_default()
        .into_boxed_str()
}

impl StoredSlice for SliceView {
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }

    fn generation(&self) -> i64 {
        self.generation
    }

    /// The same JSON is the same spec: both sides are serialized from the same types (the
    /// stored one after the API server's defaulting, which a planned slice already matches
    /// or it would be rewritten every pass either way).
    fn is(&self, want: &ResourceSlice) -> bool {
        carries_labels(self.metadata.labels.as_ref(), want) && *json(&want.spec) == *self.spec
    }

    fn devices(&self) -> Vec<Device> {
        serde_json::from_str::<ResourceSliceSpec>(&self.spec)
            .ok()
            .and_then(|spec| spec.devices)
            .unwrap_or_default()
    }
}

impl kube::Resource for SliceView {
    type DynamicType = ();
    type Scope = kube::core::ClusterResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        ResourceSlice::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        ResourceSlice::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        ResourceSlice::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        ResourceSlice::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the controller reads of an Instance: its identity (for the conditional writes of
/// `gone_nodes`) and the spec's configuration, properties, sharing and nodes. Its labels, owner
/// and legacy slot usage go: each map allocates a whole B-tree node, and with 10,000
/// Instances they were a fifth of the store.
pub(super) fn slim_instance(instance: Instance) -> Instance {
    Instance {
        metadata: identity(instance.metadata),
        spec: akri_api::v0::InstanceSpec {
            device_usage: BTreeMap::new(),
            cdi_name: String::new(),
            ..instance.spec
        },
    }
}

/// What the controller reads of a ResourceClaim: the devices allocated to it; and, while
/// one of them waits for a binding check, the chosen node and the devices' status entries
/// (their conditions only), to route the check to that node (`binding_routes.rs`).
pub(super) fn slim_claim(claim: ResourceClaim) -> ResourceClaim {
    let waiting = !akri_devices::binding::waiting_results(&claim).is_empty();
    let Some(status) = claim.status else {
        return ResourceClaim {
            metadata: identity(claim.metadata),
            ..Default::default()
        };
    };
    let allocation = status.allocation;
    let node_selector = allocation
        .as_ref()
        .and_then(|a| a.node_selector.clone())
        .filter(|_| waiting);
    let results = allocation.and_then(|a| a.devices).and_then(|d| d.results);
    let devices = status.devices.filter(|_| waiting).map(|entries| {
        (entries.into_iter())
            .map(|entry| AllocatedDeviceStatus {
                data: None,
                network_data: None,
                ..entry
            })
            .collect()
    });
    ResourceClaim {
        metadata: identity(claim.metadata),
        spec: Default::default(),
        status: results.map(|results| ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    ..Default::default()
                }),
                node_selector,
                ..Default::default()
            }),
            devices,
            ..Default::default()
        }),
    }
}

/// An object's name, namespace, UID and resource version: what a store needs of its metadata
/// (and a conditional write of its UID and version).
fn identity(metadata: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        uid: metadata.uid,
        resource_version: metadata.resource_version,
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourcePool};

    fn slice(driver: &str, devices: &[&str]) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some("s".into()),
                labels: Some([("a".to_string(), "1".to_string())].into()),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                driver: driver.into(),
                pool: ResourcePool {
                    name: "p".into(),
                    generation: 3,
                    resource_slice_count: 1,
                },
                devices: Some(
                    devices
                        .iter()
                        .map(|name| Device {
                            name: name.to_string(),
                            attributes: Some(
                                [(
                                    akri_devices::ATTR_CONFIGURATION.to_string(),
                                    DeviceAttribute {
                                        string: Some("cams".into()),
                                        ..DeviceAttribute::default()
                                    },
                                )]
                                .into(),
                            ),
                            ..Device::default()
                        })
                        .collect(),
                ),
                ..ResourceSliceSpec::default()
            },
        }
    }

    #[test]
    fn a_view_is_the_slice_it_was_made_of_and_not_one_that_differs() {
        let full = slice("udev.akri.sh", &["a", "b"]);
        let view = SliceView::from(full.clone());
        assert!(view.is(&full));
        assert_eq!(view.devices(), full.spec.devices.clone().unwrap());
        assert_eq!(
            view.devices,
            [
                ("a".to_string(), Some("cams".to_string())),
                ("b".to_string(), Some("cams".to_string()))
            ]
        );
        assert!(!view.is(&slice("udev.akri.sh", &["a"])));
        let mut other_label = full.clone();
        other_label.metadata.labels = Some([("a".to_string(), "2".to_string())].into());
        assert!(!view.is(&other_label));
        // Labels others add are theirs: a planned slice with fewer labels is the same.
        let mut fewer_labels = full;
        fewer_labels.metadata.labels = None;
        assert!(view.is(&fewer_labels));
    }

    #[test]
    fn other_drivers_slices_keep_only_their_identity() {
        let view = SliceView::from(slice("gpu.example.com", &["a"]));
        assert_eq!(view.name(), Some("s"));
        assert!(view.devices.is_empty());
        assert!(view.devices().is_empty());
    }
}
