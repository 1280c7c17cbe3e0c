//! A library for DRA kubelet plugins written in Rust: what Go drivers get from upstream's
//! `k8s.io/dynamic-resource-allocation/kubeletplugin` helper, and what it takes to be a good
//! peer of the real kubelet.
//!
//! A driver implements [`Driver`] (prepare one checked claim, unprepare one) and starts it
//! with [`Plugin::builder`]; the library does the rest. See the README for a walk-through
//! and `examples/minimal.rs` for a complete driver.
//!
//! What a driver uses:
//! - [`builder`]: the entry point, [`Plugin::builder`], and [`Plugin`], what a started plugin
//!   offers (publishing devices, [`Plugin::publish_pools`] for several pools, health).
//! - [`Driver`], [`Claim`], [`Prepared`]: the trait a driver implements, the checked claim it
//!   is given, what it answers; [`BackgroundError`]: what goes wrong off the kubelet's path.
//! - [`cdi`]: the CDI spec files through which the container runtime gets prepared devices.
//! - [`metadata`]: device metadata, a file per request that containers read (KEP-5304).
//!
//! Lower level, for a plugin that assembles the pieces itself (this project's node agent
//! does; a driver on the builder need not look further):
//! - [`service`]: the `v1` and `v1beta1` DRA gRPC services over one [`Driver`].
//! - [`claim`]: each claim read from the API server and checked (UID, allocation, node,
//!   driver) before the driver sees it.
//! - [`checkpoint`]: the prepared claims, on disk, so that a restarted plugin unprepares
//!   exactly what it prepared and prepares again with the same CDI ids.
//! - [`slices`]: publishing pools of devices as ResourceSlices, generation by generation.
//! - [`health`]: the device health stream the kubelet reads.
//! - [`registration`], [`plugin`], [`authority`]: the sockets the kubelet finds and calls.
//! - [`vanished`]: keeping a device that disappeared published (tainted) while claims hold it.
//! - [`api_support`]: which optional DRA fields the API server keeps (asked, not guessed).
//! - [`device_status`]: a claim's `status.devices` entries of one driver, by server-side apply.

#![warn(missing_docs)]

pub mod api_support;
pub mod background;
pub use node_io::authority;
pub mod builder;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
pub mod device_status;
pub mod health;
pub mod metadata;
mod node_pools;
pub mod plugin;
pub mod registration;
pub mod service;
pub mod slices;
pub mod vanished;

pub use background::BackgroundError;
pub use builder::{Builder, KUBELET_DIR, Plugin};
pub use checkpoint::{PreparedClaim, PreparedDevice};
pub use claim::{Claim, ClaimError, ClaimRef, Prepared};
pub use node_pools::Repairs;
pub use service::{ClaimFailure, Driver};
