//! The CPU backend's integration tests, one binary (one link): collectives whose ranks leave early,
//! foreign ids, idle devices and reduce layouts. The loom model has a binary of its own.

#[path = "../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

mod ccl_early_leave;
mod foreign_id;
mod idle;
mod reduce_layouts;
