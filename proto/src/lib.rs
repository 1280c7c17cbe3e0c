//! Akri's discovery-handler protocol, generated from `protos/` at build time.
//!
//! Package, service names and field numbers are Akri's (`discovery-utils/proto/discovery.proto`),
//! so the peers are Akri's discovery handlers and agent. The kubelet's protocols live in the
//! `kubelet-proto` crate.

// Generated code is not ours to lint.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

/// Akri's discovery-handler protocol.
pub mod discovery {
    /// `v0.Registration` and `v0.DiscoveryHandler`.
    pub mod v0 {
        tonic::include_proto!("v0");
    }
}
