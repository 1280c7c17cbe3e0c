//! I/O plumbing shared by node components, free of DRA and of Akri: gRPC over Unix sockets
//! that the kubelet's clients can call ([`authority`]), and files replaced whole
//! ([`files`]). The DRA library, the device-plugin library, the discovery handlers and
//! `akri-migrate` use it; none of them depends on another for it.

pub mod authority;
pub mod files;
