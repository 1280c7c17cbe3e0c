//! `akri-migrate`: see the crate documentation and `akri-migrate --help`.

use akri_migrate::{Destination, Options, Source, cluster, names::Rename};
use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

const EXAMPLES: &str = "\
Examples:
  # Migrate Configuration files; print the v1 objects
  akri-migrate configurations/

  # Everything in the cluster: one file per Configuration, a JSON report
  akri-migrate --from-cluster --all-namespaces --output-dir v1/ --report report.json

  # Let the API server check the result, then apply it
  akri-migrate --from-cluster -A --apply --dry-run=server
  akri-migrate --from-cluster -A --apply

  # Also move the Deployments that request akri.sh/... resources to DRA claims (in place)
  akri-migrate configurations/ deployments/ --rewrite-workloads

  # Two Configurations named `cams` in namespaces lab and prod: choose the names
  akri-migrate -A --from-cluster --rename lab/cams=lab-cams --rename prod/cams=cams

Exit status: 0 migrated; 1 errors (nothing written); 2 usage; 3 fields without a v1
equivalent (nothing written; --allow-lossy writes the rest).";

/// Moves Akri v0 Configurations to the akri.sh/v1 DRA API: each becomes a
/// DiscoveryConfiguration and, when it deploys brokers, a BrokerTemplate of Akri's shape.
/// Every v0 field is carried over or reported.
#[derive(Debug, Parser)]
#[command(version, about, after_help = EXAMPLES)]
struct Args {
    /// YAML or JSON files (several documents each), directories of them, or `-` for stdin:
    /// akri.sh/v0 Configurations and the workloads that request their devices.
    #[arg(
        required_unless_present = "from_cluster",
        conflicts_with = "from_cluster"
    )]
    inputs: Vec<PathBuf>,

    /// Read the Configurations and workloads from the cluster (kubeconfig as kubectl finds it).
    #[arg(long)]
    from_cluster: bool,

    /// With --from-cluster, the namespace to read (default: the kubeconfig's); for files,
    /// the namespace of objects that name none (default: `default`).
    #[arg(short, long)]
    namespace: Option<String>,

    /// With --from-cluster, read every namespace.
    #[arg(
        short = 'A',
        long,
        requires = "from_cluster",
        conflicts_with = "namespace"
    )]
    all_namespaces: bool,

    /// Write one file per Configuration (`<namespace>.<name>.yaml`) here instead of stdout.
    #[arg(short, long, conflicts_with = "apply")]
    output_dir: Option<PathBuf>,

    /// Apply the result with server-side apply (field manager --field-manager).
    #[arg(long)]
    apply: bool,

    /// With --apply: `server` to have the API server validate without storing anything.
    #[arg(long, value_parser = ["none", "server"], default_value = "none", requires = "apply")]
    dry_run: String,

    /// The field manager of --apply.
    #[arg(long, default_value = "akri-migrate")]
    field_manager: String,

    /// Write every finding (file, document, object, field, kind, reason) as JSON here.
    #[arg(long)]
    report: Option<PathBuf>,

    /// Write the result even though some v0 fields have no v1 equivalent (they are reported).
    #[arg(long)]
    allow_lossy: bool,

    /// Rewrite workload files in place: requests for akri.sh/<configuration> and
    /// akri.sh/<instance> become ResourceClaimTemplates the pods name.
    #[arg(long, conflicts_with = "from_cluster")]
    rewrite_workloads: bool,

    /// `<namespace>/<name>=<new name>`: the DiscoveryConfiguration name of a Configuration.
    #[arg(long = "rename", value_name = "NAMESPACE/NAME=NEW")]
    renames: Vec<Rename>,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let source = if args.from_cluster {
        match (&args.namespace, args.all_namespaces) {
            (_, true) => Source::Cluster(None),
            (Some(ns), false) => Source::Cluster(Some(ns.clone())),
            (None, false) => Source::ClusterDefaultNamespace,
        }
    } else {
        Source::Paths(args.inputs.clone())
    };
    let destination = match (&args.output_dir, args.apply) {
        (Some(dir), _) => Destination::Directory(dir.clone()),
        (None, true) => Destination::Apply(cluster::ApplyOptions {
            field_manager: args.field_manager.clone(),
            dry_run: args.dry_run == "server",
        }),
        (None, false) => Destination::Stdout,
    };
    let options = Options {
        source,
        destination,
        default_namespace: args.namespace.clone().unwrap_or_else(|| "default".into()),
        renames: args.renames.clone(),
        allow_lossy: args.allow_lossy,
        rewrite_workloads: args.rewrite_workloads,
    };
    let (report, outcome) = akri_migrate::run_process(&options, &mut std::io::stdout())?;
    for finding in &report.findings {
        eprintln!("{finding}");
    }
    if let Some(path) = &args.report {
        akri_migrate::output::write(path, &report.to_json())?;
    }
    match outcome {
        akri_migrate::Outcome::Failed => eprintln!(
            "akri-migrate: errors (above); nothing was written, or with --apply, the objects named were not applied"
        ),
        akri_migrate::Outcome::Lossy => eprintln!(
            "akri-migrate: some fields have no v1 equivalent (above, `lossy:`); nothing was written. --allow-lossy writes the rest"
        ),
        akri_migrate::Outcome::Migrated => {}
    }
    Ok(ExitCode::from(outcome.exit_code()))
}
