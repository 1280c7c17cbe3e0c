//! Preparing claims for containers: the Akri side of the DRA driver.
//!
//! For each device allocated to this driver the container gets, through one CDI spec per
//! claim: the device's discovered properties as environment variables (as Akri's agent does
//! for its brokers), its mounts and its device nodes, and the mounts of the claim's device
//! metadata files. The claim's `status.devices` gets an entry per device (configuration,
//! Instance, properties), removed again at unprepare.

use crate::node_devices::{KnownDevice, NodeDevices};
use dra_plugin::cdi::{self, CdiDevice, CdiRoot, DeviceNode, Mount};
use dra_plugin::checkpoint::PreparedClaim;
use dra_plugin::device_status::DeviceStatus;
use dra_plugin::metadata::DeviceMetadata;
use dra_plugin::{Claim, ClaimRef, Driver, Prepared};

/// Why an Akri device was not prepared or unprepared (the kubelet shows it in the pod's
/// events). Claims that are not allocated here never reach the driver: the library checks
/// them.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(
        "device {device} of claim {claim} is not available on node {node} (its discovery handler no longer reports it)"
    )]
    Gone {
        device: String,
        claim: ClaimRef,
        node: String,
    },
    #[error(transparent)]
    Spec(#[from] cdi::Error),
}

/// The DRA driver of one discovery handler on this node.
pub struct AkriDriver {
    pub driver: String,
    /// The CDI class: the handler name, lower-cased (`akri.sh/<class>=<device>`).
    pub cdi_class: String,
    pub cdi: CdiRoot,
    pub devices: NodeDevices,
}

impl Driver for AkriDriver {
    type Error = PrepareError;

    async fn prepare(&self, checked: &Claim) -> Result<Prepared, PrepareError> {
        let claim = &checked.reference;
        let results = &checked.results;

        // One CDI device per allocated device: a device with consumable capacity can be the
        // result of two requests of one claim, and both requests then get the same CDI id.
        let mut cdi_devices: Vec<CdiDevice> = Vec::new();
        let mut found: Vec<KnownDevice> = Vec::new();
        for result in results {
            if cdi_devices.iter().any(|d| d.name == result.device) {
                continue;
            }
            let known = self
                .devices
                .lookup(&self.driver, &result.device)
                .ok_or_else(|| PrepareError::Gone {
                    device: result.device.clone(),
                    claim: claim.clone(),
                    node: self.devices.node().to_string(),
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
            found.push(known);
        }
        // Each result's device among those written (two results can share a device).
        let devices: Vec<usize> = (results.iter())
            .map(|result| {
                (cdi_devices.iter())
                    .position(|d| d.name == result.device)
                    .expect("every result has its CDI device")
            })
            .collect();
        // With the mounts of the claim's device metadata files: one spec file per claim.
        let spec = checked.write_cdi_spec(&self.cdi, &self.cdi_class, cdi_devices)?;
        // Recorded and written by the library, off the kubelet's path.
        let status: Vec<DeviceStatus> = (results.iter().zip(&devices))
            .map(|(result, &index)| DeviceStatus {
                pool: result.pool.clone(),
                device: result.device.clone(),
                share_id: result.share_id.clone(),
                data: Some(status_data(&found[index])),
                conditions: Vec::new(),
            })
            .collect();
        let cdi_ids = (devices.iter())
            .map(|&index| vec![spec.qualified_ids[index].clone()])
            .collect();
        // What containers read in the device metadata file: what the slice shows.
        let metadata = (devices.iter())
            .map(|&index| device_metadata(&found[index]))
            .collect();
        Ok(Prepared {
            cdi_ids,
            cdi_spec_files: vec![spec.path],
            metadata,
            status,
        })
    }

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        prepared: Option<&PreparedClaim>,
    ) -> Result<(), PrepareError> {
        let files = match prepared {
            Some(prepared) => prepared.cdi_spec_files.clone(),
            // Not recorded: remove what a prepare interrupted before recording would have left.
            None => vec![self.cdi.spec_path(&self.cdi_class, &claim.uid)?],
        };
        for file in files {
            cdi::remove_claim_spec(&file)?;
        }
        Ok(())
    }
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

/// A device's metadata (the file its containers read at the standard path, KEP-5304): the
/// attributes its ResourceSlice publishes, less any property whose name says it holds a
/// credential ([`shown_property`]). The file is world-readable in the container; the
/// container's environment still has every property.
fn device_metadata(known: &KnownDevice) -> DeviceMetadata {
    let mut attributes = akri_devices::attributes(&akri_devices::InstanceDevice {
        instance: &known.instance,
        configuration: &known.configuration,
        capacity: 1,
        properties: &known.device.properties,
    });
    attributes.retain(|name, _| {
        let property = name.strip_prefix(akri_devices::PROPERTY_DOMAIN);
        property.is_none_or(|key| shown_property(key.trim_start_matches('/')))
    });
    DeviceMetadata {
        attributes,
        network_data: None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_metadata_is_what_the_slice_shows_without_credentials() {
        let known = KnownDevice {
            configuration: "cams".into(),
            instance: "cams-1a2b3c".into(),
            device: crate::discovery::DiscoveredDevice {
                id: "cam".into(),
                properties: [
                    ("ONVIF_DEVICE_IP_ADDRESS", "10.0.0.7"),
                    ("ONVIF_PASSWORD", "hunter2"),
                    ("API_TOKEN", "t0k3n"),
                    ("not a C identifier", "left out of slices too"),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
                mounts: Vec::new(),
                device_specs: Vec::new(),
            },
        };
        let metadata = device_metadata(&known);
        let names: Vec<&str> = metadata.attributes.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "akri.sh/configuration",
                "akri.sh/instance",
                "property.akri.sh/ONVIF_DEVICE_IP_ADDRESS"
            ]
        );
        assert_eq!(
            metadata.attributes["property.akri.sh/ONVIF_DEVICE_IP_ADDRESS"].string,
            Some("10.0.0.7".into())
        );
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
}
