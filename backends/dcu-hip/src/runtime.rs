//! The HIP runtime as a [`Runtime`] of the shared GPU layer (`unihal_gpu`): each raw call once,
//! its failure named with HIP's own call name and `hipError_t`.

use crate::conv::{blas_op, blas_status, codes, vendor};
use crate::ffi::{self, Handle};
use crate::loader::Hip;
use std::ffi::{c_int, c_void, CStr};
use std::sync::Arc;
use unihal_gpu::device::GpuDevice;
use unihal_gpu::gemm::BlasCall;
use unihal_gpu::library::Library;
use unihal_gpu::runtime::{
    unsupported_format, HostFn, PreparedModule, Raw, RawCaptureStatus, Runtime,
};
use unihal_gpu::stream::GpuStream;
use unihal_hal::{
    CaptureMode, DType, DeviceId, FillValue, HalError, ModuleSource, NativeHandle, Result,
};

/// A HIP device of the shared GPU layer.
pub type HipDevice = GpuDevice<Hip>;
/// A HIP stream of the shared GPU layer.
pub type HipStream = GpuStream<Hip>;

/// What makes a HIP device current: its ordinal (`hipSetDevice`; HIP has no context to retain).
pub struct HipContext {
    pub(crate) id: DeviceId,
}

impl Hip {
    /// `Ok` for `hipSuccess`, else the vendor error of `call`.
    pub(crate) fn check(&self, call: &str, rc: c_int) -> Result<()> {
        match rc {
            0 => Ok(()),
            rc => Err(vendor(&self.api, call, rc)),
        }
    }

    /// `Ok(true)` for success, `Ok(false)` for `hipErrorNotReady`.
    fn done(&self, call: &str, rc: c_int) -> Result<bool> {
        match rc {
            0 => Ok(true),
            codes::NOT_READY => Ok(false),
            rc => Err(vendor(&self.api, call, rc)),
        }
    }

    fn alloc_result(&self, call: &str, len: usize, rc: c_int, p: *mut c_void) -> Result<u64> {
        match rc {
            0 => Ok(p as u64),
            codes::OUT_OF_MEMORY => {
                let (mut free, mut total) = (0usize, 0usize);
                // SAFETY: two out-pointers to locals.
                let _ = unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
                Err(HalError::OutOfMemory {
                    requested: len as u64,
                    free: free as u64,
                })
            }
            rc => Err(vendor(&self.api, call, rc)),
        }
    }
}

fn h(r: Raw) -> Handle {
    r.0
}

/// The data of a host function queued through `hipStreamAddCallback` (the fallback when the
/// runtime does not export `hipLaunchHostFunc`).
struct Callback {
    f: HostFn,
    data: *mut c_void,
}

unsafe extern "C" fn stream_callback(_stream: Handle, _status: c_int, user: *mut c_void) {
    // SAFETY: `user` came from Box::into_raw in `launch_host_fn` and the runtime calls this
    // once; the function and data are the caller's, valid for one call.
    let cb = unsafe { Box::from_raw(user as *mut Callback) };
    // SAFETY: as above.
    unsafe { (cb.f)(cb.data) };
}

/// The graph entries of the HIP runtime, all present.
struct GraphFns {
    begin: unsafe extern "C" fn(Handle, c_int) -> c_int,
    end: unsafe extern "C" fn(Handle, *mut Handle) -> c_int,
    is_capturing: unsafe extern "C" fn(Handle, *mut c_int) -> c_int,
    info: unsafe extern "C" fn(Handle, *mut c_int, *mut std::ffi::c_ulonglong) -> c_int,
    exchange: unsafe extern "C" fn(*mut c_int) -> c_int,
    instantiate: unsafe extern "C" fn(
        *mut Handle,
        Handle,
        *mut Handle,
        *mut std::ffi::c_char,
        usize,
    ) -> c_int,
    launch: unsafe extern "C" fn(Handle, Handle) -> c_int,
    destroy: unsafe extern "C" fn(Handle) -> c_int,
    exec_destroy: unsafe extern "C" fn(Handle) -> c_int,
    nodes: unsafe extern "C" fn(Handle, *mut Handle, *mut usize) -> c_int,
}

impl Hip {
    /// The graph entries, or `Err` naming those the runtime does not export.
    fn graph_fns(&self) -> std::result::Result<GraphFns, String> {
        let a = &self.api;
        match (
            a.stream_begin_capture,
            a.stream_end_capture,
            a.stream_is_capturing,
            a.stream_get_capture_info,
            a.thread_exchange_stream_capture_mode,
            a.graph_instantiate,
            a.graph_launch,
            a.graph_destroy,
            a.graph_exec_destroy,
            a.graph_get_nodes,
        ) {
            (
                Some(begin),
                Some(end),
                Some(is_capturing),
                Some(info),
                Some(exchange),
                Some(instantiate),
                Some(launch),
                Some(destroy),
                Some(exec_destroy),
                Some(nodes),
            ) => Ok(GraphFns {
                begin,
                end,
                is_capturing,
                info,
                exchange,
                instantiate,
                launch,
                destroy,
                exec_destroy,
                nodes,
            }),
            _ => {
                let missing: Vec<&str> = [
                    ("hipStreamBeginCapture", a.stream_begin_capture.is_some()),
                    ("hipStreamEndCapture", a.stream_end_capture.is_some()),
                    ("hipStreamIsCapturing", a.stream_is_capturing.is_some()),
                    (
                        "hipStreamGetCaptureInfo",
                        a.stream_get_capture_info.is_some(),
                    ),
                    (
                        "hipThreadExchangeStreamCaptureMode",
                        a.thread_exchange_stream_capture_mode.is_some(),
                    ),
                    ("hipGraphInstantiate", a.graph_instantiate.is_some()),
                    ("hipGraphLaunch", a.graph_launch.is_some()),
                    ("hipGraphDestroy", a.graph_destroy.is_some()),
                    ("hipGraphExecDestroy", a.graph_exec_destroy.is_some()),
                    ("hipGraphGetNodes", a.graph_get_nodes.is_some()),
                ]
                .into_iter()
                .filter(|(_, present)| !present)
                .map(|(name, _)| name)
                .collect();
                Err(format!(
                    "the HIP runtime does not export {}",
                    missing.join(", ")
                ))
            }
        }
    }

    /// The graph entries (`Unsupported` naming the missing ones).
    fn graphs(&self) -> Result<GraphFns> {
        self.graph_fns().map_err(HalError::unsupported)
    }
}

impl Runtime for Hip {
    type Context = HipContext;
    type Blas = RocblasHandle;
    const VENDOR: &'static str = "HIP";

    fn enter<T>(&self, ctx: &HipContext, _what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // SAFETY: a valid ordinal (devices are opened below the runtime's count).
        let rc = unsafe { (self.api.set_device)(ctx.id.ordinal as c_int) };
        self.check("hipSetDevice", rc)?;
        f()
    }

    fn native_device(ctx: &HipContext) -> NativeHandle {
        NativeHandle::Int(ctx.id.ordinal as i64)
    }

    fn poisons(&self, e: &HalError) -> bool {
        matches!(e, HalError::Vendor { code, library, .. }
            if library == crate::conv::LIBRARY && crate::conv::poisons(*code))
    }

    fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.check("hipDeviceSynchronize", unsafe {
            (self.api.device_synchronize)()
        })
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two out-pointers to locals.
        let rc = unsafe { (self.api.mem_get_info)(&mut free, &mut total) };
        self.check("hipMemGetInfo", rc)?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<u64> {
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local and a non-zero size.
        let rc = unsafe { (self.api.malloc)(&mut p, len) };
        self.alloc_result("hipMalloc", len, rc, p)
    }

    fn malloc_async(&self, len: usize, stream: Raw) -> Result<u64> {
        let Some(malloc_async) = self.api.malloc_async else {
            return self.malloc(len);
        };
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local, a non-zero size and a live stream.
        let rc = unsafe { malloc_async(&mut p, len, h(stream)) };
        self.alloc_result("hipMallocAsync", len, rc, p)
    }

    unsafe fn free(&self, ptr: u64, pooled: bool) -> Result<()> {
        match (pooled, self.api.free_async) {
            // Pool memory goes back to its pool through the null stream (every use has
            // completed: the HAL frees only then), and that stream is waited for: it holds only
            // such frees (the backend's streams are non-blocking, so neither waits for the
            // other), so the wait is short and the memory is back when the drop returns, without
            // synchronising the device as `hipFree` does.
            (true, Some(free_async)) => {
                let null = std::ptr::null_mut();
                // SAFETY: the caller's contract.
                self.check("hipFreeAsync", unsafe {
                    free_async(ptr as *mut c_void, null)
                })?;
                // SAFETY: the null stream of the current device.
                self.check("hipStreamSynchronize", unsafe {
                    (self.api.stream_synchronize)(null)
                })
            }
            // SAFETY: the caller's contract.
            _ => self.check("hipFree", unsafe { (self.api.free)(ptr as *mut c_void) }),
        }
    }

    fn host_alloc(&self, len: usize) -> Result<*mut u8> {
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local and a non-zero size.
        let rc = unsafe { (self.api.host_malloc)(&mut p, len, ffi::HOST_MALLOC_DEFAULT) };
        match rc {
            0 => Ok(p as *mut u8),
            codes::OUT_OF_MEMORY => Err(HalError::OutOfMemory {
                requested: len as u64,
                free: 0,
            }),
            rc => Err(vendor(&self.api, "hipHostMalloc", rc)),
        }
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("hipHostFree", unsafe {
            (self.api.host_free)(ptr as *mut c_void)
        })
    }

    fn peers(&self, ctx: &HipContext) -> Result<Vec<u32>> {
        let me = ctx.id.ordinal as c_int;
        let mut peers = Vec::new();
        for o in (0..self.devices as c_int).filter(|&o| o != me) {
            let mut can = 0;
            // SAFETY: an out-pointer to a local and two valid ordinals.
            let rc = unsafe { (self.api.device_can_access_peer)(&mut can, me, o) };
            self.check("hipDeviceCanAccessPeer", rc)?;
            if can != 0 {
                peers.push(o as u32);
            }
        }
        Ok(peers)
    }

    fn enable_peer(&self, peer: &HipContext) -> Result<()> {
        // SAFETY: a valid ordinal; flags must be 0.
        match unsafe { (self.api.device_enable_peer_access)(peer.id.ordinal as c_int, 0) } {
            0 | codes::PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            rc => Err(vendor(&self.api, "hipDeviceEnablePeerAccess", rc)),
        }
    }

    fn stream_create(&self) -> Result<Raw> {
        let mut s = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        let rc = unsafe { (self.api.stream_create_with_flags)(&mut s, ffi::STREAM_NON_BLOCKING) };
        self.check("hipStreamCreateWithFlags", rc)?;
        Ok(Raw(s))
    }

    unsafe fn stream_destroy(&self, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("hipStreamDestroy", unsafe {
            (self.api.stream_destroy)(h(stream))
        })
    }

    fn stream_synchronize(&self, stream: Raw) -> Result<()> {
        // SAFETY: a live stream.
        self.check("hipStreamSynchronize", unsafe {
            (self.api.stream_synchronize)(h(stream))
        })
    }

    fn stream_query(&self, stream: Raw) -> Result<bool> {
        // SAFETY: a live stream.
        self.done("hipStreamQuery", unsafe {
            (self.api.stream_query)(h(stream))
        })
    }

    fn stream_wait_event(&self, stream: Raw, event: Raw) -> Result<()> {
        // SAFETY: a live stream and event; flags must be 0.
        self.check("hipStreamWaitEvent", unsafe {
            (self.api.stream_wait_event)(h(stream), h(event), 0)
        })
    }

    unsafe fn launch_host_fn(&self, stream: Raw, f: HostFn, data: *mut c_void) -> Result<()> {
        if let Some(launch) = self.api.launch_host_func {
            // SAFETY: a live stream; the caller's contract for `f` and `data`.
            return self.check("hipLaunchHostFunc", unsafe { launch(h(stream), f, data) });
        }
        let cb = Box::into_raw(Box::new(Callback { f, data }));
        // SAFETY: a live stream; `stream_callback` takes ownership of `cb` when called (once);
        // flags must be 0.
        let rc = unsafe {
            (self.api.stream_add_callback)(h(stream), stream_callback, cb as *mut c_void, 0)
        };
        if rc != 0 {
            // Not queued: the runtime will never call it.
            // SAFETY: from Box::into_raw above, not handed to the runtime.
            drop(unsafe { Box::from_raw(cb) });
        }
        self.check("hipStreamAddCallback", rc)
    }

    unsafe fn copy_h2d(&self, dst: u64, src: *const u8, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract (HIP's declaration takes a non-const source).
        self.check("hipMemcpyHtoDAsync", unsafe {
            (self.api.memcpy_htod_async)(dst as Handle, src as *mut c_void, len, h(stream))
        })
    }

    unsafe fn copy_d2h(&self, dst: *mut u8, src: u64, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("hipMemcpyDtoHAsync", unsafe {
            (self.api.memcpy_dtoh_async)(dst as *mut c_void, src as Handle, len, h(stream))
        })
    }

    unsafe fn copy_d2d(&self, dst: u64, src: u64, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("hipMemcpyDtoDAsync", unsafe {
            (self.api.memcpy_dtod_async)(dst as Handle, src as Handle, len, h(stream))
        })
    }

    unsafe fn copy_peer(
        &self,
        dst: (&HipContext, u64),
        src: (&HipContext, u64),
        len: usize,
        stream: Raw,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("hipMemcpyPeerAsync", unsafe {
            (self.api.memcpy_peer_async)(
                dst.1 as *mut c_void,
                dst.0.id.ordinal as c_int,
                src.1 as *const c_void,
                src.0.id.ordinal as c_int,
                len,
                h(stream),
            )
        })
    }

    unsafe fn fill(&self, dst: u64, value: FillValue, count: usize, stream: Raw) -> Result<()> {
        let (d, s) = (dst as Handle, h(stream));
        // SAFETY: the caller's contract.
        let (call, rc) = unsafe {
            match value {
                FillValue::U8(v) => (
                    "hipMemsetD8Async",
                    (self.api.memset_d8_async)(d, v, count, s),
                ),
                FillValue::U16(v) => (
                    "hipMemsetD16Async",
                    (self.api.memset_d16_async)(d, v, count, s),
                ),
                FillValue::U32(v) => (
                    "hipMemsetD32Async",
                    (self.api.memset_d32_async)(d, v as c_int, count, s),
                ),
            }
        };
        self.check(call, rc)
    }

    unsafe fn launch(
        &self,
        function: Raw,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        stream: Raw,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: the caller's contract; the runtime copies the argument values during the call.
        self.check("hipModuleLaunchKernel", unsafe {
            (self.api.module_launch_kernel)(
                h(function),
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_mem,
                h(stream),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn event_create(&self, timing: bool) -> Result<Raw> {
        let flags = if timing {
            ffi::EVENT_DEFAULT
        } else {
            ffi::EVENT_DISABLE_TIMING
        };
        let mut e = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        let rc = unsafe { (self.api.event_create_with_flags)(&mut e, flags) };
        self.check("hipEventCreateWithFlags", rc)?;
        Ok(Raw(e))
    }

    unsafe fn event_destroy(&self, event: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("hipEventDestroy", unsafe {
            (self.api.event_destroy)(h(event))
        })
    }

    fn event_record(&self, event: Raw, stream: Raw) -> Result<()> {
        // SAFETY: a live event and stream of the same device.
        self.check("hipEventRecord", unsafe {
            (self.api.event_record)(h(event), h(stream))
        })
    }

    fn event_query(&self, event: Raw) -> Result<bool> {
        // SAFETY: a live event.
        self.done("hipEventQuery", unsafe { (self.api.event_query)(h(event)) })
    }

    fn event_synchronize(&self, event: Raw) -> Result<()> {
        // SAFETY: a live event.
        self.check("hipEventSynchronize", unsafe {
            (self.api.event_synchronize)(h(event))
        })
    }

    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32> {
        let mut ms = 0.0;
        // SAFETY: an out-pointer to a local and two live, completed, timing events.
        let rc = unsafe { (self.api.event_elapsed_time)(&mut ms, h(start), h(end)) };
        self.check("hipEventElapsedTime", rc)?;
        Ok(ms)
    }

    fn prepare_module(&self, source: &ModuleSource) -> Result<PreparedModule> {
        match source {
            ModuleSource::HipCodeObject(bytes) => Ok(PreparedModule {
                params: unihal_codeobj::amdgpu::prepare(bytes)?,
                image: bytes.to_vec(),
            }),
            other => Err(unsupported_format(
                "HIP",
                "HIP code objects (raw AMDGPU ELF or an uncompressed offload bundle)",
                other,
            )),
        }
    }

    fn module_load(&self, image: &[u8]) -> Result<Raw> {
        let mut m = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local and a complete code object, alive for the call.
        let rc = unsafe { (self.api.module_load_data)(&mut m, image.as_ptr() as *const c_void) };
        self.check("hipModuleLoadData", rc)?;
        Ok(Raw(m))
    }

    fn module_function(&self, module: Raw, name: &CStr) -> Result<Option<Raw>> {
        let mut f = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local, a loaded module and a NUL-terminated name.
        match unsafe { (self.api.module_get_function)(&mut f, h(module), name.as_ptr()) } {
            0 => Ok(Some(Raw(f))),
            codes::NOT_FOUND => Ok(None),
            rc => Err(vendor(&self.api, "hipModuleGetFunction", rc)),
        }
    }

    unsafe fn module_unload(&self, module: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("hipModuleUnload", unsafe {
            (self.api.module_unload)(h(module))
        })
    }

    fn load_library(&self, device: &Arc<HipDevice>) -> Result<Library> {
        crate::device::load_library(device)
    }

    fn graph_support(&self) -> std::result::Result<(), String> {
        self.graph_fns().map(drop)
    }

    fn graph_mem_nodes(&self) -> bool {
        // `hipMallocAsync`/`hipFreeAsync` on a capturing stream record memory nodes (HIP's
        // "Stream Ordered Memory Allocator" and graph APIs).
        self.api.malloc_async.is_some() && self.api.free_async.is_some()
    }

    unsafe fn free_async(&self, ptr: u64, stream: Raw) -> Result<()> {
        let Some(free_async) = self.api.free_async else {
            return Err(HalError::unsupported(
                "hipFreeAsync (stream-ordered free): not exported by this HIP runtime",
            ));
        };
        // SAFETY: the caller's contract: memory of `hipMallocAsync` on this device, freed once,
        // unused after this point of the stream's order.
        self.check("hipFreeAsync", unsafe {
            free_async(ptr as *mut c_void, h(stream))
        })
    }

    fn stream_begin_capture(&self, stream: Raw, mode: CaptureMode) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: a live stream and a documented mode.
        let rc = unsafe { (g.begin)(h(stream), crate::conv::capture_mode(mode)) };
        self.check("hipStreamBeginCapture", rc)
    }

    fn stream_end_capture(&self, stream: Raw) -> Result<Raw> {
        let g = self.graphs()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: a live stream and an out-pointer to a local.
        let rc = unsafe { (g.end)(h(stream), &mut graph) };
        self.check("hipStreamEndCapture", rc)?;
        Ok(Raw(graph))
    }

    fn stream_capture_info(&self, stream: Raw) -> Result<RawCaptureStatus> {
        let g = self.graphs()?;
        let mut status = 0;
        // SAFETY: a live stream and an out-pointer to a local.
        let rc = unsafe { (g.is_capturing)(h(stream), &mut status) };
        self.check("hipStreamIsCapturing", rc)?;
        if status == 0 {
            return Ok(RawCaptureStatus::None);
        }
        let (mut status, mut id) = (0, 0);
        // SAFETY: a live stream and out-pointers to locals.
        let rc = unsafe { (g.info)(h(stream), &mut status, &mut id) };
        self.check("hipStreamGetCaptureInfo", rc)?;
        crate::conv::capture_status(status, id)
    }

    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode> {
        let g = self.graphs()?;
        let mut m = crate::conv::capture_mode(mode);
        // SAFETY: an in/out pointer to a local holding a documented mode.
        let rc = unsafe { (g.exchange)(&mut m) };
        self.check("hipThreadExchangeStreamCaptureMode", rc)?;
        crate::conv::capture_mode_of(m).ok_or_else(|| {
            HalError::Internal(format!(
                "hipThreadExchangeStreamCaptureMode returned an undocumented mode {m}"
            ))
        })
    }

    fn graph_instantiate(&self, graph: Raw) -> Result<Raw> {
        let g = self.graphs()?;
        let mut exec = std::ptr::null_mut();
        let mut node = std::ptr::null_mut();
        let mut log = [0 as std::ffi::c_char; 512];
        // SAFETY: a live graph, out-pointers to locals and a log buffer of the length passed.
        let rc =
            unsafe { (g.instantiate)(&mut exec, h(graph), &mut node, log.as_mut_ptr(), log.len()) };
        if rc != 0 {
            let mut e = vendor(&self.api, "hipGraphInstantiate", rc);
            // The runtime's log names what failed, where it wrote one.
            log[log.len() - 1] = 0;
            // SAFETY: NUL-terminated (above).
            let text = unsafe { CStr::from_ptr(log.as_ptr()) }.to_string_lossy();
            if let (HalError::Vendor { message, .. }, false) = (&mut e, text.is_empty()) {
                message.push_str(&format!(" ({text})"));
            }
            return Err(e);
        }
        Ok(Raw(exec))
    }

    fn graph_launch(&self, exec: Raw, stream: Raw) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: a live executable graph and a live stream of its device.
        let rc = unsafe { (g.launch)(h(exec), h(stream)) };
        self.check("hipGraphLaunch", rc)
    }

    fn graph_node_count(&self, graph: Raw) -> Result<usize> {
        let g = self.graphs()?;
        let mut n = 0usize;
        // SAFETY: a live graph; NULL nodes asks for the count alone.
        let rc = unsafe { (g.nodes)(h(graph), std::ptr::null_mut(), &mut n) };
        self.check("hipGraphGetNodes", rc)?;
        Ok(n)
    }

    unsafe fn graph_destroy(&self, graph: Raw) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: the caller's contract.
        let rc = unsafe { (g.destroy)(h(graph)) };
        self.check("hipGraphDestroy", rc)
    }

    unsafe fn graph_exec_destroy(&self, exec: Raw) -> Result<()> {
        let g = self.graphs()?;
        // SAFETY: the caller's contract.
        let rc = unsafe { (g.exec_destroy)(h(exec)) };
        self.check("hipGraphExecDestroy", rc)
    }

    fn capture_error(
        &self,
        e: HalError,
        arg: &'static str,
        capture: &dyn Fn() -> Option<unihal_hal::CaptureId>,
    ) -> HalError {
        crate::conv::capture_error(e, arg, capture)
    }

    fn blas_dtypes(&self) -> &'static [unihal_hal::DType] {
        if crate::loader::rocblas().is_ok() {
            &unihal_gpu::gemm::BLAS_DTYPES
        } else {
            &[]
        }
    }

    unsafe fn blas_gemm(
        &self,
        handle: &Self::Blas,
        call: &unihal_gpu::gemm::BlasCall,
    ) -> Result<()> {
        // SAFETY: the caller's contract (Runtime::blas_gemm).
        unsafe { rocblas_gemm(handle, call) }
    }

    fn blas_create(&self) -> Result<Self::Blas> {
        RocblasHandle::new()
    }

    fn blas_bind(&self, handle: &Self::Blas, stream: Raw) -> Result<()> {
        handle.bind(stream)
    }
}

/// A rocBLAS handle of one device, pooled per device by the shared GPU layer (a stream takes
/// one for its first matmul and gives it back once its work ran; never destroyed).
pub struct RocblasHandle(crate::ffi::Handle);

// SAFETY: a rocBLAS handle may be used from any thread, by one at a time (the stream that holds
// it serialises its use under its lock).
unsafe impl Send for RocblasHandle {}

impl RocblasHandle {
    /// A handle of the current device.
    pub(crate) fn new() -> Result<RocblasHandle> {
        let (api, _) = crate::loader::rocblas()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the device is current.
        blas_status("rocblas_create_handle", unsafe {
            (api.create_handle)(&mut h)
        })?;
        Ok(RocblasHandle(h))
    }

    /// Makes later calls with this handle run on `stream`.
    pub(crate) fn bind(&self, stream: Raw) -> Result<()> {
        let (api, _) = crate::loader::rocblas()?;
        // SAFETY: a live handle and stream of its device.
        blas_status("rocblas_set_stream", unsafe {
            (api.set_stream)(self.0, stream.0)
        })
    }
}

/// Queues one strided-batched GEMM through rocBLAS on the handle's stream.
///
/// # Safety
/// `Runtime::blas_gemm`'s contract: `bc` was validated against its buffers, which are kept
/// until the work ran.
pub(crate) unsafe fn rocblas_gemm(h: &RocblasHandle, bc: &BlasCall) -> Result<()> {
    let (api, _) = crate::loader::rocblas()?;
    let (data, compute) = match bc.dtype {
        DType::F64 => (crate::ffi::ROCBLAS_F64, crate::ffi::ROCBLAS_F64),
        DType::F16 => (crate::ffi::ROCBLAS_F16, crate::ffi::ROCBLAS_F32),
        DType::Bf16 => (crate::ffi::ROCBLAS_BF16, crate::ffi::ROCBLAS_F32),
        _ => (crate::ffi::ROCBLAS_F32, crate::ffi::ROCBLAS_F32),
    };
    let (g, (alpha, beta)) = (bc.gemm, bc.scalars());
    // SAFETY: the caller's contract covers the operands; alpha/beta are host values read during
    // the call (the default pointer mode), beta = 0 makes rocBLAS not read C, and D is C
    // (rocBLAS allows them to alias with equal layouts).
    let st = unsafe {
        (api.gemm_strided_batched_ex)(
            h.0,
            blas_op(g.op_a),
            blas_op(g.op_b),
            g.m,
            g.n,
            g.k,
            alpha,
            bc.pb as *const _,
            data,
            g.lda,
            g.stride_a,
            bc.pa as *const _,
            data,
            g.ldb,
            g.stride_b,
            beta,
            bc.pc as *const _,
            data,
            g.ldc,
            g.stride_c,
            bc.pc as *mut _,
            data,
            g.ldc,
            g.stride_c,
            g.count,
            compute,
            crate::ffi::ROCBLAS_GEMM_ALGO_STANDARD,
            0,
            0,
        )
    };
    blas_status("rocblas_gemm_strided_batched_ex", st)
}
