//! Where the Kubernetes binaries built by `hack/k8s-bins.sh` are.

use crate::Error;
use std::path::{Path, PathBuf};

/// A directory holding etcd, kube-apiserver, kube-scheduler, kube-controller-manager and
/// (for the main version) kubelet-peer.
#[derive(Clone, Debug)]
pub struct BinDir {
    dir: PathBuf,
    version: String,
}

impl BinDir {
    /// `$AKRI_K8S_BIN_DIR` if set, else the main version's build output
    /// (`_output/k8s/v<hack/k8s/VERSION>/bin`). `$AKRI_K8S_VERSION` selects another
    /// version's output, e.g. `1.34.4`.
    pub fn from_env() -> Result<Self, Error> {
        let repo = repo_root();
        let main_version = main_version()?;
        let version = std::env::var("AKRI_K8S_VERSION")
            .map(|v| v.trim_start_matches('v').to_string())
            .unwrap_or(main_version);
        let dir = match std::env::var_os("AKRI_K8S_BIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => repo.join(format!("_output/k8s/v{version}/bin")),
        };
        let bins = BinDir { dir, version };
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-scheduler",
            "kube-controller-manager",
        ] {
            bins.require(name)?;
        }
        Ok(bins)
    }

    /// The Kubernetes version these binaries were built from, e.g. `1.36.3`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The kubelet peer: this version's if built, else the main version's. Built only for the
    /// main version, so on an older control plane it runs one minor ahead of the API server
    /// (a skew real clusters avoid; the DRA v1 API it uses is the same from 1.34 on).
    pub fn kubelet_peer(&self) -> Result<PathBuf, Error> {
        self.require("kubelet-peer").or_else(|missing| {
            let main = BinDir {
                dir: repo_root().join(format!("_output/k8s/v{}/bin", main_version()?)),
                version: main_version()?,
            };
            main.require("kubelet-peer").map_err(|_| missing)
        })
    }

    /// The path of one binary, or an error that says how to build it.
    pub fn require(&self, name: &str) -> Result<PathBuf, Error> {
        let path = self.dir.join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::BinariesMissing {
                dir: self.dir.clone(),
                missing: name.to_string(),
                version_arg: format!(" {}", self.version),
            })
        }
    }
}

/// The main Kubernetes version (`hack/k8s/VERSION`).
fn main_version() -> Result<String, Error> {
    Ok(
        std::fs::read_to_string(repo_root().join("hack/k8s/VERSION"))
            .map_err(Error::io("read hack/k8s/VERSION"))?
            .trim()
            .to_string(),
    )
}

/// The repository root (this crate lives in `<root>/testing`).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testing/ has a parent")
        .to_path_buf()
}
