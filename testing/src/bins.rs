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

/// What `hack/node-bins.sh` builds for a real test node: containerd, its runc shim, ctr, runc,
/// the CNI plugins, and the pause and busybox images as OCI archives.
#[derive(Clone, Debug)]
pub struct NodeBins {
    root: PathBuf,
}

impl NodeBins {
    /// `$AKRI_NODE_BINS_ROOT` if set, else `_output/node`; an error naming the script when
    /// something is missing.
    pub fn from_env() -> Result<Self, Error> {
        let root = std::env::var_os("AKRI_NODE_BINS_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("_output/node"));
        let bins = NodeBins { root };
        for name in ["containerd", "containerd-shim-runc-v2", "ctr", "runc"] {
            bins.require(name)?;
        }
        for plugin in ["bridge", "host-local", "loopback"] {
            bins.require(&format!("cni/{plugin}"))?;
        }
        for image in ["pause", "busybox"] {
            bins.image_archive(image)?;
        }
        Ok(bins)
    }

    /// The directory with containerd, the shim, ctr and runc (the shim is found on `PATH`).
    pub fn bin_dir(&self) -> PathBuf {
        self.root.join("bin")
    }

    /// The directory with the CNI plugins.
    pub fn cni_dir(&self) -> PathBuf {
        self.root.join("bin/cni")
    }

    /// The path of one binary under `bin/`.
    pub fn require(&self, name: &str) -> Result<PathBuf, Error> {
        let path = self.root.join("bin").join(name);
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::NodeBinariesMissing { missing: path })
        }
    }

    /// The OCI archive of image `image` (`pause` or `busybox`).
    pub fn image_archive(&self, image: &str) -> Result<PathBuf, Error> {
        let path = self.root.join("images").join(format!("{image}.tar"));
        if path.is_file() {
            Ok(path)
        } else {
            Err(Error::NodeBinariesMissing { missing: path })
        }
    }

    /// The name an image is imported under (`hack/node-bins.sh` writes them to
    /// `images/names`), e.g. `docker.io/library/busybox:akri-test` for `busybox`.
    pub fn image_name(&self, image: &str) -> Result<String, Error> {
        let path = self.root.join("images/names");
        let names = std::fs::read_to_string(&path)
            .map_err(Error::io(format!("read {}", path.display())))?;
        names
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{image}=")))
            .map(str::to_string)
            .ok_or(Error::NodeBinariesMissing { missing: path })
    }
}
