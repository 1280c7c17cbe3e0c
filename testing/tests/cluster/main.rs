//! The harness and the installed product in one test binary (one link step in CI): control
//! planes starting, the network, a real node, and the Helm chart.

mod akri_move;
mod chart;
mod legacy_only;
mod monitoring;
mod network;
mod reachability;
mod real_node;
mod startup;
mod uninstall;
mod upgrade;
