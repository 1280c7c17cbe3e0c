//! Writes the CRD YAML of every akri.sh kind into the Helm chart.
//!
//! Usage: `cargo run -p akri-api --bin crdgen [-- <dir>]` (default: charts/akri/crds of the
//! repository).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(akri_api::crds::CHART_CRD_DIR)
        });
    std::fs::create_dir_all(&dir)?;
    for crd in akri_api::crds::all() {
        let path = dir.join(akri_api::crds::file_name(&crd));
        std::fs::write(&path, akri_api::crds::render(&crd)?)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}
