//! akri-migrate's tests in one binary (one link step in CI): the CLI, golden files, the API
//! server, and equivalence of migrated objects with what Akri's would run.

mod apiserver;
mod cli;
mod common;
mod equivalence;
mod golden;
