//! DRA kubelet plugins measured side by side, in one run: each is a process serving the DRA
//! gRPC service on a node of one API server, with nine claims allocated to it by hand, and one
//! gRPC client (this process) drives them block by block in turn, so that drift hits them
//! all. Per plugin: NodePrepareResources p50/p99 with 1 and 8 claims per call, a re-prepare of
//! a prepared claim, unprepare, the CPU time of the calls and resident memory. Used by
//! dra-plugin's `versus_go` and the kubelet-plugin's `versus` benches.

use crate::ControlPlane;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kubelet_proto::dra::v1 as dra;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

type BoxError = Box<dyn std::error::Error>;

/// What each block measures, in the order printed.
pub const MEASURED: [&str; 5] = [
    "prepare, 1 claim",
    "prepare, 8 claims",
    "re-prepare, 1 claim",
    "unprepare, 1 claim",
    "unprepare, 8 claims",
];

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

    /// One block of `rounds`: 1 claim, a re-prepare, unprepare, 8 claims, unprepare.
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
}

/// Builds `what` (cargo arguments naming one binary or example) in release, for the target
/// named by `BENCH_TARGET` if set (e.g. `x86_64-unknown-linux-musl`, what the images ship),
/// else for the host, and returns that build's release directory. Built as a user builds it,
/// so the contenders compared are built alike.
pub fn release_build(what: &[&str]) -> Result<std::path::PathBuf, BoxError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = std::env::var("BENCH_TARGET").ok();
    let mut build = std::process::Command::new(cargo);
    build.args(["build", "--release", "--quiet"]).args(what);
    if let Some(target) = &target {
        build.args(["--target", target]);
    }
    if !build.status()?.success() {
        return Err(format!("cargo build --release {} failed", what.join(" ")).into());
    }
    // A bench's binary is <target dir>/release/deps/<bench>-<hash>.
    let exe = std::env::current_exe()?;
    let release = exe.parent().and_then(Path::parent).ok_or("no target dir")?;
    Ok(match target {
        Some(target) => release
            .parent()
            .ok_or("no target dir")?
            .join(target)
            .join("release"),
        None => release.to_path_buf(),
    })
}

/// Our driver's binary: the example, built as a driver author would build it.
fn example_binary() -> Result<std::path::PathBuf, BoxError> {
    let release = release_build(&["-p", "dra-plugin", "--example", "minimal"])?;
    Ok(release.join("examples").join("minimal"))
}

/// Which driver a contender runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The Go driver on upstream's helper (`hack/k8s/go-dra-driver`, built by
    /// `hack/k8s-bins.sh`).
    Go,
    /// dra-plugin's example driver; with `metadata`, writing device metadata (KEP-5304) as
    /// the kubelet-plugin does.
    Example {
        /// Whether it writes device metadata files.
        metadata: bool,
    },
}

/// Starts driver `<label>.bench.example.com` with `count` devices (dev-0..) on `node`, the
/// `peer`; returns it once it has published them.
pub async fn start(
    label: &str,
    peer: Peer,
    (cp, node): (&ControlPlane, &str),
    count: usize,
) -> Result<Contender, BoxError> {
    let name = format!("{label}.bench.example.com");
    let dir = tempfile::Builder::new()
        .prefix("versus-go-")
        .tempdir()?
        .keep();
    let go = peer == Peer::Go;
    let mut command = match peer {
        Peer::Go => {
            let mut c =
                tokio::process::Command::new(crate::BinDir::from_env()?.require("go-dra-driver")?);
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
        }
        Peer::Example { metadata } => {
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
            if metadata {
                c.env("DEVICE_METADATA", "true");
            }
            c
        }
    };
    let mut child = command
        .stdout(match go {
            true => std::process::Stdio::piped(),
            false => std::process::Stdio::null(),
        })
        .kill_on_drop(true)
        .spawn()?;
    if go {
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        while lines.next_line().await?.ok_or("the driver exited")? != "READY" {}
    }
    // Ours serves its socket before it publishes.
    published_devices(cp, &name, count).await?;
    let socket = match go {
        true => dir.join("plugin/dra.sock"),
        false => dir.join("plugins").join(&name).join("dra.sock"),
    };
    let devices: Vec<String> = (0..9).map(|i| format!("dev-{i}")).collect();
    Contender::new(label, &name, child, &socket, (cp, node), &devices).await
}

/// Prints each contender's p50/p99 of what was measured, CPU time and `resident` memory (MiB,
/// taken by the caller), each with its ratio to the first contender's.
pub fn print(contenders: &[&Contender], resident: &[f64]) {
    let base = contenders[0];
    let mut header = format!("{:<24}", "");
    for c in contenders {
        header.push_str(&format!(" {:>18}", c.label));
    }
    for c in &contenders[1..] {
        header.push_str(&format!(" {:>14}", format!("{}/{}", c.label, base.label)));
    }
    eprintln!("{header}");
    for what in MEASURED {
        let mut line = format!("{what:<24}");
        for c in contenders {
            let (p50, p99) = (c.quantile(what, 0.5), c.quantile(what, 0.99));
            line.push_str(&format!(" {:>18}", format!("{p50:.2}/{p99:.2} ms")));
        }
        let (b50, b99) = (base.quantile(what, 0.5), base.quantile(what, 0.99));
        for c in &contenders[1..] {
            let ratio = format!(
                "{:.2}/{:.2}",
                c.quantile(what, 0.5) / b50,
                c.quantile(what, 0.99) / b99
            );
            line.push_str(&format!(" {ratio:>14}"));
        }
        eprintln!("{line}");
    }
    let mut cpu = format!("{:<24}", "CPU time of the calls");
    let mut rss = format!("{:<24}", "resident memory");
    for (c, mib) in contenders.iter().zip(resident) {
        cpu.push_str(&format!(" {:>18}", format!("{:.2} s", c.cpu_seconds())));
        rss.push_str(&format!(" {:>18}", format!("{mib:.1} MiB")));
    }
    for (c, mib) in contenders.iter().zip(resident).skip(1) {
        let cpu_ratio = c.cpu_seconds() / base.cpu_seconds().max(0.01);
        cpu.push_str(&format!(" {cpu_ratio:>14.2}"));
        rss.push_str(&format!(" {:>14.2}", mib / resident[0]));
    }
    eprintln!("{cpu}\n{rss}");
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

/// Waits until `driver` has published `count` devices (its pools' current generations), and
/// returns their names, sorted.
pub async fn published_devices(
    cp: &ControlPlane,
    driver: &str,
    count: usize,
) -> Result<Vec<String>, BoxError> {
    let slices = Api::<ResourceSlice>::all(cp.client().await?);
    let fields = ListParams::default().fields(&format!("spec.driver={driver}"));
    let start = Instant::now();
    loop {
        let listed = slices.list(&fields).await?.items;
        let newest = listed
            .iter()
            .map(|s| s.spec.pool.generation)
            .max()
            .unwrap_or(0);
        let mut names: Vec<String> = (listed.into_iter())
            .filter(|s| s.spec.pool.generation == newest)
            .flat_map(|s| s.spec.devices.unwrap_or_default())
            .map(|d| d.name)
            .collect();
        if names.len() == count {
            names.sort();
            return Ok(names);
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("{driver} did not publish {count} devices").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
