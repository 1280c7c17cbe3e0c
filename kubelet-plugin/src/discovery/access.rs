//! What a configuration's devices may bring into containers: the check between a handler's
//! report and everything that hands it on (CDI specs, `Allocate` answers). A handler is a
//! pod on the node, often parsing hostile network input; what it reports must not become a
//! bind mount of the host's `/`, `/dev/mem` with `rwm`, or `LD_PRELOAD` in every container
//! that claims its devices.

use super::DiscoveredDevice;
use akri_api::v1::{ContainerAccess, HostPathPrefix};

/// Environment names no device brings into a container: they change what a program loads or
/// runs, or where its traffic goes. `LD_*` as a whole.
const DENIED_ENVIRONMENT: &[&str] = &[
    "PATH",
    "BASH_ENV",
    "ENV",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCPATH",
    "MALLOC_CONF",
    "NLSPATH",
    "NODE_OPTIONS",
    "PERL5LIB",
    "PERL5OPT",
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "RUBYLIB",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "_JAVA_OPTIONS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
];

/// Device nodes the `udev` default never hands out: the host's memory and I/O ports.
const DENIED_DEVICE_NODES: &[&str] = &["/dev/mem", "/dev/kmem", "/dev/port"];

/// What one configuration's devices may bring into containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    device_nodes: Vec<Prefix>,
    mounts: Vec<Prefix>,
    /// Device nodes refused even under an allowed prefix (the `udev` default's).
    denied_device_nodes: &'static [&'static str],
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Prefix {
    path: String,
    writable: bool,
}

impl From<&HostPathPrefix> for Prefix {
    fn from(p: &HostPathPrefix) -> Self {
        Prefix {
            path: p.path.clone(),
            writable: p.writable,
        }
    }
}

impl Access {
    /// What the configuration says, or else its handler's default: `udev` brings the device
    /// nodes its rules matched (under `/dev/`, read-write, not the host's memory), every
    /// other handler (network devices: ONVIF, OPC UA, debugEcho, any other) environment only.
    pub fn of(configured: Option<&ContainerAccess>, handler: &str) -> Access {
        match configured {
            Some(access) => Access {
                device_nodes: access.device_nodes.iter().map(Prefix::from).collect(),
                mounts: access.mounts.iter().map(Prefix::from).collect(),
                denied_device_nodes: &[],
            },
            None if handler == "udev" => Access {
                device_nodes: vec![Prefix {
                    path: "/dev/".into(),
                    writable: true,
                }],
                mounts: Vec::new(),
                denied_device_nodes: DENIED_DEVICE_NODES,
            },
            None => Access {
                device_nodes: Vec::new(),
                mounts: Vec::new(),
                denied_device_nodes: &[],
            },
        }
    }

    /// Why `device` may not be handed to containers, if it may not.
    pub fn check(&self, device: &DiscoveredDevice) -> Result<(), String> {
        for name in device.properties.keys() {
            if name.starts_with("LD_") || DENIED_ENVIRONMENT.contains(&name.to_uppercase().as_str())
            {
                return Err(format!(
                    "environment variable {name} is never brought into containers"
                ));
            }
        }
        for node in &device.device_specs {
            let path = &node.host_path;
            let prefix = allowed(&self.device_nodes, path)
                .filter(|_| !self.denied_device_nodes.iter().any(|d| under(path, d)))
                .ok_or_else(|| format!("device node {path} is not under an allowed prefix"))?;
            // `m` lets a container make a node of this one device only (the cgroup rule is
            // per device number): Akri's udev default, harmless once the device is allowed.
            let permitted = if prefix.writable { "rwm" } else { "rm" };
            if let Some(p) = node.permissions.chars().find(|p| !permitted.contains(*p)) {
                return Err(format!(
                    "device node {path} asks for permission {p:?} ({}); at most {permitted:?} is allowed",
                    node.permissions
                ));
            }
        }
        for mount in &device.mounts {
            let path = &mount.host_path;
            let prefix = allowed(&self.mounts, path)
                .ok_or_else(|| format!("mount of {path} is not under an allowed prefix"))?;
            if !mount.read_only && !prefix.writable {
                return Err(format!("mount of {path} must be read-only"));
            }
        }
        Ok(())
    }
}

/// The first prefix `path` is under, if `path` is a plain absolute path.
fn allowed<'a>(prefixes: &'a [Prefix], path: &str) -> Option<&'a Prefix> {
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return None;
    }
    prefixes.iter().find(|p| path.starts_with(&p.path))
}

/// Whether `path` is `node` or below it.
fn under(path: &str, node: &str) -> bool {
    path == node
        || path
            .strip_prefix(node)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::device::{DeviceSpec, Mount};

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

    #[test]
    fn network_handlers_bring_environment_only() {
        let onvif = Access::of(None, "onvif");
        assert_eq!(
            onvif.check(&device(&["IP", "ONVIF_DEVICE_UUID"], &[], &[])),
            Ok(())
        );
        let root = onvif.check(&device(&[], &[], &[("/", true)]));
        assert_eq!(
            root,
            Err("mount of / is not under an allowed prefix".into())
        );
        assert!(
            onvif
                .check(&device(&[], &[("/dev/video0", "rw")], &[]))
                .is_err()
        );
        for name in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "PATH",
            "path",
            "HTTPS_PROXY",
            "PYTHONPATH",
        ] {
            let refused = onvif.check(&device(&[name], &[], &[])).unwrap_err();
            assert!(refused.contains(name), "{refused}");
        }
    }

    #[test]
    fn udev_brings_device_nodes_under_dev_but_not_the_hosts_memory() {
        let udev = Access::of(None, "udev");
        assert_eq!(
            udev.check(&device(&["UDEV_DEVNODE"], &[("/dev/video0", "rw")], &[])),
            Ok(())
        );
        for node in [
            "/dev/mem",
            "/dev/kmem",
            "/dev/port",
            "/etc/shadow",
            "/dev/../etc/shadow",
            "dev/video0",
        ] {
            assert!(
                udev.check(&device(&[], &[(node, "rw")], &[])).is_err(),
                "{node}"
            );
        }
        assert_eq!(
            udev.check(&device(&[], &[("/dev/video0", "rwm")], &[])),
            Ok(()),
            "Akri's udev default"
        );
        assert!(
            udev.check(&device(&[], &[("/dev/video0", "rwx")], &[]))
                .is_err()
        );
        assert!(
            udev.check(&device(&[], &[], &[("/dev", true)])).is_err(),
            "no mounts"
        );
        // Not a prefix of /dev/memory_bandwidth, which is another device.
        assert_eq!(
            udev.check(&device(&[], &[("/dev/memory_bandwidth", "r")], &[])),
            Ok(())
        );
    }

    #[test]
    fn a_configuration_names_what_it_allows() {
        let configured = ContainerAccess {
            device_nodes: vec![HostPathPrefix {
                path: "/dev/ttyUSB".into(),
                writable: false,
            }],
            mounts: vec![
                HostPathPrefix {
                    path: "/var/lib/cameras/".into(),
                    writable: false,
                },
                HostPathPrefix {
                    path: "/srv/spool/".into(),
                    writable: true,
                },
            ],
        };
        let access = Access::of(Some(&configured), "udev");
        assert_eq!(
            access.check(&device(&[], &[("/dev/ttyUSB0", "r")], &[])),
            Ok(())
        );
        assert_eq!(
            access.check(&device(&[], &[("/dev/ttyUSB0", "rw")], &[])),
            Err(
                "device node /dev/ttyUSB0 asks for permission 'w' (rw); at most \"rm\" is allowed"
                    .into()
            )
        );
        assert!(
            access
                .check(&device(&[], &[("/dev/video0", "r")], &[]))
                .is_err(),
            "not named"
        );
        assert_eq!(
            access.check(&device(&[], &[], &[("/var/lib/cameras/a", true)])),
            Ok(())
        );
        assert_eq!(
            access.check(&device(&[], &[], &[("/var/lib/cameras/a", false)])),
            Err("mount of /var/lib/cameras/a must be read-only".into())
        );
        assert_eq!(
            access.check(&device(&[], &[], &[("/srv/spool/x", false)])),
            Ok(())
        );
        assert!(
            access
                .check(&device(&[], &[], &[("/var/lib/cameras/../../etc", true)]))
                .is_err()
        );
    }
}
