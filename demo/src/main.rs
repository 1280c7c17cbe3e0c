//! akri-demo: the whole flow on this machine (`hack/demo.sh` builds what is missing and runs
//! it). A local control plane, two nodes (real, containerd + kubelet, where this machine can
//! run them; else simulated, the kubelet's own DRA code), each with the real kubelet-plugin
//! binary discovering debugEcho devices, the real driver-controller, then the examples in
//! `examples/debug-echo/` applied with kubectl, and what each component did printed, down to
//! what the pod's container prints. The cluster stays up until Ctrl-C; `--check` exits instead, non-zero when
//! what it saw is wrong.

#![allow(clippy::print_stdout)]

mod chart;
mod cluster;
mod docs;
mod flow;
mod lifecycle;
mod progress;
mod report;

use clap::Parser;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Check what the demo shows and exit (non-zero when it is wrong) instead of leaving the
    /// cluster running.
    #[arg(long)]
    check: bool,
    /// Simulated nodes (the kubelet's DRA code only, no containers) even where real ones
    /// (containerd + kubelet, root, `hack/node-bins.sh`) can run.
    #[arg(long, conflicts_with = "real_nodes")]
    simulated_nodes: bool,
    /// Real nodes or none: fail when this machine cannot run them, and with `--check` unless
    /// the container itself printed its device (`hack/test.sh` asks for this; it runs as root).
    #[arg(long)]
    real_nodes: bool,
    /// Where akri-kubelet-plugin and akri-driver-controller are; default: beside this binary.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .expect("a binary lives in a directory")
            .to_path_buf(),
    };
    let binaries = cluster::Binaries::beside(&bin_dir)?;

    let node_kind = if args.real_nodes {
        cluster::NodeKind::Real
    } else if args.simulated_nodes {
        cluster::NodeKind::Simulated
    } else {
        cluster::NodeKind::RealWherePossible
    };

    println!("Starting (Ctrl-C stops and removes everything):");
    // Ctrl-C while starting drops what has started so far, and with it the cluster's
    // directory, as Ctrl-C does later.
    let cluster = tokio::select! {
        cluster = cluster::Cluster::start(&binaries, node_kind) => cluster?,
        _ = tokio::signal::ctrl_c() => return stopping(),
    };
    println!("Applying the debugEcho examples:");
    let report = tokio::select! {
        report = flow::run(&cluster) => report?,
        _ = tokio::signal::ctrl_c() => return stopping(),
    };
    report.print();
    let documented = docs::commands()?;
    let doc_run = docs::run(&cluster, documented, &binaries.kubectl_akri);
    println!(
        "\nThe docs' kubectl commands: {} ran against this cluster, {} failed{}",
        doc_run.ran,
        doc_run.failed.len(),
        if doc_run.skipped > 0 {
            format!(
                ", {} not run (they need containers; simulated nodes have none)",
                doc_run.skipped
            )
        } else {
            String::new()
        }
    );
    for (command, why) in &doc_run.failed {
        println!(
            "  {}:{}: {}\n    {why}",
            command.file, command.line, command.command
        );
    }

    if args.check {
        let mut problems = report.problems();
        if args.real_nodes && !report.container {
            problems.push("real nodes were asked for, but no container printed its device".into());
        }
        // The README shows a sample of this output on real nodes: each of its lines must be
        // printed (simulated nodes print the CDI edits instead of the container's output).
        if cluster.real {
            let sample = docs::readme_sample()?;
            for line in docs::missing_from(&sample, &report.render()) {
                problems.push(format!(
                    "README.md's \"Run it\" sample shows a line this run did not print: {line:?}"
                ));
            }
        }
        // The user guide shows what its `kubectl akri devices` prints on this cluster.
        let heading = "Device inventory: `kubectl akri devices`";
        let inventory = doc_run.printed("kubectl akri devices").unwrap_or_default();
        for line in docs::missing_from(&docs::sample("docs/user-guide.md", heading)?, inventory) {
            problems.push(format!(
                "docs/user-guide.md's \"{heading}\" shows a line `kubectl akri devices` did not print here: {line:?}\n{inventory}"
            ));
        }
        if doc_run.ran == 0 {
            problems.push("no documented kubectl command was found to run".to_string());
        }
        if !doc_run.failed.is_empty() {
            problems.push(format!(
                "{} documented kubectl commands failed",
                doc_run.failed.len()
            ));
        }
        // What users do next with what they installed: upgrade it, then remove it.
        if let Some(images) = &cluster.images
            && problems.is_empty()
        {
            println!("\nUpgrading, then uninstalling as docs/operations.md says:");
            let upgraded = lifecycle::upgrade(&cluster, images).await;
            problems.extend(upgraded.map_err(|e| e.context(cluster.diagnostics()))?);
            let uninstalled = lifecycle::uninstall(&cluster).await;
            problems.extend(uninstalled.map_err(|e| e.context(cluster.diagnostics()))?);
        }
        if problems.is_empty() {
            println!("\ncheck: everything above is as the examples should make it");
            return Ok(());
        }
        for problem in &problems {
            println!("check failed: {problem}");
        }
        print_logs(&cluster.logs);
        anyhow::bail!("{} of the demo's checks failed", problems.len());
    }

    println!(
        "\nThe cluster keeps running. In another shell:\n  export KUBECONFIG={}\n  {kubectl} get akridc,akrii,resourceslices -A{}\nLogs: {}\nCtrl-C stops it.",
        cluster.cp.kubeconfig().display(),
        if cluster.real {
            format!("\n  {} logs lobby-broker", cluster.kubectl.display())
        } else {
            String::new()
        },
        cluster.logs.display(),
        kubectl = cluster.kubectl.display(),
    );
    tokio::signal::ctrl_c().await?;
    stopping()
}

fn stopping() -> anyhow::Result<()> {
    println!("stopping");
    Ok(())
}

/// The end of each component's log (they go with the cluster's directory).
fn print_logs(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        println!("--- {} (last 20 lines)", entry.path().display());
        for line in &lines[lines.len().saturating_sub(20)..] {
            println!("{line}");
        }
    }
}
