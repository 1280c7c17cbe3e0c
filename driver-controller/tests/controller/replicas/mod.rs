//! Two replicas of the driver-controller against a real control plane: one acts, the other
//! waits and takes over when the first dies; objects are garbage-collected with their
//! configuration; status and the HTTP endpoints say what is going on.

use crate::support;

mod common;
mod leader;
mod status;
mod stores;
