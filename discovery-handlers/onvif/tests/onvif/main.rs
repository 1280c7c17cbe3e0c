//! The ONVIF handler's tests in one binary (one link step in CI): its binary, and real
//! cameras (protocol peers) through the node agent.

mod binary;
mod real_cameras;
