//! The product as a user installs it: the images `hack/images.sh` built, made present in a
//! real node's containerd under a private registry's names (as if pulled from it; nothing is
//! pulled), and Helm (built by `hack/helm.sh`) run on `charts/akri`. Shared by the chart tests,
//! the legacy-only cluster tests and the demo.

use crate::{ControlPlane, Error, RealNode};
use std::path::{Path, PathBuf};

/// The registry the images are named after (`image.registry`): on loopback, so a kubelet that
/// ever tried to pull would reach nothing but this machine.
pub const REGISTRY: &str = "localhost:5000/akri";

/// The repository (the chart, the images, the examples).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testing/ is in the repository")
        .to_path_buf()
}

/// The images `hack/images.sh` wrote (`_output/images/<name>`, OCI layouts) and their tag.
pub struct Images {
    layouts: Vec<PathBuf>,
    pub tag: String,
}

impl Images {
    /// The built images; an error that says to run `hack/images.sh` when there are none.
    pub fn built() -> Result<Images, Error> {
        let dir = repo().join("_output/images");
        let missing = || {
            Error::Other(format!(
                "no images in {}: run hack/images.sh",
                dir.display()
            ))
        };
        let mut layouts = Vec::new();
        let mut tags = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(&dir).map_err(|_| missing())?.flatten() {
            let path = entry.path();
            let Ok(index) = std::fs::read(path.join("index.json")) else {
                continue;
            };
            let index: serde_json::Value = serde_json::from_slice(&index)
                .map_err(|e| Error::Other(format!("{}: {e}", path.display())))?;
            for manifest in index["manifests"].as_array().into_iter().flatten() {
                if let Some(tag) =
                    manifest["annotations"]["org.opencontainers.image.ref.name"].as_str()
                {
                    tags.insert(tag.to_string());
                }
            }
            layouts.push(path);
        }
        if layouts.is_empty() {
            return Err(missing());
        }
        if tags.len() != 1 {
            return Err(Error::Other(format!(
                "the images in {} carry tags {tags:?}, want one: run hack/images.sh",
                dir.display()
            )));
        }
        layouts.sort();
        Ok(Images {
            layouts,
            tag: tags.into_iter().next().expect("one tag"),
        })
    }

    /// Only the images named (e.g. `akri-kubelet-plugin`): less to load on a node that runs
    /// nothing else of ours.
    pub fn only(mut self, names: &[&str]) -> Images {
        self.layouts.retain(|layout| {
            layout
                .file_name()
                .is_some_and(|name| names.iter().any(|n| name == *n))
        });
        self
    }

    fn names(&self) -> impl Iterator<Item = (&Path, String)> {
        self.layouts.iter().map(|layout| {
            let name = layout.file_name().expect("a layout directory");
            (layout.as_path(), name.to_string_lossy().into_owned())
        })
    }

    /// Starts real node `name` of `cp` with every image present, as the chart's pods need.
    pub async fn on_new_node(&self, cp: &ControlPlane, name: &str) -> Result<RealNode, Error> {
        let node = RealNode::start(cp, name).await?;
        self.load(&node).await?;
        Ok(node)
    }

    /// Makes every image present on `node` as `<REGISTRY>/<name>:<tag>`.
    pub async fn load(&self, node: &RealNode) -> Result<(), Error> {
        for (layout, name) in self.names() {
            node.import_image_layout(layout, &format!("{REGISTRY}/{name}"))
                .await
                .map_err(|e| {
                    Error::Other(format!("load image {name} into {}: {e}", node.node_name()))
                })?;
        }
        Ok(())
    }

    /// Makes every image, already loaded, present on `node` under another tag too: what a
    /// rebuilt image looks like to the node.
    pub async fn tag_as(&self, node: &RealNode, tag: &str) -> Result<(), Error> {
        for (_, name) in self.names() {
            let source = format!("{REGISTRY}/{name}:{}", self.tag);
            let target = format!("{REGISTRY}/{name}:{tag}");
            node.ctr(&["images", "tag", "--force", &source, &target])
                .await?;
        }
        Ok(())
    }

    /// The `--set` values that run these images: the registry and the tag of every image.
    pub fn values(&self) -> [String; 2] {
        [
            format!("image.registry={REGISTRY}"),
            format!("image.tag={}", self.tag),
        ]
    }
}

/// Runs `cp`'s kubectl with `args` from the repository root (relative paths, as the docs write
/// them, work); its stdout, or an error with what it printed.
pub fn kubectl<S: AsRef<std::ffi::OsStr>>(cp: &ControlPlane, args: &[S]) -> Result<String, Error> {
    let output = std::process::Command::new(cp.bins().require("kubectl")?)
        .args(args)
        .current_dir(repo())
        .env("KUBECONFIG", cp.kubeconfig())
        .output()
        .map_err(Error::io("run kubectl"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Other(format!(
            "kubectl {:?}: {}{}",
            args.iter()
                .map(|a| a.as_ref().to_string_lossy())
                .collect::<Vec<_>>(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// Runs `script` as a user's shell would (`sh -c` with `set -e`: it stops at the first failing
/// command), from the repository root, against the cluster of `kubeconfig`, with our Helm and
/// `tools` (e.g. the control plane's `kubectl`) first on `PATH`: how a test runs the docs'
/// blocks as written. What it printed, or an error with that.
pub async fn shell(kubeconfig: &Path, tools: &[&Path], script: &str) -> Result<String, Error> {
    shell_in(&repo(), kubeconfig, tools, script).await
}

/// [`shell`], from directory `dir` (where a section's files should land, e.g. an export).
pub async fn shell_in(
    dir: &Path,
    kubeconfig: &Path,
    tools: &[&Path],
    script: &str,
) -> Result<String, Error> {
    let helm = Helm::new()?;
    let dirs = (tools.iter().copied().chain([helm.bin()]))
        .map(|b| b.parent().unwrap_or(Path::new(".")).to_path_buf());
    let path = std::env::join_paths(dirs.chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .map_err(|e| Error::Other(format!("PATH: {e}")))?;
    let output = tokio::process::Command::new("sh")
        .args(["-c", &format!("set -e\n{script}")])
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .envs(helm.env())
        .output()
        .await
        .map_err(Error::io("run sh"))?;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    match output.status.success() {
        true => Ok(printed),
        false => Err(Error::Other(format!("sh -c {script:?} failed:\n{printed}"))),
    }
}

/// Helm as a process, with its own config, cache and data directories, run from the
/// repository root (relative chart paths, as the docs write them, work).
pub struct Helm {
    bin: PathBuf,
    home: tempfile::TempDir,
}

/// What a Helm run printed.
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Helm {
    /// The binary `hack/helm.sh` builds; an error that says so without it.
    pub fn new() -> Result<Helm, Error> {
        let bin = repo().join("_output/tools/bin/helm");
        if !bin.is_file() {
            return Err(Error::Other(format!(
                "Helm is missing at {}: run `hack/helm.sh` first (it builds Helm from the Go module proxy)",
                bin.display()
            )));
        }
        Ok(Helm {
            bin,
            home: tempfile::tempdir().map_err(Error::io("create Helm's home"))?,
        })
    }

    /// The binary, for a shell that runs the docs' commands.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The environment Helm runs with: its own directories, no inherited `KUBECONFIG`.
    pub fn env(&self) -> [(&'static str, PathBuf); 3] {
        [
            ("HELM_CACHE_HOME", self.home.path().join("cache")),
            ("HELM_CONFIG_HOME", self.home.path().join("config")),
            ("HELM_DATA_HOME", self.home.path().join("data")),
        ]
    }

    /// Runs Helm; an error only when it cannot be run.
    pub async fn run(&self, args: &[&str]) -> Result<Run, Error> {
        let output = tokio::process::Command::new(&self.bin)
            .args(args)
            .current_dir(repo())
            .envs(self.env())
            .env_remove("KUBECONFIG")
            .output()
            .await
            .map_err(Error::io(format!("run {}", self.bin.display())))?;
        Ok(Run {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    /// Runs Helm and returns its stdout; an error with its output when it fails.
    pub async fn ok(&self, args: &[&str]) -> Result<String, Error> {
        let run = self.run(args).await?;
        if !run.success {
            return Err(Error::Other(format!(
                "helm {} failed:\n{}\n{}",
                args.join(" "),
                run.stdout,
                run.stderr
            )));
        }
        Ok(run.stdout)
    }
}
