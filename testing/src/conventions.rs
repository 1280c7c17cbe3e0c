//! Conventions of the workspace's code that a compiler does not check, checked here.
//!
//! **An error prints its cause once.** A `thiserror` variant that wraps another error shows it
//! in its own message (`"reading node {node}: {cause}"`) and does not also return it from
//! `source()`: log lines print errors with `%error` (Display only), and `anyhow` in `main`
//! prints the message and then every `source()`, so a cause both shown and marked appeared
//! twice. Hence no `#[source]`, no field named `source` (thiserror makes that a source by its
//! name) and `#[from]` only on `#[error(transparent)]` variants, which add no words of their
//! own. Where `?` should wrap, write the `From` impl by hand (`testing/src/error.rs`).

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir)
            .expect("reading a workspace directory")
            .flatten()
        {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && name != "_output" && !name.to_string_lossy().starts_with('.')
                {
                    rust_sources(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// What breaks the convention in one file: each `#[error(..)]` up to the next one or the
    /// end of its type.
    fn violations(file: &str, text: &str) -> Vec<String> {
        let mut found = Vec::new();
        // Attributes only: the first thing on their line (not this file's test strings).
        let starts: Vec<usize> = text
            .match_indices("#[error(")
            .map(|(i, _)| i)
            .filter(|&i| {
                text[..i]
                    .rsplit('\n')
                    .next()
                    .is_some_and(|l| l.trim().is_empty())
            })
            .collect();
        for (n, &start) in starts.iter().enumerate() {
            let end = starts.get(n + 1).copied().unwrap_or(text.len());
            let mut variant = &text[start..end];
            if let Some(close) = variant.find("\n}") {
                variant = &variant[..close];
            }
            let line = text[..start].lines().count() + 1;
            let transparent = variant.starts_with("#[error(transparent)]");
            let source_field = variant
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .any(|word| word == "source:");
            if variant.contains("#[source]") || source_field {
                found.push(format!("{file}:{line}: a cause marked as source"));
            }
            if variant.contains("#[from]") && !transparent {
                found.push(format!(
                    "{file}:{line}: #[from] on a variant with its own message"
                ));
            }
        }
        found
    }

    #[test]
    fn every_error_prints_its_cause_once() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let mut files = Vec::new();
        rust_sources(root, &mut files);
        assert!(
            files.len() > 100,
            "found only {} Rust files under {}",
            files.len(),
            root.display()
        );
        let mut found = Vec::new();
        for path in &files {
            let text = std::fs::read_to_string(path).unwrap();
            let file = path.strip_prefix(root).unwrap().display().to_string();
            found.extend(violations(&file, &text));
        }
        assert!(
            found.is_empty(),
            "errors that would print a cause twice:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn the_check_finds_a_cause_shown_and_marked() {
        let both = "\n    #[error(\"reading {path}: {source}\")]\n    Read {\n        path: String,\n        #[source]\n        source: std::io::Error,\n    },\n}\n";
        assert_eq!(violations("x.rs", both).len(), 1);
        let by_name = "\n    #[error(\"reading {path}: {source}\")]\n    Read { path: String, source: std::io::Error },\n}\n";
        assert_eq!(violations("x.rs", by_name).len(), 1);
        let from = "\n    #[error(\"kube: {0}\")]\n    Kube(#[from] kube::Error),\n}\n";
        assert_eq!(violations("x.rs", from).len(), 1);
        let fine = "\n    #[error(\"reading {path}: {cause}\")]\n    Read { path: String, cause: std::io::Error },\n    #[error(transparent)]\n    Io(#[from] std::io::Error),\n}\n";
        assert_eq!(violations("x.rs", fine), Vec::<String>::new());
    }
}
