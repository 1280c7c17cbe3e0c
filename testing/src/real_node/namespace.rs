//! The node's own mount namespace, shared by its containerd and kubelet (and so by the shims
//! and containers they start).
//!
//! The kubelet's device-plugin directory is not under `--root-dir`: it is the constant
//! `/var/lib/kubelet/device-plugins`, and the device manager empties it when it starts. Two
//! kubelets on one machine would take each other's device plugins away. In the node's
//! namespace that path is the node's own directory (a bind mount), so each node has its
//! own, and the plugins under test (outside the namespace) use it at its real path,
//! `<node dir>/device-plugins`.
//!
//! The namespace is persistent (bound to a file), so that containerd or the kubelet can be
//! restarted into it while the other keeps running; its mounts are private, so nothing the
//! node mounts (pod volumes, container root filesystems, network namespaces) appears on the
//! machine, and all of it goes when the namespace does.

use super::run;
use crate::Error;
use std::path::{Path, PathBuf};

/// Where the kubelet keeps device plugins, whatever its root directory.
const KUBELET_DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";

#[derive(Clone, Debug)]
pub(super) struct MountNamespace {
    file: PathBuf,
}

impl MountNamespace {
    /// Creates the namespace of the node whose directory is `dir`, with `device_plugins`
    /// mounted at the kubelet's device-plugin path.
    pub fn create(dir: &Path, device_plugins: &Path) -> Result<Self, Error> {
        // The file a persistent namespace is bound to must be on a private mount (else the
        // namespace would hold a reference to itself): the node's directory is made one.
        let dir_s = dir.display().to_string();
        run("mount", &["--bind", &dir_s, &dir_s])?;
        run("mount", &["--make-private", &dir_s])?;
        let file = dir.join("mount-ns");
        std::fs::write(&file, "").map_err(Error::io("create the mount namespace file"))?;
        let file_s = file.display().to_string();
        run(
            "unshare",
            &[
                &format!("--mount={file_s}"),
                "--propagation=private",
                "true",
            ],
        )?;
        // The mount point has to exist; on the machine it stays an empty directory.
        std::fs::create_dir_all(KUBELET_DEVICE_PLUGINS)
            .map_err(Error::io(format!("create {KUBELET_DEVICE_PLUGINS}")))?;
        std::fs::create_dir_all(device_plugins)
            .map_err(Error::io("create the node's device-plugin directory"))?;
        let namespace = MountNamespace { file };
        let (program, args) = namespace.command(
            Path::new("mount"),
            &[
                "--bind".into(),
                device_plugins.display().to_string(),
                KUBELET_DEVICE_PLUGINS.into(),
            ],
        );
        run(
            &program.display().to_string(),
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )?;
        Ok(namespace)
    }

    /// `binary args...` run inside the namespace (through nsenter, which execs it: the
    /// process keeps its pid and a parent-death signal set before).
    pub fn command(&self, binary: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
        let mut all = vec![
            format!("--mount={}", self.file.display()),
            "--".to_string(),
            binary.display().to_string(),
        ];
        all.extend_from_slice(args);
        (PathBuf::from("nsenter"), all)
    }
}
