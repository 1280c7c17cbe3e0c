//! The udev discovery handler as its own process (a DaemonSet mounting the host's `/sys`,
//! `/dev` and `/run/udev`), registering with the node agent the way Akri's handlers do.

use akri_discovery_handler::standalone::{self, HandlerArgs};
use akri_udev::{NAME, SHARED, Udev};
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut udev = Udev::start();
    udev.sysfs = akri_udev::sysfs::Sysfs::new(args.sysfs, args.udev_data);
    if let Some(seconds) = args.rescan_seconds {
        udev.rescan = std::time::Duration::from_secs(seconds);
    }
    standalone::run(udev, NAME, SHARED, args.handler).await?;
    Ok(())
}
