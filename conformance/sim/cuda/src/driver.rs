//! The CUDA driver entry points (`cu*`): the subset cudarc's safe API calls, plus pinned host
//! memory, error names and the cuda-13 `_v2` variants. Each maps onto the simulator core; the
//! current context selects the device where the driver API does.

use crate::conv::*;
use crate::{api, out, sim, Sim, DRIVER_VERSION, PRIMARY_CTX, SIM};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use unihal_sim::gpu::ops;

fn c(e: unihal_sim::SimError) -> i32 {
    code(&e)
}

fn f(e: ops::Fail) -> i32 {
    fail_code(e)
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
        // SAFETY: the caller provides `len` bytes.
        if unsafe { ops::copy_c_str(&full, name, len.max(0) as usize) } {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        }
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
        ops::device_synchronize(sim()?).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> c_int {
    api("cuMemGetInfo_v2", || {
        let (fr, t) = ops::mem_info(sim()?).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe {
            out(free, fr as usize)?;
            out(total, t as usize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut u64, bytes: usize) -> c_int {
    api("cuMemAlloc_v2", || {
        let a = ops::malloc(sim()?, bytes).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(p, a) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(p: u64) -> c_int {
    api("cuMemFree_v2", || ops::free(sim()?, p).map_err(f))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(p: *mut u64, bytes: usize, stream: *mut c_void) -> c_int {
    api("cuMemAllocAsync", || {
        let a = ops::malloc_async(sim()?, bytes, stream).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(p, a) }
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeAsync(p: u64, stream: *mut c_void) -> c_int {
    api("cuMemFreeAsync", || {
        ops::free_async(sim()?, p, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(p: u64, v: u8, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemsetD8Async", || {
        ops::fill(sim()?, p, v as u32, 1, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD16Async(p: u64, v: u16, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemsetD16Async", || {
        ops::fill(sim()?, p, v as u32, 2, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD32Async(p: u64, v: u32, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemsetD32Async", || {
        ops::fill(sim()?, p, v, 4, n, stream).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller provides `n` readable bytes at `src` (the driver's contract).
    api("cuMemcpyHtoDAsync_v2", || unsafe {
        ops::copy_h2d(sim()?, dst, src, n, stream).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller provides `n` writable bytes at `dst` (the driver's contract).
    api("cuMemcpyDtoHAsync_v2", || unsafe {
        ops::copy_d2h(sim()?, dst, src, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, n: usize, stream: *mut c_void) -> c_int {
    api("cuMemcpyDtoDAsync_v2", || {
        ops::copy_d2d(sim()?, dst, src, n, stream).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut *mut c_void, flags: c_uint) -> c_int {
    api("cuStreamCreate", || {
        if flags > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // Without CU_STREAM_NON_BLOCKING (1) the stream is ordered with the null stream.
        let id = ops::stream_create(sim()?, flags & 1 == 0).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(stream, id as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> c_int {
    api("cuStreamDestroy_v2", || {
        ops::stream_destroy(sim()?, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> c_int {
    api("cuStreamSynchronize", || {
        ops::stream_synchronize(sim()?, stream).map_err(f)
    })
}

/// `CUhostFn`: a host function run in stream order.
pub type HostFn = Option<unsafe extern "C" fn(*mut c_void)>;

#[no_mangle]
pub extern "C" fn cuLaunchHostFunc(stream: *mut c_void, hf: HostFn, data: *mut c_void) -> c_int {
    api("cuLaunchHostFunc", || {
        let hf = hf.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let data = data as usize;
        // SAFETY: the caller's function and data, called once in stream order, as the driver
        // does.
        let call = Box::new(move || unsafe { hf(data as *mut c_void) });
        ops::launch_host_fn(sim()?, stream, call).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: *mut c_void) -> c_int {
    api("cuStreamQuery", || {
        ops::stream_query(sim()?, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(
    stream: *mut c_void,
    event: *mut c_void,
    _flags: c_uint,
) -> c_int {
    api("cuStreamWaitEvent", || {
        ops::stream_wait_event(sim()?, stream, event).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut *mut c_void, _flags: c_uint) -> c_int {
    api("cuEventCreate", || {
        let id = ops::event_create(sim()?).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(event, id as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: *mut c_void) -> c_int {
    api("cuEventDestroy_v2", || {
        ops::event_destroy(sim()?, event).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> c_int {
    api("cuEventRecord", || {
        ops::event_record(sim()?, event, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: *mut c_void) -> c_int {
    api("cuEventSynchronize", || {
        ops::event_synchronize(sim()?, event).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuEventQuery(event: *mut c_void) -> c_int {
    api("cuEventQuery", || {
        ops::event_query(sim()?, event).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> c_int {
    api("cuEventElapsedTime", || {
        let v = ops::event_elapsed(sim()?, start, end).map_err(f)?;
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
        let s = sim()?;
        s.current_dev().map_err(f)?;
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
        let id = ops::module_load(s, entries).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(module, id as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    func: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> c_int {
    api("cuModuleGetFunction", || {
        if name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name (the caller's contract).
        let name = unsafe { CStr::from_ptr(name) };
        let id = ops::module_function(sim()?, module, name).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(func, id as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> c_int {
    api("cuModuleUnload", || {
        ops::module_unload(sim()?, module).map_err(f)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    func: *mut c_void,
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
        if !extra.is_null() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: kernelParams holds one valid pointer per parameter (the driver's contract).
        unsafe {
            ops::launch(
                sim()?,
                func,
                [gx, gy, gz],
                [bx, by, bz],
                shared,
                stream,
                params,
            )
        }
        .map_err(f)
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
        let yes = ops::can_access_peer(sim()?, d as i64, peer as i64).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { out(can, c_int::from(yes)) }
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
        s.current()?;
        let other = context_ordinal(s, peer)?;
        ops::enable_peer(s, other, flags).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxDisablePeerAccess(peer: *mut c_void) -> c_int {
    api("cuCtxDisablePeerAccess", || {
        let s = sim()?;
        s.current()?;
        ops::disable_peer(s, context_ordinal(s, peer)?).map_err(f)
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
        let (d, sr) = (context_ordinal(s, dst_ctx)?, context_ordinal(s, src_ctx)?);
        ops::copy_peer(s, (d, dst), (sr, src), n, stream).map_err(f)
    })
}

/// Pinned host memory (`cuMemHostAlloc` leaves it uninitialised: the simulator fills it with a
/// garbage pattern), registered so that async copies from and to it happen when the stream
/// executes them.
fn host_alloc(s: &Sim, p: *mut *mut c_void, bytes: usize) -> Result<(), i32> {
    let a = ops::host_alloc(s, bytes).map_err(f)?;
    // SAFETY: the out-pointer contract; on a null out-pointer the allocation is released.
    unsafe { out(p, a) }.inspect_err(|_| {
        let _ = ops::host_free(s, a);
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
    // Unknown, or a queued copy still reads or writes it (freeing now would race with the copy):
    // refused.
    api("cuMemFreeHost", || ops::host_free(sim()?, p).map_err(f))
}

// Stream capture and graphs (CUDA Driver API, "Stream Management" and "Graph Management"):
// the core's `unihal_sim::graph`, with CUDA's handles and codes.

/// `cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode)`.
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture_v2(stream: *mut c_void, mode: c_int) -> c_int {
    api("cuStreamBeginCapture_v2", || {
        ops::begin_capture(sim()?, stream, i64::from(mode)).map_err(f)
    })
}

/// The unversioned export keeps CUDA 10.0's signature (no mode): a global-mode capture. Headers
/// since CUDA 10.1 map `cuStreamBeginCapture` to `cuStreamBeginCapture_v2`.
#[no_mangle]
pub extern "C" fn cuStreamBeginCapture(stream: *mut c_void) -> c_int {
    api("cuStreamBeginCapture", || {
        ops::begin_capture(sim()?, stream, 0).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: *mut c_void, graph: *mut *mut c_void) -> c_int {
    api("cuStreamEndCapture", || {
        if graph.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let r = ops::end_capture(sim()?, stream).map_err(f);
        // A failed capture returns a NULL graph.
        // SAFETY: checked non-null; the caller's.
        unsafe { graph.write(r.unwrap_or(0) as *mut c_void) };
        r.map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: *mut c_void, status: *mut c_int) -> c_int {
    api("cuStreamIsCapturing", || {
        let (st, _) = ops::capture_status(sim()?, stream).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(status, st) }
    })
}

/// Status and id of a stream's capture (the id is written only when active or invalidated).
///
/// # Safety
/// `status` valid (required); `id` null or valid.
unsafe fn capture_info(stream: *mut c_void, status: *mut c_int, id: *mut u64) -> Result<(), i32> {
    if status.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (st, cid) = ops::capture_status(sim()?, stream).map_err(f)?;
    // SAFETY: checked non-null; the caller's.
    unsafe { status.write(st) };
    if !id.is_null() && st != 0 {
        // SAFETY: non-null, the caller's.
        unsafe { id.write(cid) };
    }
    Ok(())
}

/// Writes "no graph, no dependencies" through the optional outputs of the `_v2`/`_v3` queries
/// (the simulator does not expose its capture graph).
///
/// # Safety
/// Each pointer null or valid.
unsafe fn no_capture_graph(graph: *mut *mut c_void, deps: *mut *const c_void, n: *mut usize) {
    // SAFETY: each is null or the caller's.
    unsafe {
        if !graph.is_null() {
            graph.write(std::ptr::null_mut());
        }
        if !deps.is_null() {
            deps.write(std::ptr::null());
        }
        if !n.is_null() {
            n.write(0);
        }
    }
}

/// The CUDA 10.x export: `(CUstream, CUstreamCaptureStatus*, cuuint64_t*)`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    stream: *mut c_void,
    status: *mut c_int,
    id: *mut u64,
) -> c_int {
    // SAFETY: the driver's contract, passed on.
    api("cuStreamGetCaptureInfo", || unsafe {
        capture_info(stream, status, id)
    })
}

/// CUDA 11.3's `_v2`: status, id, graph, dependencies, their count.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    stream: *mut c_void,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    n: *mut usize,
) -> c_int {
    api("cuStreamGetCaptureInfo_v2", || {
        // SAFETY: the driver's contract.
        unsafe {
            capture_info(stream, status, id)?;
            no_capture_graph(graph, deps, n);
        }
        Ok(())
    })
}

/// CUDA 12.3's `_v3` (what CUDA 13's `cuStreamGetCaptureInfo` names): also edge data.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: *mut c_void,
    status: *mut c_int,
    id: *mut u64,
    graph: *mut *mut c_void,
    deps: *mut *const c_void,
    edges: *mut *const c_void,
    n: *mut usize,
) -> c_int {
    api("cuStreamGetCaptureInfo_v3", || {
        if !edges.is_null() && deps.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the driver's contract.
        unsafe {
            capture_info(stream, status, id)?;
            no_capture_graph(graph, deps, n);
            if !edges.is_null() {
                edges.write(std::ptr::null());
            }
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut c_int) -> c_int {
    api("cuThreadExchangeStreamCaptureMode", || {
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller's.
        let old = ops::exchange_capture_mode(i64::from(unsafe { mode.read() })).map_err(f)?;
        // SAFETY: as above.
        unsafe { mode.write(old) };
        Ok(())
    })
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
const AUTO_FREE_ON_LAUNCH: u64 = 1;
/// Every `CUgraphInstantiate_flags` bit (auto-free 1, upload 2, device launch 4, node priority 8).
const INSTANTIATE_FLAGS: u64 = 0xf;

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    flags: u64,
) -> c_int {
    api("cuGraphInstantiateWithFlags", || {
        sim()?;
        // Upload is for cuGraphInstantiateWithParams only; device launch is not simulated.
        if flags & !INSTANTIATE_FLAGS != 0 || flags & 2 != 0 || flags & 4 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if exec.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = ops::instantiate(graph, flags & AUTO_FREE_ON_LAUNCH != 0).map_err(f)?;
        // SAFETY: checked non-null; the caller's.
        unsafe { out(exec, h as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn cuGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> c_int {
    api("cuGraphLaunch", || {
        ops::graph_launch(sim()?, exec, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphDestroy(graph: *mut c_void) -> c_int {
    api("cuGraphDestroy", || {
        sim()?;
        ops::graph_destroy(graph).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn cuGraphExecDestroy(exec: *mut c_void) -> c_int {
    api("cuGraphExecDestroy", || {
        sim()?;
        ops::exec_destroy(exec).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: *mut c_void,
    nodes: *mut *mut c_void,
    count: *mut usize,
) -> c_int {
    api("cuGraphGetNodes", || {
        sim()?;
        // SAFETY: the driver's contract.
        unsafe { ops::graph_nodes(graph, nodes, count) }.map_err(f)
    })
}
