//! The claim a driver prepares: read from the API server and checked by the library, so a
//! driver sees only a claim that is really allocated, to this node, with devices of its own.
//!
//! The kubelet names a claim by namespace, name and UID. Between the scheduler's allocation
//! and the kubelet's call the claim may have been deleted, or deleted and created again under
//! the same name (another UID, another allocation): preparing what the name holds now would
//! hand a pod devices allocated to someone else. So the UID must match, the claim must be
//! allocated, its allocation must admit this node, and it must hold a device of this driver.

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, DeviceRequestAllocationResult, ResourceClaim,
};
use kube::api::Api;

/// A claim as the kubelet names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The UID the kubelet expects: a claim of that name with another UID is another claim.
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A claim to prepare, as the library read and checked it.
#[derive(Clone, Debug)]
pub struct Claim {
    /// How the kubelet named it.
    pub reference: ClaimRef,
    /// The object as read (for anything the driver wants beyond its results).
    pub object: ResourceClaim,
    /// This driver's allocation results, in the allocation's order: never empty. A result of
    /// a `firstAvailable` subrequest names it `request/subrequest`
    /// ([`base_request_name`](crate::service::base_request_name) gives the request).
    pub results: Vec<DeviceRequestAllocationResult>,
    /// The allocation's configurations that concern this driver: opaque parameters addressed
    /// to it, from the claim and from its device classes, in precedence order (class before
    /// claim, as upstream applies them).
    pub config: Vec<DeviceAllocationConfiguration>,
    /// The CDI devices that mount the claim's device metadata files, when the plugin writes
    /// device metadata ([`crate::metadata`]); [`Claim::write_cdi_spec`] puts them in the
    /// driver's spec.
    pub(crate) metadata_mounts: Vec<crate::cdi::CdiDevice>,
    /// Their CDI ids, once a spec holds them.
    pub(crate) metadata_ids: std::sync::OnceLock<Vec<String>>,
}

/// What only the driver knows of a claim it prepared; the library makes the
/// [`PreparedClaim`](crate::PreparedClaim) record (the kubelet's answer, the checkpoint) from
/// it and the claim.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prepared {
    /// The CDI device ids the containers get for each of the claim's results, in
    /// [`Claim::results`] order.
    pub cdi_ids: Vec<Vec<String>>,
    /// The CDI spec files written for the claim: unprepare gets them back, and a prepare after
    /// a reboot that wiped them writes them again from what they held.
    pub cdi_spec_files: Vec<std::path::PathBuf>,
    /// What the containers read about each result's device in its metadata file, in
    /// [`Claim::results`] order (fewer entries: the rest get none), when the plugin writes
    /// device metadata ([`Builder::device_metadata`](crate::Builder::device_metadata)).
    pub metadata: Vec<crate::metadata::DeviceMetadata>,
    /// The driver's entries for the claim's `status.devices` (none: nothing is written). The
    /// library records them with the claim and writes them off the kubelet's path
    /// ([`device_status::Writer`](crate::device_status::Writer)); a process that dies before
    /// they are applied leaves them to the next one, which applies what the checkpoint holds.
    /// Unprepare removes them.
    pub status: Vec<crate::device_status::DeviceStatus>,
}

impl Prepared {
    /// One spec with one CDI device per result, in the results' order (as
    /// [`CdiRoot::write_claim_spec`](crate::cdi::CdiRoot::write_claim_spec) wrote it).
    pub fn one_spec(spec: crate::cdi::ClaimSpec) -> Prepared {
        Prepared {
            cdi_ids: spec.qualified_ids.into_iter().map(|id| vec![id]).collect(),
            cdi_spec_files: vec![spec.path],
            metadata: Vec::new(),
            status: Vec::new(),
        }
    }
}

impl Claim {
    /// Writes the claim's spec of kind `<vendor>/<class>` in `root` with `devices`
    /// ([`CdiRoot::write_claim_spec`](crate::cdi::CdiRoot::write_claim_spec)), and with the
    /// mounts of the claim's device metadata files when the plugin writes them: one spec file
    /// per claim, where a driver that writes its own spec otherwise gets a second one from the
    /// library (every file is an inode made and freed on the kubelet's path, and one more spec
    /// for the runtime's CDI cache to read). The ids returned are those of `devices`, in order.
    pub fn write_cdi_spec(
        &self,
        root: &crate::cdi::CdiRoot,
        class: &str,
        mut devices: Vec<crate::cdi::CdiDevice>,
    ) -> Result<crate::cdi::ClaimSpec, crate::cdi::Error> {
        let own = devices.len();
        devices.extend(self.metadata_mounts.iter().cloned());
        let mut spec = root.write_claim_spec(class, &self.reference.uid, &devices)?;
        let metadata_ids = spec.qualified_ids.split_off(own);
        if !metadata_ids.is_empty() {
            // Set once per prepare: a driver writing its spec twice writes the same ids.
            let _ = self.metadata_ids.set(metadata_ids);
        }
        Ok(spec)
    }

    /// The record of this claim prepared as `prepared` says, or (a driver's mistake) how many
    /// results it had and how many lists of CDI ids came back.
    pub(crate) fn record(
        &self,
        prepared: Prepared,
    ) -> Result<crate::PreparedClaim, (usize, usize)> {
        if prepared.cdi_ids.len() != self.results.len() {
            return Err((self.results.len(), prepared.cdi_ids.len()));
        }
        let devices = (self.results.iter().zip(prepared.cdi_ids))
            .map(|(result, cdi_device_ids)| crate::PreparedDevice {
                request_names: vec![result.request.clone()],
                pool_name: result.pool.clone(),
                device_name: result.device.clone(),
                cdi_device_ids,
                share_id: result.share_id.clone(),
            })
            .collect();
        Ok(crate::PreparedClaim {
            uid: self.reference.uid.clone(),
            namespace: self.reference.namespace.clone(),
            name: self.reference.name.clone(),
            devices,
            cdi_spec_files: prepared.cdi_spec_files,
            cdi_spec_contents: Default::default(),
            metadata_files: Vec::new(),
            status: prepared.status,
        })
    }
}

/// Why a claim is not prepared before the driver is even asked. The text is what the kubelet
/// shows in the pod's events.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The claim is gone (the pod's claim was deleted, or the pod with it).
    #[error("claim {0} no longer exists")]
    NotFound(ClaimRef),
    /// A claim of that name exists, but it is another one.
    #[error("claim {claim} was replaced (UID {found:?}, the kubelet asked for {})", claim.uid)]
    Replaced {
        /// The claim the kubelet asked for.
        claim: ClaimRef,
        /// The UID the API server has under that name.
        found: Option<String>,
    },
    /// The claim has no allocation (the kubelet should not ask; an admin may have cleared it).
    #[error("claim {0} is not allocated")]
    NotAllocated(ClaimRef),
    /// The allocation's node selector does not admit this node.
    #[error("claim {claim} is allocated for other nodes, not {node}")]
    OtherNode {
        /// The claim.
        claim: ClaimRef,
        /// This node.
        node: String,
    },
    /// The allocation holds no device of this driver.
    #[error("claim {claim} has no device of driver {driver}")]
    NoDevices {
        /// The claim.
        claim: ClaimRef,
        /// This driver.
        driver: String,
    },
    /// The API server did not answer the read.
    #[error("reading claim {claim}: {cause}")]
    Read {
        /// The claim.
        claim: ClaimRef,
        /// What the client said.
        cause: Box<kube::Error>,
    },
}

/// Where claims are read from: the API server ([`kube::Client`]), or, in tests of the gRPC
/// service alone, anything else that produces claims.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim stored under `claim`'s namespace and name, whatever its UID.
    async fn read(&self, claim: &ClaimRef) -> Result<ResourceClaim, kube::Error>;
}

#[tonic::async_trait]
impl ClaimSource for kube::Client {
    async fn read(&self, claim: &ClaimRef) -> Result<ResourceClaim, kube::Error> {
        Api::<ResourceClaim>::namespaced(self.clone(), &claim.namespace)
            .get(&claim.name)
            .await
    }
}

/// A source shared (the builder's, when one is given).
#[tonic::async_trait]
impl ClaimSource for std::sync::Arc<dyn ClaimSource> {
    async fn read(&self, claim: &ClaimRef) -> Result<ResourceClaim, kube::Error> {
        self.as_ref().read(claim).await
    }
}

/// How long one read may take: the kubelet's own call has a deadline (about 45 s), and a
/// prepare that waits for an unreachable API server should fail in time to be retried.
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Reads `claim` from `source` and checks it for `driver` on `node`.
pub(crate) async fn read_and_check(
    source: &dyn ClaimSource,
    claim: &ClaimRef,
    driver: &str,
    node: &str,
) -> Result<Claim, ClaimError> {
    let object = match tokio::time::timeout(READ_TIMEOUT, source.read(claim)).await {
        Ok(Ok(object)) => object,
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => {
            return Err(ClaimError::NotFound(claim.clone()));
        }
        Ok(Err(source)) => {
            return Err(ClaimError::Read {
                claim: claim.clone(),
                cause: Box::new(source),
            });
        }
        Err(elapsed) => {
            return Err(ClaimError::Read {
                claim: claim.clone(),
                cause: Box::new(kube::Error::Service(Box::new(elapsed))),
            });
        }
    };
    check(object, claim, driver, node)
}

/// The checks of [`read_and_check`] on a claim already read. Pure, so unit-tested.
pub(crate) fn check(
    object: ResourceClaim,
    claim: &ClaimRef,
    driver: &str,
    node: &str,
) -> Result<Claim, ClaimError> {
    if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
        return Err(ClaimError::Replaced {
            claim: claim.clone(),
            found: object.metadata.uid.clone(),
        });
    }
    let Some(allocation) = object.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(ClaimError::NotAllocated(claim.clone()));
    };
    if let Some(selector) = &allocation.node_selector
        && !selects_node(selector, node)
    {
        return Err(ClaimError::OtherNode {
            claim: claim.clone(),
            node: node.to_string(),
        });
    }
    let devices = allocation.devices.as_ref();
    let results: Vec<_> = devices
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.driver == driver)
        .cloned()
        .collect();
    if results.is_empty() {
        return Err(ClaimError::NoDevices {
            claim: claim.clone(),
            driver: driver.to_string(),
        });
    }
    let mut config: Vec<_> = devices
        .and_then(|d| d.config.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.opaque.as_ref().is_some_and(|o| o.driver == driver))
        .cloned()
        .collect();
    // Class configuration first: a claim's own configuration overrides its class's.
    config.sort_by_key(|c| c.source != "FromClass");
    Ok(Claim {
        reference: claim.clone(),
        object,
        results,
        config,
        metadata_mounts: Vec::new(),
        metadata_ids: Default::default(),
    })
}

/// Whether an allocation's node selector admits `node`, as far as it names nodes: by the
/// `metadata.name` field or the `kubernetes.io/hostname` label (what the scheduler writes).
/// Terms are ORed; a term naming no node admits every node.
pub fn selects_node(selector: &NodeSelector, node: &str) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let fields = term
            .match_fields
            .iter()
            .flatten()
            .filter(|r| r.key == "metadata.name");
        let labels = term
            .match_expressions
            .iter()
            .flatten()
            .filter(|r| r.key == "kubernetes.io/hostname");
        fields.chain(labels).all(|requirement| {
            let listed = requirement.values.iter().flatten().any(|v| v == node);
            match requirement.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => true,
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_record_pairs_each_result_with_its_cdi_ids_and_refuses_a_miscount() {
        let result = |request: &str, device: &str| DeviceRequestAllocationResult {
            request: request.into(),
            driver: "d".into(),
            pool: "node-a".into(),
            device: device.into(),
            share_id: (device == "shared").then(|| "s1".into()),
            ..Default::default()
        };
        let claim = Claim {
            reference: reference(),
            object: ResourceClaim::default(),
            results: vec![result("a", "dev-0"), result("b/sub", "shared")],
            config: Vec::new(),
            metadata_mounts: Vec::new(),
            metadata_ids: Default::default(),
        };
        let answer = |ids: &[&str]| Prepared {
            cdi_ids: ids.iter().map(|id| vec![id.to_string()]).collect(),
            cdi_spec_files: vec!["/cdi/spec.json".into()],
            ..Prepared::default()
        };
        let record = claim.record(answer(&["v/k=0", "v/k=1"])).unwrap();
        assert_eq!((record.uid.as_str(), record.name.as_str()), ("u1", "c"));
        assert_eq!(
            record.cdi_spec_files,
            vec![std::path::PathBuf::from("/cdi/spec.json")]
        );
        let devices: Vec<_> = (record.devices.iter())
            .map(|d| {
                (
                    d.request_names.join(","),
                    d.device_name.as_str(),
                    d.cdi_device_ids.join(","),
                    d.share_id.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            devices,
            [
                ("a".to_string(), "dev-0", "v/k=0".to_string(), None),
                (
                    "b/sub".to_string(),
                    "shared",
                    "v/k=1".to_string(),
                    Some("s1")
                ),
            ]
        );
        assert_eq!(claim.record(answer(&["v/k=0"])), Err((2, 1)));
    }

    fn selector(value: serde_json::Value) -> NodeSelector {
        serde_json::from_value(value).unwrap()
    }

    fn reference() -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u1".into(),
        }
    }

    fn claim(uid: &str, allocation: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": { "name": "c", "namespace": "ns", "uid": uid },
            "spec": {},
            "status": { "allocation": allocation },
        }))
        .unwrap()
    }

    #[test]
    fn node_selectors_name_nodes_by_field_or_hostname() {
        let by_field = selector(json!({ "nodeSelectorTerms": [{
            "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["a"] }] }] }));
        assert!(selects_node(&by_field, "a"));
        assert!(!selects_node(&by_field, "b"));
        let by_label = selector(json!({ "nodeSelectorTerms": [
            { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": ["b"] }] },
            { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": ["c"] }] },
        ] }));
        assert!(selects_node(&by_label, "c"));
        assert!(!selects_node(&by_label, "a"));
        let other = selector(json!({ "nodeSelectorTerms": [{
            "matchExpressions": [{ "key": "zone", "operator": "In", "values": ["z1"] }] }] }));
        assert!(
            selects_node(&other, "a"),
            "a term naming no node admits any node"
        );
    }

    #[test]
    fn the_driver_gets_only_its_results_and_configuration_class_first() {
        let object = claim(
            "u1",
            json!({
                "devices": {
                    "results": [
                        { "request": "a/gpu", "driver": "mine.example.com", "pool": "p", "device": "d1" },
                        { "request": "b", "driver": "other.example.com", "pool": "p", "device": "d2" },
                        { "request": "c", "driver": "mine.example.com", "pool": "p", "device": "d3" },
                    ],
                    "config": [
                        { "source": "FromClaim", "opaque": { "driver": "mine.example.com", "parameters": { "claim": 1 } } },
                        { "source": "FromClaim", "opaque": { "driver": "other.example.com", "parameters": {} } },
                        { "source": "FromClass", "opaque": { "driver": "mine.example.com", "parameters": { "class": 1 } } },
                    ],
                },
            }),
        );
        let checked = check(object, &reference(), "mine.example.com", "n").unwrap();
        let devices: Vec<_> = checked.results.iter().map(|r| r.device.as_str()).collect();
        assert_eq!(devices, ["d1", "d3"]);
        assert_eq!(checked.results[0].request, "a/gpu");
        let sources: Vec<_> = checked.config.iter().map(|c| c.source.as_str()).collect();
        assert_eq!(sources, ["FromClass", "FromClaim"]);
    }

    #[test]
    fn a_claim_is_refused_for_another_uid_no_allocation_another_node_or_no_devices() {
        let ours = json!({ "devices": { "results": [
            { "request": "r", "driver": "mine.example.com", "pool": "p", "device": "d" } ] } });
        let replaced = check(
            claim("u2", ours.clone()),
            &reference(),
            "mine.example.com",
            "n",
        );
        assert!(
            matches!(replaced, Err(ClaimError::Replaced { found: Some(ref u), .. }) if u == "u2")
        );

        let mut unallocated = claim("u1", ours.clone());
        unallocated.status = None;
        let error = check(unallocated, &reference(), "mine.example.com", "n").unwrap_err();
        assert_eq!(error.to_string(), "claim ns/c is not allocated");

        let mut elsewhere = ours.clone();
        elsewhere["nodeSelector"] = json!({ "nodeSelectorTerms": [{
            "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["m"] }] }] });
        let error = check(
            claim("u1", elsewhere),
            &reference(),
            "mine.example.com",
            "n",
        );
        assert!(matches!(error, Err(ClaimError::OtherNode { .. })));

        let error = check(claim("u1", ours), &reference(), "theirs.example.com", "n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "claim ns/c has no device of driver theirs.example.com"
        );
    }
}
