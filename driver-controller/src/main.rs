//! Cluster-wide DRA controller: DeviceClasses, shared-device ResourceSlices, PropertyFilter compilation.
//!
//! This binary is a skeleton: its behaviour is tracked by its own issue. It parses its
//! flags so that packaging (chart, CI) can already invoke it.

use clap::Parser;

/// Cluster-wide DRA controller: DeviceClasses, shared-device ResourceSlices, PropertyFilter compilation.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {}

fn main() -> anyhow::Result<()> {
    let _args = Args::parse();
    anyhow::bail!("not implemented yet: see the project's issues for this component")
}
