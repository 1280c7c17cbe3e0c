//! The udev handler's tests in one binary (one link step in CI): its binary, real devices,
//! and the node agent discovering them.

mod agent;
mod binary;
mod real_devices;
