//! Prints the legacy path's Allocate latency (p50/p99) and its slot-claim conflicts per 1,000
//! allocations, on one node alone and on two nodes racing for one shared device, side by side:
//! `cargo bench -p akri-kubelet-plugin --bench legacy`.
//!
//! Each simulated node is the kubelet's own device manager (kubelet peer) in front of the node
//! agent's device plugins, on a real kube-apiserver. A node admits pods asking for the device's
//! Instance-level resource one after another, holds up to 2 at once and releases the oldest,
//! waiting until the reclaimer freed its slot (grace 0): every admission claims a slot with a
//! write to the Instance, and on two nodes 4 wanted slots meet 3.

#[allow(dead_code)]
#[path = "../tests/node_agent/legacy/cluster.rs"]
mod cluster;

use akri_testing::ControlPlane;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Pod admissions each node attempts.
const ATTEMPTS_PER_NODE: usize = 500;
const CAPACITY: usize = 3;

#[derive(Default)]
struct Racer {
    /// The device manager's admission of each admitted pod (Allocate included), as the
    /// kubelet peer timed it.
    admitted: Vec<f64>,
    /// The whole request of each refused pod, as the benchmark timed it.
    refused: Vec<f64>,
}

#[tokio::main]
async fn main() {
    eprintln!(
        "{:<28} {:>9} {:>9} {:>13} {:>13} {:>13} {:>10} {:>16}",
        "scenario",
        "admitted",
        "refused",
        "admit p50 ms",
        "admit p99 ms",
        "refuse p50 ms",
        "conflicts",
        "per 1,000 Alloc"
    );
    for nodes in [1, 2] {
        scenario(nodes).await;
    }
}

async fn scenario(nodes: usize) {
    let c = Arc::new(cluster::cluster(nodes, Duration::ZERO).await);
    let config = ControlPlane::unique_name("cam");
    let [cam] = c.configuration(&config, &["cam0"], CAPACITY, true).await;
    let il = format!("akri.sh/{cam}");
    for node in &c.nodes {
        cluster::registered(node, &il, CAPACITY).await;
    }
    let started = Instant::now();
    let mut racers = Vec::new();
    for n in 0..nodes {
        let (c, cam) = (c.clone(), cam.clone());
        racers.push(tokio::spawn(async move { race(&c, n, &cam).await }));
    }
    let mut all = Racer::default();
    for racer in racers {
        let racer = racer.await.expect("racer");
        all.admitted.extend(racer.admitted);
        all.refused.extend(racer.refused);
    }
    let took = started.elapsed();
    // Allocate calls the plugins answered (the kubelet refuses a pod itself, without calling
    // Allocate, when it sees no healthy device), and the claims among them that lost a slot
    // to the other node's concurrent write.
    let (mut calls, mut claims, mut conflicts) = (0, 0, 0);
    for node in &c.nodes {
        let counters = node.agent.legacy_counters().expect("legacy counters");
        calls += counters.allocations.load(Ordering::Relaxed)
            + counters.failed_allocations.load(Ordering::Relaxed);
        claims += counters.claims.load(Ordering::Relaxed);
        conflicts += counters.conflicts.load(Ordering::Relaxed);
    }
    let label = format!("{nodes} node(s), capacity {CAPACITY}");
    eprintln!(
        "{label:<28} {:>9} {:>9} {:>13.1} {:>13.1} {:>13.1} {:>10} {:>16.1}",
        all.admitted.len(),
        all.refused.len(),
        percentile(&mut all.admitted, 50) * 1e3,
        percentile(&mut all.admitted, 99) * 1e3,
        percentile(&mut all.refused, 50) * 1e3,
        conflicts,
        conflicts as f64 * 1000.0 / calls.max(1) as f64,
    );
    eprintln!(
        "  {} attempts in {:.1}s; {calls} Allocate calls reached the plugins, {claims} slots claimed",
        nodes * ATTEMPTS_PER_NODE,
        took.as_secs_f64()
    );
}

async fn race(c: &cluster::Cluster, n: usize, cam: &str) -> Racer {
    let il = format!("akri.sh/{cam}");
    let node = &c.nodes[n];
    let mut racer = Racer::default();
    let mut held = std::collections::VecDeque::new();
    for i in 0..ATTEMPTS_PER_NODE {
        let pod = format!("race-{n}-{i}");
        c.pod(&pod, &[("broker", &il, 1)]).await;
        let asked = Instant::now();
        match node.peer.allocate(&c.ns, &pod, "broker").await {
            Ok(options) => {
                racer.admitted.push(
                    options["admit_seconds"]
                        .as_f64()
                        .expect("the peer times admission"),
                );
                held.push_back((pod, cluster::allocated_slot(&options)));
            }
            Err(_) => racer.refused.push(asked.elapsed().as_secs_f64()),
        }
        if held.len() >= 2 || (held.len() == 1 && i % 3 == 0) {
            let (old, slot) = held.pop_front().expect("a held pod");
            c.release_and_reclaim(node, &old, cam, &slot).await;
        }
    }
    for (old, slot) in held {
        c.release_and_reclaim(node, &old, cam, &slot).await;
    }
    racer
}

/// The `p`th percentile (nearest rank) of `values`, 0 when empty.
fn percentile(values: &mut [f64], p: usize) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = (values.len() * p).div_ceil(100).max(1);
    values[rank - 1]
}
