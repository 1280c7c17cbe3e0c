//! The debugEcho discovery handler as its own process, registering with the node agent the
//! way Akri's handlers do.

use akri_debug_echo::{DEFAULT_AVAILABILITY_FILE, DEFAULT_POLL_INTERVAL, Discovery};
use akri_discovery_handler::standalone::HandlerArgs;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "akri-debug-echo-discovery-handler",
    version,
    about = "Akri's debugEcho discovery handler: devices without hardware"
)]
struct Args {
    #[command(flatten)]
    handler: HandlerArgs,
    /// The availability file ("OFFLINE" hides every device; otherwise one offline
    /// description per line).
    #[arg(long, default_value = DEFAULT_AVAILABILITY_FILE)]
    availability_file: PathBuf,
    /// Register as shared: a description seen from several nodes is one device (Akri's
    /// environment variable, so its DaemonSet's settings carry over).
    #[arg(long, env = "DEBUG_ECHO_INSTANCES_SHARED", num_args = 0..=1, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set)]
    shared: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let discovery = Discovery {
        availability_file: args.availability_file,
        poll_interval: DEFAULT_POLL_INTERVAL,
    };
    akri_debug_echo::run_process(discovery, args.shared, args.handler)?;
    Ok(())
}
