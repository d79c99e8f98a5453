//! The CUDA driver entry points the backend calls, declared here returning a plain `c_int`.
//!
//! cudarc's bindings declare every driver function as returning its `CUresult` *enum*: a driver
//! that returns a code the enum does not list (a newer driver's, or a broken one's) would be
//! undefined behaviour at the call's return. So the backend resolves the same symbols from the
//! library cudarc opened ([`cudarc::driver::sys::culib`], already probed by the loader) with
//! integer results, and keeps every code as a number: an unknown one becomes
//! [`unihal_hal::HalError::Vendor`] with that number. cudarc's *types* (handles, flag and
//! attribute enums, which only go into the driver) are still used.
//!
//! The wrappers mirror the cudarc `result` functions the backend used, so call sites read the
//! same. A symbol missing from the driver panics with cudarc's message; every driver call runs
//! under [`crate::loader::guard`], which turns that into `Unavailable`.

#![allow(non_snake_case)] // the driver's own names

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute, CUdeviceptr, CUevent, CUevent_flags,
    CUevent_wait_flags, CUfunction, CUmodule, CUstream, CUstream_flags,
};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// A failed driver call's result code, as the driver returned it (possibly one `cuda.h` does not
/// list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DriverError(pub(crate) c_int);

/// A driver call's raw result.
#[must_use]
pub(crate) struct Code(c_int);

impl Code {
    /// Ok for `CUDA_SUCCESS` (0), else the code.
    pub(crate) fn result(self) -> Result<(), DriverError> {
        match self.0 {
            0 => Ok(()),
            c => Err(DriverError(c)),
        }
    }
}

/// `cuda.h` codes the backend tests for.
pub(crate) mod codes {
    pub const NOT_READY: i32 = 600;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NOT_FOUND: i32 = 500;
    pub const PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
}

/// `symbol` from the driver cudarc opened, typed `F`.
///
/// # Safety
/// `F` must be the C signature of `symbol` (with an integer result).
unsafe fn resolve<F: Copy>(symbol: &str) -> F {
    // SAFETY: the loader probed the driver before any call (so `culib` finds it); the caller
    // vouches for the signature.
    match unsafe { cudarc::driver::sys::culib().get::<F>(symbol.as_bytes()) } {
        Ok(f) => *f,
        Err(e) => panic!("Missing symbol {symbol}: {e}"),
    }
}

/// The file the driver's `cuInit` lives in (what the loader really opened), if the process maps
/// one.
pub(crate) fn driver_file() -> Option<String> {
    // SAFETY: only the address is read; the signature is cuInit's.
    let f = unsafe { resolve::<unsafe extern "C" fn(c_uint) -> c_int>("cuInit") };
    unihal_dynlib::mapped_file(f as usize)
}

/// Declares driver functions: `fn name(args)` calls the symbol `name` and returns its [`Code`].
macro_rules! driver {
    ($( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ); )*) => { $(
        /// The driver function of this name (see the module docs).
        ///
        /// # Safety
        /// The driver's contract for this function.
        #[allow(clippy::too_many_arguments)] // the driver's own argument lists
        pub(crate) unsafe fn $name($($arg: $ty),*) -> Code {
            type F = unsafe extern "C" fn($($ty),*) -> c_int;
            static S: OnceLock<F> = OnceLock::new();
            // SAFETY: `F` is the C signature of the symbol of this name in cuda.h, with its
            // `CUresult` read as the integer it is.
            let f = *S.get_or_init(|| unsafe { resolve::<F>(stringify!($name)) });
            // SAFETY: the caller's contract.
            Code(unsafe { f($($arg),*) })
        }
    )* };
}

driver! {
    fn cuInit(flags: c_uint);
    fn cuDriverGetVersion(v: *mut c_int);
    fn cuGetErrorName(e: c_int, s: *mut *const c_char);
    fn cuGetErrorString(e: c_int, s: *mut *const c_char);
    fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int);
    fn cuDeviceGetCount(n: *mut c_int);
    fn cuDeviceGetName(name: *mut c_char, len: c_int, d: CUdevice);
    fn cuDeviceGetAttribute(v: *mut c_int, a: CUdevice_attribute, d: CUdevice);
    fn cuDeviceTotalMem_v2(bytes: *mut usize, d: CUdevice);
    fn cuDeviceCanAccessPeer(can: *mut c_int, d: CUdevice, peer: CUdevice);
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, d: CUdevice);
    fn cuDevicePrimaryCtxRelease_v2(d: CUdevice);
    fn cuCtxSetCurrent(ctx: CUcontext);
    fn cuCtxSynchronize();
    fn cuCtxEnablePeerAccess(peer: CUcontext, flags: c_uint);
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    fn cuMemAlloc_v2(p: *mut CUdeviceptr, bytes: usize);
    fn cuMemAllocAsync(p: *mut CUdeviceptr, bytes: usize, s: CUstream);
    fn cuMemFree_v2(p: CUdeviceptr);
    fn cuMemHostAlloc(p: *mut *mut c_void, bytes: usize, flags: c_uint);
    fn cuMemFreeHost(p: *mut c_void);
    fn cuEventCreate(e: *mut CUevent, flags: c_uint);
    fn cuEventRecord(e: CUevent, s: CUstream);
    fn cuEventQuery(e: CUevent);
    fn cuEventSynchronize(e: CUevent);
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent);
    fn cuEventDestroy_v2(e: CUevent);
    fn cuStreamCreate(s: *mut CUstream, flags: c_uint);
    fn cuStreamDestroy_v2(s: CUstream);
    fn cuStreamSynchronize(s: CUstream);
    fn cuStreamQuery(s: CUstream);
    fn cuStreamWaitEvent(s: CUstream, e: CUevent, flags: c_uint);
    fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void);
    fn cuModuleGetFunction(f: *mut CUfunction, m: CUmodule, name: *const c_char);
    fn cuModuleUnload(m: CUmodule);
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, s: CUstream);
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, s: CUstream);
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, s: CUstream);
    fn cuMemcpyPeerAsync(
        dst: CUdeviceptr,
        dst_ctx: CUcontext,
        src: CUdeviceptr,
        src_ctx: CUcontext,
        n: usize,
        s: CUstream,
    );
    fn cuMemsetD8Async(p: CUdeviceptr, v: u8, n: usize, s: CUstream);
    fn cuMemsetD16Async(p: CUdeviceptr, v: u16, n: usize, s: CUstream);
    fn cuMemsetD32Async(p: CUdeviceptr, v: u32, n: usize, s: CUstream);
    fn cuLaunchKernel(
        f: CUfunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        s: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    );
    fn cuLaunchHostFunc(
        s: CUstream,
        f: Option<unsafe extern "C" fn(*mut c_void)>,
        data: *mut c_void,
    );
}

/// `cuGetErrorName` / `cuGetErrorString` of `code` (None when the driver does not know it).
pub(crate) fn error_text(code: c_int, name: bool) -> Option<String> {
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: an out-pointer to a local; the driver stores a pointer to a static string.
    let r = unsafe {
        if name {
            cuGetErrorName(code, &mut s)
        } else {
            cuGetErrorString(code, &mut s)
        }
    };
    if r.result().is_err() || s.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated static string of the driver.
    Some(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

/// Wrappers with values instead of out-pointers (cudarc's `result` layer, integer results).
pub(crate) mod result {
    use super::*;

    type R<T> = Result<T, DriverError>;

    pub(crate) fn init() -> R<()> {
        // SAFETY: flags must be 0.
        unsafe { cuInit(0) }.result()
    }

    pub(crate) mod device {
        use super::*;

        pub(crate) fn get(ordinal: c_int) -> R<CUdevice> {
            let mut d = 0;
            // SAFETY: an out-pointer to a local.
            unsafe { cuDeviceGet(&mut d, ordinal) }.result()?;
            Ok(d)
        }

        pub(crate) fn get_count() -> R<c_int> {
            let mut n = 0;
            // SAFETY: an out-pointer to a local.
            unsafe { cuDeviceGetCount(&mut n) }.result()?;
            Ok(n)
        }

        pub(crate) fn get_name(d: CUdevice) -> R<String> {
            let mut buf = [0 as c_char; 256];
            // SAFETY: a buffer of the length passed.
            unsafe { cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, d) }.result()?;
            // Terminated here whatever the driver wrote.
            buf[buf.len() - 1] = 0;
            // SAFETY: NUL-terminated (above).
            Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned())
        }

        /// # Safety
        /// A valid device.
        pub(crate) unsafe fn get_attribute(d: CUdevice, a: CUdevice_attribute) -> R<c_int> {
            let mut v = 0;
            // SAFETY: an out-pointer to a local; the caller's device.
            unsafe { cuDeviceGetAttribute(&mut v, a, d) }.result()?;
            Ok(v)
        }

        /// # Safety
        /// A valid device.
        pub(crate) unsafe fn total_mem(d: CUdevice) -> R<usize> {
            let mut v = 0;
            // SAFETY: an out-pointer to a local; the caller's device.
            unsafe { cuDeviceTotalMem_v2(&mut v, d) }.result()?;
            Ok(v)
        }
    }

    pub(crate) mod primary_ctx {
        use super::*;

        /// # Safety
        /// A valid device.
        pub(crate) unsafe fn retain(d: CUdevice) -> R<CUcontext> {
            let mut c = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local; the caller's device.
            unsafe { cuDevicePrimaryCtxRetain(&mut c, d) }.result()?;
            Ok(c)
        }

        /// # Safety
        /// A device whose primary context the caller retained.
        pub(crate) unsafe fn release(d: CUdevice) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuDevicePrimaryCtxRelease_v2(d) }.result()
        }
    }

    pub(crate) mod ctx {
        use super::*;

        /// # Safety
        /// A live context (or null).
        pub(crate) unsafe fn set_current(c: CUcontext) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuCtxSetCurrent(c) }.result()
        }

        pub(crate) fn synchronize() -> R<()> {
            // SAFETY: no arguments; the current context (an error without one).
            unsafe { cuCtxSynchronize() }.result()
        }
    }

    pub(crate) fn mem_get_info() -> R<(usize, usize)> {
        let (mut free, mut total) = (0, 0);
        // SAFETY: out-pointers to locals.
        unsafe { cuMemGetInfo_v2(&mut free, &mut total) }.result()?;
        Ok((free, total))
    }

    /// # Safety
    /// A current context.
    pub(crate) unsafe fn malloc_sync(len: usize) -> R<CUdeviceptr> {
        let mut p = 0;
        // SAFETY: an out-pointer to a local.
        unsafe { cuMemAlloc_v2(&mut p, len) }.result()?;
        Ok(p)
    }

    /// # Safety
    /// A live stream of the current context.
    pub(crate) unsafe fn malloc_async(s: CUstream, len: usize) -> R<CUdeviceptr> {
        let mut p = 0;
        // SAFETY: an out-pointer to a local; the caller's stream.
        unsafe { cuMemAllocAsync(&mut p, len, s) }.result()?;
        Ok(p)
    }

    /// # Safety
    /// Device memory of `cuMemAlloc(Async)`, no longer used.
    pub(crate) unsafe fn free_sync(p: CUdeviceptr) -> R<()> {
        // SAFETY: the caller's contract.
        unsafe { cuMemFree_v2(p) }.result()
    }

    /// # Safety
    /// A current context.
    pub(crate) unsafe fn malloc_host(len: usize, flags: c_uint) -> R<*mut c_void> {
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        unsafe { cuMemHostAlloc(&mut p, len, flags) }.result()?;
        Ok(p)
    }

    /// # Safety
    /// Memory of `cuMemHostAlloc`, no longer used.
    pub(crate) unsafe fn free_host(p: *mut c_void) -> R<()> {
        // SAFETY: the caller's contract.
        unsafe { cuMemFreeHost(p) }.result()
    }

    pub(crate) mod event {
        use super::*;

        pub(crate) fn create(flags: CUevent_flags) -> R<CUevent> {
            let mut e = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local; flags of the enum (in the current context).
            unsafe { cuEventCreate(&mut e, flags as c_uint) }.result()?;
            Ok(e)
        }

        /// # Safety
        /// A live event and a live stream of its context.
        pub(crate) unsafe fn record(e: CUevent, s: CUstream) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuEventRecord(e, s) }.result()
        }

        /// # Safety
        /// A live event.
        pub(crate) unsafe fn query(e: CUevent) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuEventQuery(e) }.result()
        }

        /// # Safety
        /// A live event.
        pub(crate) unsafe fn synchronize(e: CUevent) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuEventSynchronize(e) }.result()
        }

        /// # Safety
        /// Two live events.
        pub(crate) unsafe fn elapsed(start: CUevent, end: CUevent) -> R<f32> {
            let mut ms = 0.0;
            // SAFETY: an out-pointer to a local; the caller's events.
            unsafe { cuEventElapsedTime_v2(&mut ms, start, end) }.result()?;
            Ok(ms)
        }

        /// # Safety
        /// A live event, destroyed once.
        pub(crate) unsafe fn destroy(e: CUevent) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuEventDestroy_v2(e) }.result()
        }
    }

    pub(crate) mod stream {
        use super::*;

        /// A non-blocking stream of the current context.
        pub(crate) fn create_non_blocking() -> R<CUstream> {
            let mut s = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local.
            unsafe { cuStreamCreate(&mut s, CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint) }
                .result()?;
            Ok(s)
        }

        /// # Safety
        /// A live stream.
        pub(crate) unsafe fn synchronize(s: CUstream) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuStreamSynchronize(s) }.result()
        }

        /// # Safety
        /// A live stream, destroyed once.
        pub(crate) unsafe fn destroy(s: CUstream) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuStreamDestroy_v2(s) }.result()
        }

        /// # Safety
        /// A live stream and a live event.
        pub(crate) unsafe fn wait_event(s: CUstream, e: CUevent, f: CUevent_wait_flags) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuStreamWaitEvent(s, e, f as c_uint) }.result()
        }
    }

    pub(crate) mod module {
        use super::*;

        /// # Safety
        /// A NUL-terminated PTX image or a cubin, in the current context.
        pub(crate) unsafe fn load_data(image: *const c_void) -> R<CUmodule> {
            let mut m = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local; the caller's image.
            unsafe { cuModuleLoadData(&mut m, image) }.result()?;
            Ok(m)
        }

        /// # Safety
        /// A live module.
        pub(crate) unsafe fn get_function(m: CUmodule, name: &CStr) -> R<CUfunction> {
            let mut f = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local, the caller's module and a NUL-terminated name.
            unsafe { cuModuleGetFunction(&mut f, m, name.as_ptr()) }.result()?;
            Ok(f)
        }

        /// # Safety
        /// A live module, unloaded once.
        pub(crate) unsafe fn unload(m: CUmodule) -> R<()> {
            // SAFETY: the caller's contract.
            unsafe { cuModuleUnload(m) }.result()
        }
    }
}

/// `symbol` from the driver cudarc opened, or `None` when the driver does not export it.
///
/// # Safety
/// `F` must be the C signature of `symbol` (with an integer result).
unsafe fn resolve_optional<F: Copy>(symbol: &str) -> Option<F> {
    // SAFETY: as `resolve`.
    unsafe { cudarc::driver::sys::culib().get::<F>(symbol.as_bytes()) }
        .ok()
        .map(|f| *f)
}

/// `CUgraph`, `CUgraphExec`, `CUgraphNode`: opaque pointers.
pub(crate) type GraphHandle = *mut c_void;

/// `cuStreamGetCaptureInfo` in the spellings drivers export, newest first (all take the
/// status and id first; the later arguments are optional outputs passed as NULL).
#[derive(Clone, Copy)]
pub(crate) enum CaptureInfoFn {
    /// `cuStreamGetCaptureInfo_v3(hStream, *status, *id, *graph, **deps, **edgeData,
    /// *numDeps)`: CUDA 12.3 and later (what CUDA 13's `cuStreamGetCaptureInfo` is).
    V3(
        unsafe extern "C" fn(
            CUstream,
            *mut c_int,
            *mut u64,
            *mut GraphHandle,
            *mut *const GraphHandle,
            *mut *const c_void,
            *mut usize,
        ) -> c_int,
    ),
    /// `cuStreamGetCaptureInfo_v2(hStream, *status, *id, *graph, **deps, *numDeps)`: CUDA 11.3
    /// and later (what CUDA 12's `cuStreamGetCaptureInfo` is).
    V2(
        unsafe extern "C" fn(
            CUstream,
            *mut c_int,
            *mut u64,
            *mut GraphHandle,
            *mut *const GraphHandle,
            *mut usize,
        ) -> c_int,
    ),
    /// The unversioned export `cuStreamGetCaptureInfo(hStream, *status, *id)` (CUDA 10.1's ABI,
    /// still exported for binaries built then).
    V1(unsafe extern "C" fn(CUstream, *mut c_int, *mut u64) -> c_int),
}

/// The driver's stream-capture and graph entries (CUDA 11.4 and later export them all),
/// resolved once; each a C signature from NVIDIA's Driver API reference, with `CUresult`, the
/// capture mode and status enums read as the integers they are.
pub(crate) struct GraphApi {
    /// `cuStreamBeginCapture_v2(hStream, CUstreamCaptureMode mode)`.
    pub(crate) begin_capture: unsafe extern "C" fn(CUstream, c_int) -> c_int,
    /// `cuStreamEndCapture(hStream, CUgraph* phGraph)`.
    pub(crate) end_capture: unsafe extern "C" fn(CUstream, *mut GraphHandle) -> c_int,
    /// `cuStreamIsCapturing(hStream, CUstreamCaptureStatus* captureStatus)`.
    pub(crate) is_capturing: unsafe extern "C" fn(CUstream, *mut c_int) -> c_int,
    /// `cuStreamGetCaptureInfo` (see [`CaptureInfoFn`]).
    pub(crate) capture_info: CaptureInfoFn,
    /// `cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode)`.
    pub(crate) exchange_mode: unsafe extern "C" fn(*mut c_int) -> c_int,
    /// `cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long
    /// long flags)`.
    pub(crate) instantiate: unsafe extern "C" fn(*mut GraphHandle, GraphHandle, u64) -> c_int,
    /// `cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)`.
    pub(crate) launch: unsafe extern "C" fn(GraphHandle, CUstream) -> c_int,
    /// `cuGraphDestroy(CUgraph hGraph)`.
    pub(crate) destroy: unsafe extern "C" fn(GraphHandle) -> c_int,
    /// `cuGraphExecDestroy(CUgraphExec hGraphExec)`.
    pub(crate) exec_destroy: unsafe extern "C" fn(GraphHandle) -> c_int,
    /// `cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes)`.
    pub(crate) get_nodes: unsafe extern "C" fn(GraphHandle, *mut GraphHandle, *mut usize) -> c_int,
}

/// `cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)` (CUDA 11.2 and later), resolved once;
/// `None` when the driver lacks it.
pub(crate) fn mem_free_async() -> Option<unsafe extern "C" fn(CUdeviceptr, CUstream) -> c_int> {
    static F: OnceLock<Option<unsafe extern "C" fn(CUdeviceptr, CUstream) -> c_int>> =
        OnceLock::new();
    // SAFETY: the field's type is the symbol's C signature (NVIDIA's Driver API reference,
    // "Stream Ordered Memory Allocator"), `CUresult` read as the integer it is.
    *F.get_or_init(|| unsafe { resolve_optional("cuMemFreeAsync") })
}

/// The graph entries, or the names of those the driver lacks.
pub(crate) fn graph_api() -> Result<&'static GraphApi, String> {
    static API: OnceLock<Result<GraphApi, String>> = OnceLock::new();
    API.get_or_init(|| {
        let mut missing = Vec::new();
        macro_rules! get {
            ($name:literal) => {{
                // SAFETY: the field's type is the symbol's C signature (see GraphApi).
                let f = unsafe { resolve_optional($name) };
                if f.is_none() {
                    missing.push($name);
                }
                f
            }};
        }
        let begin_capture = get!("cuStreamBeginCapture_v2");
        let end_capture = get!("cuStreamEndCapture");
        let is_capturing = get!("cuStreamIsCapturing");
        // SAFETY: each spelling's C signature (see CaptureInfoFn).
        let capture_info = unsafe {
            resolve_optional("cuStreamGetCaptureInfo_v3")
                .map(CaptureInfoFn::V3)
                .or_else(|| resolve_optional("cuStreamGetCaptureInfo_v2").map(CaptureInfoFn::V2))
                .or_else(|| resolve_optional("cuStreamGetCaptureInfo").map(CaptureInfoFn::V1))
        };
        if capture_info.is_none() {
            missing.push("cuStreamGetCaptureInfo");
        }
        let exchange_mode = get!("cuThreadExchangeStreamCaptureMode");
        let instantiate = get!("cuGraphInstantiateWithFlags");
        let launch = get!("cuGraphLaunch");
        let destroy = get!("cuGraphDestroy");
        let exec_destroy = get!("cuGraphExecDestroy");
        let get_nodes = get!("cuGraphGetNodes");
        match (
            begin_capture,
            end_capture,
            is_capturing,
            capture_info,
            exchange_mode,
            instantiate,
            launch,
            destroy,
            exec_destroy,
            get_nodes,
        ) {
            (
                Some(begin_capture),
                Some(end_capture),
                Some(is_capturing),
                Some(capture_info),
                Some(exchange_mode),
                Some(instantiate),
                Some(launch),
                Some(destroy),
                Some(exec_destroy),
                Some(get_nodes),
            ) => Ok(GraphApi {
                begin_capture,
                end_capture,
                is_capturing,
                capture_info,
                exchange_mode,
                instantiate,
                launch,
                destroy,
                exec_destroy,
                get_nodes,
            }),
            _ => Err(format!(
                "the CUDA driver does not export {}",
                missing.join(", ")
            )),
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}
