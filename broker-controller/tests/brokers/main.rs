//! The broker-controller against a real control plane, in one test binary (one link step in
//! CI): one module per concern, one support module.

mod binary;
mod objects;
mod scheduled;
mod support;
