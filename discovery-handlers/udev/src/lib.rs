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
//! members' nodes are `UDEV_DEVNODE_0`, `UDEV_DEVNODE_1`, ... in devpath order, counting
//! nodes only (Akri numbers members in no fixed order, nodeless ones too).
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
/// When the scan after an event is repeated (udevd has finished with the device by then).
const FOLLOW_UP: Duration = Duration::from_secs(1);

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
        for (i, node) in nodes.into_iter().flatten().enumerate() {
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
    // After a kernel event, one more scan a moment later: udevd writes its database (the
    // ENV{} and TAG keys) after the kernel's event, and its own event reaches only the host's
    // network namespace.
    let mut follow_up = false;
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
        let wait = if follow_up { FOLLOW_UP } else { udev.rescan };
        tokio::select! {
            () = event => follow_up = true,
            () = tokio::time::sleep(wait) => follow_up = false,
            () = lists.closed() => return,
        }
    }
}

/// The handler as its own process (the binary's whole life after its flags): udev read from
/// `sysfs`, rescanning every `rescan` if given, served and registered as `args` say until
/// SIGTERM.
pub fn run_process(
    sysfs: sysfs::Sysfs,
    rescan: Option<Duration>,
    args: akri_discovery_handler::standalone::HandlerArgs,
) -> Result<(), akri_discovery_handler::standalone::Error> {
    // Made on the runtime: the uevent monitor is a task of it.
    let make = move || {
        let mut udev = Udev::start();
        udev.sysfs = sysfs;
        if let Some(rescan) = rescan {
            udev.rescan = rescan;
        }
        udev
    };
    akri_discovery_handler::standalone::run_process(make, NAME, SHARED, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    /// A sysfs tree of a USB camera as the kernel lays it out (a USB device with a driver, an
    /// interface, a video4linux node below it), and udev's database entry for the node.
    fn camera_sysfs() -> (tempfile::TempDir, Sysfs) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("sys");
        let usb = root.join("devices/pci0000:00/0000:00:14.0/usb1/1-1");
        let video = usb.join("1-1:1.0/video4linux/video0");
        let write = |path: &Path, text: &str| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            &usb.join("uevent"),
            "DEVTYPE=usb_device\nPRODUCT=5a9/4519/100\n",
        );
        write(&usb.join("idVendor"), "05a9\n");
        write(&usb.join("idProduct"), "4519\n");
        write(&usb.join("1-1:1.0/uevent"), "DEVTYPE=usb_interface\n");
        write(&video.join("uevent"), "MAJOR=81\nMINOR=0\nDEVNAME=video0\n");
        write(&video.join("name"), "USB Camera: Camera \n");
        for dir in [
            "bus/usb/drivers/usb",
            "bus/usb/drivers/uvcvideo",
            "class/video4linux",
        ] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        symlink(root.join("bus/usb"), usb.join("subsystem")).unwrap();
        symlink(root.join("bus/usb/drivers/usb"), usb.join("driver")).unwrap();
        symlink(root.join("bus/usb"), usb.join("1-1:1.0/subsystem")).unwrap();
        symlink(
            root.join("bus/usb/drivers/uvcvideo"),
            usb.join("1-1:1.0/driver"),
        )
        .unwrap();
        symlink(root.join("class/video4linux"), video.join("subsystem")).unwrap();
        symlink(&video, root.join("class/video4linux/video0")).unwrap();
        std::fs::create_dir_all(root.join("bus/usb/devices")).unwrap();
        symlink(&usb, root.join("bus/usb/devices/1-1")).unwrap();
        let data = dir.path().join("udev");
        write(
            &data.join("c81:0"),
            "S:v4l/by-id/usb-camera\nE:ID_VENDOR=Vimicro\nE:ID_MODEL=Camera\nG:uaccess\nG:seat\n",
        );
        let sysfs = Sysfs::new(root, data);
        (dir, sysfs)
    }

    fn found(sysfs: &Sysfs, rules: &[&str]) -> Vec<String> {
        let selection = Selection::from_details(Details {
            udev_rules: rules.iter().map(|r| r.to_string()).collect(),
            group_recursive: false,
            permissions: "rw".into(),
        })
        .unwrap();
        selection.find(sysfs).into_iter().map(|d| d.id).collect()
    }

    const VIDEO: &str = "/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/video4linux/video0";

    #[test]
    fn a_usb_camera_is_selected_by_akris_kinds_of_rules() {
        let (_dir, sysfs) = camera_sysfs();
        for rule in [
            r#"KERNEL=="video[0-9]*""#,
            r#"SUBSYSTEM=="video4linux", ATTRS{idVendor}=="05a9", ATTRS{idProduct}=="4519""#,
            r#"SUBSYSTEM=="video4linux", DRIVERS=="uvcvideo""#,
            r#"SUBSYSTEM=="video4linux", SUBSYSTEMS=="usb", KERNELS=="1-1""#,
            r#"ENV{ID_VENDOR}=="Vimicro", ENV{ID_MODEL}=="Cam*""#,
            r#"TAG=="uaccess", SUBSYSTEM=="video4linux""#,
            r#"TAGS=="seat", KERNEL=="video0""#,
            r#"ATTR{name}=="USB Camera: Camera""#,
            r#"DEVPATH=="*/video4linux/*""#,
        ] {
            assert_eq!(found(&sysfs, &[rule]), [VIDEO], "{rule}");
        }
        for rule in [
            r#"SUBSYSTEM=="video4linux", ATTRS{idVendor}=="dead""#,
            r#"SUBSYSTEM=="video4linux", ATTRS{idVendor}!="05a9""#,
            r#"SUBSYSTEM=="video4linux", DRIVERS!="uvcvideo""#,
            r#"ENV{ID_VENDOR}=="Other""#,
            r#"TAG=="seat2""#,
            // Each parent key holds somewhere up the chain, but not on one device.
            r#"SUBSYSTEM=="video4linux", DRIVERS=="uvcvideo", ATTRS{idVendor}=="05a9""#,
        ] {
            assert!(found(&sysfs, &[rule]).is_empty(), "{rule}");
        }
    }

    #[test]
    fn a_device_without_a_node_is_reported_as_its_nearest_parent_with_one() {
        let (_dir, sysfs) = camera_sysfs();
        // The USB device has no node and no parent with one: itself, without a node.
        let selection = Selection::from_details(Details {
            udev_rules: vec![r#"SUBSYSTEM=="usb", ATTR{idVendor}=="05a9""#.into()],
            group_recursive: false,
            permissions: "rw".into(),
        })
        .unwrap();
        let devices = selection.find(&sysfs);
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].id, "/devices/pci0000:00/0000:00:14.0/usb1/1-1");
        assert!(devices[0].device_specs.is_empty());
        assert!(!devices[0].properties.contains_key(DEVNODE_PROPERTY));
        // With groupRecursive, the camera's node joins the USB device.
        let grouped = Selection::from_details(Details {
            udev_rules: vec![
                r#"SUBSYSTEM=="usb", ATTR{idVendor}=="05a9""#.into(),
                r#"KERNEL=="video0""#.into(),
            ],
            group_recursive: true,
            permissions: "rw".into(),
        })
        .unwrap()
        .find(&sysfs);
        assert_eq!(grouped.len(), 1);
        assert_eq!(grouped[0].properties["UDEV_DEVNODE_0"], "/dev/video0");
        assert_eq!(grouped[0].device_specs[0].permissions, "rw");
    }

    #[test]
    fn permissions_are_checked() {
        let details = |permissions: &str| Details {
            udev_rules: vec![r#"KERNEL=="null""#.into()],
            group_recursive: false,
            permissions: permissions.into(),
        };
        for good in ["r", "rw", "rwm", "mw"] {
            assert!(Selection::from_details(details(good)).is_ok(), "{good}");
        }
        for bad in ["", "x", "rr", "rwmx"] {
            assert!(Selection::from_details(details(bad)).is_err(), "{bad:?}");
        }
    }
}
