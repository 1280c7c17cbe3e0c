//! The udev discovery handler as its own process (a DaemonSet mounting the host's `/sys`,
//! `/dev` and `/run/udev`), registering with the node agent the way Akri's handlers do.

use akri_discovery_handler::standalone::HandlerArgs;
use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "akri-udev-discovery-handler",
    version,
    about = "Akri's udev discovery handler: devices that udev rules select"
)]
struct Args {
    #[command(flatten)]
    handler: HandlerArgs,
    /// Where sysfs is mounted.
    #[arg(long, default_value = "/sys")]
    sysfs: PathBuf,
    /// udev's database (present where udevd runs; ENV{} and TAG keys read it).
    #[arg(long, default_value = "/run/udev/data")]
    udev_data: PathBuf,
    /// Rescan this often even without device events [default: 300 with events, 10 without].
    #[arg(long)]
    rescan_seconds: Option<u64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    akri_udev::run_process(
        akri_udev::sysfs::Sysfs::new(args.sysfs, args.udev_data),
        args.rescan_seconds.map(std::time::Duration::from_secs),
        args.handler,
    )?;
    Ok(())
}
