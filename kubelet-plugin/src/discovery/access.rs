//! What a configuration's devices may bring into containers: the check between a handler's
//! report and everything that hands it on (CDI specs, `Allocate` answers). A handler is a
//! pod on the node, often parsing hostile network input; what it reports must not become a
//! bind mount of the host's `/`, `/dev/sda` or `/dev/mem` with `rwm`, or `BASH_FUNC_ls%%` in
//! every container that claims its devices.
//!
//! Every part is an allowlist, compared in canonical form: environment names are the handler
//! kind's known properties plus what the configuration names; device nodes are resolved on
//! the node (symlinks followed as the kernel would, never out of `/dev/`, so `/dev//mem`,
//! `/dev/./mem` and `/dev/char/1:1` are all `/dev/mem`) and must be character devices, block
//! and memory devices only where an administrator said so; mounts are compared without `//`,
//! `.` or `..`; permissions are always written out. What is admitted is the canonical device,
//! so what was checked is what the CDI spec and `Allocate` hand on.

use super::DiscoveredDevice;
use super::device::{DeviceSpec, Mount};
use akri_api::v1::{ContainerAccess, HostPathPrefix};
use std::collections::{BTreeSet, VecDeque};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;

/// A property name a handler kind is known to report: a name, or a name followed by `_<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Name(&'static str),
    Numbered(&'static str),
}

/// The properties this project's handlers, and Akri's of the same names, report.
fn known_properties(handler: &str) -> &'static [Known] {
    use Known::*;
    match handler {
        akri_debug_echo::NAME => &[Name(akri_debug_echo::DESCRIPTION_PROPERTY)],
        akri_udev::NAME => &[
            Name(akri_udev::DEVPATH_PROPERTY),
            Name(akri_udev::DEVNODE_PROPERTY),
            Numbered(akri_udev::DEVNODE_PROPERTY),
        ],
        akri_onvif::NAME => &[
            Name(akri_onvif::SERVICE_URL_PROPERTY),
            Name(akri_onvif::UUID_PROPERTY),
            Name(akri_onvif::IP_ADDRESS_PROPERTY),
            Name(akri_onvif::MAC_ADDRESS_PROPERTY),
            Name(akri_onvif::STREAM_URI_PROPERTY),
        ],
        akri_opcua::NAME => &[
            Name(akri_opcua::DISCOVERY_URL_PROPERTY),
            Name(akri_opcua::APPLICATION_NAME_PROPERTY),
            Name(akri_opcua::APPLICATION_URI_PROPERTY),
        ],
        _ => &[],
    }
}

impl Known {
    fn allows(self, name: &str) -> bool {
        match self {
            Known::Name(known) => name == known,
            Known::Numbered(known) => name
                .strip_prefix(known)
                .and_then(|rest| rest.strip_prefix('_'))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        }
    }
}

/// Character devices of major 1 that every container has anyway (`null`, `zero`, `full`,
/// `random`, `urandom`); the others of major 1 (`mem`, `kmem`, `port`, `kmsg`, ...) are the
/// host's memory devices.
const HARMLESS_MEMORY_MINORS: [u32; 5] = [3, 5, 7, 8, 9];

/// Where this process sees the host's `/dev/`: `/dev` itself for an agent on the host, the
/// chart's read-only mount of it in the node agent's container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostDev(PathBuf);

impl HostDev {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        HostDev(root.into())
    }

    /// `path`'s canonical form under `/dev/` (symlinks followed as the kernel follows them,
    /// relative ones from their directory, absolute ones from the host's `/`) and what is
    /// there.
    fn resolve(&self, path: &str) -> Result<(String, DeviceKind), String> {
        const MAX_LINKS: usize = 40;
        let outside = || format!("device node {path} is not under /dev/");
        let rest = path.strip_prefix("/dev/").ok_or_else(outside)?;
        let mut todo: VecDeque<String> = rest.split('/').map(String::from).collect();
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(component) = todo.pop_front() {
            match component.as_str() {
                "" | "." => continue,
                ".." => {
                    done.pop().ok_or_else(outside)?;
                    continue;
                }
                _ => {}
            }
            let here: PathBuf = self
                .0
                .iter()
                .chain(done.iter().map(|c| c.as_ref()))
                .collect();
            let here = here.join(&component);
            let meta = std::fs::symlink_metadata(&here)
                .map_err(|e| format!("device node {path}: {}", io_reason(&e)))?;
            if !meta.file_type().is_symlink() {
                done.push(component);
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(format!("device node {path}: too many symbolic links"));
            }
            let target =
                std::fs::read_link(&here).map_err(|e| format!("device node {path}: {e}"))?;
            let target = target
                .to_str()
                .ok_or_else(|| format!("device node {path}: a link that is not UTF-8"))?;
            let mut next: VecDeque<String> = match target.strip_prefix('/') {
                Some(absolute) => {
                    done.clear();
                    let in_dev = (absolute.strip_prefix("dev/"))
                        .or((absolute == "dev").then_some(""))
                        .ok_or_else(|| {
                            format!("device node {path} links out of /dev/ ({target})")
                        })?;
                    in_dev.split('/').map(String::from).collect()
                }
                None => target.split('/').map(String::from).collect(),
            };
            next.extend(todo);
            todo = next;
        }
        if done.is_empty() {
            return Err(outside());
        }
        let canonical = format!("/dev/{}", done.join("/"));
        let here: PathBuf = self
            .0
            .iter()
            .chain(done.iter().map(|c| c.as_ref()))
            .collect();
        let meta = std::fs::symlink_metadata(&here)
            .map_err(|e| format!("device node {path}: {}", io_reason(&e)))?;
        let kind = if meta.file_type().is_char_device() {
            let (major, minor) = numbers(meta.rdev());
            if major == 1 && !HARMLESS_MEMORY_MINORS.contains(&minor) {
                DeviceKind::Memory
            } else {
                DeviceKind::Character
            }
        } else if meta.file_type().is_block_device() {
            DeviceKind::Block
        } else {
            return Err(format!("{path} is not a device node"));
        };
        Ok((canonical, kind))
    }
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "not found on this node".into(),
        _ => e.to_string(),
    }
}

/// A device number's major and minor, as Linux encodes them (glibc's `gnu_dev_major`).
fn numbers(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    (major as u32, minor as u32)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceKind {
    Character,
    Block,
    Memory,
}

/// What one configuration's devices may bring into containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    handler: String,
    device_nodes: Vec<Prefix>,
    mounts: Vec<Prefix>,
    /// Environment names besides the handler kind's known properties.
    environment: BTreeSet<String>,
    /// Device nodes the configuration itself lists (the `static` handler's), by the path
    /// listed: allowed read-write as they resolve (block and memory devices still only
    /// where `containerAccess` says).
    listed_nodes: BTreeSet<String>,
    block_devices: bool,
    memory_devices: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Prefix {
    path: String,
    writable: bool,
}

impl From<&HostPathPrefix> for Prefix {
    fn from(p: &HostPathPrefix) -> Self {
        // The prefix in the canonical form the paths it is compared with take, its
        // trailing `/` kept (`/dev/video` allows `/dev/video0`, `/srv/` only below `/srv`).
        let mut path = canonical(&p.path).unwrap_or_default();
        if p.path.ends_with('/') && path != "/" {
            path.push('/');
        }
        Prefix {
            path,
            writable: p.writable,
        }
    }
}

impl Access {
    /// What the configuration says, or else its handler's default: `udev` brings the
    /// character devices its rules matched (under `/dev/`, read-write, not the host's
    /// memory), every other handler (network devices: ONVIF, OPC UA, debugEcho, any other)
    /// environment only. Either way a handler kind's known properties are environment it may
    /// bring.
    pub fn of(configured: Option<&ContainerAccess>, handler: &str) -> Access {
        let handler = handler.to_string();
        match configured {
            Some(access) => Access {
                handler,
                device_nodes: access.device_nodes.iter().map(Prefix::from).collect(),
                mounts: access.mounts.iter().map(Prefix::from).collect(),
                environment: access.environment.iter().cloned().collect(),
                listed_nodes: BTreeSet::new(),
                block_devices: access.block_devices,
                memory_devices: access.memory_devices,
            },
            None => Access {
                device_nodes: if handler == akri_udev::NAME {
                    vec![Prefix {
                        path: "/dev/".into(),
                        writable: true,
                    }]
                } else {
                    Vec::new()
                },
                handler,
                mounts: Vec::new(),
                environment: BTreeSet::new(),
                listed_nodes: BTreeSet::new(),
                block_devices: false,
                memory_devices: false,
            },
        }
    }

    /// The `static` handler's devices are the configuration's own words, not a handler pod's:
    /// the property names and device nodes its `details` list may come into containers (what
    /// else a handler under that name reported is still refused). Other handlers: unchanged.
    pub fn with_listed(mut self, details: &str) -> Access {
        if self.handler != akri_static::NAME {
            return self;
        }
        // Details that do not parse fail the handler's own Discover call, saying why.
        for device in akri_static::details(details).map_or(Vec::new(), |d| d.devices) {
            self.environment.extend(device.properties().into_keys());
            self.listed_nodes.extend(device.device_nodes);
        }
        self
    }

    /// `device` as it may be handed to containers (device nodes by their canonical host
    /// paths, permissions written out, mounts in canonical form), or why it may not.
    pub fn admit(
        &self,
        device: &DiscoveredDevice,
        dev: &HostDev,
    ) -> Result<DiscoveredDevice, String> {
        let known = known_properties(&self.handler);
        for name in device.properties.keys() {
            if !(known.iter().any(|k| k.allows(name)) || self.environment.contains(name)) {
                return Err(format!(
                    "environment variable {name:?} is not a known property of handler kind {} and not in containerAccess.environment",
                    self.handler
                ));
            }
        }
        let mut admitted = device.clone();
        admitted.device_specs = (device.device_specs.iter())
            .map(|node| self.admit_node(node, dev))
            .collect::<Result<_, _>>()?;
        admitted.mounts = (device.mounts.iter())
            .map(|mount| self.admit_mount(mount))
            .collect::<Result<_, _>>()?;
        Ok(admitted)
    }

    fn admit_node(&self, node: &DeviceSpec, dev: &HostDev) -> Result<DeviceSpec, String> {
        let asked = &node.host_path;
        let (path, kind) = dev.resolve(asked)?;
        let shown = if path == *asked {
            path.clone()
        } else {
            format!("{asked} ({path})")
        };
        let listed = Prefix {
            path: asked.clone(),
            writable: true,
        };
        let prefix = match self.listed_nodes.contains(asked) {
            true => &listed,
            false => allowed(&self.device_nodes, &path)
                .ok_or_else(|| format!("device node {shown} is not under an allowed prefix"))?,
        };
        match kind {
            DeviceKind::Block if !self.block_devices => {
                return Err(format!(
                    "device node {shown} is a block device, and containerAccess.blockDevices is not set"
                ));
            }
            DeviceKind::Memory if !self.memory_devices => {
                return Err(format!(
                    "device node {shown} is one of the host's memory devices, and containerAccess.memoryDevices is not set"
                ));
            }
            _ => {}
        }
        // `m` lets a container make a node of this one device only (the cgroup rule is per
        // device number): Akri's udev default, harmless once the device is allowed.
        let permitted = if prefix.writable { "rwm" } else { "rm" };
        if let Some(p) = node.permissions.chars().find(|p| !permitted.contains(*p)) {
            return Err(format!(
                "device node {shown} asks for permission {p:?} ({}); at most {permitted:?} is allowed",
                node.permissions
            ));
        }
        let container_path = canonical(&node.container_path).ok_or_else(|| {
            format!(
                "device node {shown}: container path {:?} is not absolute or has '..'",
                node.container_path
            )
        })?;
        Ok(DeviceSpec {
            container_path,
            host_path: path,
            // Empty means `rwm` to CDI: written out, so that it is never more than allowed.
            permissions: if node.permissions.is_empty() {
                permitted.to_string()
            } else {
                node.permissions.clone()
            },
        })
    }

    fn admit_mount(&self, mount: &Mount) -> Result<Mount, String> {
        let asked = &mount.host_path;
        let path = canonical(asked)
            .ok_or_else(|| format!("mount of {asked} is not an absolute path without '..'"))?;
        let prefix = allowed(&self.mounts, &path)
            .ok_or_else(|| format!("mount of {asked} is not under an allowed prefix"))?;
        if !mount.read_only && !prefix.writable {
            return Err(format!("mount of {asked} must be read-only"));
        }
        let container_path = canonical(&mount.container_path).ok_or_else(|| {
            format!(
                "mount of {asked}: container path {:?} is not absolute or has '..'",
                mount.container_path
            )
        })?;
        Ok(Mount {
            container_path,
            host_path: path,
            read_only: mount.read_only,
        })
    }
}

/// `path` without `//` and `.`, if it is absolute and has no `..` (a mount's host path is
/// followed by the runtime, not here: `..` would leave the prefix it is compared with).
fn canonical(path: &str) -> Option<String> {
    let rest = path.strip_prefix('/')?;
    let mut components = Vec::new();
    for component in rest.split('/') {
        match component {
            "" | "." => {}
            ".." => return None,
            c => components.push(c),
        }
    }
    Some(format!("/{}", components.join("/")))
}

/// The first prefix the canonical `path` starts with.
fn allowed<'a>(prefixes: &'a [Prefix], path: &str) -> Option<&'a Prefix> {
    prefixes
        .iter()
        .find(|p| !p.path.is_empty() && path.starts_with(&p.path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::Path;

    fn device(env: &[&str], nodes: &[(&str, &str)], mounts: &[(&str, bool)]) -> DiscoveredDevice {
        DiscoveredDevice {
            id: "d".into(),
            properties: env
                .iter()
                .map(|e| (e.to_string(), "x".to_string()))
                .collect(),
            device_specs: (nodes.iter())
                .map(|(path, permissions)| DeviceSpec {
                    container_path: path.to_string(),
                    host_path: path.to_string(),
                    permissions: permissions.to_string(),
                })
                .collect(),
            mounts: (mounts.iter())
                .map(|(path, read_only)| Mount {
                    container_path: "/data".into(),
                    host_path: path.to_string(),
                    read_only: *read_only,
                })
                .collect(),
        }
    }

    /// This machine's `/dev`: real device nodes, real kinds.
    fn host() -> HostDev {
        HostDev::new("/dev")
    }

    fn check(access: &Access, device: &DiscoveredDevice) -> Result<(), String> {
        access.admit(device, &host()).map(|_| ())
    }

    fn access(nodes: &[(&str, bool)], mounts: &[(&str, bool)], env: &[&str]) -> ContainerAccess {
        let prefixes = |list: &[(&str, bool)]| {
            (list.iter())
                .map(|(path, writable)| HostPathPrefix {
                    path: path.to_string(),
                    writable: *writable,
                })
                .collect()
        };
        ContainerAccess {
            device_nodes: prefixes(nodes),
            mounts: prefixes(mounts),
            environment: env.iter().map(|e| e.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn static_devices_bring_what_their_configuration_lists_and_no_more() {
        let details = "devices:\n- {id: tty, nodes: [n], properties: {BAUD: '9600'}, deviceNodes: [/dev/tty]}\n- {id: disk, nodes: [n], deviceNodes: [/dev/loop0]}";
        let listed = Access::of(None, akri_static::NAME).with_listed(details);
        assert_eq!(
            check(&listed, &device(&["BAUD"], &[("/dev/tty", "rw")], &[])),
            Ok(())
        );
        // Not listed: refused as from any handler.
        assert!(check(&listed, &device(&["LD_PRELOAD"], &[], &[])).is_err());
        assert!(check(&listed, &device(&[], &[("/dev/null", "rw")], &[])).is_err());
        // Listed, but a block device: only where containerAccess says.
        if Path::new("/dev/loop0").exists() {
            let refused = check(&listed, &device(&[], &[("/dev/loop0", "rw")], &[]));
            assert!(refused.unwrap_err().contains("block device"));
        }
        // Another handler's details list nothing it may bring.
        let onvif = Access::of(None, "onvif").with_listed(details);
        assert!(check(&onvif, &device(&["BAUD"], &[], &[])).is_err());
    }

    #[test]
    fn network_handlers_bring_their_known_properties_only() {
        let onvif = Access::of(None, "onvif");
        assert_eq!(
            check(
                &onvif,
                &device(&["ONVIF_DEVICE_IP_ADDRESS", "ONVIF_DEVICE_UUID"], &[], &[])
            ),
            Ok(())
        );
        let root = check(&onvif, &device(&[], &[], &[("/", true)]));
        assert_eq!(
            root,
            Err("mount of / is not under an allowed prefix".into())
        );
        assert!(check(&onvif, &device(&[], &[("/dev/null", "rw")], &[])).is_err());
        // What the denylist let through (issue 52): names that run code in a shell, Python,
        // Lua, or send a client elsewhere. None is a property the handler kind reports.
        for name in [
            "BASH_FUNC_ls%%",
            "SHELLOPTS",
            "PS4",
            "PYTHONWARNINGS",
            "BROWSER",
            "LUA_INIT",
            "KUBERNETES_SERVICE_HOST",
            "LD_PRELOAD",
            "PATH",
            "onvif_device_uuid",
            "DEBUG_ECHO_DESCRIPTION",
        ] {
            let refused = check(&onvif, &device(&[name], &[], &[])).unwrap_err();
            assert!(
                refused.contains(name) && refused.contains("onvif"),
                "{refused}"
            );
        }
    }

    #[test]
    fn each_handler_kind_knows_its_own_properties() {
        for (handler, names) in [
            ("debugEcho", &["DEBUG_ECHO_DESCRIPTION"][..]),
            (
                "udev",
                &[
                    "UDEV_DEVPATH",
                    "UDEV_DEVNODE",
                    "UDEV_DEVNODE_0",
                    "UDEV_DEVNODE_12",
                ],
            ),
            ("opcua", &["OPCUA_DISCOVERY_URL", "OPCUA_APPLICATION_NAME"]),
            ("onvif", &["ONVIF_DEVICE_SERVICE_URL", "ONVIF_STREAM_URI"]),
        ] {
            let access = Access::of(None, handler);
            assert_eq!(
                check(&access, &device(names, &[], &[])),
                Ok(()),
                "{handler}"
            );
        }
        let udev = Access::of(None, "udev");
        for name in [
            "UDEV_DEVNODE_",
            "UDEV_DEVNODE_x",
            "UDEV_DEVNODE_0_1",
            "UDEV_DEVPATHS",
        ] {
            assert!(check(&udev, &device(&[name], &[], &[])).is_err(), "{name}");
        }
        // A handler of one's own brings only what its configuration names.
        let serial = Access::of(None, "serial");
        assert!(check(&serial, &device(&["BAUD"], &[], &[])).is_err());
        let named = access(&[], &[], &["BAUD"]);
        let serial = Access::of(Some(&named), "serial");
        assert_eq!(check(&serial, &device(&["BAUD"], &[], &[])), Ok(()));
        assert!(check(&serial, &device(&["BAUD", "LUA_INIT"], &[], &[])).is_err());
    }

    #[test]
    fn udev_brings_character_devices_under_dev_but_not_the_hosts_memory_or_disks() {
        let udev = Access::of(None, "udev");
        assert_eq!(
            check(
                &udev,
                &device(&["UDEV_DEVNODE"], &[("/dev/null", "rw")], &[])
            ),
            Ok(())
        );
        assert_eq!(
            check(&udev, &device(&[], &[("/dev/null", "rwm")], &[])),
            Ok(()),
            "Akri's udev default"
        );
        // The host's memory and disks in every spelling: see fake_dev's tests below.
        for node in [
            "/etc/shadow",
            "/dev/../etc/shadow",
            "dev/null",
            "/dev/",
            "/dev/shm",
        ] {
            assert!(
                check(&udev, &device(&[], &[(node, "rw")], &[])).is_err(),
                "{node}"
            );
        }
        assert!(check(&udev, &device(&[], &[("/dev/null", "rwx")], &[])).is_err());
        assert!(
            check(&udev, &device(&[], &[], &[("/dev", true)])).is_err(),
            "no mounts"
        );
    }

    /// A /dev of the host's memory (`mem`, 1:1), a disk (`sda`, 8:0) and their udev aliases,
    /// made with mknod(1) (the tests run as root, as CI does).
    fn fake_dev() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path();
        for (name, kind, major, minor) in [("mem", "c", "1", "1"), ("sda", "b", "8", "0")] {
            let made = std::process::Command::new("mknod")
                .arg(dev.join(name))
                .args([kind, major, minor])
                .status()
                .expect("mknod(1)");
            assert!(made.success(), "mknod {name}: the tests need root");
        }
        std::fs::create_dir_all(dev.join("char")).unwrap();
        std::fs::create_dir_all(dev.join("block")).unwrap();
        symlink("../mem", dev.join("char/1:1")).unwrap();
        symlink("../sda", dev.join("block/8:0")).unwrap();
        dir
    }

    #[test]
    fn the_hosts_memory_and_disks_are_refused_however_they_are_spelled() {
        let dir = fake_dev();
        let dev = HostDev::new(dir.path());
        let udev = Access::of(None, "udev");
        // The text comparison let each of these through (issue 52).
        for (node, what) in [
            ("/dev/mem", "memory devices"),
            ("/dev//mem", "memory devices"),
            ("/dev/./mem", "memory devices"),
            ("/dev/char/1:1", "memory devices"),
            ("/dev/char/../mem", "memory devices"),
            ("/dev/sda", "block device"),
            ("/dev/block/8:0", "block device"),
        ] {
            let refused = udev
                .admit(&device(&[], &[(node, "rwm")], &[]), &dev)
                .unwrap_err();
            assert!(refused.contains(what), "{node}: {refused}");
            if node != "/dev/mem" && node != "/dev/sda" {
                assert!(
                    refused.contains(" (/dev/"),
                    "{node}: the canonical path said: {refused}"
                );
            }
        }
        // Allowed by name, an administrator's word: admitted by the canonical path.
        let mut raw = access(&[("/dev/", true)], &[], &[]);
        (raw.block_devices, raw.memory_devices) = (true, true);
        let raw = Access::of(Some(&raw), "udev");
        for (node, canonical) in [
            ("/dev/char/1:1", "/dev/mem"),
            ("/dev/block/8:0", "/dev/sda"),
        ] {
            let admitted = raw.admit(&device(&[], &[(node, "rw")], &[]), &dev).unwrap();
            assert_eq!(admitted.device_specs[0].host_path, canonical);
        }
    }

    #[test]
    fn block_devices_only_where_the_configuration_says_so() {
        // The machine's first block device (this kind of machine has its disk under /dev).
        let Some(block) = std::fs::read_dir("/dev")
            .unwrap()
            .flatten()
            .find(|e| e.file_type().is_ok_and(|t| t.is_block_device()))
        else {
            panic!("this machine has no block device under /dev to test with");
        };
        let path = format!("/dev/{}", block.file_name().to_string_lossy());
        let udev = Access::of(None, "udev");
        let refused = check(&udev, &device(&[], &[(&path, "rw")], &[])).unwrap_err();
        assert!(refused.contains("block device"), "{refused}");
        // Through /dev/block/<major>:<minor> too.
        let (major, minor) = numbers(block.metadata().unwrap().rdev());
        let alias = format!("/dev/block/{major}:{minor}");
        if Path::new(&alias).exists() {
            let refused = check(&udev, &device(&[], &[(&alias, "rw")], &[])).unwrap_err();
            assert!(refused.contains(&format!("{alias} ({path})")), "{refused}");
        }
        let mut disks = access(&[("/dev/", true)], &[], &[]);
        disks.block_devices = true;
        let disks = Access::of(Some(&disks), "udev");
        assert_eq!(check(&disks, &device(&[], &[(&path, "rw")], &[])), Ok(()));
    }

    #[test]
    fn device_nodes_are_admitted_by_their_canonical_path() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("dev");
        std::fs::create_dir_all(root.join("serial/by-id")).unwrap();
        std::fs::create_dir_all(root.join("char")).unwrap();
        // Links are resolved in the host's /dev, wherever this process sees it.
        symlink("/dev/null", root.join("absolute")).unwrap();
        symlink("/etc/passwd", root.join("char/abs-escape")).unwrap();
        symlink("../../ttyUSB0", root.join("serial/by-id/usb-FTDI")).unwrap();
        symlink("../../../../etc/passwd", root.join("serial/escape")).unwrap();
        let dev = HostDev::new(&root);
        let refused = dev.resolve("/dev/absolute").unwrap_err();
        assert!(
            refused.contains("not found"),
            "the fake /dev has no null: {refused}"
        );
        let refused = dev.resolve("/dev/char/abs-escape").unwrap_err();
        assert!(
            refused.contains("links out of /dev/ (/etc/passwd)"),
            "{refused}"
        );
        let refused = dev.resolve("/dev/serial/escape").unwrap_err();
        assert!(refused.contains("not under /dev/"), "{refused}");
        let refused = dev.resolve("/dev/serial/by-id/usb-FTDI").unwrap_err();
        assert!(refused.contains("not found"), "{refused}");
        // On the machine's own /dev: aliases and spellings of null are null.
        let host = host();
        for spelling in [
            "/dev/null",
            "/dev//null",
            "/dev/./null",
            "/dev/char/../null",
        ] {
            if spelling.contains("char") && !Path::new("/dev/char").exists() {
                continue;
            }
            assert_eq!(
                host.resolve(spelling),
                Ok(("/dev/null".into(), DeviceKind::Character)),
                "{spelling}"
            );
        }
        let admitted = Access::of(Some(&access(&[("/dev/null", false)], &[], &[])), "x")
            .admit(&device(&[], &[("/dev//null", "")], &[]), &host)
            .unwrap();
        assert_eq!(
            admitted.device_specs,
            [DeviceSpec {
                container_path: "/dev/null".into(),
                host_path: "/dev/null".into(),
                permissions: "rm".into(),
            }],
            "canonical paths, and empty permissions written out as what the prefix allows"
        );
    }

    #[test]
    fn a_configuration_names_what_it_allows() {
        let configured = access(
            &[("/dev/nul", false)],
            &[("/var/lib/cameras/", false), ("/srv/spool/", true)],
            &[],
        );
        let access = Access::of(Some(&configured), "udev");
        assert_eq!(
            check(&access, &device(&[], &[("/dev/null", "r")], &[])),
            Ok(())
        );
        assert_eq!(
            check(&access, &device(&[], &[("/dev/null", "rw")], &[])),
            Err(
                "device node /dev/null asks for permission 'w' (rw); at most \"rm\" is allowed"
                    .into()
            )
        );
        assert!(
            check(&access, &device(&[], &[("/dev/zero", "r")], &[])).is_err(),
            "not named"
        );
        assert_eq!(
            check(&access, &device(&[], &[], &[("/var/lib/cameras/a", true)])),
            Ok(())
        );
        assert_eq!(
            check(
                &access,
                &device(&[], &[], &[("/var/lib//cameras/./a", true)])
            ),
            Ok(())
        );
        assert_eq!(
            check(&access, &device(&[], &[], &[("/var/lib/cameras/a", false)])),
            Err("mount of /var/lib/cameras/a must be read-only".into())
        );
        assert_eq!(
            check(&access, &device(&[], &[], &[("/srv/spool/x", false)])),
            Ok(())
        );
        for path in [
            "/var/lib/cameras/../../etc",
            "/var/lib/cameras",
            "var/lib/cameras/a",
        ] {
            assert!(
                check(&access, &device(&[], &[], &[(path, true)])).is_err(),
                "{path}"
            );
        }
    }
}
