//! The `akri.sh` API.
//!
//! - [`v0`]: `Configuration` and `Instance`, schema-compatible with Akri v0.13, for the legacy
//!   device-plugin path and for migration.
//! - [`v1`]: `DiscoveryConfiguration`, `BrokerTemplate` and `PropertyFilter` for the DRA path.

pub mod crds;
pub mod v0;
pub mod v1;
pub mod workload;

/// The API group of every kind in this crate.
pub const GROUP: &str = "akri.sh";
