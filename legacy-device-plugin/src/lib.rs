//! Akri v0 `Configuration`s served as kubelet device plugins, for clusters without DRA.
//!
//! - [`slots`]: what each plugin advertises and which `deviceUsage` slots an allocation
//!   claims (pure; Akri's seeds 000 and 003).
//! - [`claims`]: writing slot claims to Instances with optimistic concurrency.
//! - [`plugins`]: the Instance- and Configuration-level plugins and the node's set of them.
//!
//! The node agent (`akri-kubelet-plugin`) runs discovery and writes the Instances; this
//! crate turns them into device plugins. The kubelet-facing machinery is `device-plugin`'s.

pub mod claims;
pub mod plugins;
pub mod slots;
