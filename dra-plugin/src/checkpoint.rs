//! The claims a plugin has prepared, kept on disk so that they survive a restart.
//!
//! After a restart (even SIGKILL) the kubelet may call NodeUnprepareResources for a claim
//! prepared by the previous process, and it may call NodePrepareResources again for a claim
//! that is already prepared. The plugin must then remove exactly what prepare wrote and answer
//! with the same CDI device ids as before; it can only do that if it remembers, so it stores
//! the prepared claims here before it answers the kubelet.
//!
//! The file is JSON, compact (indented here):
//!
//! ```json
//! { "version": 1, "checksum": 1234567890, "claims": { "<claim uid>": { ... } } }
//! ```
//!
//! `checksum` is the CRC-32 of the compact JSON serialization of `claims` as these types
//! write it (struct fields in declaration order, map keys sorted), so re-indenting the file
//! does not matter but any change to the data does. Every store writes a temporary file in the
//! same directory, fsyncs it, renames it over the checkpoint and fsyncs the directory: a crash
//! leaves either the old or the new checkpoint, never a mix (at worst a stray hidden `.tmp`
//! file, which `Checkpoint::open` ignores).
//!
//! A checkpoint that cannot be read (an I/O error) is an [`Error`]: the file may be fine and
//! the disk briefly unhappy. One that does not parse, has an unknown version or a wrong
//! checksum is set aside by `Checkpoint::open_or_set_aside`: renamed to
//! `<name>.corrupt-<unix seconds>` for the operator to inspect, and the plugin starts with no
//! recorded claims. That loses nothing a driver cannot rebuild: the kubelet prepares again
//! every claim of a pod it (re)starts, and unprepare of a claim the checkpoint does not know
//! removes what a prepare would have written, by naming convention (see
//! [`crate::service::Driver::unprepare`]). Refusing to start instead would leave the node's
//! devices published while nothing prepares them.
//!
//! The order that survives a crash at any point (this is what [`crate::service`] does):
//! 1. the driver writes the claim's CDI specs (deterministic names and content);
//! 2. the service stores the claim, with the spec paths and their content, in the checkpoint;
//! 3. only then does the kubelet hear "prepared".
//!
//! A crash between 1 and 2 leaves specs the checkpoint does not know: the kubelet still
//! believes the claim unprepared and either prepares it again (same names, same content) or
//! unprepares it (removal by naming convention). Preparing a recorded claim again rewrites any
//! of its specs that is missing or differs from the recorded content, so a reboot that wiped
//! the CDI directory (a tmpfs on most nodes) heals on the kubelet's next prepare. Unprepare
//! removes the specs (a missing one is fine) and then stores the claims without it.
//!
//! There is one writer: the plugin process that opened the checkpoint (a second process on the
//! same node must wait for the first; the kubelet-plugin takes a lock file in its state
//! directory). Within the process, [`crate::service::DraService`] serialises stores.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use std::io;

use std::path::{Path, PathBuf};

/// The only format this code reads and writes.
const VERSION: u64 = 1;

/// A claim the plugin prepared, with what unprepare needs to undo it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim's UID (also its key in [`PreparedClaims`]).
    pub uid: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The devices prepared for the claim, as the kubelet was told.
    pub devices: Vec<PreparedDevice>,
    /// The CDI spec files prepare wrote for this claim (one per CDI kind), recorded as paths
    /// so that unprepare removes exactly these even if the plugin's CDI settings changed.
    pub cdi_spec_files: Vec<PathBuf>,
    /// The content of each of those files as prepare wrote it, so that preparing the claim
    /// again can rewrite a spec that is gone (a reboot wiped the CDI directory) or changed.
    /// Read back by [`crate::service::DraService`] right after the driver wrote them. Absent
    /// in checkpoints written before it existed (same version: an empty map is not written).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cdi_spec_contents: BTreeMap<PathBuf, String>,
    /// The library's own files for the claim, the device metadata ([`crate::metadata`]) and
    /// its CDI spec, with their content: healed like the specs, removed at unprepare. Absent
    /// when device metadata is off (an empty list is not written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metadata_files: Vec<WrittenFile>,
    /// The driver's entries in the claim's `status.devices`
    /// ([`Prepared::status`](crate::Prepared::status)): kept here, where every prepare is
    /// stored durably anyway, so that the next process applies what this one had no time to.
    /// Absent when the driver writes none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub status: Vec<crate::device_status::DeviceStatus>,
}

/// A file the library wrote for a claim, kept whole to be written again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenFile {
    /// Where.
    pub path: PathBuf,
    /// What it holds.
    pub content: String,
    /// Its permission bits.
    pub mode: u32,
}

/// One allocated device of a prepared claim, as NodePrepareResources reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests this device was allocated for.
    pub request_names: Vec<String>,
    /// The pool the device belongs to.
    pub pool_name: String,
    /// The device's name within its pool.
    pub device_name: String,
    /// The fully qualified CDI device ids the kubelet hands to the container runtime.
    pub cdi_device_ids: Vec<String>,
    /// The share id of an allocation of consumable capacity, if any.
    pub share_id: Option<String>,
}

/// Prepared claims by claim uid.
pub type PreparedClaims = BTreeMap<String, PreparedClaim>;

/// Errors of reading and writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file exists but could not be read (an I/O error; the file itself may be fine).
    #[error("cannot read checkpoint {}: {cause}", path.display())]
    Read {
        /// The checkpoint file.
        path: PathBuf,
        /// Why.
        cause: io::Error,
    },
    /// The file is not JSON, or not the shape of a checkpoint.
    #[error("checkpoint {} is not a valid checkpoint file: {cause}", path.display())]
    Parse {
        /// The checkpoint file.
        path: PathBuf,
        /// What did not parse.
        cause: serde_json::Error,
    },
    /// The file records a version other than the one this code reads, or none.
    #[error("checkpoint {} has version {found}; this plugin reads version {VERSION}", path.display())]
    Version {
        /// The checkpoint file.
        path: PathBuf,
        /// The `version` the file records, as JSON, or `(none)`.
        found: String,
    },
    /// The claims in the file do not match the checksum recorded with them.
    #[error("checkpoint {} is corrupt: it records checksum {recorded}, its data has {computed}", path.display())]
    Checksum {
        /// The checkpoint file.
        path: PathBuf,
        /// The checksum the file records.
        recorded: u32,
        /// The checksum of the claims the file holds.
        computed: u32,
    },
    /// The claims could not be serialized to JSON (to store them or to compute their checksum).
    #[error("cannot encode prepared claims for checkpoint {}: {cause}", path.display())]
    Encode {
        /// The checkpoint file.
        path: PathBuf,
        /// Why.
        cause: serde_json::Error,
    },
    /// Storing failed: creating the directory, writing or renaming the file, or setting a
    /// corrupt file aside.
    #[error("cannot write checkpoint {}: {cause}", path.display())]
    Write {
        /// The checkpoint file.
        path: PathBuf,
        /// Why.
        cause: io::Error,
    },
}

impl Error {
    /// The checkpoint file, for a message telling the operator what to inspect.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        match self {
            Error::Read { path, .. }
            | Error::Parse { path, .. }
            | Error::Version { path, .. }
            | Error::Checksum { path, .. }
            | Error::Encode { path, .. }
            | Error::Write { path, .. } => path,
        }
    }
}

/// The file on disk. Reading happens once, in `Checkpoint::open`; the plugin keeps the
/// claims in memory and writes them after every change (`encode`, then `write`).
///
/// The calls block on file I/O (a few small writes and fsyncs); from async code run them in
/// `tokio::task::spawn_blocking` (as [`crate::service::DraService`] does) if that matters.
#[derive(Clone, Debug)]
pub(crate) struct Checkpoint {
    path: PathBuf,
}

/// The file as read (its `version` is checked before, on the parsed value).
#[derive(Deserialize)]
struct OnDisk {
    checksum: u32,
    claims: PreparedClaims,
}

/// [`OnDisk`] as written: the claims borrowed, not copied (they hold every file's content).
#[derive(Serialize)]
struct OnDiskRef<'a> {
    version: u64,
    checksum: u32,
    claims: &'a PreparedClaims,
}

/// A checkpoint that could not be used and was moved out of the way.
#[derive(Debug)]
pub struct SetAside {
    /// Where the unusable file is now.
    pub moved_to: PathBuf,
    /// Why it could not be used.
    pub reason: Error,
}

impl Checkpoint {
    /// [`open`](Self::open), except that a file that does not parse, has another version or a
    /// wrong checksum is renamed to `<name>.corrupt-<unix seconds>` and the plugin starts
    /// without recorded claims (see the module documentation for why that is safe). The caller
    /// should tell the operator, loudly, what was set aside.
    pub(crate) fn open_or_set_aside(
        path: impl Into<PathBuf>,
    ) -> Result<(Checkpoint, PreparedClaims, Option<SetAside>), Error> {
        let path = path.into();
        match Checkpoint::open(&path) {
            Ok((checkpoint, claims)) => Ok((checkpoint, claims, None)),
            Err(
                reason @ (Error::Parse { .. } | Error::Version { .. } | Error::Checksum { .. }),
            ) => {
                let seconds = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let mut moved_to = path.clone().into_os_string();
                moved_to.push(format!(".corrupt-{seconds}"));
                let moved_to = PathBuf::from(moved_to);
                std::fs::rename(&path, &moved_to).map_err(|cause| Error::Write {
                    path: path.clone(),
                    cause,
                })?;
                let set_aside = SetAside { moved_to, reason };
                Ok((Checkpoint { path }, PreparedClaims::new(), Some(set_aside)))
            }
            Err(error) => Err(error),
        }
    }

    /// Reads the checkpoint at `path`; a missing file means no claims are prepared.
    pub(crate) fn open(path: impl Into<PathBuf>) -> Result<(Checkpoint, PreparedClaims), Error> {
        let path = path.into();
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok((Checkpoint { path }, PreparedClaims::new()));
            }
            Err(cause) => return Err(Error::Read { path, cause }),
        };
        // The version first: another version may have another shape.
        let value: serde_json::Value = match serde_json::from_slice(&bytes) {
            Ok(value) => value,
            Err(cause) => return Err(Error::Parse { path, cause }),
        };
        let version = value.get("version");
        if version.and_then(serde_json::Value::as_u64) != Some(VERSION) {
            let found = version.map_or("(none)".to_string(), ToString::to_string);
            return Err(Error::Version { path, found });
        }
        let file: OnDisk = match serde_json::from_value(value) {
            Ok(file) => file,
            Err(cause) => return Err(Error::Parse { path, cause }),
        };
        let computed = match checksum(&file.claims) {
            Ok(computed) => computed,
            Err(cause) => return Err(Error::Encode { path, cause }),
        };
        if computed != file.checksum {
            return Err(Error::Checksum {
                path,
                recorded: file.checksum,
                computed,
            });
        }
        Ok((Checkpoint { path }, file.claims))
    }

    /// Replaces the checkpoint with `claims`, atomically; creates the directory if missing.
    #[cfg(test)]
    pub(crate) fn store(&self, claims: &PreparedClaims) -> Result<(), Error> {
        self.write(&self.encode(claims)?)
    }

    /// The file's bytes for `claims` (compact JSON: it is rewritten whole on every change),
    /// apart from [`write`](Self::write) so that an async caller encodes on its own thread
    /// and hands only the bytes to a blocking one.
    pub(crate) fn encode(&self, claims: &PreparedClaims) -> Result<Vec<u8>, Error> {
        let encode = |cause| Error::Encode {
            path: self.path.clone(),
            cause,
        };
        let file = OnDiskRef {
            version: VERSION,
            checksum: checksum(claims).map_err(encode)?,
            claims,
        };
        let mut bytes = serde_json::to_vec(&file).map_err(encode)?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// Replaces the checkpoint with `bytes` from [`encode`](Self::encode), atomically.
    pub(crate) fn write(&self, bytes: &[u8]) -> Result<(), Error> {
        let write = |cause| Error::Write {
            path: self.path.clone(),
            cause,
        };
        if let Some(dir) = parent(&self.path) {
            std::fs::create_dir_all(dir).map_err(write)?;
        }
        // Only the plugin needs to read it.
        node_io::files::write_atomically(&self.path, bytes, 0o600).map_err(write)
    }

    /// The checkpoint file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

fn checksum(claims: &PreparedClaims) -> Result<u32, serde_json::Error> {
    Ok(crc32fast::hash(&serde_json::to_vec(claims)?))
}

/// The directory of `path`, `None` for a bare file name (the current directory).
fn parent(path: &Path) -> Option<&Path> {
    path.parent().filter(|dir| !dir.as_os_str().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn claims() -> PreparedClaims {
        let claim = PreparedClaim {
            uid: "0b6c1c5e-8d0e-4b53-9a3f-1f2e3d4c5b6a".to_string(),
            namespace: "default".to_string(),
            name: "camera".to_string(),
            devices: vec![PreparedDevice {
                request_names: vec!["cam".to_string()],
                pool_name: "node-a".to_string(),
                device_name: "onvif-1a2b3c".to_string(),
                cdi_device_ids: vec!["akri.sh/onvif=0b6c1c5e-onvif-1a2b3c".to_string()],
                share_id: Some("7d1e".to_string()),
            }],
            cdi_spec_files: vec![PathBuf::from("/var/run/cdi/akri.sh-onvif-0b6c1c5e.json")],
            cdi_spec_contents: BTreeMap::new(),
            metadata_files: Vec::new(),
            status: vec![crate::device_status::DeviceStatus {
                pool: "node-a".to_string(),
                device: "onvif-1a2b3c".to_string(),
                data: Some(serde_json::json!({ "instance": "onvif-1a2b3c" })),
                ..Default::default()
            }],
        };
        BTreeMap::from([(claim.uid.clone(), claim)])
    }

    fn stored(dir: &Path) -> PathBuf {
        let path = dir.join("checkpoint.json");
        let (checkpoint, _) = Checkpoint::open(&path).unwrap();
        checkpoint.store(&claims()).unwrap();
        path
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = stored(dir.path());
        let (checkpoint, read) = Checkpoint::open(&path).unwrap();
        assert_eq!(read, claims());
        checkpoint.store(&PreparedClaims::new()).unwrap();
        assert!(Checkpoint::open(&path).unwrap().1.is_empty());

        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            ["checkpoint.json"],
            "no temporary file is left behind"
        );
    }

    #[test]
    fn missing_file_is_empty_and_store_creates_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/checkpoint.json");
        let (checkpoint, read) = Checkpoint::open(&path).unwrap();
        assert!(read.is_empty());
        checkpoint.store(&claims()).unwrap();
        assert_eq!(Checkpoint::open(&path).unwrap().1, claims());
    }

    #[test]
    fn reformatting_keeps_the_checksum_valid() {
        let dir = tempfile::tempdir().unwrap();
        let path = stored(dir.path());
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).expect("the checkpoint is JSON");
        std::fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
        assert_eq!(Checkpoint::open(&path).unwrap().1, claims());
    }

    #[test]
    fn a_changed_byte_is_a_checksum_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = stored(dir.path());
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("onvif-1a2b3c", "onvif-1a2b3d")).unwrap();
        let error = Checkpoint::open(&path).unwrap_err();
        assert!(matches!(error, Error::Checksum { .. }), "{error}");
        assert_eq!(error.path(), path);
        assert!(error.to_string().contains(&*path.to_string_lossy()));
    }

    #[test]
    fn unknown_version_and_garbage_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = stored(dir.path());
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"version\":1", "\"version\":2")).unwrap();
        let error = Checkpoint::open(&path).unwrap_err();
        assert!(
            matches!(&error, Error::Version { found, .. } if found == "2"),
            "{error}"
        );

        std::fs::write(&path, r#"{"claims": {}}"#).unwrap();
        let error = Checkpoint::open(&path).unwrap_err();
        assert!(matches!(error, Error::Version { .. }), "{error}");

        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        let error = Checkpoint::open(&path).unwrap_err();
        assert!(matches!(error, Error::Parse { .. }), "{error}");

        std::fs::write(&path, "").unwrap();
        let error = Checkpoint::open(&path).unwrap_err();
        assert!(matches!(error, Error::Parse { .. }), "{error}");
    }

    #[test]
    fn a_corrupt_file_is_set_aside_and_an_unreadable_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        std::fs::write(&path, b"{ not json").unwrap();
        let (checkpoint, claims, set_aside) = Checkpoint::open_or_set_aside(&path).unwrap();
        let set_aside = set_aside.expect("set aside");
        assert!(claims.is_empty());
        assert!(matches!(set_aside.reason, Error::Parse { .. }));
        assert_eq!(std::fs::read(&set_aside.moved_to).unwrap(), b"{ not json");
        assert!(!path.exists(), "the corrupt file is no longer where it was");
        checkpoint.store(&self::claims()).unwrap();
        let (_, again, none) = Checkpoint::open_or_set_aside(&path).unwrap();
        assert!(none.is_none());
        assert_eq!(again, self::claims());

        // A directory where the file should be cannot be read: not "corrupt", an error.
        let unreadable = dir.path().join("dir.json");
        std::fs::create_dir(&unreadable).unwrap();
        assert!(matches!(
            Checkpoint::open_or_set_aside(&unreadable),
            Err(Error::Read { .. })
        ));
    }

    #[test]
    fn spec_contents_round_trip_and_old_records_keep_their_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = stored(dir.path());
        let old = std::fs::read_to_string(&path).unwrap();
        assert!(
            !old.contains("cdi_spec_contents"),
            "an empty map is not written, so files from before the field still verify"
        );
        let mut claims = claims();
        let claim = claims.values_mut().next().unwrap();
        claim
            .cdi_spec_contents
            .insert(claim.cdi_spec_files[0].clone(), "{}\n".to_string());
        let (checkpoint, _) = Checkpoint::open(&path).unwrap();
        checkpoint.store(&claims).unwrap();
        assert_eq!(Checkpoint::open(&path).unwrap().1, claims);
    }

    #[test]
    fn a_temporary_file_left_by_a_crash_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = stored(dir.path());
        // What a crash between creating and renaming the temporary file leaves.
        let leftover = dir.path().join(".checkpoint.json.a1B2c3.tmp");
        std::fs::write(&leftover, r#"{"version": 1, "checks"#).unwrap();

        let (checkpoint, read) = Checkpoint::open(&path).unwrap();
        assert_eq!(read, claims());
        checkpoint.store(&PreparedClaims::new()).unwrap();
        assert!(Checkpoint::open(&path).unwrap().1.is_empty());
    }
}
