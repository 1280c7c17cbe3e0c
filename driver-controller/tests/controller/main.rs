//! The driver-controller against real control planes, in one test binary (one link step in
//! CI): allocation through the real scheduler, and several replicas (leader election, status,
//! stores); the device inventory read from what they made.

mod allocation;
mod binding;
mod handlers;
mod inventory;
mod replicas;
mod spec_mirror;
mod support;
