//! The simulated CANN stack's integration tests, one binary (one link), called in process: the
//! runtime, aclnn operators, HCCL, the SoC variants and the exported symbols. Each test runs in a
//! process of its own (the stack's state is process-wide). The ABI check has a binary of its own
//! (feature abi-check).

#[path = "../../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod aclnn;
mod concurrent;
mod finalize;
mod hccl;
mod hccl_mismatch;
mod ops;
mod runtime;
mod soc_910;
mod symbols;
