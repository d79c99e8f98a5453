//! The simulated runtimes' core's integration tests, one binary (one link): collectives (in process
//! and across processes), the core's rules and the kernels. Each test runs in a process of its own
//! (the simulator's state is process-wide).

#[path = "../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

mod ccl;
mod ccl_processes;
mod core;
mod kernels;
mod nvrtc_library;
