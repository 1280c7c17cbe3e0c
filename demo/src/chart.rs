//! The product as a user installs it, on the demo's real nodes: the images and the chart in
//! the registry ([`akri_testing::product`]; `hack/demo.sh` pushed them as the Quickstart
//! says), the release namespace with the Pod Security label the chart needs, and `helm
//! install` of the chart from the registry by version with the values such a user sets: the
//! registry of every image at once, and the embedded debugEcho handler.

use crate::cluster::NAMESPACE;
use akri_testing::product::Helm;
pub use akri_testing::product::{CHART, Images, REGISTRY, repo, shell};
use std::path::Path;

/// The release's name.
pub const RELEASE: &str = "akri";

/// `helm install`, as the Quickstart says, waiting until every component's pods are ready.
pub async fn install(kubeconfig: &Path, images: &Images) -> anyhow::Result<()> {
    let [image_registry, _] = images.values();
    helm(
        kubeconfig,
        &[
            "install",
            RELEASE,
            CHART,
            "--version",
            &images.tag,
            "--plain-http",
            "--namespace",
            NAMESPACE,
            "--set",
            &image_registry,
            "--set",
            "kubeletPlugin.debugEcho.enabled=true",
            "--set",
            "kubeletPlugin.debugEcho.shared=true",
            "--wait",
            "--timeout",
            "3m",
        ],
    )
    .await
}

/// Runs Helm from the repository against the cluster of `kubeconfig`.
pub async fn helm(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<()> {
    let kubeconfig = kubeconfig.display().to_string();
    let mut args = args.to_vec();
    args.extend(["--kubeconfig", &kubeconfig]);
    Helm::new()?.ok(&args).await?;
    Ok(())
}
