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

use akri_testing::{BinDir, ControlPlane, ControlPlaneOptions};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kubelet_proto::dra::v1 as dra;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Rounds per block; each driver gets `BLOCKS` blocks, alternating.
const ROUNDS: usize = 200;
const BLOCKS: usize = 4;

/// Our driver's binary: the example, built as a driver author would build it.
fn example_binary() -> Result<PathBuf, Box<dyn std::error::Error>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--release", "--quiet", "-p", "dra-plugin"])
        .args(["--example", "minimal"])
        .status()?;
    if !built.success() {
        return Err("cargo build --release --example minimal failed".into());
    }
    // This binary is <target>/release/deps/versus_go-<hash>.
    let exe = std::env::current_exe()?;
    let release = exe.parent().and_then(Path::parent).ok_or("no target dir")?;
    Ok(release.join("examples").join("minimal"))
}

/// One driver under test.
struct Driver {
    label: &'static str,
    name: String,
    child: tokio::process::Child,
    grpc: dra::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    /// Nine claims allocated to it: one for single calls, eight for batches.
    claims: Vec<dra::Claim>,
    latencies: BTreeMap<&'static str, Vec<Duration>>,
    cpu_ticks: u64,
}

impl Driver {
    async fn start(
        label: &'static str,
        go: bool,
        cp: &ControlPlane,
        node: &str,
        count: usize,
    ) -> Result<Driver, Box<dyn std::error::Error>> {
        let name = format!("{label}.bench.example.com");
        let dir = tempfile::Builder::new()
            .prefix("versus-go-")
            .tempdir()?
            .keep();
        let mut command = if go {
            let mut c = tokio::process::Command::new(BinDir::from_env()?.require("go-dra-driver")?);
            c.arg(format!("--kubeconfig={}", cp.kubeconfig().display()))
                .arg(format!("--driver-name={name}"))
                .arg(format!("--node-name={node}"))
                .arg(format!("--registry-dir={}", dir.join("registry").display()))
                .arg(format!("--plugin-dir={}", dir.join("plugin").display()))
                .arg(format!("--cdi-dir={}", dir.join("cdi").display()))
                .arg(format!(
                    "--checkpoint={}",
                    dir.join("checkpoint.json").display()
                ))
                .arg(format!("--devices={count}"));
            c
        } else {
            // The example's own settings: its gadgets dev-0..dev-<count-1>, the kubelet's
            // directories in `dir`.
            let gadgets: Vec<String> = (0..count).map(|i| format!("dev-{i}")).collect();
            let mut c = tokio::process::Command::new(example_binary()?);
            c.env("KUBECONFIG", cp.kubeconfig())
                .env("DRIVER_NAME", &name)
                .env("NODE_NAME", node)
                .env("GADGETS", gadgets.join(","))
                .env("CDI_ROOT", dir.join("cdi"))
                .env("KUBELET_DIR", &dir);
            c
        };
        let mut child = command
            .stdout(match go {
                true => std::process::Stdio::piped(),
                false => std::process::Stdio::null(),
            })
            .kill_on_drop(true)
            .spawn()?;
        if go {
            let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
            while lines.next_line().await?.ok_or("the driver exited")? != "READY" {}
        }
        // Ours serves its socket before it publishes.
        wait_published(cp, &name, count).await?;
        let socket = match go {
            true => dir.join("plugin/dra.sock"),
            false => dir.join("plugins").join(&name).join("dra.sock"),
        };
        let channel = dra_plugin::authority::connect(&socket).await?;
        let claims = allocated_claims(cp, &name, node).await?;
        Ok(Driver {
            label,
            name,
            child,
            grpc: dra::dra_plugin_client::DraPluginClient::new(channel),
            claims,
            latencies: BTreeMap::new(),
            cpu_ticks: 0,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    async fn prepare(&mut self, claims: &[dra::Claim]) -> Duration {
        let started = Instant::now();
        let answer = self
            .grpc
            .node_prepare_resources(dra::NodePrepareResourcesRequest {
                claims: claims.to_vec(),
            })
            .await
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
        let answer = self
            .grpc
            .node_unprepare_resources(dra::NodeUnprepareResourcesRequest {
                claims: claims.to_vec(),
            })
            .await
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

    /// One block of rounds: 1 claim, 8 claims, a re-prepare, unprepares.
    async fn block(&mut self) {
        let cpu_before = cpu_ticks(self.pid());
        let one = self.claims[..1].to_vec();
        let eight = self.claims[1..9].to_vec();
        for _ in 0..ROUNDS {
            let t = self.prepare(&one).await;
            self.record("prepare, 1 claim", t);
            let t = self.prepare(&one).await;
            self.record("re-prepare, 1 claim", t);
            let t = self.unprepare(&one).await;
            self.record("unprepare, 1 claim", t);
            let t = self.prepare(&eight).await;
            self.record("prepare, 8 claims", t);
            let t = self.unprepare(&eight).await;
            self.record("unprepare, 8 claims", t);
        }
        self.cpu_ticks += cpu_ticks(self.pid()) - cpu_before;
    }

    fn record(&mut self, what: &'static str, took: Duration) {
        self.latencies.entry(what).or_default().push(took);
    }

    fn quantile(&self, what: &str, q: f64) -> f64 {
        let mut all = self.latencies[what].clone();
        all.sort();
        let at = ((all.len() as f64 * q) as usize).min(all.len() - 1);
        all[at].as_secs_f64() * 1e3
    }
}

/// User + system CPU time of a process, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
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

async fn wait_published(
    cp: &ControlPlane,
    driver: &str,
    count: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let slices = Api::<ResourceSlice>::all(cp.client().await?);
    let fields = ListParams::default().fields(&format!("spec.driver={driver}"));
    let start = Instant::now();
    loop {
        let listed = slices.list(&fields).await?.items;
        if dra_plugin::slices::current_devices(&listed).len() == count {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("{driver} did not publish {count} devices").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Nine claims allocated by hand to devices dev-0..dev-8 of `driver` on `node`.
async fn allocated_claims(
    cp: &ControlPlane,
    driver: &str,
    node: &str,
) -> Result<Vec<dra::Claim>, Box<dyn std::error::Error>> {
    let api = Api::<ResourceClaim>::namespaced(cp.client().await?, "default");
    let mut claims = Vec::new();
    for i in 0..9 {
        let name = format!("{}-{i}", driver.split('.').next().unwrap_or(driver));
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": { "devices": { "requests": [{ "name": "r", "exactly": { "deviceClassName": "bench" } }] } },
        }))?;
        let created = api.create(&PostParams::default(), &claim).await?;
        let status = json!({ "status": { "allocation": { "devices": { "results": [
            { "request": "r", "driver": driver, "pool": node, "device": format!("dev-{i}") }
        ] } } } });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        claims.push(dra::Claim {
            namespace: "default".into(),
            name,
            uid: created.metadata.uid.expect("created claims have a UID"),
        });
    }
    Ok(claims)
}

fn resident_mib(pid: u32) -> f64 {
    akri_testing::memory_kb(pid).map_or(0.0, |(rss, _)| rss as f64 / 1024.0)
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let node = "bench-node";
    cp.create_node(node).await?;

    let mut go = Driver::start("go", true, &cp, node, 100).await?;
    let mut rust = Driver::start("rust", false, &cp, node, 100).await?;
    // Warm up both (connections, caches), then measure in alternating blocks.
    go.block().await;
    rust.block().await;
    go.latencies.clear();
    rust.latencies.clear();
    (go.cpu_ticks, rust.cpu_ticks) = (0, 0);
    for _ in 0..BLOCKS {
        go.block().await;
        rust.block().await;
    }
    let rss_100 = (resident_mib(go.pid()), resident_mib(rust.pid()));
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
    eprintln!(
        "{:<24} {:>18} {:>18} {:>16}",
        "", "Go helper", "dra-plugin", "ours/theirs"
    );
    for what in [
        "prepare, 1 claim",
        "prepare, 8 claims",
        "re-prepare, 1 claim",
        "unprepare, 1 claim",
        "unprepare, 8 claims",
    ] {
        let (g50, g99) = (go.quantile(what, 0.5), go.quantile(what, 0.99));
        let (r50, r99) = (rust.quantile(what, 0.5), rust.quantile(what, 0.99));
        eprintln!(
            "{what:<24} {:>18} {:>18} {:>16}",
            format!("{g50:.2}/{g99:.2} ms"),
            format!("{r50:.2}/{r99:.2} ms"),
            format!("{:.2}/{:.2}", r50 / g50, r99 / g99)
        );
    }
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
    let cpu = |ticks: u64| ticks as f64 / 100.0;
    eprintln!(
        "{:<24} {:>18} {:>18} {:>16}",
        "CPU time of the calls",
        format!("{:.2} s", cpu(go.cpu_ticks)),
        format!("{:.2} s", cpu(rust.cpu_ticks)),
        format!("{:.2}", rust.cpu_ticks as f64 / go.cpu_ticks.max(1) as f64)
    );
    eprintln!(
        "{:<24} {:>18} {:>18} {:>16}",
        "resident, 100 devices",
        format!("{:.1} MiB", rss_100.0),
        format!("{:.1} MiB", rss_100.1),
        format!("{:.2}", rss_100.1 / rss_100.0)
    );
    eprintln!("(drivers {} and {})", go.name, rust.name);
    drop((go, rust));

    // Resident memory with 1,000 devices published, after a block of calls.
    let mut go = Driver::start("go1000", true, &cp, node, 1000).await?;
    let mut rust = Driver::start("rust1000", false, &cp, node, 1000).await?;
    go.block().await;
    rust.block().await;
    let rss_1000 = (resident_mib(go.pid()), resident_mib(rust.pid()));
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
