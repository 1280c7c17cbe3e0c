//! The `udev` discovery handler: devices of this node that udev rules select (USB cameras,
//! serial adapters, block devices, anything in sysfs), reported as Akri's udev handler
//! reports them, so brokers written for Akri keep working.
//!
//! Discovery details, as in Akri:
//!
//! ```yaml
//! udevRules:                 # a device matching any rule is found
//! - 'SUBSYSTEM=="video4linux", ATTRS{idVendor}=="05a9"'
//! groupRecursive: false      # true: devices below a found device join it as one device
//! permissions: rwm           # of the device nodes in the container: r, w, m or a mix
//! ```
//!
//! Each found device has the id and property `UDEV_DEVPATH` (its devpath; a device without
//! a node is reported as its nearest parent with one), `UDEV_DEVNODE` (its node) and the node
//! as a device spec; with `groupRecursive`, one device per topmost found device, whose
//! members' nodes are `UDEV_DEVNODE_0`, `UDEV_DEVNODE_1`, ... in devpath order (Akri numbers
//! them in no fixed order).
//!
//! The rules' syntax is in [`rule`]; sysfs is read by [`sysfs`]; hot-plug comes from
//! [`monitor`], with a rescan every [`Udev::rescan`] as well.

pub mod monitor;
pub mod rule;
pub mod sysfs;

use akri_discovery_handler::{DeviceLists, Discover, proto};
use monitor::Monitor;
use rule::Rule;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use sysfs::Sysfs;
use tonic::Status;

/// The name configurations use, as in Akri.
pub const NAME: &str = "udev";
/// udev devices belong to the node that sees them.
pub const SHARED: bool = false;
/// The property with the device's devpath, as in Akri.
pub const DEVPATH_PROPERTY: &str = "UDEV_DEVPATH";
/// The property with the device's node, as in Akri (`_<n>` appended in a group).
pub const DEVNODE_PROPERTY: &str = "UDEV_DEVNODE";
/// How long a burst of uevents (a USB device brings several) is let settle before a rescan.
const SETTLE: Duration = Duration::from_millis(100);

/// The udev handler: where sysfs is, the uevents, how often to rescan anyway.
#[derive(Clone, Debug)]
pub struct Udev {
    pub sysfs: Sysfs,
    pub monitor: Monitor,
    /// Rescans this often, events or not (Akri's handler rescans every 10 s and has no events).
    pub rescan: Duration,
}

impl Udev {
    /// The host's sysfs and udev database, uevents if this process can have them; rescans
    /// every 10 s without them and every 5 minutes with them. Needs a Tokio runtime.
    pub fn start() -> Self {
        let monitor = Monitor::start();
        let rescan = if monitor.live() {
            Duration::from_secs(300)
        } else {
            Duration::from_secs(10)
        };
        Udev {
            sysfs: Sysfs::default(),
            monitor,
            rescan,
        }
    }
}

/// Akri's udev discovery details.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Details {
    pub udev_rules: Vec<String>,
    #[serde(default)]
    pub group_recursive: bool,
    #[serde(default = "all_permissions")]
    pub permissions: String,
}

fn all_permissions() -> String {
    "rwm".into()
}

/// What one configuration asks for, checked.
#[derive(Clone, Debug)]
pub struct Selection {
    rules: Vec<Rule>,
    group_recursive: bool,
    permissions: String,
}

impl Selection {
    /// Checks the details: at least one rule, every rule usable, permissions some of `rwm`.
    pub fn from_details(details: Details) -> Result<Self, String> {
        if details.udev_rules.is_empty() {
            return Err("udevRules is empty: list at least one rule".into());
        }
        let rules = details
            .udev_rules
            .iter()
            .map(|text| Rule::parse(text).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let p = &details.permissions;
        let valid = !p.is_empty()
            && p.chars().all(|c| "rwm".contains(c))
            && p.chars().collect::<std::collections::BTreeSet<_>>().len() == p.len();
        if !valid {
            return Err(format!(
                "permissions {p:?}: use r, w and m, each at most once (e.g. rw or rwm)"
            ));
        }
        Ok(Selection {
            rules,
            group_recursive: details.group_recursive,
            permissions: details.permissions,
        })
    }

    /// The devices of `sysfs` this selection finds, as the protocol reports them.
    pub fn find(&self, sysfs: &Sysfs) -> Vec<proto::Device> {
        // devpath -> node, for every device a rule selects (or its nearest parent with a
        // node, as Akri's handler reports it).
        let mut found: BTreeMap<String, Option<String>> = BTreeMap::new();
        for device in sysfs.devices() {
            if !self.rules.iter().any(|rule| rule.matches(sysfs, &device)) {
                continue;
            }
            if device.devnode.is_some() {
                found.insert(device.devpath, device.devnode);
            } else if let Some(parent) = sysfs.ancestors(&device).find(|d| d.devnode.is_some()) {
                found.insert(parent.devpath, parent.devnode);
            } else {
                found.insert(device.devpath, None);
            }
        }
        // With groupRecursive, a device below another found one joins it.
        let mut groups: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
        for (devpath, node) in found {
            let top = self
                .group_recursive
                .then(|| {
                    groups
                        .keys()
                        .find(|top| devpath.starts_with(&format!("{top}/")))
                        .cloned()
                })
                .flatten();
            groups.entry(top.unwrap_or(devpath)).or_default().push(node);
        }
        groups
            .into_iter()
            .map(|(devpath, nodes)| self.device(devpath, nodes))
            .collect()
    }

    fn device(&self, devpath: String, nodes: Vec<Option<String>>) -> proto::Device {
        let mut properties = std::collections::HashMap::new();
        let mut device_specs = Vec::new();
        for (i, node) in nodes.into_iter().enumerate() {
            let Some(node) = node else { continue };
            let name = if self.group_recursive {
                format!("{DEVNODE_PROPERTY}_{i}")
            } else {
                DEVNODE_PROPERTY.to_string()
            };
            properties.insert(name, node.clone());
            device_specs.push(proto::DeviceSpec {
                container_path: node.clone(),
                host_path: node,
                permissions: self.permissions.clone(),
            });
        }
        properties.insert(DEVPATH_PROPERTY.to_string(), devpath.clone());
        proto::Device {
            id: devpath,
            properties,
            mounts: Vec::new(),
            device_specs,
        }
    }
}

impl Discover for Udev {
    fn start(&self, request: proto::DiscoverRequest, lists: DeviceLists) -> Result<(), Status> {
        let details: Details =
            akri_discovery_handler::details::parse(NAME, &request.discovery_details)?;
        let selection = Selection::from_details(details)
            .map_err(|e| Status::invalid_argument(format!("udev discovery details: {e}")))?;
        tokio::spawn(report(selection, self.clone(), lists));
        Ok(())
    }
}

/// Sends the found devices now, after device events and every rescan interval, until the
/// agent goes away.
async fn report(selection: Selection, udev: Udev, mut lists: DeviceLists) {
    let mut events = udev.monitor.subscribe();
    loop {
        let (s, fs) = (selection.clone(), udev.sysfs.clone());
        let devices = match tokio::task::spawn_blocking(move || s.find(&fs)).await {
            Ok(devices) => devices,
            Err(error) => {
                lists
                    .fail(Status::internal(format!("udev scan failed: {error}")))
                    .await;
                return;
            }
        };
        if !lists.send(devices).await {
            return;
        }
        let event = async {
            match events.as_mut() {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(SETTLE).await;
                    rx.mark_unchanged();
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = event => {}
            () = tokio::time::sleep(udev.rescan) => {}
            () = lists.closed() => return,
        }
    }
}
