//! The node agent's tests in one binary (one link step in CI), one module per concern:
//! discovery (registry, streams, the embedded handler), DRA end to end with the kubelet's own
//! managers, restarts and outages, Instances, the legacy device plugins, the real node
//! (containerd + kubelet).

mod discovery_debug_echo;
mod discovery_registry;
mod discovery_stream;
mod dra_e2e;
mod dra_restarts;
mod embedded;
mod instances;
mod legacy;
mod real_node;
