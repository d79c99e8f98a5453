//! Helpers of the simulated-NCCL tests: device setup, buffers, and ranks as threads.
#![allow(dead_code)]

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::Once;
use unihal_sim_cuda::driver::*;
use unihal_sim_cuda::nccl::*;
use unihal_sim_cuda::nccl_conv::*;

pub const F32: i32 = 7;
pub const I32: i32 = 2;
pub const SUM: i32 = 0;
pub const AVG: i32 = 4;

/// Serialises the tests of one binary: they share the simulated devices and their null
/// streams, and two communicators' collectives queued in different orders on shared streams
/// deadlock (as they would with NCCL).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Two devices, and a watchdog short enough for the timeout test yet long enough for peers
/// that are merely slow on a loaded 2-core machine.
pub fn init() {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        std::env::set_var("UNIHAL_SIM_DEVICES", "2");
        std::env::set_var("UNIHAL_SIM_WATCHDOG_MS", "3000");
    });
    assert_eq!(cuInit(0), 0);
}

pub fn set_device(d: i32) {
    let mut ctx = null_mut();
    // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
    unsafe { assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, d), 0) };
    assert_eq!(cuCtxSetCurrent(ctx), 0);
}

pub fn ok(r: i32) {
    assert_eq!(r, NCCL_SUCCESS, "ncclResult {r}: {}", last());
}

pub fn last() -> String {
    // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
    unsafe { CStr::from_ptr(ncclGetLastError(null_mut())) }
        .to_string_lossy()
        .into_owned()
}

pub fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
    unsafe { ok(ncclGetUniqueId(&mut id)) };
    id
}

/// A device buffer on the current device holding `data`.
pub fn upload<T: Copy>(data: &[T]) -> u64 {
    let bytes = std::mem::size_of_val(data);
    let mut p = 0u64;
    // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
    unsafe {
        assert_eq!(cuMemAlloc_v2(&mut p, bytes.max(1)), 0);
        assert_eq!(
            cuMemcpyHtoDAsync_v2(p, data.as_ptr() as *const c_void, bytes, null_mut()),
            0
        );
    }
    p
}

pub fn download<T: Copy + Default>(p: u64, n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    let bytes = std::mem::size_of_val(&v[..]);
    // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
    unsafe {
        assert_eq!(
            cuMemcpyDtoHAsync_v2(v.as_mut_ptr() as *mut c_void, p, bytes, null_mut()),
            0
        )
    };
    v
}

/// Runs `f(rank, comm)` on one thread per rank, each with its device current and its rank of
/// a fresh communicator, which is destroyed afterwards.
pub fn on_ranks<R: Send + 'static>(
    n: i32,
    f: impl Fn(i32, *mut c_void) -> R + Send + Sync + Copy + 'static,
) -> Vec<R> {
    ranks_then(n, true, f)
}

/// As [`on_ranks`]; `destroy: false` leaves the communicator to `f` (which aborts it).
pub fn ranks_then<R: Send + 'static>(
    n: i32,
    destroy: bool,
    f: impl Fn(i32, *mut c_void) -> R + Send + Sync + Copy + 'static,
) -> Vec<R> {
    init();
    let id = unique_id();
    let threads: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                set_device(r);
                let mut comm = null_mut();
                // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
                unsafe { ok(ncclCommInitRank(&mut comm, n, id, r)) };
                let out = f(r, comm);
                if destroy {
                    ok(ncclCommDestroy(comm));
                }
                out
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}
