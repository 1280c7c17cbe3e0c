//! DRA kubelet plugins measured side by side, in one run: each is a process serving the DRA
//! gRPC service on a node of one API server, with nine claims allocated to it by hand, and one
//! gRPC client (this process) drives them block by block, the order rotated per block, so that
//! drift and each one's deferred work hit them all alike. Per plugin: NodePrepareResources
//! p50/p99 with 1 and 8 claims per call, a re-prepare of a prepared claim, unprepare, the CPU
//! time of the calls, resident memory, and the API requests per claim held past any status
//! write window, counted by the API server. A bench repeats this over several runs (fresh
//! processes each) and prints the spread. Used by dra-plugin's `versus_go` and the
//! kubelet-plugin's `versus` benches.

mod peers;
mod report;

pub use peers::{Peer, published_devices, release_build, start};
pub use report::{Figures, print, print_requests, print_spread};

use crate::ControlPlane;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kubelet_proto::dra::v1 as dra;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error>;

/// What each block measures, in the order printed.
pub const MEASURED: [&str; 5] = [
    "prepare, 1 claim",
    "prepare, 8 claims",
    "re-prepare, 1 claim",
    "unprepare, 1 claim",
    "unprepare, 8 claims",
];

/// How long a claim is held prepared when API requests are counted, and how long each block is
/// followed by quiet: past dra-plugin's status write window, so that a plugin's deferred writes
/// are made (and counted, and cost their CPU) inside its own turn, not the next plugin's. Twice
/// `dra_plugin::device_status::BATCH_WINDOW` (200 ms; this library's lib does not link
/// dra-plugin, and `versus_go` checks the two agree).
pub const HOLD: Duration = Duration::from_millis(400);

/// How many runs a bench makes: `BENCH_RUNS`, 3 unless set.
pub fn runs() -> usize {
    std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3)
}

/// One plugin under test.
pub struct Contender {
    pub label: String,
    /// Its DRA driver name.
    pub driver: String,
    child: tokio::process::Child,
    grpc: dra::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    /// Nine claims allocated to it: one for single calls, eight for batches.
    pub claims: Vec<dra::Claim>,
    latencies: BTreeMap<&'static str, Vec<Duration>>,
    cpu_ticks: u64,
}

impl Contender {
    /// `child` serves driver `driver` on `socket` and has published `devices` of pool `node`;
    /// the first nine get a claim each (`<label>-<i>` in `default`), allocated by hand.
    pub async fn new(
        label: &str,
        driver: &str,
        child: tokio::process::Child,
        socket: &Path,
        (cp, node): (&ControlPlane, &str),
        devices: &[String],
    ) -> Result<Contender, BoxError> {
        let channel = node_io::authority::connect(socket).await?;
        let api = Api::<ResourceClaim>::namespaced(cp.client().await?, "default");
        let mut claims = Vec::new();
        for (i, device) in devices.iter().take(9).enumerate() {
            let name = format!("{label}-{i}");
            let claim: ResourceClaim = serde_json::from_value(json!({
                "metadata": { "name": name },
                "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "bench" } }] } },
            }))?;
            let created = api.create(&PostParams::default(), &claim).await?;
            let status = json!({ "status": { "allocation": { "devices": { "results": [
                { "request": "r", "driver": driver, "pool": node, "device": device }
            ] } } } });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await?;
            claims.push(dra::Claim {
                namespace: "default".into(),
                name,
                uid: created.metadata.uid.ok_or("created claims have a UID")?,
            });
        }
        Ok(Contender {
            label: label.to_string(),
            driver: driver.to_string(),
            child,
            grpc: dra::dra_plugin_client::DraPluginClient::new(channel),
            claims,
            latencies: BTreeMap::new(),
            cpu_ticks: 0,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Resident memory now, in MiB.
    pub fn resident_mib(&self) -> f64 {
        crate::memory_kb(self.pid()).map_or(0.0, |(rss, _)| rss as f64 / 1024.0)
    }

    /// Forgets what was measured (after a warm-up block).
    pub fn clear(&mut self) {
        self.latencies.clear();
        self.cpu_ticks = 0;
    }

    async fn prepare(&mut self, claims: &[dra::Claim]) -> Duration {
        let started = Instant::now();
        let request = dra::NodePrepareResourcesRequest {
            claims: claims.to_vec(),
        };
        let answer = (self.grpc.node_prepare_resources(request).await)
            .expect("prepare answered")
            .into_inner();
        let took = started.elapsed();
        assert!(
            answer.claims.len() == claims.len()
                && answer.claims.values().all(|c| c.error.is_empty()),
            "{}: {answer:?}",
            self.label
        );
        took
    }

    async fn unprepare(&mut self, claims: &[dra::Claim]) -> Duration {
        let started = Instant::now();
        let request = dra::NodeUnprepareResourcesRequest {
            claims: claims.to_vec(),
        };
        let answer = (self.grpc.node_unprepare_resources(request).await)
            .expect("unprepare answered")
            .into_inner();
        let took = started.elapsed();
        assert!(
            answer.claims.values().all(|c| c.error.is_empty()),
            "{}: {answer:?}",
            self.label
        );
        took
    }

    /// One block of `rounds`: 1 claim, a re-prepare, unprepare, 8 claims, unprepare; then
    /// [`HOLD`] of quiet, counted in its CPU time.
    pub async fn block(&mut self, rounds: usize) {
        let cpu_before = cpu_ticks(self.pid());
        let one = self.claims[..1].to_vec();
        let eight = self.claims[1..9].to_vec();
        for _ in 0..rounds {
            let t = self.prepare(&one).await;
            self.record(MEASURED[0], t);
            let t = self.prepare(&one).await;
            self.record(MEASURED[2], t);
            let t = self.unprepare(&one).await;
            self.record(MEASURED[3], t);
            let t = self.prepare(&eight).await;
            self.record(MEASURED[1], t);
            let t = self.unprepare(&eight).await;
            self.record(MEASURED[4], t);
        }
        tokio::time::sleep(HOLD).await;
        self.cpu_ticks += cpu_ticks(self.pid()) - cpu_before;
    }

    fn record(&mut self, what: &'static str, took: Duration) {
        self.latencies.entry(what).or_default().push(took);
    }

    /// The `q` quantile of `what`, in ms.
    pub fn quantile(&self, what: &str, q: f64) -> f64 {
        let mut all = self.latencies[what].clone();
        all.sort();
        let at = ((all.len() as f64 * q) as usize).min(all.len() - 1);
        all[at].as_secs_f64() * 1e3
    }

    /// CPU time of the calls measured, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_ticks as f64 / 100.0
    }

    /// What was measured, with resident memory now.
    pub fn figures(&self) -> Figures {
        Figures {
            label: self.label.clone(),
            quantiles: (MEASURED.iter())
                .map(|&what| (what, (self.quantile(what, 0.5), self.quantile(what, 0.99))))
                .collect(),
            cpu_seconds: self.cpu_seconds(),
            resident_mib: self.resident_mib(),
        }
    }
}

/// Measures `contenders`: a warm-up block each (connections, caches; then forgotten), then
/// `blocks` blocks of `rounds` each, block `b` starting with contender `offset + b` and going
/// round, so that no contender always follows the same one. Returns each one's figures.
pub async fn measure(
    contenders: &mut [Contender],
    (rounds, blocks): (usize, usize),
    offset: usize,
) -> Vec<Figures> {
    for c in contenders.iter_mut() {
        c.block(rounds).await;
        c.clear();
    }
    let n = contenders.len();
    for b in 0..blocks {
        for i in 0..n {
            contenders[(offset + b + i) % n].block(rounds).await;
        }
    }
    contenders.iter().map(Contender::figures).collect()
}

/// [`measure`] [`runs`] times over, each run's rotation starting one contender further, each
/// run's figures printed as it ends; returns them all.
pub async fn measure_runs(
    contenders: &mut [Contender],
    (rounds, blocks): (usize, usize),
) -> Vec<Vec<Figures>> {
    let runs = runs();
    let mut all = Vec::new();
    for run in 0..runs {
        let figures = measure(contenders, (rounds, blocks), run).await;
        eprintln!("run {}/{runs}:", run + 1);
        print(&figures);
        all.push(figures);
    }
    all
}

/// The API requests each contender makes per claim it prepares, holds for [`HOLD`] (past any
/// status write window) and unprepares, `claims` times, one contender after the other (each
/// given [`HOLD`] to settle after its last): the API server's own `apiserver_request_total`,
/// (reads: GET, LIST, WATCH; writes), Leases left out (none of these plugins leads). The
/// claims' own reads by the library count: they are part of a prepare.
pub async fn requests_per_claim(
    cp: &ControlPlane,
    contenders: &mut [Contender],
    claims: usize,
) -> Result<Vec<(f64, f64)>, BoxError> {
    let client = cp.client().await?;
    let mut all = Vec::new();
    for c in contenders.iter_mut() {
        let before = requests(&client).await?;
        let one = c.claims[..1].to_vec();
        for _ in 0..claims {
            c.prepare(&one).await;
            tokio::time::sleep(HOLD).await;
            c.unprepare(&one).await;
            tokio::time::sleep(HOLD).await;
        }
        let after = requests(&client).await?;
        let per_claim = |i: usize| (after[i] - before[i]) / claims as f64;
        all.push((per_claim(0), per_claim(1)));
    }
    Ok(all)
}

/// The API server's request counters so far: reads and writes, Leases left out.
async fn requests(client: &kube::Client) -> Result<[f64; 2], BoxError> {
    let mut counts = [0.0; 2];
    for (labels, value) in crate::apiserver_samples(client, "apiserver_request_total").await? {
        if labels.get("resource").is_none_or(|r| r == "leases") {
            continue;
        }
        match labels.get("verb").map(String::as_str) {
            Some("GET" | "LIST" | "WATCH") => counts[0] += value,
            Some("POST" | "PUT" | "PATCH" | "DELETE" | "APPLY") => counts[1] += value,
            _ => {}
        }
    }
    Ok(counts)
}

/// User + system CPU time of a process, in clock ticks (1/100 s).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after the name and state.
    field(11) + field(12)
}
