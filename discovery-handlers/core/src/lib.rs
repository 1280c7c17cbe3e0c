//! What every discovery handler shares, so a handler is only its discovery: serving Akri's
//! `v0.DiscoveryHandler` on a Unix socket ([`serve`]), registering it with the node agent
//! ([`registration`]), parsing `discoveryDetails` with a message a person can act on
//! ([`details`]), and the thin binary around it ([`standalone`]).
//!
//! A handler implements [`Discover`]: check one configuration's details, then send complete
//! device lists to a [`DeviceLists`] until the agent goes away. The same handler is served
//! standalone (its own binary, registering like Akri's handlers do) or embedded in the
//! kubelet-plugin (served on a socket of the plugin's and registered through the same
//! registration socket), so both paths run the same code.

pub mod client;
pub mod details;
pub mod filter;
pub mod health;
pub mod registration;
pub mod serve;
pub mod standalone;

pub use akri_proto::discovery::v0 as proto;
pub use filter::FilterList;
pub use registration::{Endpoint, RegisteredHandler};
pub use serve::{DeviceLists, Discover, Served};
