//! The devices of this machine as sysfs and udev's database describe them, read the way
//! libudev reads them (the handler needs no libudev, so its image stays one static binary).
//!
//! A device is a directory below `/sys/devices` with a `uevent` file; its parent is the
//! nearest such directory above it. Enumeration walks `/sys/bus/*/devices` and
//! `/sys/class/*`, as libudev's enumerator does. Properties are the kernel's (the `uevent`
//! file) plus udev's (`E:` lines of `/run/udev/data/<id>`, where udevd runs); tags are udev's
//! (`G:` lines).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest attribute value read; sysfs attributes are one page at most, and a rule never
/// needs a binary blob.
const ATTRIBUTE_MAX: u64 = 4096;

/// Where sysfs and udev's database are.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
    udev_data: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Sysfs::new("/sys", "/run/udev/data")
    }
}

/// One device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Its directory, e.g. `/sys/devices/virtual/mem/null`.
    pub syspath: PathBuf,
    /// The syspath below the sysfs root, e.g. `/devices/virtual/mem/null`: the id Akri's
    /// handler reports.
    pub devpath: String,
    /// Its kernel name, e.g. `null` (`!` in the directory name read as `/`).
    pub sysname: String,
    pub subsystem: Option<String>,
    pub driver: Option<String>,
    /// Its device node, e.g. `/dev/null`.
    pub devnode: Option<String>,
    /// The kernel's and udev's properties.
    pub properties: BTreeMap<String, String>,
    /// udev's tags.
    pub tags: BTreeSet<String>,
}

impl Sysfs {
    /// sysfs mounted at `root`, udev's database in `udev_data`.
    pub fn new(root: impl Into<PathBuf>, udev_data: impl Into<PathBuf>) -> Self {
        Sysfs {
            root: root.into(),
            udev_data: udev_data.into(),
        }
    }

    /// Every device under `bus/*/devices` and `class/*`, each once, by devpath.
    pub fn devices(&self) -> Vec<Device> {
        let mut syspaths = BTreeSet::new();
        for (top, below) in [("bus", Some("devices")), ("class", None)] {
            for group in entries(&self.root.join(top)) {
                let dir = match below {
                    Some(below) => group.join(below),
                    None => group,
                };
                for link in entries(&dir) {
                    if let Ok(syspath) = std::fs::canonicalize(&link) {
                        syspaths.insert(syspath);
                    }
                }
            }
        }
        syspaths
            .into_iter()
            .filter_map(|syspath| self.device(&syspath))
            .collect()
    }

    /// The device at `syspath`, if there is one.
    pub fn device(&self, syspath: &Path) -> Option<Device> {
        let devpath = syspath.strip_prefix(&self.root).ok()?;
        if !syspath.join("uevent").is_file() {
            return None;
        }
        let devpath = format!("/{}", devpath.display());
        let sysname = syspath.file_name()?.to_string_lossy().replace('!', "/");
        let link_name = |name| {
            std::fs::read_link(syspath.join(name))
                .ok()
                .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()))
        };
        let subsystem = link_name("subsystem");
        let driver = link_name("driver");
        let mut properties: BTreeMap<String, String> =
            std::fs::read_to_string(syspath.join("uevent"))
                .unwrap_or_default()
                .lines()
                .filter_map(|line| line.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let devnode = properties.get("DEVNAME").map(|name| {
            if name.starts_with('/') {
                name.clone()
            } else {
                format!("/dev/{name}")
            }
        });
        let mut tags = BTreeSet::new();
        let db_id = udev_db_id(&properties, subsystem.as_deref(), &sysname);
        if let Ok(db) = std::fs::read_to_string(self.udev_data.join(db_id)) {
            for line in db.lines() {
                if let Some(property) = line.strip_prefix("E:")
                    && let Some((k, v)) = property.split_once('=')
                {
                    properties.insert(k.to_string(), v.to_string());
                } else if let Some(tag) = line.strip_prefix("G:") {
                    tags.insert(tag.to_string());
                }
            }
        }
        // What libudev adds to every device's properties.
        properties.insert("DEVPATH".into(), devpath.clone());
        if let Some(subsystem) = &subsystem {
            properties.insert("SUBSYSTEM".into(), subsystem.clone());
        }
        if let Some(driver) = &driver {
            properties.insert("DRIVER".into(), driver.clone());
        }
        if let Some(devnode) = &devnode {
            properties.insert("DEVNAME".into(), devnode.clone());
        }
        if !tags.is_empty() {
            let joined: Vec<&str> = tags.iter().map(String::as_str).collect();
            properties.insert("TAGS".into(), format!(":{}:", joined.join(":")));
        }
        Some(Device {
            syspath: syspath.to_path_buf(),
            devpath,
            sysname,
            subsystem,
            driver,
            devnode,
            properties,
            tags,
        })
    }

    /// The device's parents, nearest first.
    pub fn ancestors<'a>(&'a self, device: &Device) -> impl Iterator<Item = Device> + 'a {
        let mut dir = device.syspath.clone();
        let top = self.root.join("devices");
        std::iter::from_fn(move || {
            while dir.pop() && dir.starts_with(&top) && dir != top {
                if let Some(parent) = self.device(&dir) {
                    return Some(parent);
                }
            }
            None
        })
    }

    /// The device's attribute `file` (a path below its directory, never above: the rule
    /// parser refuses `..`), trailing whitespace dropped; a symlink reads as its target's
    /// name, as in libudev. `None` if there is no such readable file.
    pub fn attribute(&self, device: &Device, file: &str) -> Option<String> {
        use std::io::Read;
        let path = device.syspath.join(file);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if meta.file_type().is_symlink() {
            return std::fs::read_link(&path)
                .ok()?
                .file_name()
                .map(|n| n.to_string_lossy().into_owned());
        }
        if !meta.is_file() {
            return None;
        }
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .ok()?
            .take(ATTRIBUTE_MAX)
            .read_to_end(&mut bytes)
            .ok()?;
        Some(String::from_utf8_lossy(&bytes).trim_end().to_string())
    }
}

/// The name of a device's file in udev's database: `c<major>:<minor>` or
/// `b<major>:<minor>` for device nodes, `n<ifindex>` for network interfaces,
/// `+<subsystem>:<sysname>` otherwise.
fn udev_db_id(
    properties: &BTreeMap<String, String>,
    subsystem: Option<&str>,
    sysname: &str,
) -> String {
    let subsystem = subsystem.unwrap_or_default();
    if let (Some(major), Some(minor)) = (properties.get("MAJOR"), properties.get("MINOR")) {
        let kind = if subsystem == "block" { 'b' } else { 'c' };
        return format!("{kind}{major}:{minor}");
    }
    if let Some(index) = properties.get("IFINDEX") {
        return format!("n{index}");
    }
    format!("+{subsystem}:{}", sysname.replace('/', "!"))
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_ids_are_udevs() {
        let props = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let node = props(&[("MAJOR", "7"), ("MINOR", "0")]);
        assert_eq!(udev_db_id(&node, Some("block"), "loop0"), "b7:0");
        assert_eq!(udev_db_id(&node, Some("mem"), "null"), "c7:0");
        assert_eq!(
            udev_db_id(&props(&[("IFINDEX", "2")]), Some("net"), "eth0"),
            "n2"
        );
        assert_eq!(
            udev_db_id(&props(&[]), Some("usb"), "1-1:1.0"),
            "+usb:1-1:1.0"
        );
    }
}
