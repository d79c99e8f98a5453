//! Kernels used by the conformance suite's raw-launch, ordering and asynchrony cases.
//!
//! Every kernel has a stable entry name ([`names`]) and a parameter list that is the same in every
//! module format, so a case is written once. [`module_for`] returns the module in the first format
//! a device accepts for which this crate has an implementation: the host symbol table (the CPU
//! backend) or PTX (NVIDIA GPUs, and the simulated CUDA driver, which runs the host kernels of the
//! same names). The PTX is NVRTC's output for `device/uh_testing.cu`, committed so that no compiler
//! is needed to run the suite; a CI gate (`tests/all/rtc_gates.rs`) keeps it in step with the
//! source.
//!
//! Host kernels run one block per call (see [`unihal_hal::HostLaunchCtx`]) and loop over the
//! block's threads themselves. They read parameters through CUDA's `kernelParams` convention.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{HostKernel, HostLaunchCtx, HostSymbolTable, ModuleFormat, ModuleSource};

/// Entry names, identical in every module format.
pub mod names {
    /// `(out: *mut u32, n: u32)`: `out[g] = g` for every global thread index `g < n` (x only).
    pub const IOTA_U32: &str = "unihal_test_iota_u32";
    /// `(out: *mut u32)`: every thread of a 3-D launch writes `global_linear + 1` at
    /// `out[global_linear]`, where `global_linear` enumerates (thread x, y, z, block x, y, z) with
    /// thread x fastest.
    pub const COORDS: &str = "unihal_test_coords";
    /// `(n: u32, a: f32, x: *const f32, y: *mut f32)`: `y[i] = a * x[i] + y[i]`.
    pub const AXPY_F32: &str = "unihal_test_axpy_f32";
    /// `(out: *mut u8, a: u8, b: u16, c: u32, d: u64, e: f32, f: f64, s: Pair)`: writes the values
    /// packed little-endian (1+2+4+8+4+8+8 = 35 bytes) to `out`, from thread 0 of block 0.
    pub const ARGS_PROBE: &str = "unihal_test_args_probe";
    /// `(buf: *mut u32, n: u32, mul: u32, add: u32)`: `buf[i] = buf[i] * mul + add` (wrapping).
    pub const MUL_ADD_U32: &str = "unihal_test_mul_add_u32";
    /// `(flag: *const u32, out: *mut u32, value: u32, timeout_ms: u32)`: writes 1 to `*out` when it
    /// starts (so the host can see it is running), waits until `*flag != 0`, then writes `value` to
    /// `*out`. Fails with status 2 after `timeout_ms`.
    pub const WAIT_FLAG: &str = "unihal_test_wait_flag";
    /// `(status: i32)`: returns `status` (a non-zero status is a kernel fault).
    pub const FAIL: &str = "unihal_test_fail";
    /// `(x: *const u32, out: *mut u32)`: block `b` sums `x[b*B .. (b+1)*B]` through dynamic shared
    /// memory of `B * 4` bytes (`B` = block x) and writes the sum to `out[b]`.
    pub const BLOCK_SUM_U32: &str = "unihal_test_block_sum_u32";
    /// Every name.
    pub const ALL: [&str; 8] = [
        IOTA_U32,
        COORDS,
        AXPY_F32,
        ARGS_PROBE,
        MUL_ADD_U32,
        WAIT_FLAG,
        FAIL,
        BLOCK_SUM_U32,
    ];
}

/// The struct parameter of [`names::ARGS_PROBE`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair {
    pub a: u32,
    pub b: f32,
}

/// Reads parameter `i` as a `T`.
///
/// # Safety
/// `params` must hold at least `i + 1` pointers, the `i`-th pointing at a valid `T`.
unsafe fn param<T: Copy>(params: *const *mut c_void, i: usize) -> T {
    ((*params.add(i)) as *const T).read_unaligned()
}

/// Threads per block and this block's linear index.
fn block_shape(ctx: &HostLaunchCtx) -> (u64, u64) {
    let threads = ctx.block.iter().map(|&d| d as u64).product();
    let [gx, gy, _] = ctx.grid.map(|d| d as u64);
    let [bx, by, bz] = ctx.block_idx.map(|d| d as u64);
    (threads, bx + gx * (by + gy * bz))
}

unsafe extern "C" fn iota_u32(ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    let ctx = &*ctx;
    let out: u64 = param(p, 0);
    let n: u32 = param(p, 1);
    let base = ctx.block_idx[0] as u64 * ctx.block[0] as u64;
    for t in 0..ctx.block[0] as u64 {
        let g = base + t;
        if g < n as u64 {
            (out as *mut u32).add(g as usize).write(g as u32);
        }
    }
    0
}

unsafe extern "C" fn coords(ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    let ctx = &*ctx;
    let out: u64 = param(p, 0);
    let (threads, block_linear) = block_shape(ctx);
    for t in 0..threads {
        let g = block_linear * threads + t;
        (out as *mut u32).add(g as usize).write(g as u32 + 1);
    }
    0
}

unsafe extern "C" fn axpy_f32(ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    let ctx = &*ctx;
    let n: u32 = param(p, 0);
    let a: f32 = param(p, 1);
    let x = param::<u64>(p, 2) as *const f32;
    let y = param::<u64>(p, 3) as *mut f32;
    let base = ctx.block_idx[0] as u64 * ctx.block[0] as u64;
    for t in 0..ctx.block[0] as u64 {
        let i = (base + t) as usize;
        if i < n as usize {
            y.add(i).write(a * x.add(i).read() + y.add(i).read());
        }
    }
    0
}

unsafe extern "C" fn args_probe(ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    let ctx = &*ctx;
    if ctx.block_idx != [0, 0, 0] {
        return 0;
    }
    let out = param::<u64>(p, 0) as *mut u8;
    let mut bytes = Vec::with_capacity(35);
    bytes.extend_from_slice(&param::<u8>(p, 1).to_le_bytes());
    bytes.extend_from_slice(&param::<u16>(p, 2).to_le_bytes());
    bytes.extend_from_slice(&param::<u32>(p, 3).to_le_bytes());
    bytes.extend_from_slice(&param::<u64>(p, 4).to_le_bytes());
    bytes.extend_from_slice(&param::<f32>(p, 5).to_le_bytes());
    bytes.extend_from_slice(&param::<f64>(p, 6).to_le_bytes());
    let s: Pair = param(p, 7);
    bytes.extend_from_slice(&s.a.to_le_bytes());
    bytes.extend_from_slice(&s.b.to_le_bytes());
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len());
    0
}

unsafe extern "C" fn mul_add_u32(ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    let ctx = &*ctx;
    let buf = param::<u64>(p, 0) as *mut u32;
    let n: u32 = param(p, 1);
    let mul: u32 = param(p, 2);
    let add: u32 = param(p, 3);
    let base = ctx.block_idx[0] as u64 * ctx.block[0] as u64;
    for t in 0..ctx.block[0] as u64 {
        let i = (base + t) as usize;
        if i < n as usize {
            let v = buf.add(i).read();
            buf.add(i).write(v.wrapping_mul(mul).wrapping_add(add));
        }
    }
    0
}

unsafe extern "C" fn wait_flag(ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    let ctx = &*ctx;
    if ctx.block_idx != [0, 0, 0] {
        return 0;
    }
    let flag = &*(param::<u64>(p, 0) as *const AtomicU32);
    let out = &*(param::<u64>(p, 1) as *const AtomicU32);
    out.store(1, Ordering::Release);
    let value: u32 = param(p, 2);
    let timeout = Duration::from_millis(param::<u32>(p, 3) as u64);
    let start = Instant::now();
    while flag.load(Ordering::Acquire) == 0 {
        if start.elapsed() > timeout {
            return 2;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    out.store(value, Ordering::Release);
    0
}

unsafe extern "C" fn fail(_ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    param::<i32>(p, 0)
}

unsafe extern "C" fn block_sum_u32(ctx: *const HostLaunchCtx, p: *const *mut c_void) -> i32 {
    let ctx = &*ctx;
    let x = param::<u64>(p, 0) as *const u32;
    let out = param::<u64>(p, 1) as *mut u32;
    let b = ctx.block[0] as usize;
    if (ctx.shared_bytes as usize) < b * 4 {
        return 3;
    }
    let shared = ctx.shared as *mut u32;
    let base = ctx.block_idx[0] as usize * b;
    for t in 0..b {
        shared.add(t).write(x.add(base + t).read());
    }
    let mut sum = 0u32;
    for t in 0..b {
        sum = sum.wrapping_add(shared.add(t).read());
    }
    out.add(ctx.block_idx[0] as usize).write(sum);
    0
}

const PTR: usize = 8;

/// The test kernels as a host symbol table.
pub fn host_symbols() -> HostSymbolTable {
    let mut t = HostSymbolTable::new();
    let k = |func, param_sizes| HostKernel { func, param_sizes };
    t.insert(names::IOTA_U32, k(iota_u32, &[PTR, 4]));
    t.insert(names::COORDS, k(coords, &[PTR]));
    t.insert(names::AXPY_F32, k(axpy_f32, &[4, 4, PTR, PTR]));
    t.insert(
        names::ARGS_PROBE,
        k(args_probe, &[PTR, 1, 2, 4, 8, 4, 8, 8]),
    );
    t.insert(names::MUL_ADD_U32, k(mul_add_u32, &[PTR, 4, 4, 4]));
    t.insert(names::WAIT_FLAG, k(wait_flag, &[PTR, PTR, 4, 4]));
    t.insert(names::FAIL, k(fail, &[4]));
    t.insert(names::BLOCK_SUM_U32, k(block_sum_u32, &[PTR, PTR]));
    t
}

/// The test kernels as PTX for sm_80 and later (NVRTC 13.0's output for `device/uh_testing.cu`).
pub const PTX: &str = include_str!("../device/uh_testing.ptx");

/// The HIP source of the test kernels (`device/uh_testing.hip`), compiled by hiprtc for a
/// device's architecture at run time (the HIP backend's `test_kernels`).
pub const HIP_SOURCE: &str = include_str!("../device/uh_testing.hip");

/// Module formats this crate has the test kernels in.
pub const FORMATS: [ModuleFormat; 2] = [ModuleFormat::HostSymbols, ModuleFormat::Ptx];

/// The test kernels in the first of `accepted` formats available here, or `None`.
pub fn module_for(accepted: &[ModuleFormat]) -> Option<ModuleSource> {
    accepted.iter().find_map(|f| match f {
        ModuleFormat::HostSymbols => Some(ModuleSource::HostSymbols(Arc::new(host_symbols()))),
        ModuleFormat::Ptx => Some(ModuleSource::Ptx(PTX.to_string())),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_the_host_table() {
        let t = host_symbols();
        for n in names::ALL {
            assert!(t.get(n).is_some(), "{n}");
        }
        assert_eq!(t.names().count(), names::ALL.len());
    }
}
