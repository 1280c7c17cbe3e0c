//! The plugins a side-by-side bench starts, each as its own process.

use super::{BoxError, Contender};
use crate::ControlPlane;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

/// Which driver a contender runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// The Go driver on upstream's helper (`hack/k8s/go-dra-driver`, built by
    /// `hack/k8s-bins.sh`), doing what the example does per claim; `per_claim` stores its
    /// checkpoint after each claim (as dra-example-driver does) instead of once per call (as
    /// dra-plugin does).
    Go {
        /// Whether its checkpoint is stored per claim rather than per call.
        per_claim: bool,
    },
    /// Upstream's own DRA test driver (`test/e2e/dra/test-driver` of `k8s.io/kubernetes`,
    /// built by `hack/k8s-bins.sh`), as it is: a CDI spec per claim, written without fsync or
    /// rename, the prepared claims in memory only (no checkpoint), and every gRPC call kept in
    /// memory for its e2e tests (its resident memory grows with the calls).
    Upstream,
    /// dra-plugin's example driver; with `metadata`, writing device metadata (KEP-5304) as
    /// the kubelet-plugin does.
    Example {
        /// Whether it writes device metadata files.
        metadata: bool,
    },
}

/// The Go drivers' `GOMAXPROCS`: 1, as dra-plugin's example and the kubelet-plugin run one
/// runtime thread (both also move blocking file work to other threads, as Go's runtime does
/// for system calls), unless the bench itself runs with `GOMAXPROCS` set (`GOMAXPROCS=2` for
/// Go's default on this 2-core machine).
fn gomaxprocs() -> String {
    std::env::var("GOMAXPROCS").unwrap_or_else(|_| "1".into())
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

/// Starts driver `<label>.bench.example.com` with `count` devices on `node`, the `peer`;
/// returns it once it has published them.
pub async fn start(
    label: &str,
    peer: Peer,
    (cp, node): (&ControlPlane, &str),
    count: usize,
) -> Result<Contender, BoxError> {
    let name = format!("{label}.bench.example.com");
    let dir = tempfile::Builder::new().prefix("versus-").tempdir()?.keep();
    let bins = crate::BinDir::from_env()?;
    let mut command = match peer {
        Peer::Go { per_claim } => {
            let mut c = tokio::process::Command::new(bins.require("go-dra-driver")?);
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
                .arg(format!(
                    "--checkpoint-per={}",
                    if per_claim { "claim" } else { "call" }
                ))
                .arg(format!("--devices={count}"))
                .env("GOMAXPROCS", gomaxprocs());
            c
        }
        Peer::Upstream => {
            // It makes the parent of its socket's directory, as the kubelet makes that.
            std::fs::create_dir_all(dir.join("plugins").join(&name))?;
            std::fs::create_dir_all(dir.join("registry"))?;
            let mut c = tokio::process::Command::new(bins.require("dra-test-driver")?);
            // Its client's default rate limit (50/s) would measure the limiter, not the
            // driver: the helper reads every claim.
            c.arg(format!("--kubeconfig={}", cp.kubeconfig().display()))
                .arg(format!("--drivername={name}"))
                .args(["--kube-api-qps=1000", "--kube-api-burst=1000"])
                .arg("kubelet-plugin")
                .arg(format!("--node-name={node}"))
                .arg(format!("--num-devices={count}"))
                .arg(format!(
                    "--plugin-registration-path={}",
                    dir.join("registry").display()
                ))
                .arg(format!("--datadir={}", dir.join("plugins").display()))
                .arg(format!("--cdi-dir={}", dir.join("cdi").display()))
                .env("GOMAXPROCS", gomaxprocs());
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
    let go = matches!(peer, Peer::Go { .. });
    let mut child = command
        .stdout(match go {
            true => std::process::Stdio::piped(),
            false => std::process::Stdio::null(),
        })
        .stderr(std::fs::File::create(dir.join("log"))?)
        .kill_on_drop(true)
        .spawn()?;
    if go {
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
        while lines.next_line().await?.ok_or("the driver exited")? != "READY" {}
    }
    // Ours and upstream's serve their sockets before they publish.
    let published = match published_devices(cp, &name, count).await {
        Ok(published) => published,
        Err(error) => {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(format!("{error}; its log ends:\n{}", tail.join("\n")).into());
        }
    };
    let socket = match peer {
        Peer::Go { .. } => dir.join("plugin/dra.sock"),
        Peer::Upstream | Peer::Example { .. } => dir.join("plugins").join(&name).join("dra.sock"),
    };
    // The claims go to the first nine devices by index (upstream's are device-00...).
    let devices: Vec<String> = match peer {
        Peer::Upstream => published.into_iter().take(9).collect(),
        _ => (0..9).map(|i| format!("dev-{i}")).collect(),
    };
    Contender::new(label, &name, child, &socket, (cp, node), &devices).await
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
