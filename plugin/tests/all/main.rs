//! The plugin boundary's integration tests, one binary (one link): the exported boundary, host
//! nodes, hostile plugins, ownership and the loader's refusals. The suites through plugins have
//! binaries of their own (their own harness), as does the loom model.

#[path = "../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod export_boundary;
mod host_nodes;
mod hostile;
mod ownership;
mod refusals;
