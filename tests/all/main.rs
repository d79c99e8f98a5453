//! The root package's integration tests, one binary (one link): the `unihal` binary's commands, the
//! benchmark's formats, settings, the bootstrap, dead ranks, the captured training step, the MLP on
//! every backend and stress. Tests with process-wide state (a simulated runtime's settings) each
//! run in a process of their own. The fault sweeps (which the sanitized build compiles alone) and
//! the MPI and gloo tests (features) have binaries of their own.

#[path = "../support/isolation.rs"]
mod isolation;
use isolation::own_process;

// Shared by several modules.
#[path = "../support/mlp.rs"]
#[allow(dead_code)] // each backend's MLP test uses what it needs
mod mlp;
#[path = "../support/simulated.rs"]
#[allow(dead_code)] // quiesce is the fault sweeps'
mod simulated;

mod bench_format;
mod bootstrap;
mod cli;
mod dead_rank;
mod graph_step;
mod mlp_ascend;
mod mlp_ascend_910a;
mod mlp_training;
mod open_preferred;
mod settings;
mod stress;
