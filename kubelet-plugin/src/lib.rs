//! The per-node Akri DRA kubelet plugin; `main.rs` is the thin binary around this library.

pub mod discovery;

pub mod agent;
pub mod driver;
pub mod instances;
pub mod node_devices;
pub mod properties;
pub mod state_lock;
