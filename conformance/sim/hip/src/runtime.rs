//! The HIP runtime entry points (`hip*`) unihal's HIP backend calls, each mapped onto the
//! simulator core's shared GPU calls (`unihal_sim::gpu::ops`); the calling thread's current
//! device (`hipSetDevice`, default 0) selects the device where HIP's API does.

use crate::conv::*;
use crate::{api, out, sim, Sim};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use unihal_codeobj::amdgpu;
use unihal_sim::gpu::ops;
use unihal_sim::module::Entry;

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
    format!("unihal simulated HIP device {ordinal} (not a GPU{concurrent})\0")
}

/// Events created with `hipEventDisableTiming`.
static UNTIMED: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

#[no_mangle]
pub extern "C" fn hipInit(flags: c_uint) -> c_int {
    api("hipInit", || {
        if flags != 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        crate::SIM
            .get_or_init(crate::start)
            .as_ref()
            .map(|_| ())
            .map_err(|e| *e)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipRuntimeGetVersion(v: *mut c_int) -> c_int {
    // Answered before (and without) hipInit, as the real runtime does.
    api("hipRuntimeGetVersion", || {
        let settings = crate::HipSettings {
            arch: crate::ARCHS[0],
            numbering: crate::HipSettings::numbering_from_env(),
        };
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(v, settings.version()) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDriverGetVersion(v: *mut c_int) -> c_int {
    // SAFETY: the same contract, passed on.
    unsafe { hipRuntimeGetVersion(v) }
}

#[no_mangle]
pub extern "C" fn hipGetErrorName(e: c_int) -> *const c_char {
    names(e).map_or(c"hipErrorUnknown".as_ptr(), |(n, _)| n.as_ptr())
}

#[no_mangle]
pub extern "C" fn hipGetErrorString(e: c_int) -> *const c_char {
    names(e).map_or(c"unknown error".as_ptr(), |(_, t)| t.as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceCount(n: *mut c_int) -> c_int {
    api("hipGetDeviceCount", || {
        let s = sim()?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(n, s.face.devices.len() as c_int) }
    })
}

#[no_mangle]
pub extern "C" fn hipSetDevice(d: c_int) -> c_int {
    api("hipSetDevice", || {
        let s = sim()?;
        s.face.dev(d as i64).map_err(f)?;
        s.face.set_current(Some(d as usize));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDevice(d: *mut c_int) -> c_int {
    api("hipGetDevice", || {
        let o = sim()?.face.current().ok_or(HIP_ERROR_INVALID_DEVICE)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(d, o as c_int) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetName(name: *mut c_char, len: c_int, d: c_int) -> c_int {
    api("hipDeviceGetName", || {
        let mode = sim()?.face.dev(d as i64).map_err(f)?.mode();
        let full = device_name(d as usize, mode);
        // SAFETY: the caller provides `len` bytes.
        if unsafe { ops::copy_c_str(&full, name, len.max(0) as usize) } {
            Ok(())
        } else {
            Err(HIP_ERROR_INVALID_VALUE)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceTotalMem(bytes: *mut usize, d: c_int) -> c_int {
    api("hipDeviceTotalMem", || {
        let total = sim()?.face.dev(d as i64).map_err(f)?.memory_info().1;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(bytes, total as usize) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipDeviceGetAttribute(v: *mut c_int, attr: c_int, d: c_int) -> c_int {
    api("hipDeviceGetAttribute", || {
        let s = sim()?;
        let dev = s.face.dev(d as i64).map_err(f)?;
        let value = attribute(s.settings.numbering, attr, d, &dev.limits())
            .ok_or(HIP_ERROR_INVALID_VALUE)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(v, value) }
    })
}

/// `hipDeviceProp_t` fields at their offsets in one layout (x86-64, AMD's headers).
struct Layout {
    size: usize,
    total_global_mem: usize,
    warp_size: usize,
    multiprocessors: usize,
    gcn_arch_name: usize,
}

/// ROCm 5's `hipDeviceProp_t` (what the plain `hipGetDeviceProperties` symbol fills).
const R0000: Layout = Layout {
    size: 792,
    total_global_mem: 256,
    warp_size: 276,
    multiprocessors: 336,
    gcn_arch_name: 396,
};
/// ROCm 6's `hipDeviceProp_tR0600`.
const R0600: Layout = Layout {
    size: 1472,
    total_global_mem: 288,
    warp_size: 308,
    multiprocessors: 388,
    gcn_arch_name: 1160,
};

/// Fills the caller's properties struct in `layout` (name, memory, warp size, compute units,
/// `gcnArchName` with the feature suffixes a real device reports).
///
/// # Safety
/// `p` is valid for `layout.size` bytes.
unsafe fn properties(s: &Sim, p: *mut c_void, d: c_int, layout: &Layout) -> Result<(), i32> {
    let dev = s.face.dev(d as i64).map_err(f)?;
    if p.is_null() {
        return Err(HIP_ERROR_INVALID_VALUE);
    }
    let mut buf = vec![0u8; layout.size];
    let name = device_name(d as usize, dev.mode());
    let name = name.trim_end_matches('\0').as_bytes();
    buf[..name.len().min(255)].copy_from_slice(&name[..name.len().min(255)]);
    let total = dev.memory_info().1 as usize;
    buf[layout.total_global_mem..layout.total_global_mem + 8].copy_from_slice(&total.to_le_bytes());
    buf[layout.warp_size..layout.warp_size + 4].copy_from_slice(&WAVEFRONT.to_le_bytes());
    buf[layout.multiprocessors..layout.multiprocessors + 4]
        .copy_from_slice(&COMPUTE_UNITS.to_le_bytes());
    let arch = format!("{}:sramecc+:xnack-", s.settings.arch);
    buf[layout.gcn_arch_name..layout.gcn_arch_name + arch.len()].copy_from_slice(arch.as_bytes());
    // SAFETY: the caller provides `layout.size` bytes.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p as *mut u8, layout.size) };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDeviceProperties(p: *mut c_void, d: c_int) -> c_int {
    // SAFETY: the caller provides a struct of the ROCm 5 layout.
    api("hipGetDeviceProperties", || unsafe {
        properties(sim()?, p, d, &R0000)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGetDevicePropertiesR0600(p: *mut c_void, d: c_int) -> c_int {
    api("hipGetDevicePropertiesR0600", || {
        let s = sim()?;
        if s.settings.numbering == Numbering::Legacy {
            // A DTK-like runtime: only the old layout is there.
            return Err(HIP_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: the caller provides a struct of the R0600 layout.
        unsafe { properties(s, p, d, &R0600) }
    })
}

#[no_mangle]
pub extern "C" fn hipDeviceSynchronize() -> c_int {
    api("hipDeviceSynchronize", || {
        ops::device_synchronize(sim()?.face).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> c_int {
    api("hipMemGetInfo", || {
        let (fr, t) = ops::mem_info(sim()?.face).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe {
            out(free, fr as usize)?;
            out(total, t as usize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMalloc(p: *mut *mut c_void, bytes: usize) -> c_int {
    api("hipMalloc", || {
        let s = sim()?;
        // HIP: zero bytes allocate nothing and return a null pointer.
        let a = if bytes == 0 {
            0
        } else {
            ops::malloc(s.face, bytes).map_err(f)?
        };
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(p, a as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn hipFree(p: *mut c_void) -> c_int {
    api("hipFree", || {
        let s = sim()?;
        if p.is_null() {
            return Ok(());
        }
        ops::free(s.face, p as u64).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMallocAsync(
    p: *mut *mut c_void,
    bytes: usize,
    stream: *mut c_void,
) -> c_int {
    api("hipMallocAsync", || {
        let a = ops::malloc_async(sim()?.face, bytes, stream).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(p, a as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn hipFreeAsync(p: *mut c_void, stream: *mut c_void) -> c_int {
    api("hipFreeAsync", || {
        ops::free_async(sim()?.face, p as u64, stream).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipHostMalloc(p: *mut *mut c_void, bytes: usize, flags: c_uint) -> c_int {
    api("hipHostMalloc", || {
        let s = sim()?;
        if flags & !0xf != 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        if bytes == 0 {
            // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
            return unsafe { out(p, std::ptr::null_mut()) };
        }
        // Left uninitialised by HIP: the simulator fills it with a garbage pattern.
        let a = ops::host_alloc(s.face, bytes).map_err(f)?;
        // SAFETY: the out-pointer contract; on a null out-pointer the allocation is released.
        unsafe { out(p, a) }.inspect_err(|_| {
            let _ = ops::host_free(s.face, a);
        })
    })
}

#[no_mangle]
pub extern "C" fn hipHostFree(p: *mut c_void) -> c_int {
    api("hipHostFree", || {
        let s = sim()?;
        if p.is_null() {
            return Ok(());
        }
        // Unknown, or a queued copy still reads or writes it: refused.
        ops::host_free(s.face, p).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemcpyHtoDAsync(
    dst: *mut c_void,
    src: *mut c_void,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller provides `n` readable bytes at `src` (the runtime's contract).
    api("hipMemcpyHtoDAsync", || unsafe {
        ops::copy_h2d(sim()?.face, dst as u64, src, n, stream).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipMemcpyDtoHAsync(
    dst: *mut c_void,
    src: *mut c_void,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: the caller provides `n` writable bytes at `dst` (the runtime's contract).
    api("hipMemcpyDtoHAsync", || unsafe {
        ops::copy_d2h(sim()?.face, dst, src as u64, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipMemcpyDtoDAsync(
    dst: *mut c_void,
    src: *mut c_void,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api("hipMemcpyDtoDAsync", || {
        ops::copy_d2d(sim()?.face, dst as u64, src as u64, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipMemcpyPeerAsync(
    dst: *mut c_void,
    dst_device: c_int,
    src: *const c_void,
    src_device: c_int,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api("hipMemcpyPeerAsync", || {
        if dst_device < 0 || src_device < 0 {
            return Err(HIP_ERROR_INVALID_DEVICE);
        }
        let (d, s) = (
            (dst_device as usize, dst as u64),
            (src_device as usize, src as u64),
        );
        ops::copy_peer(sim()?.face, d, s, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipMemsetD8Async(p: *mut c_void, v: u8, n: usize, stream: *mut c_void) -> c_int {
    api("hipMemsetD8Async", || {
        ops::fill(sim()?.face, p as u64, v as u32, 1, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipMemsetD16Async(
    p: *mut c_void,
    v: u16,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api("hipMemsetD16Async", || {
        ops::fill(sim()?.face, p as u64, v as u32, 2, n, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipMemsetD32Async(
    p: *mut c_void,
    v: c_int,
    n: usize,
    stream: *mut c_void,
) -> c_int {
    api("hipMemsetD32Async", || {
        ops::fill(sim()?.face, p as u64, v as u32, 4, n, stream).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamCreateWithFlags(
    stream: *mut *mut c_void,
    flags: c_uint,
) -> c_int {
    api("hipStreamCreateWithFlags", || {
        if flags > 1 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // Without hipStreamNonBlocking (1) the stream is ordered with the null stream.
        let id = ops::stream_create(sim()?.face, flags & 1 == 0).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(stream, id as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamCreate(stream: *mut *mut c_void) -> c_int {
    // SAFETY: the same contract, passed on.
    unsafe { hipStreamCreateWithFlags(stream, 0) }
}

#[no_mangle]
pub extern "C" fn hipStreamDestroy(stream: *mut c_void) -> c_int {
    api("hipStreamDestroy", || {
        ops::stream_destroy(sim()?.face, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipStreamSynchronize(stream: *mut c_void) -> c_int {
    api("hipStreamSynchronize", || {
        ops::stream_synchronize(sim()?.face, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipStreamQuery(stream: *mut c_void) -> c_int {
    api("hipStreamQuery", || {
        ops::stream_query(sim()?.face, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipStreamWaitEvent(
    stream: *mut c_void,
    event: *mut c_void,
    flags: c_uint,
) -> c_int {
    api("hipStreamWaitEvent", || {
        if flags != 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        ops::stream_wait_event(sim()?.face, stream, event).map_err(f)
    })
}

/// `hipStreamCallback_t`: called with the stream, its status and the user's data.
pub type StreamCallback = Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void)>;

#[no_mangle]
pub extern "C" fn hipStreamAddCallback(
    stream: *mut c_void,
    cb: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> c_int {
    api("hipStreamAddCallback", || {
        let cb = cb.ok_or(HIP_ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let (s, d) = (stream as usize, data as usize);
        // SAFETY: the caller's callback and data, called once in stream order with the stream
        // and a success status, as the runtime does.
        let call = Box::new(move || unsafe { cb(s as *mut c_void, HIP_SUCCESS, d as *mut c_void) });
        ops::launch_host_fn(sim()?.face, stream, call).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventCreateWithFlags(event: *mut *mut c_void, flags: c_uint) -> c_int {
    api("hipEventCreateWithFlags", || {
        // hipEventDefault 0, BlockingSync 1, DisableTiming 2, Interprocess 4 (which needs
        // DisableTiming).
        if flags & !7 != 0 || (flags & 4 != 0 && flags & 2 == 0) {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let id = ops::event_create(sim()?.face).map_err(f)?;
        if flags & 2 != 0 {
            UNTIMED.lock().get_or_insert_with(HashSet::new).insert(id);
        }
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(event, id as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventCreate(event: *mut *mut c_void) -> c_int {
    // SAFETY: the same contract, passed on.
    unsafe { hipEventCreateWithFlags(event, 0) }
}

#[no_mangle]
pub extern "C" fn hipEventDestroy(event: *mut c_void) -> c_int {
    api("hipEventDestroy", || {
        ops::event_destroy(sim()?.face, event).map_err(f)?;
        if let Some(set) = UNTIMED.lock().as_mut() {
            set.remove(&(event as u64));
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn hipEventRecord(event: *mut c_void, stream: *mut c_void) -> c_int {
    api("hipEventRecord", || {
        ops::event_record(sim()?.face, event, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipEventSynchronize(event: *mut c_void) -> c_int {
    api("hipEventSynchronize", || {
        ops::event_synchronize(sim()?.face, event).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipEventQuery(event: *mut c_void) -> c_int {
    api("hipEventQuery", || {
        ops::event_query(sim()?.face, event).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> c_int {
    api("hipEventElapsedTime", || {
        let s = sim()?;
        let untimed = UNTIMED
            .lock()
            .as_ref()
            .is_some_and(|set| set.contains(&(start as u64)) || set.contains(&(end as u64)));
        if untimed {
            return Err(HIP_ERROR_INVALID_HANDLE);
        }
        let v = ops::event_elapsed(s.face, start, end).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(ms, v) }
    })
}

/// The code object at `image` (its length from its own headers, as the runtime reads it).
///
/// # Safety
/// `image` points at a complete ELF or offload bundle.
unsafe fn image_at<'a>(image: *const c_void) -> Result<&'a [u8], i32> {
    let mut need = 4;
    loop {
        // SAFETY: the caller's complete image is at least as long as what its headers claim,
        // and `need` only grows to what they claim.
        let prefix = unsafe { std::slice::from_raw_parts(image as *const u8, need) };
        match amdgpu::image_len(prefix).map_err(|_| HIP_ERROR_INVALID_IMAGE)? {
            Ok(len) => {
                // SAFETY: as above.
                return Ok(unsafe { std::slice::from_raw_parts(image as *const u8, len) });
            }
            Err(more) if more > need && more < (1 << 30) => need = more,
            Err(_) => return Err(HIP_ERROR_INVALID_IMAGE),
        }
    }
}

/// The kernels of a code object for the simulated architecture, as AMD's loader reads them.
fn kernels(s: &Sim, image: &[u8]) -> Result<Vec<Entry>, i32> {
    let arch = s.settings.arch;
    let elf = amdgpu::code_object_for(image, arch)
        .map_err(|_| HIP_ERROR_INVALID_IMAGE)?
        .ok_or(HIP_ERROR_NO_BINARY_FOR_GPU)?;
    match amdgpu::elf_arch(elf).map_err(|_| HIP_ERROR_INVALID_IMAGE)? {
        Some(a) if a == arch => {}
        _ => return Err(HIP_ERROR_NO_BINARY_FOR_GPU),
    }
    let descriptors = amdgpu::kernel_symbols(elf).map_err(|_| HIP_ERROR_INVALID_IMAGE)?;
    let args = amdgpu::kernel_args(elf).map_err(|_| HIP_ERROR_INVALID_IMAGE)?;
    let mut entries = Vec::with_capacity(args.len());
    for (name, param_sizes) in args {
        // A kernel of the metadata without its descriptor cannot be launched.
        if !descriptors.contains(&name) {
            return Err(HIP_ERROR_INVALID_IMAGE);
        }
        entries.push(Entry { name, param_sizes });
    }
    Ok(entries)
}

#[no_mangle]
pub unsafe extern "C" fn hipModuleLoadData(
    module: *mut *mut c_void,
    image: *const c_void,
) -> c_int {
    api("hipModuleLoadData", || {
        let s = sim()?;
        if image.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a complete code object or bundle.
        let bytes = unsafe { image_at(image) }?;
        let id = ops::module_load(s.face, kernels(s, bytes)?).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(module, id as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipModuleGetFunction(
    func: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> c_int {
    api("hipModuleGetFunction", || {
        if name.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name (the caller's contract).
        let name = unsafe { CStr::from_ptr(name) };
        let id = ops::module_function(sim()?.face, module, name).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(func, id as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn hipModuleUnload(module: *mut c_void) -> c_int {
    api("hipModuleUnload", || {
        ops::module_unload(sim()?.face, module).map_err(f)
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn hipModuleLaunchKernel(
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
    api("hipModuleLaunchKernel", || {
        if !extra.is_null() {
            return Err(HIP_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: kernelParams holds one valid pointer per parameter (the runtime's contract).
        unsafe {
            ops::launch(
                sim()?.face,
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
pub unsafe extern "C" fn hipDeviceCanAccessPeer(can: *mut c_int, d: c_int, peer: c_int) -> c_int {
    api("hipDeviceCanAccessPeer", || {
        let yes = ops::can_access_peer(sim()?.face, d as i64, peer as i64).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(can, c_int::from(yes)) }
    })
}

#[no_mangle]
pub extern "C" fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) -> c_int {
    api("hipDeviceEnablePeerAccess", || {
        let peer = usize::try_from(peer).map_err(|_| HIP_ERROR_INVALID_DEVICE)?;
        ops::enable_peer(sim()?.face, peer, flags).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipDeviceDisablePeerAccess(peer: c_int) -> c_int {
    api("hipDeviceDisablePeerAccess", || {
        let peer = usize::try_from(peer).map_err(|_| HIP_ERROR_INVALID_DEVICE)?;
        ops::disable_peer(sim()?.face, peer).map_err(f)
    })
}

// Stream capture and graphs (HIP runtime API, "Stream Management" and "Graph Management"): the
// core's `unihal_sim::graph`, with HIP's handles and codes (`hipStreamCaptureMode`,
// `hipStreamCaptureStatus` and the 900-908 errors number as CUDA's).

#[no_mangle]
pub extern "C" fn hipStreamBeginCapture(stream: *mut c_void, mode: c_int) -> c_int {
    api("hipStreamBeginCapture", || {
        ops::begin_capture(sim()?.face, stream, i64::from(mode)).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamEndCapture(
    stream: *mut c_void,
    graph: *mut *mut c_void,
) -> c_int {
    api("hipStreamEndCapture", || {
        if graph.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let r = ops::end_capture(sim()?.face, stream).map_err(f);
        // A failed capture returns a null graph.
        // SAFETY: checked non-null; the caller's.
        unsafe { graph.write(r.unwrap_or(0) as *mut c_void) };
        r.map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamIsCapturing(stream: *mut c_void, status: *mut c_int) -> c_int {
    api("hipStreamIsCapturing", || {
        let (st, _) = ops::capture_status(sim()?.face, stream).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(status, st) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipStreamGetCaptureInfo(
    stream: *mut c_void,
    status: *mut c_int,
    id: *mut u64,
) -> c_int {
    api("hipStreamGetCaptureInfo", || {
        if status.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let (st, cid) = ops::capture_status(sim()?.face, stream).map_err(f)?;
        // SAFETY: checked non-null; the caller's.
        unsafe { status.write(st) };
        if !id.is_null() && st != 0 {
            // SAFETY: non-null, the caller's.
            unsafe { id.write(cid) };
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipThreadExchangeStreamCaptureMode(mode: *mut c_int) -> c_int {
    api("hipThreadExchangeStreamCaptureMode", || {
        if mode.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller's.
        let old = ops::exchange_capture_mode(i64::from(unsafe { mode.read() })).map_err(f)?;
        // SAFETY: as above.
        unsafe { mode.write(old) };
        Ok(())
    })
}

/// `hipGraphInstantiate(hipGraphExec_t*, hipGraph_t, hipGraphNode_t* pErrorNode, char*
/// pLogBuffer, size_t bufferSize)`: the error node and log are left untouched on success.
#[no_mangle]
pub unsafe extern "C" fn hipGraphInstantiate(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    _error_node: *mut *mut c_void,
    _log: *mut c_char,
    _log_len: usize,
) -> c_int {
    api("hipGraphInstantiate", || {
        sim()?;
        if exec.is_null() {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let h = ops::instantiate(graph, false).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(exec, h as *mut c_void) }
    })
}

/// `hipGraphInstantiateWithFlags`: `hipGraphInstantiateFlagAutoFreeOnLaunch` (1) is honoured;
/// upload (2), device launch (4) and node priority (8) are accepted as HIP documents them
/// (ignored); other bits are an invalid value.
#[no_mangle]
pub unsafe extern "C" fn hipGraphInstantiateWithFlags(
    exec: *mut *mut c_void,
    graph: *mut c_void,
    flags: u64,
) -> c_int {
    api("hipGraphInstantiateWithFlags", || {
        sim()?;
        if exec.is_null() || flags & !0xf != 0 {
            return Err(HIP_ERROR_INVALID_VALUE);
        }
        let h = ops::instantiate(graph, flags & 1 != 0).map_err(f)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(exec, h as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn hipGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> c_int {
    api("hipGraphLaunch", || {
        ops::graph_launch(sim()?.face, exec, stream).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipGraphDestroy(graph: *mut c_void) -> c_int {
    api("hipGraphDestroy", || {
        sim()?;
        ops::graph_destroy(graph).map_err(f)
    })
}

#[no_mangle]
pub extern "C" fn hipGraphExecDestroy(exec: *mut c_void) -> c_int {
    api("hipGraphExecDestroy", || {
        sim()?;
        ops::exec_destroy(exec).map_err(f)
    })
}

#[no_mangle]
pub unsafe extern "C" fn hipGraphGetNodes(
    graph: *mut c_void,
    nodes: *mut *mut c_void,
    count: *mut usize,
) -> c_int {
    api("hipGraphGetNodes", || {
        sim()?;
        // SAFETY: the runtime's contract.
        unsafe { ops::graph_nodes(graph, nodes, count) }.map_err(f)
    })
}
