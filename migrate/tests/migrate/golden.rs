//! The migration of Akri's own example Configurations (`api/tests/fixtures/v0/`) and of every
//! shape of our own (`tests/fixtures/v0/`), through the binary: its stdout and stderr against
//! golden files reviewed by eye (`UPDATE_GOLDEN=1 cargo test -p akri-migrate --test migrate golden`
//! writes them), the same bytes on a second run, BrokerTemplates that the broker-controller
//! renders, and the shipped `examples/brokers/` being exactly what migration makes.

use akri_broker_controller::render::{self, Owner, Values};
use serde_json::Value;
use std::path::{Path, PathBuf};

use crate::common;
use common::repo;

fn migrate(args: &[&str]) -> std::process::Output {
    common::migrate(args, None)
}

/// Every input of the golden tests, relative to the repository.
fn inputs() -> Vec<String> {
    let mut inputs = Vec::new();
    for dir in ["api/tests/fixtures/v0", "migrate/tests/fixtures/v0"] {
        let mut files: Vec<String> = std::fs::read_dir(repo().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".yaml") && !f.starts_with("instance-"))
            .map(|f| format!("{dir}/{f}"))
            .collect();
        files.sort();
        inputs.extend(files);
    }
    inputs
}

fn golden(input: &str, extension: &str) -> PathBuf {
    let stem = Path::new(input)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    repo()
        .join("migrate/tests/fixtures/golden")
        .join(format!("{stem}.{extension}"))
}

/// Compares `actual` with the golden file (absent when `actual` is empty), or writes it.
fn check(path: &Path, actual: &str, failures: &mut Vec<String>) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        if actual.is_empty() {
            let _ = std::fs::remove_file(path);
        } else {
            std::fs::write(path, actual).unwrap();
        }
        return;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    if expected != actual {
        failures.push(format!("{}: differs; got:\n{actual}", path.display()));
    }
}

#[test]
fn akris_examples_and_every_shape_migrate_as_reviewed() {
    let inputs = inputs();
    assert!(inputs.len() >= 17, "{inputs:?}");
    let mut failures = Vec::new();
    for input in &inputs {
        let first = migrate(&[input]);
        assert!(
            first.status.success(),
            "{input}: {:?}\n{}",
            first.status,
            String::from_utf8_lossy(&first.stderr)
        );
        let stdout = String::from_utf8(first.stdout.clone()).unwrap();
        assert!(
            !stdout.contains("{{PLACEHOLDER}}"),
            "{input}: the placeholder is left in:\n{stdout}"
        );
        check(&golden(input, "yaml"), &stdout, &mut failures);
        check(
            &golden(input, "findings"),
            &String::from_utf8(first.stderr.clone()).unwrap(),
            &mut failures,
        );
        let second = migrate(&[input]);
        assert_eq!(
            first.stdout, second.stdout,
            "{input}: a second run gave other bytes"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The BrokerTemplates in a YAML stream.
fn templates(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| v["kind"] == "BrokerTemplate")
        .collect()
}

#[test]
fn every_migrated_broker_renders_bound_to_its_device() {
    let mut rendered = 0;
    for input in inputs() {
        let output = migrate(&[&input]);
        for template in templates(&String::from_utf8(output.stdout).unwrap()) {
            let properties = Default::default();
            let values = Values {
                template: "t",
                configuration: "cams",
                device_class: Some("cams"),
                instance: Some("cams-0a1b2c"),
                claim_template: Some("cams-0a1b2c-t"),
                node: Some("node-a"),
                properties: Some(&properties),
            };
            let owner = Owner {
                name: "t",
                uid: "u",
                namespace: "ns",
            };
            for (list, per_instance) in [
                ("instanceBrokerResources", true),
                ("globalBrokerResources", false),
            ] {
                for resource in template["spec"][list].as_array().into_iter().flatten() {
                    let resource = resource.as_object().unwrap();
                    let object = render::render(resource, per_instance, &values, &owner)
                        .unwrap_or_else(|e| panic!("{input}: {e}"))
                        .object;
                    rendered += 1;
                    let pod = match object["kind"].as_str().unwrap() {
                        "Pod" => &object["spec"],
                        "Job" => &object["spec"]["template"]["spec"],
                        _ => continue,
                    };
                    assert_eq!(
                        pod["resourceClaims"][0]["resourceClaimTemplateName"], "cams-0a1b2c-t",
                        "{input}"
                    );
                    assert_eq!(
                        pod["containers"][0]["resources"]["claims"][0]["name"],
                        render::POD_CLAIM_NAME,
                        "{input}"
                    );
                    let text = object.to_string();
                    assert!(!text.contains("{{PLACEHOLDER}}"), "{input}: {text}");
                    if input.ends_with("job-broker.yaml") {
                        // Written under Akri as a literal: the kubelet sees it as written.
                        assert!(text.contains("--tag '$(AKRI_LITERAL)'"), "{text}");
                    }
                }
            }
        }
    }
    assert!(rendered >= 20, "only {rendered} objects rendered");
}

#[test]
fn the_shipped_broker_examples_are_what_migration_makes() {
    for (input, example) in [
        (
            "migrate/tests/fixtures/v0/echo-brokers.yaml",
            "examples/brokers/pod-per-node.yaml",
        ),
        (
            "migrate/tests/fixtures/v0/echo-readout.yaml",
            "examples/brokers/job-per-instance.yaml",
        ),
    ] {
        let migrated = &templates(&String::from_utf8(migrate(&[input]).stdout).unwrap())[0];
        let shipped = &templates(&std::fs::read_to_string(repo().join(example)).unwrap())[0];
        for list in ["instanceBrokerResources", "globalBrokerResources"] {
            let list_of = |t: &Value| t["spec"][list].as_array().cloned().unwrap_or_default();
            assert_eq!(
                list_of(migrated),
                list_of(shipped),
                "{example}: {list} differs from the migration of {input}"
            );
        }
    }
}
