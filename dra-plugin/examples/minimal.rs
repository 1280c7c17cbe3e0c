//! A complete DRA driver on `dra-plugin`: the node has a few "gadgets"; a container that
//! claims one gets `GADGET_<NAME>=<name>` in its environment, through a CDI spec.
//!
//! Everything else (registration with the kubelet, both DRA gRPC versions, the health stream,
//! reading and checking each claim, the checkpoint, slices) is the library's.
//!
//! ```text
//! DRIVER_NAME=gadget.example.com NODE_NAME=$(hostname) GADGETS=g0,g1 \
//!     cargo run -p dra-plugin --example minimal
//! ```
//!
//! `CDI_ROOT` (default `/var/run/cdi`) and `KUBELET_DIR` (the kubelet's `--root-dir`, default
//! `/var/lib/kubelet`) move what it writes. `DEVICE_METADATA=true` gives each container a
//! device metadata file (KEP-5304) naming its gadget.
//!
//! It runs as root on the node (or in a pod with `/var/lib/kubelet/plugins`,
//! `/var/lib/kubelet/plugins_registry` and `/var/run/cdi` mounted from the host), with a
//! kubeconfig or in-cluster credentials allowed to read ResourceClaims and the Node and to
//! write ResourceSlices. `tests/library/kubelet_plugin.rs` runs this driver against the kubelet's own
//! DRA manager.

use dra_plugin::cdi::{CdiDevice, CdiRoot};
use dra_plugin::metadata::Version;
use dra_plugin::{Claim, ClaimRef, Driver, Plugin, Prepared, PreparedClaim};
use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

/// The CDI class of the gadgets: CDI ids are `example.com/gadget=<claim uid>-<device>`.
pub const CDI_CLASS: &str = "gadget";
/// The CDI vendor.
pub const CDI_VENDOR: &str = "example.com";

/// The driver: one CDI device per allocated gadget.
pub struct GadgetDriver {
    /// Where CDI specs go (`/var/run/cdi`, where the container runtime reads them).
    pub cdi: CdiRoot,
}

impl Driver for GadgetDriver {
    type Error = dra_plugin::cdi::Error;

    async fn prepare(&self, claim: &Claim) -> Result<Prepared, Self::Error> {
        // `claim.results` are this driver's allocation results, checked by the library.
        let devices: Vec<CdiDevice> = claim
            .results
            .iter()
            .map(|result| CdiDevice {
                name: result.device.clone(),
                env: vec![(
                    format!("GADGET_{}", result.device.to_uppercase()),
                    result.device.clone(),
                )],
                ..CdiDevice::default()
            })
            .collect();
        // One CDI device per result, in their order (and the device metadata mounts, where
        // the plugin writes metadata): the library records the rest.
        let spec = claim.write_cdi_spec(&self.cdi, CDI_CLASS, devices)?;
        Ok(Prepared::one_spec(spec))
    }

    async fn unprepare(
        &self,
        claim: &ClaimRef,
        prepared: Option<&PreparedClaim>,
    ) -> Result<(), Self::Error> {
        // What prepare wrote, or (not recorded) where it would have written.
        let files = match prepared {
            Some(prepared) => prepared.cdi_spec_files.clone(),
            None => vec![self.cdi.spec_path(CDI_CLASS, &claim.uid)?],
        };
        for file in files {
            dra_plugin::cdi::remove_claim_spec(&file)?;
        }
        Ok(())
    }
}

/// The node's gadgets as devices of its ResourceSlice, each with its position as attribute
/// `index` (a claim can select by it: `device.attributes["gadget.example.com"].index == 0`).
pub fn gadgets(names: &[&str]) -> Vec<Device> {
    names
        .iter()
        .enumerate()
        .map(|(index, name)| Device {
            name: name.to_string(),
            attributes: Some(
                [(
                    "index".to_string(),
                    DeviceAttribute {
                        int: Some(index as i64),
                        ..DeviceAttribute::default()
                    },
                )]
                .into(),
            ),
            ..Device::default()
        })
        .collect()
}

// One thread is plenty for a node's plugin: its work is waiting on the kubelet, the API server
// and the disk (the checkpoint's fsyncs run on tokio's blocking threads). A multi-threaded
// runtime costs a malloc arena per worker: about 5 MiB more resident memory.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let (driver, node) = (env("DRIVER_NAME")?, env("NODE_NAME")?);
    let names = std::env::var("GADGETS").unwrap_or_else(|_| "g0".into());
    let cdi_root = std::env::var("CDI_ROOT").unwrap_or_else(|_| "/var/run/cdi".into());
    let kubelet_dir =
        std::env::var("KUBELET_DIR").unwrap_or_else(|_| dra_plugin::KUBELET_DIR.into());

    let metadata = std::env::var("DEVICE_METADATA").is_ok_and(|v| v == "true");

    let client = kube::Client::try_default().await?;
    let cdi = CdiRoot::new(cdi_root, CDI_VENDOR)?;
    let builder = Plugin::builder(driver, node).kubelet_dir(kubelet_dir);
    let builder = match metadata {
        true => builder.device_metadata([Version::V1beta1, Version::V1alpha1]),
        false => builder,
    };
    let plugin = builder.start(client, GadgetDriver { cdi }).await?;
    let names: Vec<&str> = names.split(',').collect();
    plugin.publish(gadgets(&names)).await?;
    tokio::signal::ctrl_c().await?;
    Ok(())
}
