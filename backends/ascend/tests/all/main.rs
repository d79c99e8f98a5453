//! The Ascend backend's integration tests, one binary (one link), on the simulated CANN stack and
//! without one. Each test runs in a process of its own (the runtime is opened once per process,
//! with the settings its variables give). The ABI check has a binary of its own (feature
//! abi-check).

#[path = "../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod hccl;
mod hccl_async;
mod hccl_failures;
mod hccl_split;
mod split_layout;
mod unavailable;
