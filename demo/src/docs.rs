//! Every `kubectl` command the docs show runs against the demo's cluster: the lines starting
//! with `kubectl ` in the ```sh blocks of README.md and docs/*.md (a `\` at a line's end joins
//! the next). The docs promise commands that work; this keeps them honest.

use crate::cluster::Cluster;
use std::path::{Path, PathBuf};

/// A documented command and where it is.
pub struct DocCommand {
    pub file: String,
    pub line: usize,
    pub command: String,
}

/// What running them gave: the commands that failed, with why.
pub struct DocRun {
    pub ran: usize,
    pub failed: Vec<(DocCommand, String)>,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `kubectl` lines of the ```sh blocks of README.md and docs/*.md.
pub fn commands() -> std::io::Result<Vec<DocCommand>> {
    let root = repo();
    let mut files = vec![root.join("README.md")];
    if let Ok(entries) = std::fs::read_dir(root.join("docs")) {
        let mut docs: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
    }
    let mut commands = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        let name = path
            .strip_prefix(&root)
            .unwrap_or(&path)
            .display()
            .to_string();
        commands.extend(kubectl_lines(&name, &text));
    }
    Ok(commands)
}

fn kubectl_lines(file: &str, text: &str) -> Vec<DocCommand> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<DocCommand> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        if let Some(mut command) = pending.take() {
            command.command.push(' ');
            command.command.push_str(line.trim_end_matches('\\').trim());
            if line.ends_with('\\') {
                pending = Some(command);
            } else {
                commands.push(command);
            }
            continue;
        }
        if line.starts_with("kubectl ") {
            let command = DocCommand {
                file: file.to_string(),
                line: index + 1,
                command: line.trim_end_matches('\\').trim().to_string(),
            };
            if line.ends_with('\\') {
                pending = Some(command);
            } else {
                commands.push(command);
            }
        }
    }
    commands
}

/// Runs each command with `sh` in the repository, this cluster's kubectl first on `PATH`.
pub fn run(cluster: &Cluster, commands: Vec<DocCommand>) -> DocRun {
    let kubectl_dir = cluster.kubectl.parent().unwrap_or(Path::new("."));
    let path = format!(
        "{}:{}",
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
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
    DocRun { ran, failed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubectl_lines_of_sh_blocks_count_and_continuations_join() {
        let text = "intro\n```sh\nkubectl get dc\nhack/demo.sh\nkubectl get pods \\\n  -A\n```\n```text\nkubectl logs x\n```\n";
        let found: Vec<(usize, String)> = kubectl_lines("f.md", text)
            .into_iter()
            .map(|c| (c.line, c.command))
            .collect();
        assert_eq!(
            found,
            vec![
                (3, "kubectl get dc".to_string()),
                (5, "kubectl get pods -A".to_string())
            ]
        );
    }
}
