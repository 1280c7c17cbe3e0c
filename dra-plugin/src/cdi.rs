//! CDI spec files that hand prepared devices to the container runtime.
//!
//! NodePrepareResources answers with CDI device ids (`<vendor>/<class>=<name>`); the runtime
//! resolves them through spec files in a CDI directory (`/var/run/cdi` by default). This
//! module writes one spec file per (class, claim), `<vendor>-<class>-<claim uid>.json`, and
//! removes it again on unprepare.
//!
//! CDI device names must be unique across all spec files of one kind: the runtime's registry
//! drops a device defined twice. One physical device can be in several claims at once (shared
//! through consumable capacity), so each CDI device name is derived from the claim uid and the
//! DRA device name (`device_name`), sanitized into CDI's alphabet.
//!
//! A spec is replaced atomically (readers see the old file or the new one) but not fsynced:
//! the checkpoint records its content durably before the kubelet hears of the claim, and the
//! prepare the kubelet repeats after a reboot rewrites a spec that is missing or differs
//! ([`crate::service`]). `/var/run/cdi` is a tmpfs on most nodes anyway.
//!
//! We write `cdiVersion` [`CDI_VERSION`] (0.6.0): the lowest version that allows what we
//! emit. Device names start with the claim uid, possibly a digit, and device nodes may carry a
//! `hostPath` (both 0.5.0); classes may contain dots (0.6.0). The reference Go library
//! refuses a spec that uses a feature newer than its declared version, and a spec with no
//! devices or a device without edits; [`CdiRoot::write_claim_spec`] refuses those too, at
//! prepare time rather than when the container starts.
//!
//! The serde types are written by hand. The crates.io crate `container-device-interface`
//! (1.1.x) has correct field names, but it is a runtime's library, not a writer's: most fields
//! are `pub(crate)`, it depends on clap, jsonschema, oci-spec, regex, serde_yaml and anyhow,
//! and its name validators are private. Five small structs are less than that.

use node_io::files::write_replacing;
use serde::Serialize;
use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// The `cdiVersion` of the spec files we write.
pub const CDI_VERSION: &str = "0.6.0";

/// Spec files are readable by their owner only: the container runtime reads them as root, and
/// they may carry device properties resolved from Secrets.
pub const SPEC_FILE_MODE: u32 = 0o600;

/// A device as the container should see it: environment, device nodes, bind mounts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CdiDevice {
    /// The DRA device name (or anything unique within the claim and class).
    pub name: String,
    /// Variables set in the container; values may contain any character but NUL.
    pub env: Vec<(String, String)>,
    /// Device nodes made available in the container.
    pub device_nodes: Vec<DeviceNode>,
    /// Host files or directories bind-mounted into the container.
    pub mounts: Vec<Mount>,
}

/// A device node (e.g. `/dev/video0`) made available in the container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceNode {
    /// The path in the container.
    pub path: String,
    /// The path on the host, if it differs from `path`.
    pub host_path: Option<String>,
    /// Cgroup device permissions, some of `r`, `w`, `m`; the runtime's default (`rwm`) if
    /// `None`.
    pub permissions: Option<String>,
}

/// A bind mount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mount {
    /// The path in the container.
    pub container_path: String,
    /// The file or directory on the host.
    pub host_path: String,
    /// Whether the container may only read it (the `ro` mount option).
    pub read_only: bool,
}

/// A spec file written for a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimSpec {
    /// Record it (in the checkpoint) to remove it on unprepare.
    pub path: PathBuf,
    /// The fully qualified CDI device ids, in the order of the devices given.
    pub qualified_ids: Vec<String>,
}

/// Errors of writing and removing CDI spec files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A vendor or class name breaks CDI's naming rules.
    #[error("invalid CDI {what} {name:?}: {reason}")]
    InvalidName {
        /// `vendor` or `class`.
        what: &'static str,
        /// The name as given.
        name: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A spec was to be written with no devices, which CDI refuses.
    #[error("claim {claim_uid}: no devices to write a CDI spec for")]
    NoDevices {
        /// The claim.
        claim_uid: String,
    },
    /// Two devices of one spec have the same CDI device name (after sanitizing).
    #[error("claim {claim_uid}: two devices have the CDI device name {name}")]
    DuplicateDevice {
        /// The claim.
        claim_uid: String,
        /// The CDI device name they share.
        name: String,
    },
    /// A device's edits break CDI's rules (e.g. an invalid variable name or an empty path),
    /// or it has no edits at all.
    #[error("claim {claim_uid}, device {device:?}: {reason}")]
    InvalidDevice {
        /// The claim.
        claim_uid: String,
        /// The device's name as the driver gave it.
        device: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The spec file, or its directory, could not be written.
    #[error("cannot write CDI spec {}: {cause}", path.display())]
    Write {
        /// The spec file.
        path: PathBuf,
        /// Why.
        cause: io::Error,
    },
    /// The spec file could not be removed, or its removal not made durable.
    #[error("cannot remove CDI spec {}: {cause}", path.display())]
    Remove {
        /// The spec file.
        path: PathBuf,
        /// Why.
        cause: io::Error,
    },
}

/// A CDI spec directory and the vendor part of the kinds written there.
#[derive(Clone, Debug)]
pub struct CdiRoot {
    dir: PathBuf,
    vendor: String,
}

impl CdiRoot {
    /// `vendor` is a CDI vendor name such as `akri.sh`; `dir` is created on first write.
    pub fn new(dir: impl Into<PathBuf>, vendor: &str) -> Result<CdiRoot, Error> {
        validate_vendor_or_class("vendor", vendor)?;
        Ok(CdiRoot {
            dir: dir.into(),
            vendor: vendor.to_string(),
        })
    }

    /// Where the spec for `claim_uid` and `class` is written.
    pub fn spec_path(&self, class: &str, claim_uid: &str) -> Result<PathBuf, Error> {
        validate_vendor_or_class("class", class)?;
        let uid = sanitize(claim_uid);
        Ok(self.dir.join(format!("{}-{class}-{uid}.json", self.vendor)))
    }

    /// Writes (or overwrites, with the same names) the spec of kind `<vendor>/<class>` for
    /// `devices` of claim `claim_uid`.
    pub fn write_claim_spec(
        &self,
        class: &str,
        claim_uid: &str,
        devices: &[CdiDevice],
    ) -> Result<ClaimSpec, Error> {
        let path = self.spec_path(class, claim_uid)?;
        if devices.is_empty() {
            return Err(Error::NoDevices {
                claim_uid: claim_uid.to_string(),
            });
        }
        let kind = format!("{}/{class}", self.vendor);
        let mut names = BTreeSet::new();
        let mut spec = Spec {
            cdi_version: CDI_VERSION,
            kind: &kind,
            devices: Vec::new(),
        };
        for device in devices {
            let invalid = |reason: String| Error::InvalidDevice {
                claim_uid: claim_uid.to_string(),
                device: device.name.clone(),
                reason,
            };
            let name = device_name(claim_uid, &device.name);
            if !names.insert(name.clone()) {
                return Err(Error::DuplicateDevice {
                    claim_uid: claim_uid.to_string(),
                    name,
                });
            }
            spec.devices
                .push(spec_device(name, device).map_err(invalid)?);
        }
        let mut bytes = serde_json::to_vec_pretty(&spec).expect("CDI spec types serialize");
        bytes.push(b'\n');

        let write = |cause| Error::Write {
            path: path.clone(),
            cause,
        };
        std::fs::create_dir_all(&self.dir).map_err(write)?;
        write_replacing(&path, &bytes, SPEC_FILE_MODE).map_err(write)?;
        let qualified_ids = spec.devices.iter().map(|d| format!("{kind}={}", d.name));
        Ok(ClaimSpec {
            qualified_ids: qualified_ids.collect(),
            path,
        })
    }
}

/// Removes a spec file written by [`CdiRoot::write_claim_spec`]; a missing file is fine, so
/// unprepare can be repeated. Takes the path recorded at prepare time rather than (class,
/// uid), so that it removes what was written even if the plugin's settings changed since.
pub fn remove_claim_spec(path: &Path) -> Result<(), Error> {
    let remove = |cause| Error::Remove {
        path: path.to_path_buf(),
        cause,
    };
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(remove(e)),
    }
    // Make the removal durable before the checkpoint forgets the claim.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    File::open(dir.unwrap_or(Path::new(".")))
        .and_then(|d| d.sync_all())
        .map_err(remove)
}

/// The CDI device name of DRA device `device` in claim `claim_uid`: `<uid>-<device>`, with
/// every character CDI does not allow replaced by `_` and an `x` added at either end if the
/// name would not start or end with a letter or digit. DRA device names (DNS labels) and
/// claim uids (UUIDs) pass through unchanged.
pub(crate) fn device_name(claim_uid: &str, device: &str) -> String {
    sanitize(&format!("{claim_uid}-{device}"))
}

/// Maps `name` into CDI's device-name alphabet: ASCII letters, digits, `_ . : -`, starting
/// and ending with a letter or digit.
fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        out.insert(0, 'x');
    }
    if !out.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        out.push('x');
    }
    out
}

/// CDI's rule for vendor and class names: ASCII letters, digits, `_ . -`, starting with a
/// letter and ending with a letter or digit. Not sanitized: the driver chooses them, and a
/// changed kind would change every CDI id.
fn validate_vendor_or_class(what: &'static str, name: &str) -> Result<(), Error> {
    let invalid = |reason| {
        Err(Error::InvalidName {
            what,
            name: name.to_string(),
            reason,
        })
    };
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return invalid("must start with a letter");
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return invalid("must end with a letter or digit");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    {
        return invalid("may contain only letters, digits, '_', '.' and '-'");
    }
    Ok(())
}

/// One device of the spec, checked against the rules the reference Go library applies.
fn spec_device(name: String, device: &CdiDevice) -> Result<SpecDevice, String> {
    let mut env = Vec::new();
    for (key, value) in &device.env {
        if key.is_empty() || key.contains(['=', '\0']) {
            return Err(format!("invalid environment variable name {key:?}"));
        }
        if value.contains('\0') {
            return Err(format!("environment variable {key} contains NUL"));
        }
        env.push(format!("{key}={value}"));
    }
    let mut device_nodes = Vec::new();
    for node in &device.device_nodes {
        if node.path.is_empty() || node.host_path.as_ref().is_some_and(String::is_empty) {
            return Err("empty device node path".to_string());
        }
        if let Some(permissions) = &node.permissions
            && !permissions.chars().all(|c| "rwm".contains(c))
        {
            return Err(format!("invalid device node permissions {permissions:?}"));
        }
        device_nodes.push(SpecDeviceNode {
            path: node.path.clone(),
            host_path: node.host_path.clone(),
            permissions: node.permissions.clone(),
        });
    }
    let mut mounts = Vec::new();
    for mount in &device.mounts {
        if mount.container_path.is_empty() || mount.host_path.is_empty() {
            return Err("empty mount path".to_string());
        }
        let mut options = vec!["bind".to_string()];
        if mount.read_only {
            options.push("ro".to_string());
        }
        mounts.push(SpecMount {
            host_path: mount.host_path.clone(),
            container_path: mount.container_path.clone(),
            options,
        });
    }
    if env.is_empty() && device_nodes.is_empty() && mounts.is_empty() {
        return Err("no environment, device nodes or mounts: CDI refuses empty devices".into());
    }
    Ok(SpecDevice {
        name,
        container_edits: ContainerEdits {
            env,
            device_nodes,
            mounts,
        },
    })
}

// The CDI spec, as far as we write it (tags.cncf.io/container-device-interface/specs-go).

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    cdi_version: &'static str,
    kind: &'a str,
    devices: Vec<SpecDevice>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecDevice {
    name: String,
    container_edits: ContainerEdits,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerEdits {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    env: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    device_nodes: Vec<SpecDeviceNode>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    mounts: Vec<SpecMount>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecDeviceNode {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    host_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    permissions: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecMount {
    host_path: String,
    container_path: String,
    options: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use std::os::unix::fs::PermissionsExt;

    const UID_A: &str = "0b6c1c5e-8d0e-4b53-9a3f-1f2e3d4c5b6a";
    const UID_B: &str = "9f1d2e3c-4b5a-4697-8877-665544332211";

    fn camera() -> CdiDevice {
        CdiDevice {
            name: "onvif-1a2b3c".to_string(),
            env: vec![(
                "ONVIF_DEVICE_SERVICE_URL".to_string(),
                "http://10.0.0.5:80/onvif/device_service".to_string(),
            )],
            ..CdiDevice::default()
        }
    }

    fn read(path: &Path) -> Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn writes_the_cdi_json_shape() {
        let dir = tempfile::tempdir().unwrap();
        let root = CdiRoot::new(dir.path().join("cdi"), "akri.sh").unwrap();
        let usb = CdiDevice {
            name: "udev-video0".to_string(),
            env: vec![("UDEV_DEVNODE".to_string(), "/dev/video0".to_string())],
            device_nodes: vec![DeviceNode {
                path: "/dev/video0".to_string(),
                host_path: Some("/dev/v4l/by-id/cam".to_string()),
                permissions: Some("rw".to_string()),
            }],
            mounts: vec![Mount {
                container_path: "/etc/cam".to_string(),
                host_path: "/var/lib/cam".to_string(),
                read_only: true,
            }],
        };
        let spec = root
            .write_claim_spec("udev.cameras", UID_A, &[usb, camera()])
            .unwrap();

        let file = format!("akri.sh-udev.cameras-{UID_A}.json");
        assert_eq!(spec.path, dir.path().join("cdi").join(&file));
        assert_eq!(
            spec.qualified_ids,
            [
                format!("akri.sh/udev.cameras={UID_A}-udev-video0"),
                format!("akri.sh/udev.cameras={UID_A}-onvif-1a2b3c"),
            ]
        );
        assert_eq!(
            read(&spec.path),
            json!({
                "cdiVersion": "0.6.0",
                "kind": "akri.sh/udev.cameras",
                "devices": [
                    {
                        "name": format!("{UID_A}-udev-video0"),
                        "containerEdits": {
                            "env": ["UDEV_DEVNODE=/dev/video0"],
                            "deviceNodes": [{
                                "path": "/dev/video0",
                                "hostPath": "/dev/v4l/by-id/cam",
                                "permissions": "rw",
                            }],
                            "mounts": [{
                                "hostPath": "/var/lib/cam",
                                "containerPath": "/etc/cam",
                                "options": ["bind", "ro"],
                            }],
                        },
                    },
                    {
                        "name": format!("{UID_A}-onvif-1a2b3c"),
                        "containerEdits": {
                            "env": ["ONVIF_DEVICE_SERVICE_URL=http://10.0.0.5:80/onvif/device_service"],
                        },
                    },
                ],
            })
        );
        let mode = std::fs::metadata(&spec.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, SPEC_FILE_MODE);
        let names: Vec<_> = std::fs::read_dir(&root.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [file.as_str()], "no temporary file is left behind");

        // Preparing again writes the same file with the same ids.
        let again = root
            .write_claim_spec("udev.cameras", UID_A, &[camera()])
            .unwrap();
        assert_eq!(again.path, spec.path);
        assert_eq!(again.qualified_ids[0], spec.qualified_ids[1]);
    }

    #[test]
    fn one_device_in_two_claims_has_two_names_and_two_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = CdiRoot::new(dir.path(), "akri.sh").unwrap();
        let a = root.write_claim_spec("onvif", UID_A, &[camera()]).unwrap();
        let b = root.write_claim_spec("onvif", UID_B, &[camera()]).unwrap();
        assert_ne!(a.path, b.path);
        assert_ne!(a.qualified_ids, b.qualified_ids);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn sanitizes_device_names_deterministically() {
        assert_eq!(device_name(UID_A, "cam-1"), format!("{UID_A}-cam-1"));
        assert_eq!(device_name("uid", "a/b c_d.e:f"), "uid-a_b_c_d.e:f");
        assert_eq!(device_name("uid", "kamera-ü"), "uid-kamera-_x");
        assert_eq!(device_name("-uid", "x"), "x-uid-x");
        assert_eq!(device_name("uid", "a/b"), device_name("uid", "a/b"));
        assert_eq!(sanitize("../etc"), "x.._etc");

        // A collision after sanitizing is an error, not a silently shared name.
        let dir = tempfile::tempdir().unwrap();
        let root = CdiRoot::new(dir.path(), "akri.sh").unwrap();
        let devices = [
            CdiDevice {
                name: "a/b".to_string(),
                ..camera()
            },
            CdiDevice {
                name: "a_b".to_string(),
                ..camera()
            },
        ];
        let error = root.write_claim_spec("onvif", UID_A, &devices).unwrap_err();
        assert!(matches!(error, Error::DuplicateDevice { .. }), "{error}");
    }

    #[test]
    fn refuses_what_cdi_refuses() {
        assert!(CdiRoot::new("/cdi", "akri/sh").is_err());
        assert!(CdiRoot::new("/cdi", "").is_err());
        let dir = tempfile::tempdir().unwrap();
        let root = CdiRoot::new(dir.path(), "akri.sh").unwrap();
        for class in ["1cameras", "cameras-", "a/b", ""] {
            let error = root.write_claim_spec(class, UID_A, &[camera()]);
            assert!(matches!(error, Err(Error::InvalidName { .. })), "{class}");
        }
        let error = root.write_claim_spec("onvif", UID_A, &[]).unwrap_err();
        assert!(matches!(error, Error::NoDevices { .. }), "{error}");

        let bad_devices = [
            CdiDevice {
                name: "empty".to_string(),
                ..CdiDevice::default()
            },
            CdiDevice {
                env: vec![("A=B".to_string(), "c".to_string())],
                ..camera()
            },
            CdiDevice {
                env: vec![(String::new(), "c".to_string())],
                ..camera()
            },
            CdiDevice {
                env: vec![("A".to_string(), "nul\0".to_string())],
                ..camera()
            },
            CdiDevice {
                device_nodes: vec![DeviceNode {
                    path: "/dev/x".to_string(),
                    host_path: None,
                    permissions: Some("rx".to_string()),
                }],
                ..camera()
            },
            CdiDevice {
                mounts: vec![Mount::default()],
                ..camera()
            },
        ];
        for device in bad_devices {
            let error = root
                .write_claim_spec("onvif", UID_A, std::slice::from_ref(&device))
                .unwrap_err();
            assert!(
                matches!(error, Error::InvalidDevice { .. }),
                "{device:?}: {error}"
            );
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn env_values_round_trip() {
        let values = [
            "rtsp://user:p@ss@10.0.0.5:554/stream?a=1&b=2",
            "with spaces and = signs ==",
            "quotes \" ' and \\ backslashes",
            "new\nline\ttab\u{1}",
            "ünïcödé ✓",
            "",
        ];
        let device = CdiDevice {
            name: "d".to_string(),
            env: values
                .iter()
                .enumerate()
                .map(|(i, v)| (format!("PROP_{i}"), v.to_string()))
                .collect(),
            ..CdiDevice::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let root = CdiRoot::new(dir.path(), "akri.sh").unwrap();
        let spec = root.write_claim_spec("onvif", UID_A, &[device]).unwrap();

        let env = read(&spec.path)["devices"][0]["containerEdits"]["env"].clone();
        let env: Vec<String> = serde_json::from_value(env).unwrap();
        for (i, (entry, value)) in env.iter().zip(values).enumerate() {
            // What a runtime does with an entry: split at the first '='.
            let (key, read_value) = entry.split_once('=').unwrap();
            assert_eq!((key, read_value), (format!("PROP_{i}").as_str(), value));
        }
        assert_eq!(env.len(), values.len());
    }

    #[test]
    fn removal_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let root = CdiRoot::new(dir.path(), "akri.sh").unwrap();
        let spec = root.write_claim_spec("onvif", UID_A, &[camera()]).unwrap();
        remove_claim_spec(&spec.path).unwrap();
        assert!(!spec.path.exists());
        remove_claim_spec(&spec.path).unwrap();
        remove_claim_spec(&dir.path().join("never/written.json")).unwrap();
    }
}
