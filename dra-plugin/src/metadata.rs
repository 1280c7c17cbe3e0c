//! Device metadata (KEP-5304): each prepared request's devices, with their attributes, in a
//! file every container of the claim reads at a standard path.
//!
//! The kubelet and the API have no part in it: like upstream's `kubeletplugin` helper
//! (`EnableDeviceMetadata`), the plugin writes a JSON file per request on the host and a CDI
//! spec that bind-mounts it read-only into the containers, and adds that CDI id to the first
//! device of the request in its answer. A container finds it at
//!
//! ```text
//! /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json
//! /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<pod claim>/<request>/<driver>-metadata.json
//! ```
//!
//! the second for a claim made from a template, named by the pod's entry
//! (`pod.spec.resourceClaims[].name`, which the claim's `resource.kubernetes.io/pod-claim-name`
//! annotation carries), since the claim's own name is not known when the pod is written.
//!
//! The file is a JSON stream: the same `DeviceMetadata` object once per API version asked
//! for, newest first, so a reader takes the first version it knows (upstream's
//! `devicemetadata.DecodeMetadataFromStream` does). The host side is this library's own:
//! `<plugin dir>/dra-device-metadata/<claim uid>.<request>.json` (by UID, so a claim deleted
//! and made again under its name never shares a file with the old one; one directory for all,
//! as every directory made and removed per claim is two more inodes for the filesystem to
//! allocate and free on the kubelet's path). The mounts go into the driver's own spec when it
//! writes it with [`Claim::write_cdi_spec`] (`<vendor>/<class>=<claim uid>-<request>.metadata`),
//! else into a CDI spec per claim of the library's, kind `<driver>/metadata` (upstream writes
//! one per request). The files are recorded in the checkpoint with their content, healed like
//! the driver's specs and removed at unprepare.
//!
//! The file is world-readable (a container of any user reads it): it must hold nothing a
//! ResourceSlice would not show. Attributes follow the slices' rules, at most
//! [`MAX_ATTRIBUTES`] per device.

use crate::cdi::{CdiDevice, CdiRoot, Mount};
use crate::checkpoint::{PreparedClaim, WrittenFile};
use crate::claim::{Claim, ClaimRef};
use crate::service::base_request_name;
use k8s_openapi::api::resource::v1::{DeviceAttribute, NetworkDeviceData};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Where containers find the metadata files.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// The annotation the ResourceClaim controller puts on a claim made from a template: the
/// pod's name for the claim (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// The host directory under the plugin directory.
const HOST_SUBDIR: &str = "dra-device-metadata";

/// The host file of a request's metadata in the layout before 2026-11-28
/// (`<claim uid>/<request>/metadata.json`), which claims prepared then still have.
const OLD_FILE_NAME: &str = "metadata.json";

/// The metadata files are read by containers of any user.
pub const FILE_MODE: u32 = 0o644;

/// The most attributes one device's metadata may carry (upstream's validation).
pub const MAX_ATTRIBUTES: usize = 32;

/// The CDI class of the metadata specs the library writes when the driver's own spec does not
/// mount the files (`<driver>/metadata=<claim uid>-<request>`).
pub const CDI_CLASS: &str = "metadata";

/// The suffix of the CDI devices in a driver's spec that mount the metadata files
/// (`<vendor>/<class>=<claim uid>-<request>.metadata`).
pub const MOUNT_SUFFIX: &str = "metadata";

/// A version of the metadata API (`metadata.resource.k8s.io`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// `v1alpha1`, Kubernetes 1.36: the same fields.
    V1alpha1,
    /// `v1beta1`, Kubernetes 1.37: the latest.
    V1beta1,
}

impl Version {
    /// The newest version: every file carries it.
    pub const LATEST: Version = Version::V1beta1;

    /// The `apiVersion` of the objects of this version.
    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Version::V1alpha1 => "metadata.resource.k8s.io/v1alpha1",
            Version::V1beta1 => "metadata.resource.k8s.io/v1beta1",
        }
    }
}

/// What the driver tells containers about one prepared device, beyond its driver, pool and
/// name (which every file carries).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceMetadata {
    /// Attributes as a ResourceSlice spells them: an unqualified name is in the driver's
    /// domain, others carry theirs (`resource.kubernetes.io/pciBusID`). Include what the slice
    /// publishes for the device; never a credential (the file is world-readable).
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// A network device's interface, addresses and hardware address.
    pub network_data: Option<NetworkDeviceData>,
}

/// Errors of device metadata.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The versions asked for lack the latest, which every reader of today knows.
    #[error(
        "device metadata versions {asked:?} lack the latest, {}",
        Version::LATEST.api_version()
    )]
    NoLatest {
        /// The versions asked for.
        asked: Vec<Version>,
    },
    /// The driver gave a device more attributes than the API allows.
    #[error(
        "device {device} has {count} metadata attributes; at most {MAX_ATTRIBUTES} are allowed"
    )]
    TooManyAttributes {
        /// The device.
        device: String,
        /// How many it had.
        count: usize,
    },
    /// The driver gave metadata for more devices than the claim has results.
    #[error("the driver gave metadata for {given} devices of the claim's {results}")]
    Count {
        /// The claim's results of this driver.
        results: usize,
        /// The metadata entries given.
        given: usize,
    },
    /// The metadata spec's CDI names are invalid (the driver name is no CDI vendor name).
    #[error(transparent)]
    Cdi(#[from] crate::cdi::Error),
    /// A file could not be written or removed.
    #[error("device metadata {}: {cause}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        cause: io::Error,
    },
}

/// Writes and removes the metadata of one driver's claims.
#[derive(Clone, Debug)]
pub struct MetadataWriter {
    driver: String,
    dir: PathBuf,
    cdi: CdiRoot,
    versions: Vec<Version>,
}

impl MetadataWriter {
    /// The writer of `driver`, keeping files under `plugin_dir` and CDI specs in `cdi_dir`,
    /// encoding each file in `versions` (newest first; the latest must be among them).
    pub fn new(
        driver: &str,
        plugin_dir: &Path,
        cdi_dir: &Path,
        versions: impl IntoIterator<Item = Version>,
    ) -> Result<Self, Error> {
        let mut versions: Vec<Version> = versions.into_iter().collect();
        versions.sort_unstable_by(|a, b| b.cmp(a));
        versions.dedup();
        if !versions.contains(&Version::LATEST) {
            return Err(Error::NoLatest { asked: versions });
        }
        Ok(MetadataWriter {
            driver: driver.to_string(),
            dir: plugin_dir.join(HOST_SUBDIR),
            cdi: CdiRoot::new(cdi_dir, driver)?,
            versions,
        })
    }

    /// The host file of a claim's request.
    fn file(&self, uid: &str, request: &str) -> PathBuf {
        self.dir.join(format!("{uid}.{request}.json"))
    }

    /// The claim's requests in the order of their first result, each with its results'
    /// indices.
    fn requests(claim: &Claim) -> Vec<(&str, Vec<usize>)> {
        let mut requests: Vec<(&str, Vec<usize>)> = Vec::new();
        for (index, result) in claim.results.iter().enumerate() {
            let base = base_request_name(&result.request);
            match requests.iter_mut().find(|(name, _)| *name == base) {
                Some((_, devices)) => devices.push(index),
                None => requests.push((base, vec![index])),
            }
        }
        requests
    }

    /// The name containers know the claim by, for a claim made from a template.
    fn pod_claim_name(claim: &Claim) -> Option<&String> {
        (claim.object.metadata.annotations.as_ref())
            .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
            .filter(|name| !name.is_empty())
    }

    /// The CDI devices that bind-mount the claim's metadata files, one per request in the
    /// order of [`Self::requests`], named `<request>.metadata` (DRA device names have no dot).
    pub(crate) fn mounts(&self, claim: &Claim) -> Vec<CdiDevice> {
        let pod_claim_name = Self::pod_claim_name(claim);
        (Self::requests(claim).into_iter())
            .map(|(request, _)| {
                let container_path = match pod_claim_name {
                    Some(pod_claim) => format!(
                        "{CONTAINER_DIR}/resourceclaimtemplates/{pod_claim}/{request}/{}-metadata.json",
                        self.driver
                    ),
                    None => format!(
                        "{CONTAINER_DIR}/resourceclaims/{}/{request}/{}-metadata.json",
                        claim.reference.name, self.driver
                    ),
                };
                let host_path = self.file(&claim.reference.uid, request);
                CdiDevice {
                    name: format!("{request}.{MOUNT_SUFFIX}"),
                    mounts: vec![Mount {
                        container_path,
                        host_path: host_path.to_string_lossy().into_owned(),
                        read_only: true,
                    }],
                    ..CdiDevice::default()
                }
            })
            .collect()
    }

    /// Writes the metadata of `claim`, prepared as `prepared` (its devices in the claim's
    /// results order), with the driver's `metadata` per result (missing ones are empty): one
    /// file per request, and a CDI spec of its own that mounts them unless the driver's spec
    /// does ([`Claim::write_cdi_spec`]). Each request's CDI id goes to its first device.
    /// Records the files, with their content, in `prepared`.
    pub(crate) fn write(
        &self,
        claim: &Claim,
        metadata: &[DeviceMetadata],
        prepared: &mut PreparedClaim,
    ) -> Result<(), Error> {
        if metadata.len() > claim.results.len() {
            return Err(Error::Count {
                results: claim.results.len(),
                given: metadata.len(),
            });
        }
        let requests = Self::requests(claim);
        let pod_claim_name = Self::pod_claim_name(claim);
        let mut files = Vec::new();
        for (request, indices) in &requests {
            let mut devices = Vec::new();
            for &index in indices {
                let result = &claim.results[index];
                let given = metadata.get(index);
                let attributes = given.map(|m| &m.attributes);
                if let Some(attributes) = attributes.filter(|a| a.len() > MAX_ATTRIBUTES) {
                    return Err(Error::TooManyAttributes {
                        device: result.device.clone(),
                        count: attributes.len(),
                    });
                }
                devices.push(FileDevice {
                    driver: &self.driver,
                    pool: &result.pool,
                    name: &result.device,
                    attributes: attributes.filter(|a| !a.is_empty()),
                    network_data: given.and_then(|m| m.network_data.as_ref()),
                });
            }
            // The name the first result gives the request (`req/sub` for a subrequest).
            let named = &claim.results[indices[0]].request;
            let content = self.encode(&claim.reference, pod_claim_name, named, devices);
            files.push(WrittenFile {
                path: self.file(&claim.reference.uid, request),
                content,
                mode: FILE_MODE,
            });
        }
        for file in &files {
            write(file)?;
        }
        let ids = match claim.metadata_ids.get() {
            Some(ids) => ids.clone(),
            None => {
                // The driver wrote its spec without the mounts: a spec of their own, each
                // device named by its request, as before 2026-11-28.
                let mut devices = self.mounts(claim);
                for (device, (request, _)) in devices.iter_mut().zip(&requests) {
                    device.name = request.to_string();
                }
                let spec =
                    (self.cdi).write_claim_spec(CDI_CLASS, &claim.reference.uid, &devices)?;
                let content = std::fs::read_to_string(&spec.path).map_err(|cause| Error::Io {
                    path: spec.path.clone(),
                    cause,
                })?;
                files.push(WrittenFile {
                    path: spec.path,
                    content,
                    mode: crate::cdi::SPEC_FILE_MODE,
                });
                spec.qualified_ids
            }
        };
        // Each request's CDI id on its first device: the runtime mounts the file once.
        for ((_, indices), id) in requests.iter().zip(ids) {
            prepared.devices[indices[0]].cdi_device_ids.push(id);
        }
        prepared.metadata_files = files;
        Ok(())
    }

    /// Removes what [`write`](Self::write) wrote for a claim: the files `prepared` records,
    /// or, when the checkpoint does not know the claim, whatever a prepare could have left.
    pub(crate) fn remove(
        &self,
        claim: &ClaimRef,
        prepared: Option<&PreparedClaim>,
    ) -> Result<(), Error> {
        if let Some(prepared) = prepared {
            return remove_recorded(prepared);
        }
        let spec = self.cdi.spec_path(CDI_CLASS, &claim.uid)?;
        remove_file(&spec)?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |cause| Error::Io { path, cause }
        };
        let entries = match std::fs::read_dir(&self.dir) {
            Err(cause) if cause.kind() == io::ErrorKind::NotFound => return Ok(()),
            entries => entries.map_err(io(&self.dir))?,
        };
        let prefix = format!("{}.", claim.uid);
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&prefix) && name.ends_with(".json") {
                remove_file(&entry.path())?;
            } else if name == claim.uid.as_str() {
                // The layout before 2026-11-28: a directory per claim.
                let dir = entry.path();
                std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
            }
        }
        Ok(())
    }

    /// The stream: the object once per version, newest first.
    fn encode(
        &self,
        claim: &ClaimRef,
        pod_claim_name: Option<&String>,
        request: &str,
        devices: Vec<FileDevice<'_>>,
    ) -> String {
        let requests = [FileRequest {
            name: request,
            devices,
        }];
        let mut stream = String::new();
        for version in &self.versions {
            let object = FileObject {
                kind: "DeviceMetadata",
                api_version: version.api_version(),
                metadata: FileObjectMeta {
                    name: &claim.name,
                    namespace: &claim.namespace,
                    uid: &claim.uid,
                    generation: 1,
                },
                pod_claim_name,
                requests: &requests,
            };
            stream.push_str(&serde_json::to_string_pretty(&object).expect("metadata serializes"));
            stream.push('\n');
        }
        stream
    }
}

/// Removes the metadata files recorded for a claim, and their directories once empty (also
/// when the plugin no longer writes metadata: what an earlier prepare wrote still goes).
pub(crate) fn remove_recorded(prepared: &PreparedClaim) -> Result<(), Error> {
    for file in &prepared.metadata_files {
        remove_file(&file.path)?;
        // A claim prepared in the layout before 2026-11-28 (`<claim uid>/<request>/metadata.json`):
        // the request's and the claim's directories too. Not empty (another request's file)
        // is fine; the last file's removal takes them.
        let is_metadata = file.path.file_name() == Some(OLD_FILE_NAME.as_ref());
        let request_dir = file.path.parent().filter(|_| is_metadata);
        for dir in request_dir
            .into_iter()
            .flat_map(|d| [Some(d), d.parent()])
            .flatten()
        {
            let _ = std::fs::remove_dir(dir);
        }
    }
    Ok(())
}

fn remove_file(path: &Path) -> Result<(), Error> {
    match std::fs::remove_file(path) {
        Err(cause) if cause.kind() != io::ErrorKind::NotFound => Err(Error::Io {
            path: path.to_path_buf(),
            cause,
        }),
        _ => Ok(()),
    }
}

/// Writes (or rewrites) a file, making its directories (readable by all: containers of any
/// user resolve the bind mount's source as root, but read the file as themselves).
pub(crate) fn write(file: &WrittenFile) -> Result<(), Error> {
    let io = |cause| Error::Io {
        path: file.path.clone(),
        cause,
    };
    if let Some(dir) = file.path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    // Containers read it only after the prepare returns, so a new file is written in place.
    node_io::files::write_new_or_replacing(&file.path, file.content.as_bytes(), file.mode)
        .map_err(io)
}

// The file's object, as upstream's `k8s.io/dynamic-resource-allocation/api/metadata`
// serializes it (field order included).

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileObject<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: FileObjectMeta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a String>,
    requests: &'a [FileRequest<'a>],
}

#[derive(Serialize)]
struct FileObjectMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    generation: i64,
}

#[derive(Serialize)]
struct FileRequest<'a> {
    name: &'a str,
    devices: Vec<FileDevice<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FileDevice<'a> {
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    attributes: Option<&'a BTreeMap<String, DeviceAttribute>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network_data: Option<&'a NetworkDeviceData>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim the checkpoint does not know (a prepare interrupted before recording it) loses
    /// whatever a prepare could have left: its files in today's layout and its directory in
    /// the layout before, nobody else's.
    #[test]
    fn an_unrecorded_claims_files_are_removed_in_both_layouts() {
        let root = tempfile::tempdir().unwrap();
        let writer = MetadataWriter::new(
            "gadget.example.com",
            &root.path().join("plugin"),
            &root.path().join("cdi"),
            [Version::LATEST],
        )
        .unwrap();
        let dir = root.path().join("plugin").join(HOST_SUBDIR);
        let old = dir.join("uid-a").join("r");
        std::fs::create_dir_all(&old).unwrap();
        for file in [
            dir.join("uid-a.r.json"),
            dir.join("uid-a.s.json"),
            dir.join("uid-b.r.json"),
            old.join(OLD_FILE_NAME),
        ] {
            std::fs::write(file, "{}").unwrap();
        }
        let claim = ClaimRef {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "uid-a".into(),
        };
        writer.remove(&claim, None).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["uid-b.r.json"]);
    }
}
