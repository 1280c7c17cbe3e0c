//! `kubectl akri devices`: the device inventory ([`akri_inventory`]), as a kubectl plugin (on
//! PATH as `kubectl-akri`), with the user's kubeconfig and its own rights.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kubectl-akri",
    bin_name = "kubectl akri",
    version,
    about = "Akri's devices, for people"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every device (Instance) with its configuration, nodes, state, and the claims and pods
    /// that hold it.
    Devices {
        /// Where the Instances are: the chart's release namespace.
        #[arg(long, short = 'n', default_value = "akri")]
        namespace: String,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Devices { namespace } => {
            let client = kube::Client::try_default().await?;
            let snapshot = akri_inventory::read(&client, &namespace).await?;
            let table = akri_inventory::table(&akri_inventory::rows(&snapshot));
            std::io::Write::write_all(&mut std::io::stdout(), table.as_bytes())?;
        }
    }
    Ok(())
}
