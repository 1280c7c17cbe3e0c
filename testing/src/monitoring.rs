//! The chart's alerts (`charts/akri/files/prometheus-rules.yaml`) and dashboard
//! (`charts/akri/files/grafana-dashboard.json`) as tests read them: the metrics they query, by
//! the component that exports them, checked against what a running component's `/metrics`
//! declares; promtool (built by `hack/promtool.sh`); and [`Alert`], each alert judged by
//! promtool on what the real components' `/metrics` said while the failure it names lasted.

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

/// The namespace [`Alert`] puts on every scraped sample, as a ServiceMonitor's scrape does
/// (with `pod`): the chart's namespace in the docs.
pub const SCRAPED_NAMESPACE: &str = "akri";

/// One of the chart's alerts, as its rule file says it, judged on what real components'
/// `/metrics` said: each step is one scrape per component (`pod`, text), a minute apart for
/// promtool, and says which label sets the alert must be pending for then (none: silent).
/// promtool evaluates the rule file and is asked for `ALERTS` at every step: the alert's
/// expression, names and labels, not a copy of them, meet what the components export. Its
/// `for` and text are unit-tested on synthetic series (`testing/alerts/akri.test.yaml`).
pub struct Alert {
    name: String,
    steps: Vec<Step>,
}

/// One step of an [`Alert`]: every component's scrape (pod, text), and the label sets the
/// alert must be pending for then.
struct Step {
    scrapes: Vec<(String, String)>,
    pending: Vec<BTreeMap<String, String>>,
}

impl Alert {
    pub fn named(name: &str) -> Alert {
        Alert {
            name: name.to_string(),
            steps: Vec::new(),
        }
    }

    /// A step at which the alert must be silent.
    pub fn silent(self, scrapes: &[(&str, String)]) -> Alert {
        self.pending(scrapes, &[])
    }

    /// A step at which the alert must be pending for exactly `for_each` (each its labels
    /// beside `alertname`, `alertstate`, the rule's own and [`SCRAPED_NAMESPACE`]).
    pub fn pending(mut self, scrapes: &[(&str, String)], for_each: &[&[(&str, &str)]]) -> Alert {
        let scrapes = (scrapes.iter()).map(|(pod, text)| (pod.to_string(), text.clone()));
        let expected = (for_each.iter())
            .map(|labels| {
                (labels.iter())
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect()
            })
            .collect();
        self.steps.push(Step {
            scrapes: scrapes.collect(),
            pending: expected,
        });
        self
    }

    /// promtool's verdict; panics with its output (what it expected and got, at which step).
    pub fn check(self) {
        if let Err(e) = self.try_check() {
            panic!("alert {}: {e}", self.name);
        }
    }

    fn try_check(&self) -> Result<(), Error> {
        let rules_file = repo().join("charts/akri/files/prometheus-rules.yaml");
        let rules: serde_yaml::Value = serde_yaml::from_str(
            &std::fs::read_to_string(&rules_file).map_err(Error::io("read the rule file"))?,
        )
        .map_err(|e| Error::Other(format!("prometheus-rules.yaml: {e}")))?;
        let rule = (rules["groups"].as_sequence().into_iter().flatten())
            .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
            .find(|r| r["alert"].as_str() == Some(self.name.as_str()))
            .ok_or_else(|| Error::Other("no such alert in prometheus-rules.yaml".into()))?;
        let own: BTreeMap<String, String> =
            serde_yaml::from_value(rule["labels"].clone()).unwrap_or_default();
        // Every sample of every step, as one series each with its value per step.
        let mut series: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (at, step) in self.steps.iter().enumerate() {
            for (pod, text) in &step.scrapes {
                for (name, value) in samples(text, pod)? {
                    let values = series.entry(name).or_default();
                    values.resize(at, "_".to_string());
                    values.push(value);
                }
            }
        }
        let input_series: Vec<serde_json::Value> = (series.into_iter())
            .map(|(name, mut values)| {
                values.resize(self.steps.len(), "_".to_string());
                serde_json::json!({"series": name, "values": values.join(" ")})
            })
            .collect();
        let tests: Vec<serde_json::Value> = (self.steps.iter().enumerate())
            .map(|(at, step)| {
                let samples: Vec<serde_json::Value> = (step.pending.iter())
                    .map(|labels| {
                        let mut all = own.clone();
                        all.extend(labels.clone());
                        all.insert("alertname".into(), self.name.clone());
                        all.insert("alertstate".into(), "pending".into());
                        all.insert("namespace".into(), SCRAPED_NAMESPACE.into());
                        serde_json::json!({"labels": selector("ALERTS", &all), "value": 1})
                    })
                    .collect();
                serde_json::json!({
                    "expr": format!("ALERTS{{alertname=\"{}\"}}", self.name),
                    "eval_time": format!("{at}m"),
                    "exp_samples": samples,
                })
            })
            .collect();
        let test = serde_json::json!({
            "rule_files": ["rules.yaml"],
            "evaluation_interval": "1m",
            "tests": [{
                "interval": "1m",
                "input_series": input_series,
                "promql_expr_test": tests,
            }],
        });
        let dir = tempfile::tempdir().map_err(Error::io("a temporary directory"))?;
        std::fs::copy(&rules_file, dir.path().join("rules.yaml"))
            .map_err(Error::io("copy the rule file"))?;
        let text = serde_yaml::to_string(&test).map_err(|e| Error::Other(e.to_string()))?;
        std::fs::write(dir.path().join("test.yaml"), &text)
            .map_err(Error::io("write promtool's test"))?;
        let run = std::process::Command::new(promtool()?)
            .args(["test", "rules", "test.yaml"])
            .current_dir(dir.path())
            .output()
            .map_err(Error::io("run promtool"))?;
        match run.status.success() {
            true => Ok(()),
            false => Err(Error::Other(format!(
                "promtool test rules:\n{}{}\nits test:\n{text}",
                String::from_utf8_lossy(&run.stdout),
                String::from_utf8_lossy(&run.stderr)
            ))),
        }
    }
}

/// `name{labels}` in PromQL's series notation, labels in order.
fn selector(name: &str, labels: &BTreeMap<String, String>) -> String {
    let labels: Vec<String> = (labels.iter())
        .map(|(k, v)| format!("{k}={}", serde_json::Value::from(v.as_str())))
        .collect();
    format!("{name}{{{}}}", labels.join(", "))
}

/// The samples of a `/metrics` text as promtool's input series name them, each with the
/// labels a ServiceMonitor's scrape adds (`namespace`, `pod`), and its value.
fn samples(text: &str, pod: &str) -> Result<Vec<(String, String)>, Error> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let bad = || {
            Error::Other(format!(
                "a sample line promtool's series cannot take: {line}"
            ))
        };
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let close = line.rfind('}').ok_or_else(bad)?;
                (&line[..open], &line[open + 1..close], &line[close + 1..])
            }
            None => {
                let (name, rest) = line.split_once(' ').ok_or_else(bad)?;
                (name, "", rest)
            }
        };
        let value = rest.split_whitespace().next().ok_or_else(bad)?;
        let value = value.strip_prefix('+').unwrap_or(value);
        let ours = format!("namespace=\"{SCRAPED_NAMESPACE}\", pod=\"{pod}\"");
        let labels = match labels.trim() {
            "" => ours,
            labels => format!("{labels}, {ours}"),
        };
        samples.push((format!("{name}{{{labels}}}"), value.to_string()));
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_become_series_with_the_scrapes_labels() {
        let text = "# TYPE akri_a counter\nakri_a_total{result=\"ok\"} 3\nakri_b 1.5\nakri_c_bucket{le=\"+Inf\"} +Inf\n# EOF\n";
        assert_eq!(
            samples(text, "p").unwrap(),
            [
                (
                    r#"akri_a_total{result="ok", namespace="akri", pod="p"}"#.to_string(),
                    "3".to_string()
                ),
                (
                    r#"akri_b{namespace="akri", pod="p"}"#.to_string(),
                    "1.5".to_string()
                ),
                (
                    r#"akri_c_bucket{le="+Inf", namespace="akri", pod="p"}"#.to_string(),
                    "Inf".to_string()
                ),
            ]
        );
        assert!(samples("akri_a_total{result=\"ok\"\n", "p").is_err());
    }

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
