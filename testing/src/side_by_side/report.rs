//! What a side-by-side bench prints: one run's table, and the spread over runs.

use super::MEASURED;
use std::collections::BTreeMap;

/// One contender's figures from one run.
#[derive(Clone, Debug)]
pub struct Figures {
    pub label: String,
    /// p50 and p99 in ms, by what was measured.
    pub quantiles: BTreeMap<&'static str, (f64, f64)>,
    /// CPU time of the calls, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory at the run's end, in MiB.
    pub resident_mib: f64,
}

/// One run: each contender's p50/p99 of what was measured, CPU time and resident memory, each
/// with its ratio to the first contender's.
pub fn print(run: &[Figures]) {
    let base = &run[0];
    let mut header = format!("{:<24}", "");
    for f in run {
        header.push_str(&format!(" {:>18}", f.label));
    }
    for f in &run[1..] {
        header.push_str(&format!(" {:>14}", format!("{}/{}", f.label, base.label)));
    }
    eprintln!("{header}");
    for what in MEASURED {
        let mut line = format!("{what:<24}");
        for f in run {
            let (p50, p99) = f.quantiles[what];
            line.push_str(&format!(" {:>18}", format!("{p50:.2}/{p99:.2} ms")));
        }
        let (b50, b99) = base.quantiles[what];
        for f in &run[1..] {
            let (p50, p99) = f.quantiles[what];
            let ratio = format!("{:.2}/{:.2}", p50 / b50, p99 / b99);
            line.push_str(&format!(" {ratio:>14}"));
        }
        eprintln!("{line}");
    }
    let mut cpu = format!("{:<24}", "CPU time of the calls");
    let mut rss = format!("{:<24}", "resident memory");
    for f in run {
        cpu.push_str(&format!(" {:>18}", format!("{:.2} s", f.cpu_seconds)));
        rss.push_str(&format!(" {:>18}", format!("{:.1} MiB", f.resident_mib)));
    }
    for f in &run[1..] {
        let cpu_ratio = f.cpu_seconds / base.cpu_seconds.max(0.01);
        cpu.push_str(&format!(" {cpu_ratio:>14.2}"));
        rss.push_str(&format!(" {:>14.2}", f.resident_mib / base.resident_mib));
    }
    eprintln!("{cpu}\n{rss}");
}

impl Figures {
    /// Every figure, named, in the order printed.
    fn named(&self) -> Vec<(String, f64)> {
        let mut all = Vec::new();
        for what in MEASURED {
            let (p50, p99) = self.quantiles[what];
            all.push((format!("{what} p50 ms"), p50));
            all.push((format!("{what} p99 ms"), p99));
        }
        all.push(("CPU time of the calls s".into(), self.cpu_seconds));
        all.push(("resident memory MiB".into(), self.resident_mib));
        all
    }
}

/// The spread over `runs` (each the same contenders in the same order): per contender and
/// figure, the median over the runs and its range, and the same of the per-run ratio to the
/// first contender (a ratio is taken within a run, where both met the same moment).
pub fn print_spread(runs: &[Vec<Figures>]) {
    let Some(first) = runs.first() else { return };
    eprintln!(
        "over {} runs, median [min-max]; ratio to {} within each run:",
        runs.len(),
        first[0].label
    );
    let named: Vec<Vec<Vec<(String, f64)>>> = (runs.iter())
        .map(|run| run.iter().map(Figures::named).collect())
        .collect();
    for (i, f) in first.iter().enumerate() {
        eprintln!("  {}", f.label);
        for (k, (name, _)) in named[0][i].iter().enumerate() {
            let own: Vec<f64> = named.iter().map(|run| run[i][k].1).collect();
            let ratio: Vec<f64> = (named.iter())
                .map(|run| run[i][k].1 / run[0][k].1.max(1e-9))
                .collect();
            match i {
                0 => eprintln!("    {name:<30} {:>24}", spread(&own, 2)),
                _ => eprintln!(
                    "    {name:<30} {:>24}   x{}",
                    spread(&own, 2),
                    spread(&ratio, 2)
                ),
            }
        }
    }
}

/// What [`requests_per_claim`](super::requests_per_claim) counted for `contenders`.
pub fn print_requests(contenders: &[super::Contender], requests: &[(f64, f64)], claims: usize) {
    eprintln!(
        "API requests per claim prepared, held {:?} and unprepared ({claims} claims; the API server's counters):",
        super::HOLD
    );
    for (c, (reads, writes)) in contenders.iter().zip(requests) {
        eprintln!("  {:<12} reads {reads:.2}, writes {writes:.2}", c.label);
    }
}

/// `values` as "median [min-max]" with `digits` decimals (just the value when there is one).
pub fn spread(values: &[f64], digits: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() {
        0 => return "-".into(),
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    match sorted.len() {
        1 => format!("{median:.digits$}"),
        n => format!(
            "{median:.digits$} [{:.digits$}-{:.digits$}]",
            sorted[0],
            sorted[n - 1]
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn spread_is_the_median_and_the_range() {
        assert_eq!(spread(&[3.0, 1.0, 2.0], 1), "2.0 [1.0-3.0]");
        assert_eq!(spread(&[4.0, 1.0], 0), "2 [1-4]");
        assert_eq!(spread(&[0.5], 2), "0.50");
        assert_eq!(spread(&[], 2), "-");
    }
}
