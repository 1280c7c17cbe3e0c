//! Device discovery through Akri's discovery-handler protocol (`v0.Registration`,
//! `v0.DiscoveryHandler`), so Akri's handlers, and users' own, plug in unchanged.
//!
//! - [`registry`]: the registration socket handlers call, the registered set (persisted, so
//!   that a plugin restart keeps them: Akri loses them, its issue #558), and a watch of it.
//! - [`stream`]: one `Discover` call per (handler, configuration), reconnecting with backoff,
//!   yielding validated device lists or errors to surface in the configuration's status.
//! - [`debug_echo`]: the embedded `debugEcho` handler, compatible with Akri's, so the whole
//!   path runs without hardware.
//! - [`device`], [`handler`]: the plain Rust types the rest of the plugin works with.
//! - [`connect`], [`state_file`], [`backoff`]: the client side of the sockets, the registry's
//!   file, the retry schedule.

pub mod access;
pub mod backoff;
/// The embedded debugEcho handler: the same crate as its own binary.
pub use akri_debug_echo as debug_echo;
/// How handlers register: the same module they register with.
pub use akri_discovery_handler::registration as handler;
pub mod connect;
pub mod device;
pub mod registry;
pub mod state_file;
pub mod stream;

pub use access::{Access, HostDev};
pub use device::{DeviceSpec, DiscoveredDevice, InvalidDevices, Mount};
pub use handler::{Endpoint, RegisteredHandler};
pub use registry::{Handlers, Registry};
pub use stream::{DiscoveryEvent, DiscoveryRequest, DiscoveryStream, StreamConfig, StreamError};
