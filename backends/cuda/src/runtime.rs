//! The CUDA driver as a [`Runtime`] of the shared GPU layer (`unihal_gpu`): each raw call once,
//! its failure named with the driver's own call name and code.

use crate::conv::{self, already_enabled, blas_op, blas_status, not_ready, out_of_memory, vendor};
use crate::device::Context;
use crate::ffi::{self, result, DriverError};
use crate::loader::guard;
use cudarc::driver::sys;
use std::ffi::{c_void, CStr, CString};
use std::sync::Arc;
use unihal_gpu::device::GpuDevice;
use unihal_gpu::gemm::BlasCall;
use unihal_gpu::library::Library;
use unihal_gpu::runtime::{
    unsupported_format, HostFn, PreparedModule, Raw, RawCaptureStatus, Runtime,
};
use unihal_gpu::stream::GpuStream;
use unihal_hal::{
    CaptureMode, DType, FillValue, HalError, Invalid, ModuleSource, NativeHandle, Result,
};

/// The CUDA driver API (stateless: the driver is process-wide, opened by [`crate::loader`]).
#[derive(Debug, Default)]
pub struct Cuda;

/// The one instance devices refer to.
pub static CUDA: Cuda = Cuda;

/// A CUDA device of the shared GPU layer.
pub type CudaDevice = GpuDevice<Cuda>;
/// A CUDA stream of the shared GPU layer.
pub type CudaStream = GpuStream<Cuda>;

fn r<T>(call: &str, x: std::result::Result<T, DriverError>) -> Result<T> {
    x.map_err(|e| vendor(call, e))
}

/// Ok(true) for success, Ok(false) for `CUDA_ERROR_NOT_READY`.
fn done(call: &str, x: std::result::Result<(), DriverError>) -> Result<bool> {
    match x {
        Ok(()) => Ok(true),
        Err(e) if not_ready(&e) => Ok(false),
        Err(e) => Err(vendor(call, e)),
    }
}

/// A raw `CUresult` of a graph entry: Ok for success, else the vendor error of `call`.
fn code(call: &str, rc: std::ffi::c_int) -> Result<()> {
    match rc {
        0 => Ok(()),
        c => Err(vendor(call, DriverError(c))),
    }
}

/// The driver's graph entries (`Unsupported` naming the missing ones).
fn graphs() -> Result<&'static ffi::GraphApi> {
    ffi::graph_api().map_err(HalError::unsupported)
}

fn oom(requested: usize) -> HalError {
    let free = result::mem_get_info().map(|(f, _)| f as u64).unwrap_or(0);
    HalError::OutOfMemory {
        requested: requested as u64,
        free,
    }
}

fn alloc(call: &str, len: usize, x: std::result::Result<u64, DriverError>) -> Result<u64> {
    x.map_err(|e| {
        if out_of_memory(&e) {
            oom(len)
        } else {
            vendor(call, e)
        }
    })
}

impl Runtime for Cuda {
    type Context = Context;
    type Blas = CublasHandle;
    const VENDOR: &'static str = "CUDA";

    fn enter<T>(&self, ctx: &Context, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        guard(what, || {
            ctx.bind()?;
            f()
        })
    }

    fn native_device(ctx: &Context) -> NativeHandle {
        NativeHandle::Ptr(ctx.raw as *mut c_void)
    }

    fn poisons(&self, e: &HalError) -> bool {
        // A kernel fault or a killed kernel leaves the context unusable.
        matches!(e, HalError::Vendor { code, library, .. }
            if library == "CUDA driver" && matches!(*code, 700 | 702 | 714..=719))
    }

    fn device_synchronize(&self) -> Result<()> {
        r("cuCtxSynchronize", result::ctx::synchronize())
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (free, total) = r("cuMemGetInfo", result::mem_get_info())?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<u64> {
        // SAFETY: a non-zero size in the current context.
        alloc("cuMemAlloc", len, unsafe { result::malloc_sync(len) })
    }

    fn malloc_async(&self, len: usize, stream: Raw) -> Result<u64> {
        // SAFETY: a non-zero size and a live stream of the current context.
        alloc("cuMemAllocAsync", len, unsafe {
            result::malloc_async(stream.0 as sys::CUstream, len)
        })
    }

    unsafe fn free(&self, ptr: u64, _pooled: bool) -> Result<()> {
        // SAFETY: the caller's contract (CUDA documents `cuMemFree` for pool memory too, without
        // synchronising, once no queued work uses it).
        r("cuMemFree", unsafe { result::free_sync(ptr) })
    }

    fn host_alloc(&self, len: usize) -> Result<*mut u8> {
        // SAFETY: a non-zero size; flags 0 = page-locked, portable to this context.
        match unsafe { result::malloc_host(len, 0) } {
            Ok(p) => Ok(p as *mut u8),
            Err(e) if out_of_memory(&e) => Err(HalError::OutOfMemory {
                requested: len as u64,
                free: 0,
            }),
            Err(e) => Err(vendor("cuMemHostAlloc", e)),
        }
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: the caller's contract.
        r("cuMemFreeHost", unsafe {
            result::free_host(ptr as *mut c_void)
        })
    }

    fn peers(&self, ctx: &Context) -> Result<Vec<u32>> {
        let count = r("cuDeviceGetCount", result::device::get_count())?;
        let mut peers = Vec::new();
        for o in (0..count).filter(|&o| o as u32 != ctx.id.ordinal) {
            let other = r("cuDeviceGet", result::device::get(o))?;
            let mut can = 0;
            // SAFETY: two valid devices and an out-pointer to a local.
            let x = unsafe { ffi::cuDeviceCanAccessPeer(&mut can, ctx.dev, other) }.result();
            r("cuDeviceCanAccessPeer", x)?;
            if can != 0 {
                peers.push(o as u32);
            }
        }
        Ok(peers)
    }

    fn enable_peer(&self, peer: &Context) -> Result<()> {
        // SAFETY: a retained primary context of another device; flags must be 0.
        match unsafe { ffi::cuCtxEnablePeerAccess(peer.raw, 0) }.result() {
            Ok(()) => Ok(()),
            Err(e) if already_enabled(&e) => Ok(()),
            Err(e) => Err(vendor("cuCtxEnablePeerAccess", e)),
        }
    }

    fn stream_create(&self) -> Result<Raw> {
        let s = r("cuStreamCreate", result::stream::create_non_blocking())?;
        Ok(Raw(s as *mut c_void))
    }

    unsafe fn stream_destroy(&self, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        r("cuStreamDestroy", unsafe {
            result::stream::destroy(stream.0 as sys::CUstream)
        })
    }

    fn stream_synchronize(&self, stream: Raw) -> Result<()> {
        // SAFETY: a live stream (streams are destroyed only when their owner drops).
        r("cuStreamSynchronize", unsafe {
            result::stream::synchronize(stream.0 as sys::CUstream)
        })
    }

    fn stream_query(&self, stream: Raw) -> Result<bool> {
        // SAFETY: a live stream.
        done(
            "cuStreamQuery",
            unsafe { ffi::cuStreamQuery(stream.0 as sys::CUstream) }.result(),
        )
    }

    fn stream_wait_event(&self, stream: Raw, event: Raw) -> Result<()> {
        // SAFETY: a live event (of any context of this process) and a live stream.
        r("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(
                stream.0 as sys::CUstream,
                event.0 as sys::CUevent,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    }

    unsafe fn launch_host_fn(&self, stream: Raw, f: HostFn, data: *mut c_void) -> Result<()> {
        // SAFETY: a live stream; the caller's contract for `f` and `data`.
        r(
            "cuLaunchHostFunc",
            unsafe { ffi::cuLaunchHostFunc(stream.0 as sys::CUstream, Some(f), data) }.result(),
        )
    }

    unsafe fn copy_h2d(&self, dst: u64, src: *const u8, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        let x = unsafe {
            ffi::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream.0 as sys::CUstream)
        };
        r("cuMemcpyHtoDAsync", x.result())
    }

    unsafe fn copy_d2h(&self, dst: *mut u8, src: u64, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        let x = unsafe {
            ffi::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream.0 as sys::CUstream)
        };
        r("cuMemcpyDtoHAsync", x.result())
    }

    unsafe fn copy_d2d(&self, dst: u64, src: u64, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        let x = unsafe { ffi::cuMemcpyDtoDAsync_v2(dst, src, len, stream.0 as sys::CUstream) };
        r("cuMemcpyDtoDAsync", x.result())
    }

    unsafe fn copy_peer(
        &self,
        dst: (&Context, u64),
        src: (&Context, u64),
        len: usize,
        stream: Raw,
    ) -> Result<()> {
        // SAFETY: the caller's contract; the contexts are retained primary contexts.
        let x = unsafe {
            ffi::cuMemcpyPeerAsync(
                dst.1,
                dst.0.raw,
                src.1,
                src.0.raw,
                len,
                stream.0 as sys::CUstream,
            )
        };
        r("cuMemcpyPeerAsync", x.result())
    }

    unsafe fn fill(&self, dst: u64, value: FillValue, count: usize, stream: Raw) -> Result<()> {
        let s = stream.0 as sys::CUstream;
        // SAFETY: the caller's contract.
        let (call, x) = unsafe {
            match value {
                FillValue::U8(v) => ("cuMemsetD8Async", ffi::cuMemsetD8Async(dst, v, count, s)),
                FillValue::U16(v) => ("cuMemsetD16Async", ffi::cuMemsetD16Async(dst, v, count, s)),
                FillValue::U32(v) => ("cuMemsetD32Async", ffi::cuMemsetD32Async(dst, v, count, s)),
            }
        };
        r(call, x.result())
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
        // SAFETY: the caller's contract; the driver copies the argument values during the call.
        let x = unsafe {
            ffi::cuLaunchKernel(
                function.0 as sys::CUfunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_mem,
                stream.0 as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        r("cuLaunchKernel", x.result())
    }

    fn event_create(&self, timing: bool) -> Result<Raw> {
        let f = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let e = r("cuEventCreate", result::event::create(f))?;
        Ok(Raw(e as *mut c_void))
    }

    unsafe fn event_destroy(&self, event: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        r("cuEventDestroy", unsafe {
            result::event::destroy(event.0 as sys::CUevent)
        })
    }

    fn event_record(&self, event: Raw, stream: Raw) -> Result<()> {
        // SAFETY: a live event and stream of the same context.
        r("cuEventRecord", unsafe {
            result::event::record(event.0 as sys::CUevent, stream.0 as sys::CUstream)
        })
    }

    fn event_query(&self, event: Raw) -> Result<bool> {
        // SAFETY: a live event.
        done("cuEventQuery", unsafe {
            result::event::query(event.0 as sys::CUevent)
        })
    }

    fn event_synchronize(&self, event: Raw) -> Result<()> {
        // SAFETY: a live event.
        r("cuEventSynchronize", unsafe {
            result::event::synchronize(event.0 as sys::CUevent)
        })
    }

    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32> {
        // SAFETY: two live, completed, timing events.
        r("cuEventElapsedTime", unsafe {
            result::event::elapsed(start.0 as sys::CUevent, end.0 as sys::CUevent)
        })
    }

    fn prepare_module(&self, source: &ModuleSource) -> Result<PreparedModule> {
        match source {
            ModuleSource::Ptx(text) => prepare_ptx(text),
            // A cubin does not carry parameter sizes here: its launches are not size-checked.
            ModuleSource::Cubin(bytes) => Ok(PreparedModule {
                image: bytes.clone(),
                params: Default::default(),
            }),
            other => Err(unsupported_format("CUDA", "PTX and cubin", other)),
        }
    }

    fn module_load(&self, image: &[u8]) -> Result<Raw> {
        // SAFETY: a NUL-terminated PTX string or a complete cubin image, alive for the call.
        let m = r("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr() as *const c_void)
        })?;
        Ok(Raw(m as *mut c_void))
    }

    fn module_function(&self, module: Raw, name: &CStr) -> Result<Option<Raw>> {
        // SAFETY: a loaded module and a NUL-terminated name.
        match unsafe { result::module::get_function(module.0 as sys::CUmodule, name) } {
            Ok(f) => Ok(Some(Raw(f as *mut c_void))),
            Err(e) if e.0 == ffi::codes::NOT_FOUND => Ok(None),
            Err(e) => Err(vendor("cuModuleGetFunction", e)),
        }
    }

    unsafe fn module_unload(&self, module: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        r("cuModuleUnload", unsafe {
            result::module::unload(module.0 as sys::CUmodule)
        })
    }

    fn load_library(&self, device: &Arc<CudaDevice>) -> Result<Library> {
        crate::device::load_library(device)
    }

    fn graph_support(&self) -> std::result::Result<(), String> {
        ffi::graph_api().map(drop)
    }

    fn graph_mem_nodes(&self) -> bool {
        // `cuMemAllocAsync` (required) and `cuMemFreeAsync` on a capturing stream record memory
        // nodes ("Graph Memory Nodes" in the CUDA Programming Guide).
        ffi::mem_free_async().is_some()
    }

    unsafe fn free_async(&self, ptr: u64, stream: Raw) -> Result<()> {
        let Some(free_async) = ffi::mem_free_async() else {
            return Err(HalError::unsupported(
                "cuMemFreeAsync (stream-ordered free): not exported by this driver",
            ));
        };
        // SAFETY: the caller's contract: memory of `cuMemAllocAsync` on the current context,
        // freed once, unused after this point of the stream's order.
        code("cuMemFreeAsync", unsafe {
            free_async(ptr, stream.0 as sys::CUstream)
        })
    }

    fn stream_begin_capture(&self, stream: Raw, mode: CaptureMode) -> Result<()> {
        let g = graphs()?;
        // SAFETY: a live stream and a documented mode.
        let rc = unsafe { (g.begin_capture)(stream.0 as sys::CUstream, conv::capture_mode(mode)) };
        code("cuStreamBeginCapture", rc)
    }

    fn stream_end_capture(&self, stream: Raw) -> Result<Raw> {
        let g = graphs()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: a live stream and an out-pointer to a local.
        let rc = unsafe { (g.end_capture)(stream.0 as sys::CUstream, &mut graph) };
        code("cuStreamEndCapture", rc)?;
        Ok(Raw(graph))
    }

    fn stream_capture_info(&self, stream: Raw) -> Result<RawCaptureStatus> {
        let g = graphs()?;
        let s = stream.0 as sys::CUstream;
        let mut status = 0;
        // SAFETY: a live stream and an out-pointer to a local.
        code("cuStreamIsCapturing", unsafe {
            (g.is_capturing)(s, &mut status)
        })?;
        if status == 0 {
            return Ok(RawCaptureStatus::None);
        }
        let (mut status, mut id) = (0, 0u64);
        use std::ptr::null_mut as null;
        // SAFETY: a live stream, out-pointers to locals; the optional outputs are NULL, which
        // every spelling documents as allowed.
        let rc = unsafe {
            match g.capture_info {
                ffi::CaptureInfoFn::V3(f) => {
                    f(s, &mut status, &mut id, null(), null(), null(), null())
                }
                ffi::CaptureInfoFn::V2(f) => f(s, &mut status, &mut id, null(), null(), null()),
                ffi::CaptureInfoFn::V1(f) => f(s, &mut status, &mut id),
            }
        };
        code("cuStreamGetCaptureInfo", rc)?;
        conv::capture_status(status, id)
    }

    fn exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode> {
        let g = graphs()?;
        let mut m = conv::capture_mode(mode);
        // SAFETY: an in/out pointer to a local holding a documented mode.
        code("cuThreadExchangeStreamCaptureMode", unsafe {
            (g.exchange_mode)(&mut m)
        })?;
        conv::capture_mode_of(m).ok_or_else(|| {
            HalError::Internal(format!(
                "cuThreadExchangeStreamCaptureMode returned an undocumented mode {m}"
            ))
        })
    }

    fn graph_instantiate(&self, graph: Raw) -> Result<Raw> {
        let g = graphs()?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: a live graph, an out-pointer to a local, no flags.
        code("cuGraphInstantiateWithFlags", unsafe {
            (g.instantiate)(&mut exec, graph.0, 0)
        })?;
        Ok(Raw(exec))
    }

    fn graph_launch(&self, exec: Raw, stream: Raw) -> Result<()> {
        let g = graphs()?;
        // SAFETY: a live executable graph and a live stream of its context.
        code("cuGraphLaunch", unsafe {
            (g.launch)(exec.0, stream.0 as sys::CUstream)
        })
    }

    fn graph_node_count(&self, graph: Raw) -> Result<usize> {
        let g = graphs()?;
        let mut n = 0usize;
        // SAFETY: a live graph; NULL nodes asks for the count alone.
        code("cuGraphGetNodes", unsafe {
            (g.get_nodes)(graph.0, std::ptr::null_mut(), &mut n)
        })?;
        Ok(n)
    }

    unsafe fn graph_destroy(&self, graph: Raw) -> Result<()> {
        let g = graphs()?;
        // SAFETY: the caller's contract.
        code("cuGraphDestroy", unsafe { (g.destroy)(graph.0) })
    }

    unsafe fn graph_exec_destroy(&self, exec: Raw) -> Result<()> {
        let g = graphs()?;
        // SAFETY: the caller's contract.
        code("cuGraphExecDestroy", unsafe { (g.exec_destroy)(exec.0) })
    }

    fn capture_error(
        &self,
        e: HalError,
        arg: &'static str,
        capture: &dyn Fn() -> Option<unihal_hal::CaptureId>,
    ) -> HalError {
        conv::capture_error(e, arg, capture)
    }

    fn blas_dtypes(&self) -> &'static [unihal_hal::DType] {
        if crate::loader::cublas_available() {
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
        unsafe { cublas_gemm(handle, call) }
    }

    fn blas_create(&self) -> Result<Self::Blas> {
        CublasHandle::new()
    }

    fn blas_bind(&self, handle: &Self::Blas, stream: Raw) -> Result<()> {
        handle.bind(stream.0 as sys::CUstream)
    }
}

/// PTX text as a NUL-terminated image, with its entries' parameter sizes.
///
/// # Errors
/// [`HalError::InvalidArgument`] for PTX that cannot be read or contains NUL.
pub(crate) fn prepare_ptx(text: &str) -> Result<PreparedModule> {
    let bad = |why: String| {
        HalError::invalid(
            "source",
            Invalid::Value {
                value: why,
                accepted: "NUL-free PTX text with readable entries".into(),
            },
        )
    };
    let entries = unihal_kernels::rtc::ptx_signatures(text).map_err(bad)?;
    let c = CString::new(text).map_err(|_| bad("PTX text with a NUL byte".into()))?;
    Ok(PreparedModule {
        image: c.into_bytes_with_nul(),
        params: entries
            .into_iter()
            .map(|e| (e.name, e.param_sizes))
            .collect(),
    })
}

/// A cuBLAS handle of one device. A stream takes one for its first matmul and hands it back to
/// its device's pool once the work queued on it has run, so handles are never destroyed
/// (`cublasDestroy` synchronises the whole device, which a stream's release must not do) and
/// no handle's workspace is shared by two streams' work at once.
pub struct CublasHandle(pub(crate) usize);

impl CublasHandle {
    /// Creates a handle in the current context.
    pub(crate) fn new() -> Result<CublasHandle> {
        guard("cublasCreate", || {
            let mut h: cudarc::cublas::sys::cublasHandle_t = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local; the device's context is current.
            let st = unsafe { cudarc::cublas::sys::cublasCreate_v2(&mut h) };
            blas_status("cublasCreate", st)?;
            Ok(CublasHandle(h as usize))
        })
    }

    /// Makes later calls with this handle run on `stream` (of the handle's context).
    pub(crate) fn bind(&self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        guard("cublasSetStream", || {
            // SAFETY: a live handle and stream of its context.
            let st = unsafe {
                cudarc::cublas::sys::cublasSetStream_v2(
                    self.0 as cudarc::cublas::sys::cublasHandle_t,
                    stream as _,
                )
            };
            blas_status("cublasSetStream", st)
        })
    }
}

/// Queues one strided-batched GEMM through cuBLAS on the handle's stream.
///
/// # Safety
/// `Runtime::blas_gemm`'s contract: `bc` was validated against its buffers, which are kept
/// until the work ran.
pub(crate) unsafe fn cublas_gemm(h: &CublasHandle, bc: &BlasCall) -> Result<()> {
    let (data, compute) = match bc.dtype {
        DType::F64 => (
            cudarc::cublas::sys::cudaDataType::CUDA_R_64F,
            cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_64F,
        ),
        DType::F16 => (
            cudarc::cublas::sys::cudaDataType::CUDA_R_16F,
            cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::Bf16 => (
            cudarc::cublas::sys::cudaDataType::CUDA_R_16BF,
            cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        _ => (
            cudarc::cublas::sys::cudaDataType::CUDA_R_32F,
            cudarc::cublas::sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
    };
    let (g, (alpha, beta)) = (bc.gemm, bc.scalars());
    guard("cublasGemmStridedBatchedEx", || {
        // SAFETY: the caller's contract covers the operands; alpha/beta are host values read
        // during the call, and beta = 0 makes cuBLAS not read C (as the HAL requires).
        let st = unsafe {
            cudarc::cublas::sys::cublasGemmStridedBatchedEx(
                h.0 as cudarc::cublas::sys::cublasHandle_t,
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
                bc.pc as *mut _,
                data,
                g.ldc,
                g.stride_c,
                g.count,
                compute,
                cudarc::cublas::sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        blas_status("cublasGemmStridedBatchedEx", st)
    })
}
