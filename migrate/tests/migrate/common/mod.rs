//! What the migration's suites share: the repository, the binary, its stderr, an output
//! directory's files.

#![allow(dead_code, reason = "each suite uses some of these")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `akri-migrate` in the repository (so that paths in its messages are relative), with
/// `kubeconfig` when given.
pub fn migrate(args: &[&str], kubeconfig: Option<&Path>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_akri-migrate"));
    command.args(args).current_dir(repo());
    if let Some(kubeconfig) = kubeconfig {
        command.env("KUBECONFIG", kubeconfig);
    }
    command.output().expect("akri-migrate runs")
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The files of `dir` and their contents, by name.
pub fn listing(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let text = std::fs::read_to_string(e.path()).unwrap();
            (e.file_name().to_string_lossy().into_owned(), text)
        })
        .collect();
    files.sort();
    files
}
