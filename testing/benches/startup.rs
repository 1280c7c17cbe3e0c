//! Prints how long a warm (already built) control plane takes to start, from nothing to every
//! component ready: `cargo bench -p akri-testing --bench startup`.

use akri_testing::{ControlPlane, ControlPlaneOptions};
use std::time::Duration;

const RUNS: usize = 5;

#[tokio::main]
async fn main() -> Result<(), akri_testing::Error> {
    for (label, options) in [
        ("etcd + kube-apiserver", ControlPlaneOptions::default()),
        (
            "etcd + kube-apiserver + kube-scheduler + kube-controller-manager",
            ControlPlaneOptions::full(),
        ),
    ] {
        let mut times: Vec<Duration> = Vec::new();
        for _ in 0..RUNS {
            let control_plane = ControlPlane::start(options.clone()).await?;
            times.push(control_plane.started_in());
        }
        times.sort();
        eprintln!(
            "{label} (Kubernetes {}): min {:.2}s, median {:.2}s, max {:.2}s over {RUNS} starts",
            akri_testing::BinDir::from_env()?.version(),
            times[0].as_secs_f64(),
            times[RUNS / 2].as_secs_f64(),
            times[RUNS - 1].as_secs_f64(),
        );
    }
    Ok(())
}
