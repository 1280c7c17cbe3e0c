//! What a DRA driver written in Rust needs to be a good peer of the real kubelet.
//!
//! This crate knows nothing about Akri: another Rust DRA driver can use it as it is (the
//! role Go drivers get from upstream's `kubeletplugin` helper).
//!
//! - [`registration`]: the plugin-registration socket the kubelet's plugin watcher finds.
//! - [`authority`]: serving gRPC on a Unix socket to the kubelet's plugin watcher, whose
//!   requests carry an `:authority` that Rust's HTTP/2 stack rejects.
//! - [`checkpoint`]: the prepared claims, on disk, so that a restarted plugin unprepares
//!   exactly what it prepared and prepares again with the same CDI ids.
//! - [`cdi`]: the CDI spec files through which the container runtime gets prepared devices.
//! - [`api_support`]: which optional DRA fields the API server keeps (asked, not guessed).
//! - [`device_status`]: a claim's `status.devices` entries of one driver, by server-side apply.

pub mod api_support;
pub mod authority;
pub mod cdi;
pub mod checkpoint;
pub mod device_status;
pub mod health;
pub mod plugin;
pub mod registration;
pub mod service;
pub mod slices;
pub mod vanished;
