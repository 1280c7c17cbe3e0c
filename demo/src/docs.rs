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
    /// What each command that worked printed.
    pub printed: Vec<(DocCommand, String)>,
}

impl DocRun {
    /// What `command` printed, when it ran and worked.
    pub fn printed(&self, command: &str) -> Option<&str> {
        (self.printed.iter())
            .find(|(c, _)| c.command == command)
            .map(|(_, out)| out.as_str())
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `kubectl` lines of the ```sh blocks of the docs.
pub fn commands() -> std::io::Result<Vec<DocCommand>> {
    akri_testing::docs::documented(&repo(), "kubectl")
}

/// Runs each command with `sh` in the repository, this cluster's kubectl first on `PATH` and
/// then the directory of our kubectl plugin (`kubectl_akri`), as the user guide says to put it.
pub fn run(cluster: &Cluster, commands: Vec<DocCommand>, kubectl_akri: &Path) -> DocRun {
    let dir_of = |bin: &Path| bin.parent().unwrap_or(Path::new(".")).display().to_string();
    let path = format!(
        "{}:{}:{}",
        dir_of(&cluster.kubectl),
        dir_of(kubectl_akri),
        std::env::var("PATH").unwrap_or_default()
    );
    let needs_containers =
        |c: &DocCommand| c.command.contains("kubectl logs") || c.command.contains("kubectl exec");
    let (commands, skipped): (Vec<_>, Vec<_>) = commands
        .into_iter()
        .partition(|c| cluster.real || !needs_containers(c));
    let ran = commands.len();
    let (mut failed, mut printed) = (Vec::new(), Vec::new());
    for command in commands {
        let output = std::process::Command::new("sh")
            .args(["-c", &command.command])
            .current_dir(repo())
            .env("PATH", &path)
            .env("KUBECONFIG", cluster.cp.kubeconfig())
            .output();
        match output {
            Ok(output) if output.status.success() => printed.push((
                command,
                String::from_utf8_lossy(&output.stdout).into_owned(),
            )),
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
        printed,
    }
}

/// The README's sample of what the demo prints (the `text` block of "Run it"), line by line.
pub fn readme_sample() -> anyhow::Result<Vec<String>> {
    sample("README.md", "Run it")
}

/// The first `text` block of section `heading` (a `## ` heading) of `file`, line by line:
/// what the docs show a command printing.
pub fn sample(file: &str, heading: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(repo().join(file))?;
    let section = (text.split("\n## "))
        .find(|s| s.starts_with(&format!("{heading}\n")))
        .ok_or_else(|| anyhow::anyhow!("{file} has no \"{heading}\" section"))?;
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .ok_or_else(|| anyhow::anyhow!("{file}'s \"{heading}\" has no text block"))?;
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
