//! The commands the docs show, so tests and the demo can run them as written: the lines of
//! the ```sh blocks of README.md, charts/akri/README.md and docs/*.md that start with one
//! program (`kubectl`, `helm`). A `\` at a line's end joins the next line; ` #` starts a
//! comment.

use std::path::{Path, PathBuf};

/// A documented command and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocCommand {
    /// The file, relative to the repository.
    pub file: String,
    /// 1-based line of the command's start.
    pub line: usize,
    pub command: String,
}

/// The repository's docs, in a fixed order: README.md, charts/akri/README.md, docs/*.md.
pub fn markdown_files(repo: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = vec![repo.join("README.md"), repo.join("charts/akri/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo.join("docs"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    Ok(files)
}

/// Every command running `program` in the docs of `repo`.
pub fn documented(repo: &Path, program: &str) -> std::io::Result<Vec<DocCommand>> {
    let mut commands = Vec::new();
    for path in markdown_files(repo)? {
        let text = std::fs::read_to_string(&path)?;
        let file = path
            .strip_prefix(repo)
            .unwrap_or(&path)
            .display()
            .to_string();
        commands.extend(sh_commands(&file, &text, program));
    }
    Ok(commands)
}

/// The commands running `program` in the ```sh blocks of `text` (the content of `file`).
pub fn sh_commands(file: &str, text: &str, program: &str) -> Vec<DocCommand> {
    let prefix = format!("{program} ");
    let (mut in_sh, mut commands) = (false, Vec::new());
    let mut pending: Option<DocCommand> = None;
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        let line = line.split(" #").next().unwrap_or_default().trim();
        let mut command = match pending.take() {
            Some(mut start) => {
                start.command = format!("{} {line}", start.command);
                start
            }
            None if in_sh && line.starts_with(&prefix) => DocCommand {
                file: file.to_string(),
                line: index + 1,
                command: line.to_string(),
            },
            None => continue,
        };
        match command.command.strip_suffix('\\') {
            Some(start) => {
                command.command = start.trim().to_string();
                pending = Some(command);
            }
            None => commands.push(command),
        }
    }
    commands
}

/// The lines of the code blocks (```text or ```sh) in the section `## <heading>` of the
/// markdown file `file` of the repository, in order: the commands a section gives for a user to
/// run one after another.
pub fn section_lines(file: &Path, heading: &str) -> std::io::Result<Vec<String>> {
    let blocks = section_blocks(file, heading, &["text", "sh"])?;
    Ok((blocks.iter().flat_map(|block| block.lines()))
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(String::from)
        .collect())
}

/// The code blocks in one of `languages` (```` ```yaml ````, ...) of the section `## <heading>`
/// of `file`, in order, each as written.
pub fn section_blocks(
    file: &Path,
    heading: &str,
    languages: &[&str],
) -> std::io::Result<Vec<String>> {
    let text = format!("\n{}", std::fs::read_to_string(file)?);
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with(heading))
        .ok_or_else(|| {
            std::io::Error::other(format!("{} has no section {heading:?}", file.display()))
        })?;
    // The open block and its fence's indent (a block in a list item is indented), which its
    // lines lose.
    let (mut block, mut blocks) = (None::<(String, usize)>, Vec::new());
    for line in section.lines() {
        let indent = line.len() - line.trim_start().len();
        match (line.trim().strip_prefix("```"), block.take()) {
            (Some(_), Some((done, _))) => blocks.push(done),
            (Some(language), None) if languages.contains(&language) => {
                block = Some((String::new(), indent));
            }
            (Some(_), None) | (None, None) => {}
            (None, Some((mut open, fence))) => {
                open.push_str(&line[indent.min(fence)..]);
                open.push('\n');
                block = Some((open, fence));
            }
        }
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sections_blocks_of_a_language_keep_their_indentation_inside_a_list_item() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("doc.md");
        let text = "## Other\n```yaml\nno: 1\n```\n## Wanted\n1. Apply:\n\n   ```yaml\n   a:\n     b: 1\n   ```\n   ```text\n   kubectl apply -f a.yaml\n   ```\n```yaml\nc: 2\n```\n";
        std::fs::write(&file, text).unwrap();
        assert_eq!(
            section_blocks(&file, "Wanted", &["yaml"]).unwrap(),
            ["a:\n  b: 1\n", "c: 2\n"]
        );
        assert_eq!(
            section_lines(&file, "Wanted").unwrap(),
            ["kubectl apply -f a.yaml"]
        );
    }

    #[test]
    fn only_the_programs_lines_of_sh_blocks_count_and_continuations_join() {
        let text = "intro\n```sh\nkubectl get dc   # the configurations\nhack/demo.sh\nkubectl get pods \\\n  -A\nhelm list\n```\n```text\nkubectl logs x\n```\n";
        let found: Vec<(usize, String)> = sh_commands("f.md", text, "kubectl")
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
        assert_eq!(sh_commands("f.md", text, "helm")[0].command, "helm list");
    }

    #[test]
    fn a_sections_block_lines_come_in_order_and_stop_at_the_next_section() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("doc.md");
        let text = "## One\n```text\nfirst\n```\nprose\n```yaml\nkey: x\n```\n   ```sh\n   second\n\n   ```\n## Two\n```text\nthird\n```\n";
        std::fs::write(&file, text).unwrap();
        assert_eq!(section_lines(&file, "One").unwrap(), ["first", "second"]);
        assert_eq!(section_lines(&file, "Two").unwrap(), ["third"]);
        assert!(section_lines(&file, "Three").is_err());
    }
}
