//! Every `kubectl` command the docs show runs against the demo's cluster (found by
//! `akri_testing::docs`). The docs promise commands that work; this keeps them honest.

use crate::cluster::Cluster;
use std::path::{Path, PathBuf};

pub use akri_testing::docs::DocCommand;

/// What running them gave: the commands that failed, with why.
pub struct DocRun {
    pub ran: usize,
    /// Commands that need a running container (`kubectl logs`, `kubectl exec`), not run on
    /// simulated nodes.
    pub skipped: usize,
    pub failed: Vec<(DocCommand, String)>,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `kubectl` lines of the ```sh blocks of the docs.
pub fn commands() -> std::io::Result<Vec<DocCommand>> {
    akri_testing::docs::documented(&repo(), "kubectl")
}

/// Runs each command with `sh` in the repository, this cluster's kubectl first on `PATH`.
pub fn run(cluster: &Cluster, commands: Vec<DocCommand>) -> DocRun {
    let kubectl_dir = cluster.kubectl.parent().unwrap_or(Path::new("."));
    let path = format!(
        "{}:{}",
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let needs_containers =
        |c: &DocCommand| c.command.contains("kubectl logs") || c.command.contains("kubectl exec");
    let (commands, skipped): (Vec<_>, Vec<_>) = commands
        .into_iter()
        .partition(|c| cluster.real || !needs_containers(c));
    let ran = commands.len();
    let mut failed = Vec::new();
    for command in commands {
        let output = std::process::Command::new("sh")
            .args(["-c", &command.command])
            .current_dir(repo())
            .env("PATH", &path)
            .env("KUBECONFIG", cluster.cp.kubeconfig())
            .output();
        match output {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                let why = String::from_utf8_lossy(&output.stderr).trim().to_string();
                failed.push((command, why));
            }
            Err(error) => failed.push((command, error.to_string())),
        }
    }
    DocRun {
        ran,
        skipped: skipped.len(),
        failed,
    }
}
