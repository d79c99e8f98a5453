//! # A simulated CUDA driver (`libcuda.so`)
//!
//! Test infrastructure, never a product path: the CUDA driver API subset that cudarc's safe API
//! (and so unihal's CUDA backend) calls, implemented on the simulator core (`unihal-sim`) over host
//! memory, built as a shared object with the SONAME `libcuda.so` to be loaded through the backend's
//! library override exactly like the real driver. One device, named as simulated. Return codes
//! are CUDA's `CUresult` values ([`conv`]).
//!
//! * `UNIHAL_SIM_MODE`: `deferred` (default: work runs only at synchronisation points, so a
//!   missing cross-stream wait gives wrong results) or `eager`.
//! * `UNIHAL_SIM_MEMORY`: device capacity in bytes (default 8 GiB).
//!
//! Modules must be PTX; each entry runs the host function of unihal's portable library with that
//! name. Copies from and to pageable host memory follow CUDA: host-to-device copies capture the
//! source when called, device-to-host copies return once the stream has produced the data.
//! Handles are small integers in pointer clothing; the null stream is the legacy default stream
//! (here: one more stream, ordered only by events like any other).

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // every entry point follows the CUDA driver API's contract

pub mod conv;

use conv::*;
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;
use unihal_sim::{Device, EventId, FunctionId, Kernels, Limits, Mode, ModuleId, StreamId, Work};

/// The name the device reports.
pub const DEVICE_NAME: &CStr = c"unihal simulated CUDA device (not a GPU)";
/// `cuDriverGetVersion`: CUDA 13.0.
pub const DRIVER_VERSION: c_int = 13000;

struct Sim {
    dev: Device,
    default_stream: StreamId,
}

static SIM: OnceLock<Result<Sim, i32>> = OnceLock::new();
const PRIMARY_CTX: usize = 0x5100;

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

fn start() -> Result<Sim, i32> {
    let mode = match std::env::var("UNIHAL_SIM_MODE").as_deref().map(str::trim) {
        Ok("eager") => Mode::Eager,
        Ok("deferred") | Err(_) => Mode::Deferred,
        Ok(_) => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let memory = match std::env::var("UNIHAL_SIM_MEMORY") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .map_err(|_| CUDA_ERROR_INVALID_VALUE)?,
        Err(_) => 8 << 30,
    };
    let mut kernels = Kernels::new();
    let table = unihal_kernels::cpu::host_symbols();
    for name in table.names() {
        if let Some(k) = table.get(name) {
            kernels.insert(name.to_string(), k.func);
        }
    }
    let dev = Device::with_kernels(memory, mode, kernels, Limits::default());
    let default_stream = dev.create_stream().map_err(|e| code(&e))?;
    Ok(Sim {
        dev,
        default_stream,
    })
}

fn sim() -> Result<&'static Sim, i32> {
    match SIM.get() {
        Some(Ok(s)) => Ok(s),
        Some(Err(e)) => Err(*e),
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

/// Runs an entry point: panics never cross the C boundary.
fn api(f: impl FnOnce() -> Result<(), i32>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

fn c(e: unihal_sim::SimError) -> i32 {
    code(&e)
}

fn stream_of(s: &Sim, h: *mut c_void) -> StreamId {
    if h.is_null() {
        s.default_stream
    } else {
        StreamId(h as u64)
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

fn device(ordinal: c_int) -> Result<(), i32> {
    if ordinal == 0 {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_DEVICE)
    }
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> c_int {
    api(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        SIM.get_or_init(start).as_ref().map(|_| ()).map_err(|e| *e)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> c_int {
    api(|| unsafe { out(v, DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: c_int, s: *mut *const c_char) -> c_int {
    api(|| {
        let (name, _) = names(e).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        unsafe { out(s, name.as_ptr()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: c_int, s: *mut *const c_char) -> c_int {
    api(|| {
        let (_, text) = names(e).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        unsafe { out(s, text.as_ptr()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> c_int {
    api(|| {
        sim()?;
        unsafe { out(n, 1) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut c_int, ordinal: c_int) -> c_int {
    api(|| {
        sim()?;
        device(ordinal)?;
        unsafe { out(d, 0) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> c_int {
    api(|| {
        sim()?;
        device(d)?;
        let bytes = DEVICE_NAME.to_bytes_with_nul();
        if name.is_null() || len <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let n = bytes.len().min(len as usize);
        // SAFETY: the caller provides `len` bytes; the copy is at most that and ends with NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, name, n);
            *name.add(n - 1) = 0;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], d: c_int) -> c_int {
    api(|| {
        sim()?;
        device(d)?;
        unsafe { out(uuid, *b"unihal-sim-cuda0") }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], d: c_int) -> c_int {
    unsafe { cuDeviceGetUuid(uuid, d) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) -> c_int {
    api(|| {
        let s = sim()?;
        device(d)?;
        let value = attribute(attr, &s.dev.limits()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        unsafe { out(v, value) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, d: c_int) -> c_int {
    api(|| {
        let s = sim()?;
        device(d)?;
        unsafe { out(bytes, s.dev.memory_info().1 as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, d: c_int) -> c_int {
    api(|| {
        sim()?;
        device(d)?;
        unsafe { out(ctx, PRIMARY_CTX as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(d: c_int) -> c_int {
    api(|| {
        sim()?;
        device(d)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> c_int {
    api(|| {
        sim()?;
        unsafe { out(ctx, CURRENT.get() as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> c_int {
    api(|| {
        sim()?;
        if !ctx.is_null() && ctx as usize != PRIMARY_CTX {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        CURRENT.set(ctx as usize);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> c_int {
    api(|| sim()?.dev.synchronize().map_err(c))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    api(|| {
        let (f, t) = sim()?.dev.memory_info();
        unsafe {
            out(free, f as usize)?;
            out(total, t as usize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut u64, bytes: usize) -> c_int {
    api(|| {
        if bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = sim()?.dev.alloc(bytes as u64).map_err(c)?;
        unsafe { out(p, a) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(p: u64) -> c_int {
    api(|| sim()?.dev.free(p).map_err(c))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(p: *mut u64, bytes: usize, stream: *mut c_void) -> c_int {
    // Allocated at once: memory that exists now is valid for work enqueued after this call.
    api(|| {
        let s = sim()?;
        if bytes == 0 || (!stream.is_null() && s.dev.query_stream(StreamId(stream as u64)).is_err())
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = s.dev.alloc(bytes as u64).map_err(c)?;
        unsafe { out(p, a) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(p: u64, stream: *mut c_void) -> c_int {
    api(|| {
        let s = sim()?;
        let work = Work {
            touches: vec![(p, 0)],
            run: Box::new(move |m| m.free(p)),
        };
        s.dev.enqueue(stream_of(s, stream), work).map_err(c)
    })
}

fn fill(p: u64, value: u32, width: u64, count: usize, stream: *mut c_void) -> Result<(), i32> {
    let s = sim()?;
    let len = width * count as u64;
    let work = Work {
        touches: vec![(p, len)],
        run: Box::new(move |m| m.fill(p, value, width, count as u64)),
    };
    s.dev.enqueue(stream_of(s, stream), work).map_err(c)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(p: u64, v: u8, n: usize, stream: *mut c_void) -> c_int {
    api(|| fill(p, v as u32, 1, n, stream))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16Async(p: u64, v: u16, n: usize, stream: *mut c_void) -> c_int {
    api(|| fill(p, v as u32, 2, n, stream))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(p: u64, v: u32, n: usize, stream: *mut c_void) -> c_int {
    api(|| fill(p, v, 4, n, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api(|| {
        let s = sim()?;
        if src.is_null() && n > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Pageable source: captured now, as the driver stages it before returning.
        // SAFETY: the caller provides `n` readable bytes at `src`.
        let data = if n == 0 {
            Vec::new()
        } else {
            unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec()
        };
        let work = Work {
            touches: vec![(dst, n as u64)],
            run: Box::new(move |m| m.write(dst, &data)),
        };
        s.dev.enqueue(stream_of(s, stream), work).map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api(|| {
        let s = sim()?;
        if dst.is_null() && n > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if n == 0 {
            return Ok(());
        }
        // Pageable destination: returns once the stream has produced the data.
        // SAFETY: the caller provides `n` writable bytes at `dst`.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) };
        s.dev.read_on(stream_of(s, stream), src, buf).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, stream: *mut c_void) -> c_int {
    api(|| {
        let s = sim()?;
        let len = n as u64;
        let work = Work {
            touches: vec![(dst, len), (src, len)],
            run: Box::new(move |m| m.copy(dst, src, len)),
        };
        s.dev.enqueue(stream_of(s, stream), work).map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut *mut c_void, _flags: c_uint) -> c_int {
    api(|| {
        let id = sim()?.dev.create_stream().map_err(c)?;
        unsafe { out(stream, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> c_int {
    api(|| {
        if stream.is_null() {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        sim()?
            .dev
            .destroy_stream(StreamId(stream as u64))
            .map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> c_int {
    api(|| {
        let s = sim()?;
        s.dev.stream_synchronize(stream_of(s, stream)).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(
    stream: *mut c_void,
    event: *mut c_void,
    _flags: c_uint,
) -> c_int {
    api(|| {
        let s = sim()?;
        s.dev
            .wait(stream_of(s, stream), EventId(event as u64))
            .map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut *mut c_void, _flags: c_uint) -> c_int {
    api(|| {
        let id = sim()?.dev.create_event().map_err(c)?;
        unsafe { out(event, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: *mut c_void) -> c_int {
    api(|| sim()?.dev.destroy_event(EventId(event as u64)).map_err(c))
}

#[no_mangle]
pub extern "C" fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> c_int {
    api(|| {
        let s = sim()?;
        s.dev
            .record(EventId(event as u64), stream_of(s, stream))
            .map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: *mut c_void) -> c_int {
    api(|| {
        sim()?
            .dev
            .event_synchronize(EventId(event as u64))
            .map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuEventQuery(event: *mut c_void) -> c_int {
    api(|| sim()?.dev.query(EventId(event as u64)).map_err(c))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> c_int {
    api(|| {
        let v = sim()?
            .dev
            .elapsed_ms(EventId(start as u64), EventId(end as u64))
            .map_err(c)?;
        unsafe { out(ms, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> c_int {
    unsafe { cuEventElapsedTime(ms, start, end) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> c_int {
    api(|| {
        let s = sim()?;
        if image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // PTX is NUL-terminated text; a binary image (cubin/fatbin) starts with its magic, which
        // the core rejects from the first bytes.
        // SAFETY: the caller passes a NUL-terminated PTX string or a binary image (which starts with
        // a 4-byte magic, so it is at least that long); one byte is readable either way.
        let first = unsafe { *(image as *const u8) };
        let bytes: &[u8] = if first == 0x7f || first == 0x50 {
            // SAFETY: a binary image: at least its 4-byte magic.
            unsafe { std::slice::from_raw_parts(image as *const u8, 4) }
        } else {
            // SAFETY: as above: NUL-terminated text.
            unsafe { CStr::from_ptr(image as *const c_char) }.to_bytes()
        };
        let id = s.dev.load_module(bytes).map_err(c)?;
        unsafe { out(module, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> c_int {
    api(|| {
        let s = sim()?;
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name (the caller's contract).
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        let id = s.dev.function(ModuleId(module as u64), name).map_err(c)?;
        unsafe { out(f, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> c_int {
    api(|| sim()?.dev.unload_module(ModuleId(module as u64)).map_err(c))
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> c_int {
    api(|| {
        let s = sim()?;
        if !extra.is_null() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let function = FunctionId(f as u64);
        let entry = s.dev.entry(function).map_err(c)?;
        if params.is_null() && !entry.param_sizes.is_empty() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // kernelParams: one pointer per parameter to its value, sized by the PTX declaration.
        let mut args = Vec::with_capacity(entry.param_sizes.len());
        for (i, &size) in entry.param_sizes.iter().enumerate() {
            // SAFETY: the caller passes one valid pointer per kernel parameter.
            let p = unsafe { *params.add(i) };
            if p.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: each parameter pointer addresses a value of the parameter's size.
            args.push(unsafe { std::slice::from_raw_parts(p as *const u8, size) });
        }
        s.dev
            .launch(
                stream_of(s, stream),
                function,
                [gx, gy, gz],
                [bx, by, bz],
                shared,
                &args,
            )
            .map_err(c)
    })
}
