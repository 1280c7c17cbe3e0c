//! The library against real peers in one test binary (one link step in CI): the gRPC
//! service, a kubelet's registration and calls, slices and device status on a real API server.

/// The README's minimal driver, as `cargo run --example minimal` builds it: the library's
/// test driver.
#[allow(dead_code)]
#[path = "../../examples/minimal.rs"]
mod minimal;

mod allocation;
mod device_status_apiserver;
mod kubelet_plugin;
mod service_grpc;
mod slices_apiserver;
