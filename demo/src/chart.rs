//! The product as a user installs it, on the demo's real nodes: the images `hack/images.sh`
//! built, present in each node's containerd under a private registry's names (as if pulled
//! from it; nothing is pulled), the release namespace with the Pod Security label the chart
//! needs, and `helm install` of `charts/akri` with the values such a user sets: the registry
//! and the tag of every image at once, and the embedded debugEcho handler.

use crate::cluster::NAMESPACE;
use akri_testing::RealNode;
use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// The registry the demo's images are named after (`image.registry`): on loopback, so a
/// kubelet that ever tried to pull would reach nothing but this machine.
pub const REGISTRY: &str = "localhost:5000/akri";
/// The release's name.
pub const RELEASE: &str = "akri";

/// The repository (the chart, the images, the examples).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The images `hack/images.sh` wrote (`_output/images/<name>`, OCI layouts) and their tag.
pub struct Images {
    layouts: Vec<PathBuf>,
    pub tag: String,
}

impl Images {
    /// The built images; an error that says to run `hack/images.sh` when there are none.
    pub fn built() -> anyhow::Result<Images> {
        let dir = repo().join("_output/images");
        let mut layouts = Vec::new();
        let mut tags = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(&dir)
            .with_context(|| format!("no images in {}: run hack/images.sh", dir.display()))?
        {
            let path = entry?.path();
            let Ok(index) = std::fs::read(path.join("index.json")) else {
                continue;
            };
            let index: serde_json::Value = serde_json::from_slice(&index)?;
            for manifest in index["manifests"].as_array().into_iter().flatten() {
                if let Some(tag) =
                    manifest["annotations"]["org.opencontainers.image.ref.name"].as_str()
                {
                    tags.insert(tag.to_string());
                }
            }
            layouts.push(path);
        }
        anyhow::ensure!(
            !layouts.is_empty(),
            "no images in {}: run hack/images.sh",
            dir.display()
        );
        anyhow::ensure!(
            tags.len() == 1,
            "the images in {} carry tags {tags:?}, want one: run hack/images.sh",
            dir.display()
        );
        layouts.sort();
        Ok(Images {
            layouts,
            tag: tags.into_iter().next().expect("one tag"),
        })
    }

    /// Makes every image, already loaded, present on `node` under another tag too: what a
    /// rebuilt image looks like to the node.
    pub async fn tag_as(&self, node: &RealNode, tag: &str) -> anyhow::Result<()> {
        for layout in &self.layouts {
            let name = layout
                .file_name()
                .expect("a layout directory")
                .to_string_lossy();
            let source = format!("{REGISTRY}/{name}:{}", self.tag);
            let target = format!("{REGISTRY}/{name}:{tag}");
            node.ctr(&["images", "tag", "--force", &source, &target])
                .await?;
        }
        Ok(())
    }

    /// Makes every image present on `node` as `<REGISTRY>/<name>:<tag>`.
    pub async fn load(&self, node: &RealNode) -> anyhow::Result<()> {
        for layout in &self.layouts {
            let name = layout
                .file_name()
                .expect("a layout directory")
                .to_string_lossy();
            node.import_image_layout(layout, &format!("{REGISTRY}/{name}"))
                .await
                .with_context(|| format!("load image {name} into {}", node.node_name()))?;
        }
        Ok(())
    }
}

/// `helm install`, as the Quickstart says, waiting until every component's pods are ready.
pub fn install(kubeconfig: &Path, images: &Images) -> anyhow::Result<()> {
    let image_tag = format!("image.tag={}", images.tag);
    let image_registry = format!("image.registry={REGISTRY}");
    helm(
        kubeconfig,
        &[
            "install",
            RELEASE,
            "charts/akri",
            "--namespace",
            NAMESPACE,
            "--set",
            &image_registry,
            "--set",
            &image_tag,
            "--set",
            "kubeletPlugin.debugEcho.enabled=true",
            "--set",
            "kubeletPlugin.debugEcho.shared=true",
            "--wait",
            "--timeout",
            "3m",
        ],
    )
}

/// The Helm that `hack/helm.sh` builds.
fn helm_binary() -> anyhow::Result<PathBuf> {
    let helm = repo().join("_output/tools/bin/helm");
    anyhow::ensure!(
        helm.is_file(),
        "Helm is missing at {}: hack/helm.sh builds it",
        helm.display()
    );
    Ok(helm)
}

/// Runs Helm from the repository against the cluster of `kubeconfig`.
pub fn helm(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<()> {
    let helm = helm_binary()?;
    let home = tempfile::tempdir()?;
    let output = std::process::Command::new(&helm)
        .args(args)
        .current_dir(repo())
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()
        .with_context(|| format!("run {}", helm.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "helm {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Runs a shell script as a user's shell would, in the repository, against the cluster of
/// `kubeconfig`, with this cluster's `kubectl` and our Helm first on `PATH`; stops at the
/// first failing command.
pub fn shell(kubeconfig: &Path, kubectl: &Path, script: &str) -> anyhow::Result<()> {
    let helm = helm_binary()?;
    let home = tempfile::tempdir()?;
    let dirs = [kubectl, &helm].map(|b| b.parent().unwrap_or(Path::new(".")).display().to_string());
    let path = format!(
        "{}:{}:{}",
        dirs[0],
        dirs[1],
        std::env::var("PATH").unwrap_or_default()
    );
    let output = std::process::Command::new("sh")
        .args(["-c", &format!("set -e\n{script}")])
        .current_dir(repo())
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig)
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "sh -c {script:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
