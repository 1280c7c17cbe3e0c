//! Which optional resource.k8s.io/v1 fields this API server keeps.
//!
//! An API server whose feature gate for a field is off does not reject objects that carry it:
//! it silently drops the field (or, when the field was the only one of a required choice,
//! rejects the object as incomplete). Version numbers do not tell which gates an operator
//! turned on or off, so a driver asks the server itself: it creates probe objects with
//! `dryRun=All` and reads back what the server would have stored. Nothing is persisted.

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, DeviceClass, DeviceClassSpec, DeviceTaint,
    ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;

/// Errors of probing the API server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A dry-run create failed other than by the server refusing the object as invalid (422).
    #[error("probing the API server with a dry-run {kind}: {cause}")]
    Probe {
        /// The kind of the probe object: `ResourceSlice` or `DeviceClass`.
        kind: &'static str,
        /// The API server's error.
        cause: kube::Error,
    },
    /// Asking which resources `resource.k8s.io/v1` serves failed other than by a 404.
    #[error("asking the API server whether it serves resource.k8s.io/v1: {cause}")]
    Discovery {
        /// The API server's error.
        cause: kube::Error,
    },
}

/// The optional DRA fields the API server keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApiSupport {
    /// Devices with `allowMultipleAllocations` and consumable `capacity` (DRAConsumableCapacity).
    pub consumable_capacity: bool,
    /// Slices with `perDeviceNodeSelection`, each device naming its nodes (DRAPartitionableDevices).
    pub per_device_node_selection: bool,
    /// DeviceClasses with `extendedResourceName` (DRAExtendedResource).
    pub extended_resource_name: bool,
    /// Devices with `taints` (DRADeviceTaints).
    pub device_taints: bool,
    /// Devices with `bindsToNode`, `bindingConditions` and `bindingFailureConditions`
    /// (DRADeviceBindingConditions with DRAResourceClaimDeviceStatus).
    pub binding_conditions: bool,
    /// Slices with `skipNodeOperations`, so the kubelet need not call the driver's plugin for
    /// their devices (DRAOptionalNodeOperations, alpha in 1.37). The API server keeping the
    /// field does not say which nodes declare the feature: the scheduler places a pod whose
    /// claim skips them only on a node that does (`status.declaredFeatures`).
    pub optional_node_operations: bool,
}

/// Name of the probe objects (never stored: every request is a dry run).
const PROBE_NAME: &str = "dra-plugin-api-support-probe";

impl ApiSupport {
    /// Asks the API server. Needs `create` on resourceslices and deviceclasses.
    pub async fn detect(client: &kube::Client) -> Result<Self, Error> {
        Ok(ApiSupport {
            consumable_capacity: consumable_capacity(client).await?,
            per_device_node_selection: per_device_node_selection(client).await?,
            extended_resource_name: extended_resource_name(client).await?,
            device_taints: device_taints(client).await?,
            binding_conditions: binding_conditions(client).await?,
            optional_node_operations: optional_node_operations(client).await?,
        })
    }
}

/// Whether the API server serves `resource.k8s.io/v1` ResourceSlices at all: not where DRA is
/// off (Kubernetes 1.33 and older by default, or an operator's choice), where every other
/// probe here would fail with a 404. Reads the API discovery document; needs no permission
/// beyond an authenticated client's.
pub async fn serves_v1(client: &kube::Client) -> Result<bool, Error> {
    match client.list_api_group_resources("resource.k8s.io/v1").await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "resourceslices")),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(cause) => Err(Error::Discovery { cause }),
    }
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// Whether devices keep `allowMultipleAllocations` and `capacity`. Needs `create` on
/// resourceslices.
pub async fn consumable_capacity(client: &kube::Client) -> Result<bool, Error> {
    let slices = Api::<ResourceSlice>::all(client.clone());
    let stored = create_or_rejected(
        &slices,
        &dry_run(),
        &probe_slice(false, true),
        "ResourceSlice",
    )
    .await?;
    Ok(stored
        .and_then(|s| s.spec.devices)
        .and_then(|d| d.into_iter().next())
        .is_some_and(|d| d.allow_multiple_allocations == Some(true) && d.capacity.is_some()))
}

/// Whether slices keep `perDeviceNodeSelection`. With the gate off the server drops it and
/// the device's selector, then rejects the slice for naming no nodes at all. Needs `create`
/// on resourceslices.
pub(crate) async fn per_device_node_selection(client: &kube::Client) -> Result<bool, Error> {
    let slices = Api::<ResourceSlice>::all(client.clone());
    let stored = create_or_rejected(
        &slices,
        &dry_run(),
        &probe_slice(true, false),
        "ResourceSlice",
    )
    .await?;
    Ok(stored.is_some_and(|s| {
        s.spec.per_device_node_selection == Some(true)
            && s.spec
                .devices
                .and_then(|d| d.into_iter().next())
                .is_some_and(|d| d.node_selector.is_some())
    }))
}

/// Whether devices keep `taints` (and so whether the device-taint eviction controller can act
/// on them). Needs `create` on resourceslices.
pub async fn device_taints(client: &kube::Client) -> Result<bool, Error> {
    let slices = Api::<ResourceSlice>::all(client.clone());
    let mut slice = probe_slice(false, false);
    if let Some(device) = slice.spec.devices.as_mut().and_then(|d| d.first_mut()) {
        device.taints = Some(vec![DeviceTaint {
            key: "dra-plugin.probe/api-support".into(),
            effect: "NoSchedule".into(),
            ..DeviceTaint::default()
        }]);
    }
    let stored = create_or_rejected(&slices, &dry_run(), &slice, "ResourceSlice").await?;
    Ok(stored
        .and_then(|s| s.spec.devices)
        .and_then(|d| d.into_iter().next())
        .is_some_and(|d| d.taints.is_some_and(|t| !t.is_empty())))
}

/// Whether devices keep `bindsToNode` and their binding conditions (so whether the scheduler
/// waits for them before binding). Needs `create` on resourceslices.
pub async fn binding_conditions(client: &kube::Client) -> Result<bool, Error> {
    let slices = Api::<ResourceSlice>::all(client.clone());
    let mut slice = probe_slice(false, false);
    if let Some(device) = slice.spec.devices.as_mut().and_then(|d| d.first_mut()) {
        device.binds_to_node = Some(true);
        device.binding_conditions = Some(vec!["dra-plugin.probe/Ready".into()]);
        device.binding_failure_conditions = Some(vec!["dra-plugin.probe/Failed".into()]);
    }
    let stored = create_or_rejected(&slices, &dry_run(), &slice, "ResourceSlice").await?;
    Ok(stored
        .and_then(|s| s.spec.devices)
        .and_then(|d| d.into_iter().next())
        .is_some_and(|d| {
            d.binds_to_node == Some(true) && d.binding_conditions.is_some_and(|c| !c.is_empty())
        }))
}

/// Whether slices keep `skipNodeOperations`. Needs `create` on resourceslices.
pub(crate) async fn optional_node_operations(client: &kube::Client) -> Result<bool, Error> {
    let slices = Api::<ResourceSlice>::all(client.clone());
    let mut slice = probe_slice(false, false);
    slice.spec.skip_node_operations = Some(vec![crate::slices::SKIP_ALL_NODE_OPERATIONS.into()]);
    let stored = create_or_rejected(&slices, &dry_run(), &slice, "ResourceSlice").await?;
    Ok(stored.is_some_and(|s| s.spec.skip_node_operations.is_some_and(|o| !o.is_empty())))
}

/// Whether DeviceClasses keep `extendedResourceName`. Needs `create` on deviceclasses.
pub(crate) async fn extended_resource_name(client: &kube::Client) -> Result<bool, Error> {
    let classes = Api::<DeviceClass>::all(client.clone());
    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some(PROBE_NAME.into()),
            ..ObjectMeta::default()
        },
        spec: Some(DeviceClassSpec {
            extended_resource_name: Some("dra-plugin.probe/api-support".into()),
            ..DeviceClassSpec::default()
        }),
    };
    let stored = create_or_rejected(&classes, &dry_run(), &class, "DeviceClass").await?;
    Ok(stored.is_some_and(|c| c.spec.is_some_and(|s| s.extended_resource_name.is_some())))
}

/// What the server would store, or `None` when it rejects the object as invalid (a field it
/// does not know left the object incomplete).
async fn create_or_rejected<K>(
    api: &Api<K>,
    params: &PostParams,
    object: &K,
    kind: &'static str,
) -> Result<Option<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(params, object).await {
        Ok(stored) => Ok(Some(stored)),
        Err(kube::Error::Api(status)) if status.code == 422 => Ok(None),
        Err(cause) => Err(Error::Probe { kind, cause }),
    }
}

fn probe_slice(per_device_node_selection: bool, consumable: bool) -> ResourceSlice {
    let mut device = Device {
        name: "probe".into(),
        attributes: Some(BTreeMap::from([(
            "probe".to_string(),
            DeviceAttribute {
                bool: Some(true),
                ..DeviceAttribute::default()
            },
        )])),
        ..Device::default()
    };
    if consumable {
        device.allow_multiple_allocations = Some(true);
        device.capacity = Some(BTreeMap::from([(
            "slots".to_string(),
            DeviceCapacity {
                value: Quantity("2".into()),
                request_policy: None,
            },
        )]));
    }
    if per_device_node_selection {
        device.node_selector = Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(vec!["probe".into()]),
                }]),
                match_expressions: None,
            }],
        });
    }
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(PROBE_NAME.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: "probe.dra-plugin.invalid".into(),
            pool: ResourcePool {
                name: "probe".into(),
                generation: 1,
                resource_slice_count: 1,
            },
            all_nodes: (!per_device_node_selection).then_some(true),
            per_device_node_selection: per_device_node_selection.then_some(true),
            devices: Some(vec![device]),
            ..ResourceSliceSpec::default()
        },
    }
}
