//! The node's own mount namespace, shared by its containerd and kubelet (and so by the shims
//! and containers they start).
//!
//! In that namespace the node has host directories of its own at their usual paths, bind
//! mounts of directories in the node's directory ([`HOST_PATHS`]): a `/var/lib` (where the
//! chart's DaemonSets keep their sockets and state), the kubelet's root (`/var/lib/kubelet`,
//! where plugins register and the pod-resources socket is), its device-plugin directory (a
//! constant, `/var/lib/kubelet/device-plugins`, which the device manager empties when it
//! starts: two kubelets on one machine would take each other's device plugins away) and the
//! CDI spec directory. So a pod that mounts `/var/lib/kubelet/plugins_registry` from the
//! host, as the chart's kubelet-plugin does with its default values, gets its own node's, and
//! the plugins under test (outside the namespace) use the same directories at their real
//! paths, `<node dir>/kubelet/...`.
//!
//! The namespace is persistent (bound to a file), so that containerd or the kubelet can be
//! restarted into it while the other keeps running; its mounts are private, so nothing the
//! node mounts (pod volumes, container root filesystems, network namespaces) appears on the
//! machine, and all of it goes when the namespace does.

use super::run;
use crate::Error;
use std::path::{Path, PathBuf};

/// The host paths each node has of its own: (path on the node, directory in the node's
/// directory; `None`: the kubelet's root directory). In this order: a later one may be below
/// an earlier one. A `/var/lib` of its own holds what daemons keep there (the chart's
/// `/var/lib/akri` and `/var/lib/akri-kubelet-plugin`), as plain directories that an
/// operator's `rm -rf` removes.
const HOST_PATHS: [(&str, Option<&str>); 4] = [
    ("/var/lib", Some("host/var-lib")),
    ("/var/lib/kubelet", None),
    ("/var/lib/kubelet/device-plugins", Some("device-plugins")),
    ("/var/run/cdi", Some("cdi")),
];

#[derive(Clone, Debug)]
pub(super) struct MountNamespace {
    file: PathBuf,
}

impl MountNamespace {
    /// Creates the namespace of the node whose directory is `dir` and whose kubelet's root
    /// directory is `kubelet_root`, with the node's [`HOST_PATHS`] mounted.
    pub fn create(dir: &Path, kubelet_root: &Path) -> Result<Self, Error> {
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
        let namespace = MountNamespace { file };
        for (path, source) in HOST_PATHS {
            let source = source.map_or_else(|| kubelet_root.to_path_buf(), |s| dir.join(s));
            std::fs::create_dir_all(&source)
                .map_err(Error::io(format!("create {}", source.display())))?;
            // The mount point has to exist, as the namespace sees it (below an earlier mount,
            // in the node's directory; else on the machine, where it stays an empty directory).
            namespace.run("mkdir", &["-p", path])?;
            namespace.run("mount", &["--bind", &source.display().to_string(), path])?;
        }
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

    /// Runs a tool of the machine inside the namespace, to completion.
    fn run(&self, tool: &str, args: &[&str]) -> Result<(), Error> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (program, args) = self.command(Path::new(tool), &args);
        run(
            &program.display().to_string(),
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    }
}
