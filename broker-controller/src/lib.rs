//! The broker-controller: BrokerTemplates turn discovered devices into running workloads,
//! each bound to its device through a ResourceClaim the scheduler allocates.
//!
//! - [`render`]: one template object for one Instance (`$(AKRI_*)` values, names, the claim).
//! - [`desired`]: every object a template wants now.
//! - [`apply`]: server-side apply of those, deletion of the rest.
//! - [`controller`]: the reconciler and its watches, with status.
//! - [`metrics`]: Prometheus metrics.
//!
//! It reads Instances and never writes them (seed 004): allocation is the scheduler's.

pub mod apply;
pub mod controller;
pub mod desired;
pub mod metrics;
pub mod render;
