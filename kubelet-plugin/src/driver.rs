//! Preparing claims for containers: the Akri side of the DRA driver.
//!
//! For each device allocated to this driver the container gets, through one CDI spec per
//! claim: the device's discovered properties as environment variables (as Akri's agent does
//! for its brokers), its mounts and its device nodes. The claim's `status.devices` gets an
//! entry per device (configuration, Instance, properties), removed again at unprepare.

use crate::node_devices::{KnownDevice, NodeDevices};
use dra_plugin::cdi::{self, CdiDevice, CdiRoot, DeviceNode, Mount};
use dra_plugin::checkpoint::{PreparedClaim, PreparedDevice};
use dra_plugin::device_status::{self, DeviceStatus};
use dra_plugin::service::{ClaimRef, Driver};
use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;

/// The DRA driver of one discovery handler on this node.
pub struct AkriDriver {
    pub driver: String,
    /// The CDI class: the handler name, lower-cased (`akri.sh/<class>=<device>`).
    pub cdi_class: String,
    pub client: kube::Client,
    pub cdi: CdiRoot,
    pub devices: NodeDevices,
}

#[tonic::async_trait]
impl Driver for AkriDriver {
    async fn prepare(&self, claim: &ClaimRef) -> Result<PreparedClaim, String> {
        let claims = Api::<ResourceClaim>::namespaced(self.client.clone(), &claim.namespace);
        let object = crate::api_call(claims.get(&claim.name))
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) if status.code == 404 => {
                    format!("claim {}/{} no longer exists", claim.namespace, claim.name)
                }
                e => format!("reading claim {}/{}: {e}", claim.namespace, claim.name),
            })?;
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(format!(
                "claim {}/{} was replaced (UID {:?}, the kubelet asked for {})",
                claim.namespace, claim.name, object.metadata.uid, claim.uid
            ));
        }
        let allocation = object
            .status
            .and_then(|s| s.allocation)
            .ok_or_else(|| format!("claim {}/{} is not allocated", claim.namespace, claim.name))?;
        if let Some(selector) = &allocation.node_selector
            && !selects_node(selector, self.devices.node())
        {
            return Err(format!(
                "claim {}/{} is allocated for other nodes, not {}",
                claim.namespace,
                claim.name,
                self.devices.node()
            ));
        }
        let results: Vec<_> = allocation
            .devices
            .and_then(|d| d.results)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.driver == self.driver)
            .collect();
        if results.is_empty() {
            return Err(format!(
                "claim {}/{} has no device of driver {}",
                claim.namespace, claim.name, self.driver
            ));
        }

        // One CDI device per allocated device: a device with consumable capacity can be the
        // result of two requests of one claim, and both requests then get the same CDI id.
        let mut cdi_devices: Vec<CdiDevice> = Vec::new();
        for result in &results {
            if cdi_devices.iter().any(|d| d.name == result.device) {
                continue;
            }
            let known = self.devices.lookup(&self.driver, &result.device).ok_or_else(|| {
                format!(
                    "device {} of claim {}/{} is not available on node {} (its discovery handler no longer reports it)",
                    result.device,
                    claim.namespace,
                    claim.name,
                    self.devices.node()
                )
            })?;
            cdi_devices.push(CdiDevice {
                name: result.device.clone(),
                env: known.device.properties.clone().into_iter().collect(),
                device_nodes: known
                    .device
                    .device_specs
                    .iter()
                    .map(|spec| DeviceNode {
                        path: spec.container_path.clone(),
                        host_path: Some(spec.host_path.clone()),
                        permissions: (!spec.permissions.is_empty())
                            .then(|| spec.permissions.clone()),
                    })
                    .collect(),
                mounts: known
                    .device
                    .mounts
                    .iter()
                    .map(|m| Mount {
                        container_path: m.container_path.clone(),
                        host_path: m.host_path.clone(),
                        read_only: m.read_only,
                    })
                    .collect(),
            });
        }
        let spec = self
            .cdi
            .write_claim_spec(&self.cdi_class, &claim.uid, &cdi_devices)
            .map_err(|e| format!("writing the CDI spec: {e}"))?;
        let statuses: Vec<DeviceStatus> = results
            .iter()
            .filter_map(|result| {
                let known = self.devices.lookup(&self.driver, &result.device)?;
                Some(DeviceStatus {
                    pool: result.pool.clone(),
                    device: result.device.clone(),
                    share_id: result.share_id.clone(),
                    data: Some(status_data(&known)),
                })
            })
            .collect();
        write_status(&self.client, &self.driver, claim, &statuses).await;
        Ok(PreparedClaim {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: results
                .iter()
                .map(|result| {
                    let index = cdi_devices
                        .iter()
                        .position(|d| d.name == result.device)
                        .expect("every result has its CDI device");
                    PreparedDevice {
                        request_names: vec![result.request.clone()],
                        pool_name: result.pool.clone(),
                        device_name: result.device.clone(),
                        cdi_device_ids: vec![spec.qualified_ids[index].clone()],
                        share_id: result.share_id.clone(),
                    }
                })
                .collect(),
            cdi_spec_files: vec![spec.path],
            cdi_spec_contents: Default::default(),
        })
    }

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        prepared: Option<&PreparedClaim>,
    ) -> Result<(), String> {
        let files = match prepared {
            Some(prepared) => prepared.cdi_spec_files.clone(),
            // Not recorded: remove what a prepare interrupted before recording would have left.
            None => vec![
                self.cdi
                    .spec_path(&self.cdi_class, &claim.uid)
                    .map_err(|e| e.to_string())?,
            ],
        };
        for file in files {
            cdi::remove_claim_spec(&file)
                .map_err(|e| format!("removing {}: {e}", file.display()))?;
        }
        // In the background: unprepare must not wait for the API server (the kubelet
        // unprepares through outages), and the claim is usually being deallocated, which
        // drops its device status anyway.
        let (client, driver, claim) = (self.client.clone(), self.driver.clone(), claim.clone());
        tokio::spawn(async move { write_status(&client, &driver, &claim, &[]).await });
        Ok(())
    }
}

/// How long a prepare waits for the claim's device status to be written: the claim was just
/// read, so the API server answers; if it stops, the container must not wait for a status.
const STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Makes `devices` the driver's entries in the claim's `status.devices`. For workloads and
/// operators only: a failure is logged and never fails the kubelet's call (the container gets
/// its device from the CDI spec either way).
async fn write_status(
    client: &kube::Client,
    driver: &str,
    claim: &ClaimRef,
    devices: &[DeviceStatus],
) {
    let target = device_status::Claim {
        namespace: &claim.namespace,
        name: &claim.name,
        uid: &claim.uid,
    };
    let apply = device_status::apply(client, target, driver, devices);
    let error = match tokio::time::timeout(STATUS_TIMEOUT, apply).await {
        Ok(Ok(())) => return,
        Ok(Err(error)) => error.to_string(),
        Err(_) => format!("no answer within {STATUS_TIMEOUT:?}"),
    };
    tracing::warn!(
        claim = %format!("{}/{}", claim.namespace, claim.name),
        driver,
        %error,
        "could not write the claim's device status"
    );
}

/// What a claim's `status.devices` entry says about an Akri device: its configuration,
/// Instance and the discovered properties that are safe to show (see [`shown_property`]).
fn status_data(known: &KnownDevice) -> serde_json::Value {
    let properties: serde_json::Map<String, serde_json::Value> = known
        .device
        .properties
        .iter()
        .filter(|(key, _)| shown_property(key))
        .map(|(key, value)| (key.clone(), value.clone().into()))
        .collect();
    serde_json::json!({
        "configuration": known.configuration,
        "instance": known.instance,
        "properties": properties,
    })
}

/// Whether a property may appear in a claim's status, which anyone who can read the claim
/// reads: not when a `_`-separated word of its name says it holds a credential (`PASSWORD`,
/// `ONVIF_SECRET`, `API_TOKEN`, `TLS_KEY`...). Containers still get every property.
pub fn shown_property(key: &str) -> bool {
    const CREDENTIAL_WORDS: [&str; 8] = [
        "PASSWORD",
        "PASSWD",
        "PASS",
        "SECRET",
        "TOKEN",
        "CREDENTIAL",
        "CREDENTIALS",
        "KEY",
    ];
    !key.to_ascii_uppercase()
        .split(['_', '-', '.'])
        .any(|word| CREDENTIAL_WORDS.contains(&word))
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

    fn selector(value: serde_json::Value) -> NodeSelector {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn credentials_stay_out_of_claim_status() {
        for hidden in [
            "PASSWORD",
            "onvif_password",
            "API_TOKEN",
            "TLS_KEY",
            "DB-PASS",
            "x.secret",
        ] {
            assert!(!shown_property(hidden), "{hidden}");
        }
        for shown in [
            "ONVIF_DEVICE_IP_ADDRESS",
            "DEBUG_ECHO_DESCRIPTION",
            "KEYBOARD_LAYOUT",
            "PASSAGE",
        ] {
            assert!(shown_property(shown), "{shown}");
        }
    }

    #[test]
    fn node_selectors_name_nodes_by_field_or_hostname() {
        let by_field = selector(serde_json::json!({ "nodeSelectorTerms": [{
            "matchFields": [{ "key": "metadata.name", "operator": "In", "values": ["a"] }] }] }));
        assert!(selects_node(&by_field, "a"));
        assert!(!selects_node(&by_field, "b"));
        let by_label = selector(serde_json::json!({ "nodeSelectorTerms": [
            { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": ["b"] }] },
            { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": ["c"] }] },
        ] }));
        assert!(selects_node(&by_label, "c"));
        assert!(!selects_node(&by_label, "a"));
        let other = selector(serde_json::json!({ "nodeSelectorTerms": [{
            "matchExpressions": [{ "key": "zone", "operator": "In", "values": ["z1"] }] }] }));
        assert!(
            selects_node(&other, "a"),
            "a term naming no node admits any node"
        );
    }
}
