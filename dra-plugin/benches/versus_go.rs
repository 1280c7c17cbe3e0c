//! dra-plugin side by side with upstream's Go `kubeletplugin` helper, in one run:
//! `cargo bench -p dra-plugin --bench versus_go` (after `hack/k8s-bins.sh`, which builds the
//! Go driver, `hack/k8s/go-dra-driver`).
//!
//! Both drivers do the same work per claim: the library (or helper) reads the claim, the
//! driver writes one CDI spec and records the claim in an fsynced checkpoint, and a claim
//! already prepared is answered from the checkpoint. Ours is the example driver's own binary
//! (`examples/minimal.rs`, built here as `cargo build --release --example minimal` builds it,
//! so that its memory is the example's and not this harness's); theirs is the Go driver.
//! Both publish the same devices to the same API server, as separate processes, and one gRPC
//! client (this process) drives both, block by block in turn so that drift hits both.
//!
//! Printed per driver: NodePrepareResources p50/p99 with 1 and 8 claims per call, a
//! re-prepare of a prepared claim, unprepare; resident memory with 100 and 1,000 devices; CPU
//! time during the calls; and ours/theirs.

use akri_testing::side_by_side::{self, Peer, start};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use std::time::Duration;

/// Rounds per block; each driver gets `BLOCKS` blocks, alternating.
const ROUNDS: usize = 200;
const BLOCKS: usize = 4;

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let node = "bench-node";
    cp.create_node(node).await?;

    let mut go = start("go", Peer::Go, (&cp, node), 100).await?;
    let mut rust = start("rust", Peer::Example { metadata: false }, (&cp, node), 100).await?;
    // Warm up both (connections, caches), then measure in alternating blocks.
    go.block(ROUNDS).await;
    rust.block(ROUNDS).await;
    go.clear();
    rust.clear();
    for _ in 0..BLOCKS {
        go.block(ROUNDS).await;
        rust.block(ROUNDS).await;
    }
    let rss_100 = (go.resident_mib(), rust.resident_mib());
    // The floor of a first prepare: reading the claim from the API server, which every driver
    // must do (a cached copy may be an older allocation of a reallocated claim).
    let claims = Api::<ResourceClaim>::namespaced(cp.client().await?, "default");
    let mut reads = Vec::new();
    for _ in 0..ROUNDS * BLOCKS {
        let started = std::time::Instant::now();
        claims.get(&rust.claims[0].name).await?;
        reads.push(started.elapsed());
    }
    reads.sort();
    // And its durable record before answering the kubelet: one small file written and synced.
    let dir = tempfile::tempdir()?;
    let mut syncs = Vec::new();
    for i in 0..ROUNDS * BLOCKS {
        let started = std::time::Instant::now();
        let mut file = std::fs::File::create(dir.path().join("record"))?;
        std::io::Write::write_all(&mut file, format!("{i}").as_bytes())?;
        file.sync_all()?;
        syncs.push(started.elapsed());
    }
    syncs.sort();
    let ms = |all: &[Duration], q: f64| {
        all[((all.len() as f64 * q) as usize).min(all.len() - 1)].as_secs_f64() * 1e3
    };
    let read_ms = |q: f64| ms(&reads, q);
    let floor_ms = |q: f64| ms(&reads, q) + ms(&syncs, q);

    eprintln!(
        "NodePrepareResources side by side: {} calls each, {ROUNDS} rounds x {BLOCKS} blocks, alternating; 100 devices",
        ROUNDS * BLOCKS
    );
    side_by_side::print(&[&go, &rust], &[rss_100.0, rss_100.1]);
    let (g50, g99) = (
        go.quantile("prepare, 1 claim", 0.5),
        go.quantile("prepare, 1 claim", 0.99),
    );
    for (what, floor) in [
        ("the claim's GET alone", &read_ms as &dyn Fn(f64) -> f64),
        ("GET + one synced write", &floor_ms),
    ] {
        eprintln!(
            "{what:<24} {:>18} {:>18} {:>16}",
            "",
            format!("{:.2}/{:.2} ms", floor(0.5), floor(0.99)),
            format!("{:.2}/{:.2}", floor(0.5) / g50, floor(0.99) / g99)
        );
    }
    eprintln!("(drivers {} and {})", go.driver, rust.driver);
    drop((go, rust));

    // Resident memory with 1,000 devices published, after a block of calls.
    let mut go = start("go1000", Peer::Go, (&cp, node), 1000).await?;
    let mut rust = start(
        "rust1000",
        Peer::Example { metadata: false },
        (&cp, node),
        1000,
    )
    .await?;
    go.block(ROUNDS).await;
    rust.block(ROUNDS).await;
    let rss_1000 = (go.resident_mib(), rust.resident_mib());
    eprintln!(
        "{:<24} {:>18} {:>18} {:>16}",
        "resident, 1,000 devices",
        format!("{:.1} MiB", rss_1000.0),
        format!("{:.1} MiB", rss_1000.1),
        format!("{:.2}", rss_1000.1 / rss_1000.0)
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tokio::runtime::Runtime::new()?.block_on(bench())
}
