//! The CUDA backend's integration tests, one binary (one link), on the simulated driver and NCCL
//! and without a driver. Each test runs in a process of its own (the driver is opened once per
//! process, with the settings its variables give).

#[path = "../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod ccl_lacks;
mod ctx_release;
mod foreign_arch_library;
mod graph_replay_watchdog;
mod graph_simulated;
mod nccl_abort;
mod nccl_bounded;
mod nccl_drop;
mod nccl_simulated;
mod rccl_instance;
mod simulated;
mod stream_errors;
mod sync_race;
mod unavailable;
mod wrong_library;
