//! The chart's alerts and dashboard, opt-in: the rule file as the chart renders it, checked
//! and unit-tested with promtool (built by `hack/promtool.sh`, after the Kubernetes builds:
//! `hack/test.sh` runs these tests once it is there), and the dashboard's ConfigMap. That
//! the running components export every metric both query is checked where they run: the
//! upgrade test (the node's components) and the demo (the controllers). That each alert goes
//! off on the failure it names is judged by promtool where the failure is made, on what the
//! real components' `/metrics` said (`akri_testing::monitoring::Alert`): here, that every
//! alert has such a test.

use crate::chart::{Helm, find, names, of_kind};
use akri_testing::product::repo;
use serde_json::Value;

/// The alerts as the chart renders them (`metrics.prometheusRule.enabled`): a rule file
/// promtool accepts, whose every alert passes its unit tests (`testing/alerts/akri.test.yaml`:
/// silent while things are well or before its `for`, firing with its labels and text once
/// the failure it names lasted); and the dashboard's ConfigMap (`metrics.grafanaDashboard`),
/// which holds the chart's dashboard, labelled for Grafana's sidecar.
#[tokio::test]
async fn the_alerts_pass_promtool_and_the_dashboard_ships() {
    let helm = Helm::new();
    let set = [
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
    ];
    let objects = helm.template("akri", "akri", &set).await;
    let rule = find(&objects, "PrometheusRule", "akri");
    let dir = tempfile::tempdir().unwrap();
    let rules = serde_yaml::to_string(&rule["spec"]).unwrap();
    std::fs::write(dir.path().join("rules.yaml"), &rules).unwrap();
    std::fs::copy(
        repo().join("testing/alerts/akri.test.yaml"),
        dir.path().join("akri.test.yaml"),
    )
    .unwrap();
    let promtool = akri_testing::monitoring::promtool().unwrap();
    for args in [
        ["check", "rules", "rules.yaml"],
        ["test", "rules", "akri.test.yaml"],
    ] {
        let run = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
    }
    // Every alert has its tests.
    let alerts: std::collections::BTreeSet<String> = (rule["spec"]["groups"].as_array())
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    let tests: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo().join("testing/alerts/akri.test.yaml")).unwrap(),
    )
    .unwrap();
    let tested: std::collections::BTreeSet<String> = (tests["tests"].as_sequence())
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_sequence().into_iter().flatten())
        .filter_map(|t| t["alertname"].as_str().map(str::to_string))
        .collect();
    assert_eq!(alerts, tested, "alerts and the alerts tested");
    let judged = judged_on_real_metrics();
    let unjudged: Vec<&String> = alerts.iter().filter(|a| !judged.contains(*a)).collect();
    assert!(
        unjudged.is_empty(),
        "alerts no test judges on real components' /metrics (Alert::named): {unjudged:?}"
    );
    assert_eq!(alerts.len(), 7, "{alerts:?}");

    let dashboard = find(&objects, "ConfigMap", "akri-grafana-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value =
        serde_json::from_str(dashboard["data"]["akri.json"].as_str().unwrap()).unwrap();
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("charts/akri/files/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(shipped, file);
    // Both are opt-in.
    let default = helm.template("akri", "akri", &[]).await;
    assert!(of_kind(&default, "PrometheusRule").is_empty());
    assert!(
        (default.iter()).all(|o| o["metadata"]["name"] != "akri-grafana-dashboard"),
        "{:?}",
        names(&default)
    );
}

/// The alerts some test of the workspace judges on real components' `/metrics`: the names in
/// its `Alert::named("...")` calls.
fn judged_on_real_metrics() -> std::collections::BTreeSet<String> {
    fn visit(dir: &std::path::Path, judged: &mut std::collections::BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() && name != "target" && name != "_output" && name != ".git" {
                visit(&path, judged);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let mut rest = text.as_str();
                while let Some(at) = rest.find("Alert::named(\"") {
                    rest = &rest[at + "Alert::named(\"".len()..];
                    if let Some(end) = rest.find('"') {
                        judged.insert(rest[..end].to_string());
                    }
                }
            }
        }
    }
    let mut judged = std::collections::BTreeSet::new();
    visit(&repo(), &mut judged);
    judged
}
