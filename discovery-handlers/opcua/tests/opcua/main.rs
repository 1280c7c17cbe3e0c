//! The OPC UA handler's tests in one binary (one link step in CI): real servers (protocol
//! peers), and the node agent discovering them.

mod agent;
mod real_servers;
