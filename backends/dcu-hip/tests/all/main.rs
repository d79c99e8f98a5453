//! The HIP backend's integration tests, one binary (one link), on the simulated runtime, AMD's real
//! runtime and hiprtc, and without a runtime. Each test runs in a process of its own (the runtime
//! is opened once per process, with the settings its variables give). The ABI check has a binary of
//! its own (feature abi-check).

#[path = "../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod blas_keep;
mod blas_without_compiler;
mod hiprtc;
mod simulated;
mod simulated_init_fails;
mod simulated_legacy;
mod unavailable;
