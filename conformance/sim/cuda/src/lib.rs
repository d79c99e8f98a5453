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

/// The built simulator (`libunihal_sim_cuda.so`) next to the running test executable: cargo
/// builds a dev-dependency's cdylib into `target/<profile>/deps` (`cargo test`) or
/// `target/<profile>` (`cargo build`).
///
/// # Panics
/// When it is not built there (a test that needs it cannot run; the message says where).
pub fn built_library() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the executable's directory");
    [
        Some(deps.join("libunihal_sim_cuda.so")),
        deps.parent().map(|p| p.join("libunihal_sim_cuda.so")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.exists())
    .unwrap_or_else(|| {
        panic!(
            "the simulated driver (libunihal_sim_cuda.so) is not built next to {}",
            deps.display()
        )
    })
}
pub mod fault;
pub mod nccl;
pub mod nccl_conv;

use conv::*;
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use unihal_sim::{Device, Kernels, Limits, Mode, StreamId};

/// `cuDriverGetVersion`: CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;
/// The largest `UNIHAL_SIM_DEVICES`.
pub const MAX_DEVICES: usize = 8;
/// Primary context handles are `PRIMARY_CTX + ordinal`.
const PRIMARY_CTX: usize = 0x5100;

/// The simulated devices and what is shared between the faces.
struct Sim {
    devices: Vec<Arc<Device>>,
    /// The legacy default stream (the null stream) of each device.
    default_streams: Vec<StreamId>,
    watchdog: Duration,
    /// Pinned host allocations: address -> (length, layout, queued copies using it).
    pinned: Mutex<BTreeMap<u64, Pinned>>,
    /// `(device, peer)` pairs with peer access enabled (`cuCtxEnablePeerAccess`).
    peer_access: Mutex<std::collections::BTreeSet<(usize, usize)>>,
}

/// A pinned host allocation.
struct Pinned {
    len: u64,
    layout: std::alloc::Layout,
    /// Queued copies that read or write it (a free while any is queued is refused).
    in_use: Arc<std::sync::atomic::AtomicUsize>,
}

/// Marks a pinned allocation in use by one queued copy, until dropped (with the copy's work,
/// run or not).
struct PinnedUse(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for PinnedUse {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

static SIM: OnceLock<Result<Sim, i32>> = OnceLock::new();

thread_local! {
    /// The calling thread's current context (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn env_number(name: &str, default: u64) -> Result<u64, i32> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| CUDA_ERROR_INVALID_VALUE),
        Err(_) => Ok(default),
    }
}

fn start() -> Result<Sim, i32> {
    let mode = match std::env::var("UNIHAL_SIM_MODE").as_deref().map(str::trim) {
        Ok("eager") => Mode::Eager,
        Ok("concurrent") => Mode::Concurrent,
        Ok("deferred") | Err(_) => Mode::Deferred,
        Ok(_) => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let memory = env_number("UNIHAL_SIM_MEMORY", 8 << 30)?;
    let count = env_number("UNIHAL_SIM_DEVICES", 2)? as usize;
    if !(1..=MAX_DEVICES).contains(&count) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let watchdog = Duration::from_millis(env_number("UNIHAL_SIM_WATCHDOG_MS", 60_000)?);
    // The portable library and the conformance test kernels, by entry name.
    let tables = [
        unihal_kernels::cpu::host_symbols(),
        std::sync::Arc::new(unihal_kernels::testing::host_symbols()),
    ];
    let mut devices = Vec::with_capacity(count);
    let mut default_streams = Vec::with_capacity(count);
    for ordinal in 0..count {
        let mut kernels = Kernels::new();
        for table in &tables {
            for name in table.names() {
                if let Some(k) = table.get(name) {
                    kernels.insert(name.to_string(), k.func);
                }
            }
        }
        let dev = Device::with_kernels(memory, mode, kernels, Limits::default())
            .with_ordinal(ordinal as u32)
            .with_watchdog(watchdog);
        default_streams.push(dev.create_legacy_stream().map_err(|e| code(&e))?);
        devices.push(Arc::new(dev));
    }
    Ok(Sim {
        devices,
        default_streams,
        watchdog,
        pinned: Mutex::new(BTreeMap::new()),
        peer_access: Mutex::new(Default::default()),
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
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| self.devices.get(o))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    /// The ordinal of the calling thread's current context.
    fn current(&self) -> Result<usize, i32> {
        let ctx = CURRENT.get();
        ctx.checked_sub(PRIMARY_CTX)
            .filter(|&o| o < self.devices.len())
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// The current context's device.
    fn current_device(&self) -> Result<&Arc<Device>, i32> {
        Ok(&self.devices[self.current()?])
    }

    /// The device a handle (stream, event, module, function) belongs to.
    fn owner(&self, handle: u64) -> Result<&Arc<Device>, i32> {
        self.devices
            .get(Device::ordinal_of(handle) as usize)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// A stream handle's device and stream; the null stream is the current context's default.
    fn stream(&self, h: *mut c_void) -> Result<(&Arc<Device>, StreamId), i32> {
        if h.is_null() {
            let o = self.current()?;
            Ok((&self.devices[o], self.default_streams[o]))
        } else {
            Ok((self.owner(h as u64)?, StreamId(h as u64)))
        }
    }

    /// The device whose memory holds `addr` (else the current context's device, which then
    /// reports the address as unknown).
    fn memory_owner(&self, addr: u64) -> Result<&Arc<Device>, i32> {
        match self.devices.iter().find(|d| d.owns(addr)) {
            Some(d) => Ok(d),
            None => self.current_device(),
        }
    }

    /// A use of the pinned allocation holding `[addr, addr + len)`, if it is pinned.
    fn pinned_use(&self, addr: u64, len: u64) -> Option<PinnedUse> {
        let table = self.pinned.lock();
        let (_, p) = table
            .range(..=addr)
            .next_back()
            .filter(|(&start, p)| addr.saturating_add(len) <= start + p.len)?;
        p.in_use.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Some(PinnedUse(p.in_use.clone()))
    }
}

thread_local! {
    /// True while this thread runs a host function (`cuLaunchHostFunc`).
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

/// Refuses (and records as a violation) a call of `name` made from inside a host function: CUDA
/// forbids driver calls there (`CUDA_ERROR_NOT_PERMITTED`; here the device lock is also held).
fn outside_host_fn(name: &str) -> Result<(), i32> {
    if IN_HOST_FN.get() {
        fault::violation(format!("{name} called from inside a host function"));
        return Err(CUDA_ERROR_NOT_PERMITTED);
    }
    Ok(())
}

/// Runs entry point `name`: an injected failure ([`fault`]) returns its code instead; a call
/// from a host function is refused; panics never cross the C boundary.
fn api(name: &str, f: impl FnOnce() -> Result<(), i32>) -> i32 {
    if let Err(e) = outside_host_fn(name) {
        return e;
    }
    if let Some(code) = fault::injected(name) {
        return code;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Writes `v` through an out-pointer.
///
/// # Safety
/// `p` is null (an error) or valid for a write of `T`.
unsafe fn out<T>(p: *mut T, v: T) -> Result<(), i32> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null; the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}
