//! Kubelet device plugins (`deviceplugin/v1beta1`) in Rust. Knows nothing about Akri.
//!
//! - [`plugin`]: the [`DevicePlugin`] trait, what a plugin decides (its devices, allocation).
//! - [`server`]: [`ServedPlugin`], the kubelet-facing side: the plugin's socket, registration
//!   with the kubelet, and registering again after the kubelet restarts.
//! - [`pod_resources`]: the kubelet's pod-resources API, to learn which devices running
//!   containers hold.
//!
//! The Unix-socket plumbing is `node_io::authority`'s, shared with the DRA side.

pub mod plugin;
pub mod pod_resources;
pub mod server;

pub use plugin::DevicePlugin;
pub use server::{PluginConfig, ServedPlugin};
