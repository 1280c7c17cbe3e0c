//! The chart's alerts (`charts/akri/files/prometheus-rules.yaml`) and dashboard
//! (`charts/akri/files/grafana-dashboard.json`) as tests read them: the metrics they query, by
//! the component that exports them, checked against what a running component's `/metrics`
//! declares; and promtool (built by `hack/promtool.sh`).

use crate::Error;
use crate::product::repo;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// The components whose metrics the alerts and the dashboard query, by their metrics' prefix.
pub const COMPONENTS: [(&str, &str); 4] = [
    ("akri_kubelet_plugin_", "kubelet-plugin"),
    ("akri_driver_controller_", "driver-controller"),
    ("akri_broker_controller_", "broker-controller"),
    ("akri_discovery_handler_", "discovery-handler"),
];

/// Every query of the alerts and of the dashboard's panels.
pub fn queries() -> Result<Vec<String>, Error> {
    let read = |path: &str| {
        std::fs::read_to_string(repo().join(path)).map_err(Error::io("read the chart's file"))
    };
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read("charts/akri/files/prometheus-rules.yaml")?)
            .map_err(|e| Error::Other(format!("prometheus-rules.yaml: {e}")))?;
    let mut queries = Vec::new();
    for group in rules["groups"].as_sequence().into_iter().flatten() {
        for rule in group["rules"].as_sequence().into_iter().flatten() {
            queries.extend(rule["expr"].as_str().map(str::to_string));
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("charts/akri/files/grafana-dashboard.json")?)
            .map_err(|e| Error::Other(format!("grafana-dashboard.json: {e}")))?;
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.extend(target["expr"].as_str().map(str::to_string));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] == "query" {
            queries.extend(variable["query"].as_str().map(str::to_string));
        }
    }
    Ok(queries)
}

/// The metric names (as samples are named: `_total`, `_bucket`) in `query`.
pub fn metric_names(query: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = query;
    while let Some(at) = rest.find("akri_") {
        let name: String = (rest[at..].chars())
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// The metric names the alerts and the dashboard query, by component ([`COMPONENTS`]); a
/// name of no component's prefix is an error.
pub fn queried() -> Result<BTreeMap<&'static str, BTreeSet<String>>, Error> {
    let mut by_component: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for name in queries()?.iter().flat_map(|q| metric_names(q)) {
        let Some((_, component)) = COMPONENTS.iter().find(|(p, _)| name.starts_with(p)) else {
            return Err(Error::Other(format!("{name} is no component's metric")));
        };
        by_component.entry(component).or_default().insert(name);
    }
    Ok(by_component)
}

/// The sample names a `/metrics` text can have: each family its `# TYPE` line declares, with
/// a counter's `_total` and a histogram's `_bucket`, `_count` and `_sum`.
pub fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some("#"), Some("TYPE"), Some(family), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        let family = family.strip_suffix("_total").unwrap_or(family);
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_count", "_sum"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
    }
    names
}

/// The names the alerts and the dashboard query of `component` that its `/metrics` text
/// does not export.
pub fn missing(component: &str, text: &str) -> Result<Vec<String>, Error> {
    let exported = exported(text);
    let queried = queried()?.remove(component).unwrap_or_default();
    Ok(queried
        .into_iter()
        .filter(|n| !exported.contains(n))
        .collect())
}

/// promtool, as `hack/promtool.sh` builds it; an error that says so without it.
pub fn promtool() -> Result<PathBuf, Error> {
    let bin = repo().join("_output/tools/bin/promtool");
    match bin.is_file() {
        true => Ok(bin),
        false => Err(Error::Other(format!(
            "promtool is missing at {}: run `hack/promtool.sh` first (it builds it from the Go module proxy)",
            bin.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_a_query_and_names_a_metrics_text_exports() {
        let query = r#"histogram_quantile(0.99, sum by (le) (rate(akri_kubelet_plugin_prepare_seconds_bucket{result="ok"}[5m]))) / akri_x_total"#;
        assert_eq!(
            metric_names(query),
            BTreeSet::from([
                "akri_kubelet_plugin_prepare_seconds_bucket".to_string(),
                "akri_x_total".to_string(),
            ])
        );
        let text = "# HELP akri_a A.\n# TYPE akri_a counter\nakri_a_total 1\n# TYPE akri_b histogram\n# TYPE akri_c gauge\nakri_c 0\n# TYPE akri_d_total counter\n";
        let names: Vec<String> = exported(text).into_iter().collect();
        assert_eq!(
            names,
            [
                "akri_a_total",
                "akri_b_bucket",
                "akri_b_count",
                "akri_b_sum",
                "akri_c",
                "akri_d_total"
            ]
        );
    }
}
