//! dra-plugin side by side with upstream's Go `kubeletplugin` helper and upstream's own DRA
//! test driver, in one run: `cargo bench -p dra-plugin --bench versus_go` (after
//! `hack/k8s-bins.sh`, which builds the Go driver, `hack/k8s/go-dra-driver`, and upstream's
//! `test/e2e/dra/test-driver`).
//!
//! The contenders, each its own process publishing 100 devices to the same API server:
//! - `go`: a Go driver on the helper doing exactly our work per claim (the helper reads the
//!   claim, the driver writes one CDI spec and records the call's new claims in one fsynced
//!   checkpoint, a claim already prepared is answered from the checkpoint): the base of the
//!   ratios;
//! - `goperclaim`: the same with its checkpoint stored after each claim, as dra-example-driver
//!   does: the cost of that choice, measured;
//! - `upstream`: upstream's test driver as it is, which nobody here wrote: no checkpoint, its
//!   CDI spec written without fsync, every call kept in memory for its e2e tests;
//! - `rust`: dra-plugin's example driver (`examples/minimal.rs`, its own binary, built as
//!   `cargo build --release --example minimal` builds it).
//!
//! One difference stays, as it is the libraries': a re-prepare of a prepared claim is answered
//! by dra-plugin from its checkpoint without reading the claim, while upstream's helper reads
//! every claim before its driver is called, so the "re-prepare" row compares the libraries,
//! not equal work. Every driver runs one thread of its own code: the example a current-thread
//! Tokio runtime, the Go drivers `GOMAXPROCS=1` (set `GOMAXPROCS` for another value).
//!
//! One gRPC client (this process) drives them block by block, the order rotated per block and
//! per run; `BENCH_RUNS` runs (3) of 4 blocks of 200 rounds, each run's table printed, then
//! the spread over the runs. Then the API requests per claim held past dra-plugin's status
//! window (the API server's counters), the floor of a first prepare, and resident memory with
//! 1,000 devices.

use akri_testing::side_by_side::{self, Peer, start};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::Api;
use std::time::Duration;

/// Rounds per block; each driver gets `BLOCKS` blocks per run, rotated.
const ROUNDS: usize = 200;
const BLOCKS: usize = 4;
/// Claims prepared, held and unprepared per contender while API requests are counted.
const CLAIMS_COUNTED: usize = 10;

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    assert!(
        side_by_side::HOLD >= 2 * dra_plugin::device_status::BATCH_WINDOW,
        "the bench's hold must outlast the status window"
    );
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let node = "bench-node";
    cp.create_node(node).await?;

    // The base of the ratios first: the Go driver doing exactly our work.
    let mut contenders = vec![
        start("go", Peer::Go { per_claim: false }, (&cp, node), 100).await?,
        start("goperclaim", Peer::Go { per_claim: true }, (&cp, node), 100).await?,
        start("upstream", Peer::Upstream, (&cp, node), 100).await?,
        start("rust", Peer::Example { metadata: false }, (&cp, node), 100).await?,
    ];
    eprintln!(
        "NodePrepareResources side by side: per run {} calls each, {ROUNDS} rounds x {BLOCKS} blocks, rotated; 100 devices; GOMAXPROCS={}",
        ROUNDS * BLOCKS,
        std::env::var("GOMAXPROCS").unwrap_or_else(|_| "1".into())
    );
    let runs = side_by_side::measure_runs(&mut contenders, (ROUNDS, BLOCKS)).await;
    side_by_side::print_spread(&runs);
    let requests = side_by_side::requests_per_claim(&cp, &mut contenders, CLAIMS_COUNTED).await?;
    side_by_side::print_requests(&contenders, &requests, CLAIMS_COUNTED);
    let (go, rust) = (&contenders[0], &contenders[3]);
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

    // Against the last run's Go prepare.
    let (g50, g99) = (
        go.quantile("prepare, 1 claim", 0.5),
        go.quantile("prepare, 1 claim", 0.99),
    );
    for (what, floor) in [
        ("the claim's GET alone", &read_ms as &dyn Fn(f64) -> f64),
        ("GET + one synced write", &floor_ms),
    ] {
        eprintln!(
            "floor of a first prepare, {what:<24} {:>16}, of go's {:.2}/{:.2}",
            format!("{:.2}/{:.2} ms", floor(0.5), floor(0.99)),
            floor(0.5) / g50,
            floor(0.99) / g99
        );
    }
    drop(contenders);

    // Resident memory with 1,000 devices published, after a block of calls.
    let mut go = start("go1000", Peer::Go { per_claim: false }, (&cp, node), 1000).await?;
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
        "resident with 1,000 devices: go {:.1} MiB, rust {:.1} MiB, rust/go {:.2}",
        rss_1000.0,
        rss_1000.1,
        rss_1000.1 / rss_1000.0
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tokio::runtime::Runtime::new()?.block_on(bench())
}
