//! The CRDs of every kind in this crate, generated from the Rust types.
//!
//! `cargo run -p akri-api --bin crdgen` writes them into the Helm chart; a test fails when the
//! committed files differ from what the types generate.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Where the chart keeps the CRDs, relative to the repository root.
pub const CHART_CRD_DIR: &str = "charts/akri/crds";

/// Every CRD this project serves.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        crate::v0::Configuration::crd(),
        crate::v0::Instance::crd(),
        crate::v1::DiscoveryConfiguration::crd(),
        crate::v1::BrokerTemplate::crd(),
        crate::v1::PropertyFilter::crd(),
    ]
}

/// The file name a CRD is written to: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// The YAML written for a CRD, with a header that says where it comes from.
pub fn render(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    Ok(format!(
        "# Generated from the Rust types in api/ by `cargo run -p akri-api --bin crdgen`. Do not edit.\n{}",
        serde_yaml::to_string(crd)?
    ))
}
