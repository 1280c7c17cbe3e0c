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

/// The README's sample of what the demo prints (the `text` block of "Run it"), line by line.
pub fn readme_sample() -> anyhow::Result<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md"))?;
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Run it\n"))
        .ok_or_else(|| anyhow::anyhow!("README.md has no \"Run it\" section"))?;
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .ok_or_else(|| anyhow::anyhow!("README.md's \"Run it\" has no text block"))?;
    Ok(block.lines().map(str::to_string).collect())
}

/// The sample's lines that no line of `printed` matches ([`matches`]).
pub fn missing_from(sample: &[String], printed: &str) -> Vec<String> {
    sample
        .iter()
        .filter(|s| !s.trim().is_empty())
        .filter(|s| !printed.lines().any(|line| matches(s, line)))
        .cloned()
        .collect()
}

/// Whether `line` is `pattern`, leading and trailing spaces aside, where each `...` of the
/// pattern stands for anything (what differs between runs: a claim's UID, the node the
/// scheduler picked).
fn matches(pattern: &str, line: &str) -> bool {
    let (pattern, line) = (pattern.trim(), line.trim());
    let parts: Vec<&str> = pattern.split("...").collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return line == pattern;
    }
    if line.len() < first.len() + last.len() || !line.starts_with(first) || !line.ends_with(last) {
        return false;
    }
    let (mut at, end) = (first.len(), line.len() - last.len());
    for part in &parts[1..parts.len() - 1] {
        match line[at..end].find(part) {
            Some(i) => at += i + part.len(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_line_matches_a_printed_line_with_wildcards_for_what_varies() {
        let printed = "  Pod default/lobby-broker: bound to node-b\nCDI: akri.sh/debugecho=e704015f-9a1b-echo-ee2842\n";
        assert!(matches(
            "Pod default/lobby-broker: bound to node-...",
            "  Pod default/lobby-broker: bound to node-b"
        ));
        assert!(matches(
            "CDI: akri.sh/debugecho=...-echo-ee2842",
            "CDI: akri.sh/debugecho=e704015f-9a1b-echo-ee2842"
        ));
        assert!(!matches(
            "CDI: akri.sh/debugecho=...-echo-442f3a",
            "CDI: akri.sh/debugecho=e704015f-9a1b-echo-ee2842"
        ));
        assert!(
            !matches("  echo", "  echo-lobby"),
            "no wildcard: the whole line"
        );
        let sample = vec![
            "Pod default/lobby-broker: bound to node-...".to_string(),
            "  DEBUG_ECHO_DESCRIPTION=lobby".to_string(),
            String::new(),
        ];
        assert_eq!(
            missing_from(&sample, printed),
            vec!["  DEBUG_ECHO_DESCRIPTION=lobby".to_string()]
        );
    }
}
