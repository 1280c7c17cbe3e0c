//! The kubelet-plugin's own prepare path side by side with dra-plugin's example driver and the
//! Go driver on upstream's `kubeletplugin` helper, in one run, each with 100 devices, one API
//! server, one gRPC client, blocks in rotated order over `BENCH_RUNS` runs (3), with the
//! spread, and the API requests each makes per claim held past the status window
//! (`akri_testing::side_by_side`):
//! `cargo bench -p akri-kubelet-plugin --bench versus` (after `hack/k8s-bins.sh`, which builds
//! the Go driver). The kubelet-plugin is its release binary with the embedded debugEcho
//! handler; its devices are discovered and published as on a node; its prepare also writes
//! the claim's `status.devices` (off the kubelet's path) and its Instances exist, and it writes
//! each claim's device metadata files, so the example runs twice: as it is, and with device
//! metadata (`examplemd`), the like-for-like peer.
//! `BENCH_TARGET=x86_64-unknown-linux-musl` builds the kubelet-plugin and the example for that
//! target, as the images ship them (static, musl's libc), so that the image's binary is
//! compared like for like; `BENCH_AGENT_BIN=<path>` runs any other build of the kubelet-plugin.

use akri_testing::side_by_side::{self, Contender, Peer, published_devices, start};
use akri_testing::{ControlPlane, ControlPlaneOptions};
use kube::api::{Api, PostParams};
use serde_json::json;

const DEVICES: usize = 100;
const ROUNDS: usize = 200;
const BLOCKS: usize = 4;
/// Claims prepared, held and unprepared per contender while API requests are counted.
const CLAIMS_COUNTED: usize = 10;
const DRIVER: &str = "debugecho.akri.sh";

/// The kubelet-plugin's binary on `node` with `DEVICES` debugEcho devices, once published.
async fn agent(cp: &ControlPlane, node: &str) -> Result<Contender, Box<dyn std::error::Error>> {
    let client = cp.client().await?;
    let ns = cp.create_namespace("versus").await?;
    akri_testing::components::spawn_spec_mirror(&client, &ns);
    let dir = tempfile::Builder::new().prefix("versus-").tempdir()?.keep();
    let kubelet = [dir.join("registry"), dir.join("plugins"), dir.join("cdi")];
    let bin = match std::env::var_os("BENCH_AGENT_BIN") {
        Some(bin) => bin.into(),
        None if std::env::var_os("BENCH_TARGET").is_some() => {
            side_by_side::release_build(&["-p", "akri-kubelet-plugin"])?.join("akri-kubelet-plugin")
        }
        None => std::path::PathBuf::from(env!("CARGO_BIN_EXE_akri-kubelet-plugin")),
    };
    let bin = std::fs::canonicalize(&bin)?;
    let nodes = (node, ns.as_str());
    let child =
        akri_testing::components::agent_command(&bin, cp.kubeconfig(), nodes, kubelet, &dir)
            .env("RUST_LOG", "warn")
            .spawn()?;
    let descriptions: Vec<String> = (0..DEVICES).map(|i| format!("dev{i}")).collect();
    let discovery: akri_api::v1::DiscoveryConfiguration = serde_json::from_value(json!({
        "apiVersion": "akri.sh/v1", "kind": "DiscoveryConfiguration",
        "metadata": { "name": "versus" },
        "spec": { "discoveryHandler": { "name": "debugEcho", "discoveryDetails": format!("descriptions: [{}]", descriptions.join(", ")) } },
    }))?;
    Api::<akri_api::v1::DiscoveryConfiguration>::all(client)
        .create(&PostParams::default(), &discovery)
        .await?;
    let devices = published_devices(cp, DRIVER, DEVICES).await?;
    let socket = dir.join("plugins").join(DRIVER).join("dra.sock");
    Contender::new("agent", DRIVER, child, &socket, (cp, node), &devices).await
}

async fn bench() -> Result<(), Box<dyn std::error::Error>> {
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    cp.install_crds(&akri_api::crds::all()).await?;
    let node = "bench-node";
    cp.create_node(node).await?;
    // The like-for-like peer first, the base of the ratios: the example writing device
    // metadata files (KEP-5304), as the kubelet-plugin does for every claim.
    let mut contenders = vec![
        start(
            "examplemd",
            Peer::Example { metadata: true },
            (&cp, node),
            DEVICES,
        )
        .await?,
        start(
            "example",
            Peer::Example { metadata: false },
            (&cp, node),
            DEVICES,
        )
        .await?,
        start("go", Peer::Go { per_claim: false }, (&cp, node), DEVICES).await?,
        agent(&cp, node).await?,
    ];
    eprintln!(
        "NodePrepareResources side by side: per run {} calls each, {ROUNDS} rounds x {BLOCKS} blocks, rotated; {DEVICES} devices each",
        ROUNDS * BLOCKS
    );
    let runs = side_by_side::measure_runs(&mut contenders, (ROUNDS, BLOCKS)).await;
    side_by_side::print_spread(&runs);
    // The agent writes each claim's `status.devices` after dra-plugin's status window: a
    // claim held past it costs that write, which the blocks above (a claim unprepared
    // milliseconds after its prepare) never see.
    let requests = side_by_side::requests_per_claim(&cp, &mut contenders, CLAIMS_COUNTED).await?;
    side_by_side::print_requests(&contenders, &requests, CLAIMS_COUNTED);
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tokio::runtime::Runtime::new()?.block_on(bench())
}
