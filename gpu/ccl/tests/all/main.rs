//! The NCCL-API collective engine's integration tests, one binary (one link). Each test runs in a
//! process of its own (a collective library is opened once per process).

#[path = "../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod engine;
mod missing;
mod never_unloaded;
mod real_nccl;
