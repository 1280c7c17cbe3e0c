//! The binary's contract: lossy input fails with a report naming every dropped field and
//! writes nothing unless `--allow-lossy`; bad input names its file, document and field and
//! writes nothing; workloads are rewritten in place once (a second run changes nothing); an
//! output directory gets one file per Configuration, the same bytes every run.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;
use common::{listing, stderr};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn migrate(args: &[&str], stdin: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_akri-migrate"));
    command.args(args);
    if let Some(text) = stdin {
        use std::io::Write;
        command.stdin(std::process::Stdio::piped());
        command.stdout(std::process::Stdio::piped());
        command.stderr(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        return child.wait_with_output().unwrap();
    }
    command.output().unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn lossy_input_fails_with_a_report_of_every_dropped_field_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let out = dir.path().join("out");
    let input = fixtures().join("lossy/lossy.yaml");
    let output = migrate(
        &[
            path(&input),
            "--output-dir",
            path(&out),
            "--report",
            path(&report),
        ],
        None,
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert!(!out.exists(), "nothing is written");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let lossy: Vec<(String, u64, String)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "lossy")
        .map(|f| {
            assert!(
                f["file"].as_str().unwrap().ends_with("lossy/lossy.yaml"),
                "{f}"
            );
            assert!(!f["reason"].as_str().unwrap().is_empty(), "{f}");
            (
                f["object"].as_str().unwrap().to_string(),
                f["document"].as_u64().unwrap(),
                f["field"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected = [
        ("default/door-sensors", 0, "metadata.finalizers"),
        ("default/door-sensors", 0, "metadata.ownerReferences"),
        ("default/door-sensors", 0, "spec.brokerProperties"),
        (
            "default/door-sensors",
            0,
            "spec.discoveryHandler.timeoutSeconds",
        ),
        ("default/door-sensors", 0, "spec.retryPolicy"),
        (
            "Deployment default/door-watch",
            1,
            "spec.template.spec.containers[0].env",
        ),
    ];
    let expected: Vec<(String, u64, String)> = expected
        .iter()
        .map(|(o, d, f)| (o.to_string(), *d, f.to_string()))
        .collect();
    assert_eq!(lossy, expected);
    for (_, _, field) in &expected {
        assert!(
            stderr(&output).contains(&format!("field {field}: ")),
            "stderr names {field}:\n{}",
            stderr(&output)
        );
    }

    let allowed = migrate(
        &[path(&input), "--output-dir", path(&out), "--allow-lossy"],
        None,
    );
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));
    let written = std::fs::read_to_string(out.join("default.door-sensors.yaml")).unwrap();
    assert!(
        written.contains("kind: DiscoveryConfiguration"),
        "{written}"
    );
    assert!(
        !written.contains("retryPolicy") && !written.contains("finalizers"),
        "{written}"
    );
}

#[test]
fn bad_input_names_file_document_and_field_and_writes_nothing() {
    let cases = [
        (
            "not-yaml",
            "apiVersion: akri.sh/v0\nkind: Configuration\nspec: [unclosed\n",
            "document 0",
            "not YAML",
        ),
        (
            "wrong-kind",
            "apiVersion: akri.sh/v0\nkind: Configurations\nmetadata: {name: c}\n",
            "field kind",
            "akri.sh/v0 has no kind Configurations",
        ),
        (
            "unknown-version",
            "apiVersion: akri.sh/v2\nkind: Configuration\nmetadata: {name: c}\n",
            "field apiVersion",
            "unknown apiVersion akri.sh/v2",
        ),
        (
            "missing-handler",
            "apiVersion: akri.sh/v0\nkind: Configuration\nmetadata: {name: ok}\nspec: {capacity: 1}\n---\napiVersion: akri.sh/v0\nkind: Configuration\nmetadata: {name: c}\nspec: {capacity: 1}\n",
            "document 0 (ok), field spec: missing field `discoveryHandler`",
            "document 1 (c)",
        ),
        (
            "wrong-type",
            "apiVersion: akri.sh/v0\nkind: Configuration\nmetadata: {name: c}\nspec: {discoveryHandler: {name: udev}, capacity: many}\n",
            "field spec.capacity",
            "invalid type",
        ),
    ];
    for (name, text, first, second) in cases {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, text).unwrap();
        // A good Configuration next to the bad one: it is not written either.
        let good = fixtures().join("v0/custom-handler.yaml");
        let out = dir.path().join("out");
        let output = migrate(
            &[path(&good), path(&file), "--output-dir", path(&out)],
            None,
        );
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(1), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}.yaml")),
            "{name}: names the file: {err}"
        );
        assert!(err.contains(first) && err.contains(second), "{name}: {err}");
        assert!(!out.exists(), "{name}: nothing is written");
    }
}

#[test]
fn workloads_are_rewritten_once_and_stdin_reads_like_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let configurations = fixtures().join("v0/same-name.yaml");
    let text = std::fs::read_to_string(&configurations).unwrap();
    // The workloads in a file of their own; the Configurations from stdin.
    let (configs, workloads) = text.split_at(text.find("apiVersion: apps/v1").unwrap());
    let workload_file = dir.path().join("workloads.yaml");
    std::fs::write(&workload_file, workloads).unwrap();
    let first = migrate(
        &["-", path(&workload_file), "--rewrite-workloads"],
        Some(configs),
    );
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(String::from_utf8_lossy(&first.stdout).contains("name: cams-lab"));
    let rewritten = std::fs::read_to_string(&workload_file).unwrap();
    let documents: Vec<Value> = serde_yaml::Deserializer::from_str(&rewritten)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Deployment",
            "ResourceClaimTemplate",
            "Pod",
            "ResourceClaimTemplate"
        ]
    );
    let container = &documents[0]["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["resources"].get("limits").is_none(),
        "{container}"
    );
    assert_eq!(
        documents[1]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"],
        "cams-lab"
    );
    assert_eq!(
        documents[1]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"],
        2
    );
    assert_eq!(documents[1]["metadata"]["namespace"], "lab");

    let second = migrate(
        &["-", path(&workload_file), "--rewrite-workloads"],
        Some(configs),
    );
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert_eq!(
        std::fs::read_to_string(&workload_file).unwrap(),
        rewritten,
        "a second run changes nothing"
    );
    assert!(
        !stderr(&second).contains("workload:"),
        "nothing left to move: {}",
        stderr(&second)
    );
    assert!(
        stderr(&second).contains("ResourceClaimTemplate (resource.k8s.io/v1) left alone"),
        "{}",
        stderr(&second)
    );
}

#[test]
fn an_output_directory_gets_one_file_per_configuration_the_same_every_run() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = fixtures().join("v0");
    let out = dir.path().join("out");
    let first = migrate(&[path(&inputs), "--output-dir", path(&out)], None);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let written = listing(&out);
    let names: Vec<&str> = written.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"lab.cams.yaml")
            && names.contains(&"prod.cams.yaml")
            && names.contains(&"plant.plc-audit.yaml"),
        "{names:?}"
    );
    assert_eq!(names.len(), 8, "{names:?}");
    let second = migrate(&[path(&inputs), "--output-dir", path(&out)], None);
    assert_eq!(second.status.code(), Some(0));
    assert_eq!(listing(&out), written, "byte-identical");
}

/// Every `akri-migrate` command of the docs' `sh` blocks is one the binary accepts: it may
/// fail on its input (files and a cluster that are not here), never on its flags.
#[test]
fn the_documented_commands_are_accepted() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let commands = akri_testing::docs::documented(&repo, "akri-migrate").unwrap();
    assert!(commands.len() >= 5, "{commands:?}");
    let dir = tempfile::tempdir().unwrap();
    for command in commands {
        // A redirection is the shell's, not an argument.
        let line = command.command.split(" <").next().unwrap();
        let args: Vec<&str> = line.split_whitespace().skip(1).collect();
        let output = Command::new(env!("CARGO_BIN_EXE_akri-migrate"))
            .args(&args)
            .current_dir(dir.path())
            .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = stderr(&output);
        assert_ne!(
            output.status.code(),
            Some(2),
            "{}:{}: {}\n{err}",
            command.file,
            command.line,
            command.command
        );
        assert!(
            !err.contains("Usage:"),
            "{}:{}: {err}",
            command.file,
            command.line
        );
    }
}
