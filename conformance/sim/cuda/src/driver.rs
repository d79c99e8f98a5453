//! The CUDA driver entry points (`cu*`): the subset cudarc's safe API calls, plus pinned host
//! memory, error names and the cuda-13 `_v2` variants. Each maps onto the simulator core; the
//! current context selects the device where the driver API does.

use crate::conv::*;
use crate::{api, out, sim, Sim, DRIVER_VERSION, PRIMARY_CTX, SIM};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Arc;
use unihal_sim::peer::Remote;
use unihal_sim::{Device, EventId, FunctionId, ModuleId, Work};

fn c(e: unihal_sim::SimError) -> i32 {
    code(&e)
}

/// The name of device `ordinal` running work in `mode`, NUL-terminated. Backends read
/// "simulated" (not a GPU) and "concurrent" (kernels run while the host goes on) from it.
pub fn device_name(ordinal: usize, mode: unihal_sim::Mode) -> String {
    let concurrent = if mode == unihal_sim::Mode::Concurrent {
        ", concurrent"
    } else {
        ""
    };
    format!("unihal simulated CUDA device {ordinal} (not a GPU{concurrent})\0")
}

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> c_int {
    api("cuInit", || {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        SIM.get_or_init(crate::start)
            .as_ref()
            .map(|_| ())
            .map_err(|e| *e)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> c_int {
    // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
    api("cuDriverGetVersion", || unsafe { out(v, DRIVER_VERSION) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: c_int, s: *mut *const c_char) -> c_int {
    api("cuGetErrorName", || {
        let (name, _) = names(e).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(s, name.as_ptr()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: c_int, s: *mut *const c_char) -> c_int {
    api("cuGetErrorString", || {
        let (_, text) = names(e).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(s, text.as_ptr()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> c_int {
    api("cuDeviceGetCount", || {
        let s = sim()?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(n, s.devices.len() as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut c_int, ordinal: c_int) -> c_int {
    api("cuDeviceGet", || {
        sim()?.device(ordinal)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(d, ordinal) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> c_int {
    api("cuDeviceGetName", || {
        let mode = sim()?.device(d)?.mode();
        let full = device_name(d as usize, mode);
        let bytes = full.as_bytes();
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
    api("cuDeviceGetUuid", || {
        sim()?.device(d)?;
        let mut id = *b"unihal-sim-cuda0";
        id[15] = b'0' + d as u8;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(uuid, id) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], d: c_int) -> c_int {
    // SAFETY: the same contract as this function's, passed on unchanged.
    unsafe { cuDeviceGetUuid(uuid, d) }
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) -> c_int {
    api("cuDeviceGetAttribute", || {
        let dev = sim()?.device(d)?;
        let value = attribute(attr, d, &dev.limits()).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(v, value) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, d: c_int) -> c_int {
    api("cuDeviceTotalMem_v2", || {
        let dev = sim()?.device(d)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(bytes, dev.memory_info().1 as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, d: c_int) -> c_int {
    api("cuDevicePrimaryCtxRetain", || {
        sim()?.device(d)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(ctx, (PRIMARY_CTX + d as usize) as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(d: c_int) -> c_int {
    api("cuDevicePrimaryCtxRelease_v2", || {
        sim()?.device(d).map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> c_int {
    api("cuCtxGetCurrent", || {
        let current = sim()?.0.current().map_or(0, |o| PRIMARY_CTX + o);
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(ctx, current as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> c_int {
    api("cuCtxSetCurrent", || {
        let s = sim()?;
        let ordinal = if ctx.is_null() {
            None
        } else {
            Some(context_ordinal(s, ctx)?)
        };
        s.set_current(ordinal);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> c_int {
    api("cuCtxSynchronize", || {
        sim()?.current_device()?.synchronize().map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    api("cuMemGetInfo_v2", || {
        let (f, t) = sim()?.current_device()?.memory_info();
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe {
            out(free, f as usize)?;
            out(total, t as usize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut u64, bytes: usize) -> c_int {
    api("cuMemAlloc_v2", || {
        if bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = sim()?.current_device()?.alloc(bytes as u64).map_err(c)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(p, a) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(p: u64) -> c_int {
    api("cuMemFree_v2", || {
        let s = sim()?;
        s.memory_owner(p)?.free(p).map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(p: *mut u64, bytes: usize, stream: *mut c_void) -> c_int {
    // Allocated at once: memory that exists now is valid for work enqueued after this call.
    api("cuMemAllocAsync", || {
        let (dev, id) = sim()?.stream(stream)?;
        if bytes == 0 || dev.query_stream(id).is_err() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let a = dev.alloc(bytes as u64).map_err(c)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(p, a) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(p: u64, stream: *mut c_void) -> c_int {
    api("cuMemFreeAsync", || {
        let (dev, id) = sim()?.stream(stream)?;
        let work = Work {
            touches: vec![(p, 0)],
            run: Box::new(move |m| m.free(p)),
        };
        dev.enqueue(id, work).map_err(c)
    })
}

fn fill(p: u64, value: u32, width: u64, count: usize, stream: *mut c_void) -> Result<(), i32> {
    let (dev, id) = sim()?.stream(stream)?;
    let len = width * count as u64;
    let work = Work {
        touches: vec![(p, len)],
        run: Box::new(move |m| m.fill(p, value, width, count as u64)),
    };
    dev.enqueue(id, work).map_err(c)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(p: u64, v: u8, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemsetD8Async", || fill(p, v as u32, 1, n, stream))
}

#[no_mangle]
pub extern "C" fn cuMemsetD16Async(p: u64, v: u16, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemsetD16Async", || fill(p, v as u32, 2, n, stream))
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(p: u64, v: u32, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemsetD32Async", || fill(p, v, 4, n, stream))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api("cuMemcpyHtoDAsync_v2", || {
        let s = sim()?;
        let (dev, id) = s.stream(stream)?;
        if src.is_null() && n > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let run: unihal_sim::WorkFn = if let Some(used) = s.pinned_use(src as u64, n as u64) {
            // Pinned source: read when the stream executes the copy (DMA).
            let from = src as usize;
            Box::new(move |m| {
                let _used = used;
                // SAFETY: a live pinned range: cuMemFreeHost refuses it while `used` lives.
                let data = unsafe { std::slice::from_raw_parts(from as *const u8, n) };
                m.write(dst, data)
            })
        } else {
            // Pageable source: captured now, as the driver stages it before returning.
            let data = if n == 0 {
                Vec::new()
            } else {
                // SAFETY: the caller provides `n` readable bytes at `src`.
                unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec()
            };
            Box::new(move |m| m.write(dst, &data))
        };
        let work = Work {
            touches: vec![(dst, n as u64)],
            run,
        };
        dev.enqueue(id, work).map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api("cuMemcpyDtoHAsync_v2", || {
        let s = sim()?;
        let (dev, id) = s.stream(stream)?;
        if dst.is_null() && n > 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if n == 0 {
            return Ok(());
        }
        if let Some(used) = s.pinned_use(dst as u64, n as u64) {
            // Pinned destination: written when the stream executes the copy; returns at once.
            let to = dst as usize;
            let work = Work {
                touches: vec![(src, n as u64)],
                run: Box::new(move |m| {
                    let _used = used;
                    // SAFETY: a live pinned range (cuMemFreeHost refuses it while `used` lives);
                    // the caller must not read it before synchronising, as with a GPU.
                    let buf = unsafe { std::slice::from_raw_parts_mut(to as *mut u8, n) };
                    m.read(src, buf)
                }),
            };
            return dev.enqueue(id, work).map_err(c);
        }
        // Pageable destination: returns once the stream has produced the data.
        // SAFETY: the caller provides `n` writable bytes at `dst`.
        let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) };
        dev.read_on(id, src, buf).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemcpyDtoDAsync_v2", || {
        let (dev, id) = sim()?.stream(stream)?;
        dev.enqueue(id, dtod(dst, src, n as u64)).map_err(c)
    })
}

/// A copy between two ranges of one device's memory.
fn dtod(dst: u64, src: u64, len: u64) -> Work {
    Work {
        touches: vec![(dst, len), (src, len)],
        run: Box::new(move |m| m.copy(dst, src, len)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut *mut c_void, flags: c_uint) -> c_int {
    api("cuStreamCreate", || {
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Without CU_STREAM_NON_BLOCKING (1) the stream is ordered with the null stream.
        let blocking = flags & 1 == 0;
        let id = sim()?
            .current_device()?
            .create_stream_with(blocking)
            .map_err(c)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(stream, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> c_int {
    api("cuStreamDestroy_v2", || {
        if stream.is_null() {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        let (dev, id) = sim()?.stream(stream)?;
        dev.destroy_stream(id).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> c_int {
    api("cuStreamSynchronize", || {
        let (dev, id) = sim()?.stream(stream)?;
        dev.stream_synchronize(id).map_err(c)
    })
}

/// `CUhostFn`: a host function run in stream order.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(stream: *mut c_void, f: HostFn, data: *mut c_void) -> c_int {
    api("cuLaunchHostFunc", || {
        let (dev, id) = sim()?.stream(stream)?;
        let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let data = data as usize;
        let work = Work {
            touches: Vec::new(),
            run: Box::new(move |_| {
                // It must not call the driver (here the device is locked): such calls are refused
                // and recorded as violations.
                // SAFETY: the caller's function and data, called once in stream order, as the
                // driver does.
                unihal_sim::gpu::run_host_fn(|| unsafe { f(data as *mut c_void) });
                Ok(())
            }),
        };
        dev.enqueue(id, work).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: *mut c_void) -> c_int {
    api("cuStreamQuery", || {
        let (dev, id) = sim()?.stream(stream)?;
        dev.query_stream_done(id).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(
    stream: *mut c_void,
    event: *mut c_void,
    _flags: c_uint,
) -> c_int {
    api("cuStreamWaitEvent", || {
        let s = sim()?;
        let (dev, id) = s.stream(stream)?;
        let owner = s.owner(event as u64)?;
        if std::ptr::eq(owner.as_ref(), dev.as_ref()) {
            dev.wait(id, EventId(event as u64)).map_err(c)
        } else {
            dev.wait_other(id, owner, EventId(event as u64)).map_err(c)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut *mut c_void, _flags: c_uint) -> c_int {
    api("cuEventCreate", || {
        let id = sim()?.current_device()?.create_event().map_err(c)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(event, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: *mut c_void) -> c_int {
    api("cuEventDestroy_v2", || {
        let h = event as u64;
        sim()?.owner(h)?.destroy_event(EventId(h)).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> c_int {
    api("cuEventRecord", || {
        let s = sim()?;
        let (dev, id) = s.stream(stream)?;
        if !std::ptr::eq(s.owner(event as u64)?.as_ref(), dev.as_ref()) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        dev.record(EventId(event as u64), id).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: *mut c_void) -> c_int {
    api("cuEventSynchronize", || {
        let h = event as u64;
        sim()?.owner(h)?.event_synchronize(EventId(h)).map_err(c)
    })
}

#[no_mangle]
pub extern "C" fn cuEventQuery(event: *mut c_void) -> c_int {
    api("cuEventQuery", || {
        let h = event as u64;
        sim()?.owner(h)?.query(EventId(h)).map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> c_int {
    api("cuEventElapsedTime", || {
        let v = sim()?
            .owner(start as u64)?
            .elapsed_ms(EventId(start as u64), EventId(end as u64))
            .map_err(c)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(ms, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> c_int {
    // SAFETY: the same contract as this function's, passed on unchanged.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> c_int {
    api("cuModuleLoadData", || {
        let dev = sim()?.current_device()?;
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
        // Modules must be PTX: the face reads the entry points, the core loads them.
        let entries = unihal_sim::module::parse_ptx(bytes).map_err(c)?;
        let id = dev.load_module(entries).map_err(c)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(module, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> c_int {
    api("cuModuleGetFunction", || {
        let dev = sim()?.owner(module as u64)?;
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name (the caller's contract).
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        let id = dev.function(ModuleId(module as u64), name).map_err(c)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(f, id.0 as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> c_int {
    api("cuModuleUnload", || {
        let h = module as u64;
        sim()?.owner(h)?.unload_module(ModuleId(h)).map_err(c)
    })
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
    api("cuLaunchKernel", || {
        let s = sim()?;
        if !extra.is_null() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let function = FunctionId(f as u64);
        let dev = s.owner(f as u64)?;
        let entry = dev.entry(function).map_err(c)?;
        let (stream_dev, id) = s.stream(stream)?;
        if !std::ptr::eq(stream_dev.as_ref(), dev.as_ref()) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
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
        dev.launch(id, function, [gx, gy, gz], [bx, by, bz], shared, &args)
            .map_err(c)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(d: *mut c_int) -> c_int {
    api("cuCtxGetDevice", || {
        let o = sim()?.current()?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(d, o as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, d: c_int, peer: c_int) -> c_int {
    api("cuDeviceCanAccessPeer", || {
        let s = sim()?;
        s.device(d)?;
        s.device(peer)?;
        // Distinct devices reach each other (a device is not its own peer).
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(can, c_int::from(d != peer)) }
    })
}

/// The ordinal of a primary context handle.
fn context_ordinal(s: &Sim, ctx: *mut c_void) -> Result<usize, i32> {
    (ctx as usize)
        .checked_sub(PRIMARY_CTX)
        .filter(|&o| o < s.devices.len())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

#[no_mangle]
pub extern "C" fn cuCtxEnablePeerAccess(peer: *mut c_void, flags: c_uint) -> c_int {
    api("cuCtxEnablePeerAccess", || {
        let s = sim()?;
        let (me, other) = (s.current()?, context_ordinal(s, peer)?);
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if me == other {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        if !s.enable_peer(me, other) {
            return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: *mut c_void) -> c_int {
    api("cuCtxDisablePeerAccess", || {
        let s = sim()?;
        let (me, other) = (s.current()?, context_ordinal(s, peer)?);
        if !s.disable_peer(me, other) {
            return Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyPeerAsync(
    dst: u64,
    dst_ctx: *mut c_void,
    src: u64,
    src_ctx: *mut c_void,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api("cuMemcpyPeerAsync", || {
        let s = sim()?;
        let (dev, id) = s.stream(stream)?;
        let (d, sr) = (context_ordinal(s, dst_ctx)?, context_ordinal(s, src_ctx)?);
        let (dd, sd) = (&s.devices[d], &s.devices[sr]);
        let len = n as u64;
        if len == 0 {
            return Ok(());
        }
        let here = |x: &Arc<Device>| std::ptr::eq(x.as_ref(), dev.as_ref());
        let r = match (here(dd), here(sd)) {
            (true, true) => dev.enqueue(id, dtod(dst, src, len)),
            (true, false) => dev.enqueue_peer_copy(id, sd, dst, src, len, Remote::Source),
            (false, true) => dev.enqueue_peer_copy(id, dd, dst, src, len, Remote::Destination),
            // Neither side on the stream's device: not simulated.
            (false, false) => return Err(CUDA_ERROR_NOT_SUPPORTED),
        };
        r.map_err(c)
    })
}

/// Allocates pinned host memory (page-aligned, zeroed), registered so that async copies from
/// and to it happen when the stream executes them.
/// The byte fresh pinned host memory holds (cuMemHostAlloc leaves it uninitialised).
const GARBAGE: u8 = 0xcd;

fn host_alloc(s: &Sim, p: *mut *mut c_void, bytes: usize) -> Result<(), i32> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let layout =
        std::alloc::Layout::from_size_align(bytes, 4096).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    // SAFETY: a non-zero size.
    let a = unsafe { std::alloc::alloc_zeroed(layout) };
    if a.is_null() {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // cuMemHostAlloc does not clear what it returns: the simulated driver hands out a garbage
    // pattern, so a backend that shows fresh pinned memory to safe code without clearing it is
    // caught (`memory.host.zeroed`).
    // SAFETY: `a` is valid for `bytes` bytes, just allocated, not yet shared.
    unsafe { std::ptr::write_bytes(a, GARBAGE, bytes) };
    s.pin(a as u64, bytes as u64, layout);
    // SAFETY: the out-pointer contract; on a null out-pointer the allocation is released.
    unsafe { out(p, a as *mut c_void) }.inspect_err(|_| {
        let _ = s.unpin(a as u64);
        // SAFETY: allocated just above with this layout and never handed out.
        unsafe { std::alloc::dealloc(a, layout) };
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    p: *mut *mut c_void,
    bytes: usize,
    _flags: c_uint,
) -> c_int {
    api("cuMemHostAlloc", || host_alloc(sim()?, p, bytes))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocHost_v2(p: *mut *mut c_void, bytes: usize) -> c_int {
    api("cuMemAllocHost_v2", || host_alloc(sim()?, p, bytes))
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> c_int {
    api("cuMemFreeHost", || {
        let s = sim()?;
        // Unknown, or a queued copy still reads or writes it (freeing now would race with the
        // copy): refused.
        let layout = s.unpin(p as u64).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: allocated by host_alloc with this layout; removed from the table (no new copy
        // can treat it as pinned) with no queued copy using it.
        unsafe { std::alloc::dealloc(p as *mut u8, layout) };
        Ok(())
    })
}
