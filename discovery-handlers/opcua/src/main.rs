//! The OPC UA discovery handler as its own process (a DaemonSet), registering with the node
//! agent the way Akri's handlers do.

use akri_discovery_handler::standalone::HandlerArgs;
use akri_opcua::Opcua;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "akri-opcua-discovery-handler",
    version,
    about = "Akri's OPC UA discovery handler: servers found through discovery URLs and Local Discovery Servers"
)]
struct Args {
    #[command(flatten)]
    handler: HandlerArgs,
    /// Look for servers this often (seconds).
    #[arg(long, default_value_t = 10)]
    rescan_seconds: u64,
    /// The OPC UA client's certificate store (FindServers needs no certificate; the client
    /// keeps its trust lists here): a writable directory.
    #[arg(long, default_value = "/tmp/akri-opcua-pki")]
    pki_dir: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut opcua = Opcua {
        rescan: Duration::from_secs(args.rescan_seconds),
        ..Opcua::default()
    };
    opcua.finder.pki_dir = args.pki_dir;
    akri_opcua::run_process(opcua, args.handler)?;
    Ok(())
}
