//! The ONVIF discovery handler as its own process (a DaemonSet on the host network, for
//! multicast), registering with the node agent the way Akri's handlers do.

use akri_discovery_handler::standalone::HandlerArgs;
use akri_onvif::Onvif;
use clap::Parser;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "akri-onvif-discovery-handler",
    version,
    about = "Akri's ONVIF discovery handler: IP cameras found by WS-Discovery"
)]
struct Args {
    #[command(flatten)]
    handler: HandlerArgs,
    /// Probe this often (seconds).
    #[arg(long, default_value_t = 10)]
    rescan_seconds: u64,
    /// Where probes go: WS-Discovery's multicast group.
    #[arg(long, default_value = akri_onvif::probe::MULTICAST)]
    probe_target: std::net::SocketAddr,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let onvif = Onvif {
        probe_target: args.probe_target,
        rescan: Duration::from_secs(args.rescan_seconds),
        ..Onvif::default()
    };
    akri_onvif::run_process(onvif, args.handler)?;
    Ok(())
}
