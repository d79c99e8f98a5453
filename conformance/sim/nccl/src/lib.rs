//! # The simulated NCCL API, for every GPU face
//!
//! Test infrastructure, never a product path. NCCL and RCCL export one C API (`nccl*`; RCCL
//! spells all-to-all `ncclAllToAll`, NVIDIA `ncclAlltoAll`: both are exported). This crate
//! implements it once on the simulator core: its communicators are `unihal_sim::ccl` cliques
//! whose collectives queue on the streams of the process's GPU face
//! (`unihal_sim::gpu::global`), the same devices and streams the runtime face (the CUDA driver
//! today, the HIP runtime next) hands out. A face's shared object links this crate, and its
//! `#[no_mangle]` entry points are exported from that object: one library then serves as the
//! runtime and as its collective library, loaded through both overrides.
//!
//! * [`api`]: the entry points (version, unique ids, init, collectives, point-to-point, groups,
//!   asynchronous errors, abort, destroy, split), with injected failures and recorded
//!   violations from the core (`unihal_sim::fault`).
//! * [`conv`]: result codes (NCCL 2.30.7's numbering; RCCL's is the same up to
//!   `ncclInProgress = 7`), data types and reductions.

#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // every entry point follows NCCL's contract

pub mod api;
pub mod conv;
