//! # A simulated NVIDIA stack: the CUDA driver (`libcuda.so`) and NCCL
//!
//! Test infrastructure, never a product path: the CUDA driver API subset that cudarc's safe API
//! (and so unihal's CUDA backend) calls ([`driver`]) and the NCCL subset of unihal's NCCL binding
//! ([`nccl`]), implemented on the simulator core (`unihal-sim`) over host memory. Built as one
//! shared object, `libunihal_sim_cuda.so` with the SONAME `libcuda.so` (so the system loader never
//! picks it up by the driver's name, yet cudarc's `libcuda.so` resolves to it once it is loaded by
//! path), to be loaded through the backend's library
//! overrides exactly like the real libraries: point the driver override *and* the NCCL override at
//! this one file (or link `libnccl.so.2` to it). They are one object because simulated NCCL
//! queues its collectives on the simulated driver's streams; the real NCCL reaches the driver
//! through the CUDA runtime instead.
//!
//! Devices are named "unihal simulated CUDA device N (not a GPU)" and report compute capability
//! 8.0, so nobody mistakes their results for a GPU's. Return codes are CUDA's `CUresult` values
//! ([`conv`]) and NCCL's `ncclResult_t` values ([`nccl_conv`]).
//!
//! * `UNIHAL_SIM_MODE`: `deferred` (default: work runs only at synchronisation points, so a
//!   missing cross-stream wait gives wrong results), `eager`, or `concurrent` (work runs as it is
//!   enqueued, each kernel on its own thread, so the host goes on while a kernel runs; devices
//!   are then named "... (not a GPU, concurrent)").
//! * `UNIHAL_SIM_DEVICES`: number of devices, 1 to 8 (default 2), each with its own primary
//!   context, streams and memory; ranks of a communicator must be on distinct devices, as NCCL
//!   requires.
//! * `UNIHAL_SIM_MEMORY`: capacity of each device in bytes (default 8 GiB).
//! * `UNIHAL_SIM_WATCHDOG_MS`: how long a synchronisation, or a communicator's initialisation,
//!   waits for peers that never come before failing (default 60000): real NCCL would hang.
//! * `UNIHAL_SIM_FAIL=name:n:code,...`: injected failures ([`fault`]): the `n`th call of entry
//!   point `name` returns `code` (any number, also one `cuda.h` does not list); tests arm them
//!   per thread with the exported `unihal_sim_fail`.
//! * `UNIHAL_SIM_NCCL_CALL_US`: how long every call on an NCCL communicator holds it (default 0),
//!   to widen the windows in which unserialised uses of one communicator overlap.
//!
//! Stricter than the real libraries where they leave misuse undefined: a driver or NCCL call
//! from inside a host function is refused (`CUDA_ERROR_NOT_PERMITTED`), and a use of an NCCL
//! communicator after `ncclCommAbort`/`ncclCommDestroy` (`ncclInvalidArgument`) or two threads
//! inside calls on one communicator at once are detected; each is recorded as a violation that
//! tests read with the exported `unihal_sim_violations` ([`fault`]).
//!
//! Contexts follow the driver: each device has one primary context; the calling thread's current
//! context selects the device for allocations, stream/event/module creation and NCCL's
//! `ncclCommInitRank`; stream, event, module and function handles carry their device's ordinal.
//! Modules must be PTX; each entry runs the host function of unihal's portable library (or of the
//! conformance test kernels) with that name. Copies from and to pageable host memory follow CUDA (host-to-device copies capture the
//! source when called, device-to-host copies return once the stream produced the data); the null
//! stream is CUDA's legacy default stream, implicitly ordered with streams created without
//! `CU_STREAM_NON_BLOCKING`; copies
//! from and to pinned host memory (`cuMemHostAlloc`) happen when the stream executes them, so a
//! host buffer reused before synchronising shows up as wrong data, and freeing pinned memory that
//! a queued copy still uses is refused (`CUDA_ERROR_INVALID_VALUE`) instead of racing. Every pair of
//! distinct devices can access each other (`cuDeviceCanAccessPeer` reports 1;
//! `cuCtxEnablePeerAccess` is tracked per direction with the driver's errors); `cuMemcpyPeerAsync`
//! copies between their memories in the stream's order only, and `cuStreamWaitEvent` accepts
//! another device's event (the core's two-device gates).

#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // every entry point follows its vendor API's contract

pub mod conv;
pub mod driver;

/// The built simulator (`libunihal_sim_cuda.so`) next to the running test executable.
///
/// # Panics
/// When it is not built there (see [`unihal_sim::built_library`]).
pub fn built_library() -> std::path::PathBuf {
    unihal_sim::built_library("libunihal_sim_cuda.so")
}
/// The C test controls (injected failures, violations), exported from this object.
pub use unihal_sim::fault_c as fault;
/// How backends learn that this runtime is simulated (`unihal_dynlib::SIMULATED_SYMBOL`).
pub use unihal_sim::gpu::unihal_simulated_runtime;
/// The NCCL faces of this library (the shared simulated NCCL API, exported from this object).
pub use unihal_sim_nccl::{api as nccl, conv as nccl_conv};

use conv::*;
use std::sync::{Arc, OnceLock};
use unihal_sim::gpu::GpuFace;
use unihal_sim::Device;

/// `cuDriverGetVersion`: CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;
pub use unihal_sim::gpu::MAX_DEVICES;
/// Primary context handles are `PRIMARY_CTX + ordinal`.
const PRIMARY_CTX: usize = 0x5100;

/// The simulated devices: the core's GPU face state (device table, current device, default
/// streams, pinned host table, peer access; shared with the NCCL face), with the CUDA driver's
/// handles and result codes.
pub(crate) struct Sim(&'static GpuFace);

impl std::ops::Deref for Sim {
    type Target = GpuFace;
    fn deref(&self) -> &GpuFace {
        self.0
    }
}

static SIM: OnceLock<Result<Sim, i32>> = OnceLock::new();

fn start() -> Result<Sim, i32> {
    unihal_sim::gpu::global().map(Sim).map_err(|e| {
        eprintln!("unihal-sim: {e}");
        code(&e)
    })
}

/// The simulator, once `cuInit` succeeded.
fn sim() -> Result<&'static Sim, i32> {
    match SIM.get() {
        Some(Ok(s)) => Ok(s),
        Some(Err(e)) => Err(*e),
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

impl Sim {
    /// The device with this ordinal.
    fn device(&self, ordinal: i32) -> Result<&Arc<Device>, i32> {
        self.0
            .device(ordinal as i64)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The ordinal of the calling thread's current context.
    fn current(&self) -> Result<usize, i32> {
        self.0.current().ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }
}

/// Runs entry point `name` ([`unihal_sim::gpu::ops::entry`] with CUDA's codes: a call from a
/// host function is `CUDA_ERROR_NOT_PERMITTED`, a panic `CUDA_ERROR_UNKNOWN`).
fn api(name: &str, f: impl FnOnce() -> Result<(), i32>) -> i32 {
    let codes = unihal_sim::gpu::ops::EntryCodes {
        not_permitted: CUDA_ERROR_NOT_PERMITTED,
        unknown: CUDA_ERROR_UNKNOWN,
    };
    unihal_sim::gpu::ops::entry(name, codes, f)
}

/// Writes `v` through an out-pointer (`CUDA_ERROR_INVALID_VALUE` for a null one).
///
/// # Safety
/// `p` is null (an error) or valid for a write of `T`.
unsafe fn out<T>(p: *mut T, v: T) -> Result<(), i32> {
    // SAFETY: the caller's contract.
    unsafe { unihal_sim::gpu::ops::out(p, v, CUDA_ERROR_INVALID_VALUE) }
}
