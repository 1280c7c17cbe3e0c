//! Per-node DRA kubelet plugin: discovery, Instances, node-local ResourceSlices, prepare/unprepare with CDI.
//!
//! This binary is a skeleton: its behaviour is tracked by its own issue. It parses its
//! flags so that packaging (chart, CI) can already invoke it.

use clap::Parser;

/// Per-node DRA kubelet plugin: discovery, Instances, node-local ResourceSlices, prepare/unprepare with CDI.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {}

fn main() -> anyhow::Result<()> {
    let _args = Args::parse();
    anyhow::bail!("not implemented yet: see the project's issues for this component")
}
