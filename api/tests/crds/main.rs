//! The CRDs against a real API server and Akri's v0 objects, in one test binary (one link
//! step in CI): one module per concern.

mod crds_apiserver;
mod crds_fresh;
mod v0_crd;
mod v0_roundtrip;
