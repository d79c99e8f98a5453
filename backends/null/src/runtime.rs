//! The [`Runtime`] implementation: the raw calls of the vendor's runtime under the shared GPU
//! layer. Each must do exactly what its doc comment on `Runtime` says, map the vendor's failure
//! to a `HalError::Vendor` naming the vendor call ([`crate::conv`]), and report out-of-memory as
//! `HalError::OutOfMemory`.
//!
//! The null runtime implements none: each call is `Unsupported`, naming the vendor calls it maps
//! to and the conformance cases that check it. Replace them in milestone order (docs/PORTING.md):
//! memory, streams, events and host callbacks together (the memory cases need streams, streams
//! need events), then modules and launches, then library ops, then collectives.

use crate::conv::unimplemented;
use std::ffi::{c_void, CStr};
use std::sync::Arc;
use unihal_gpu::device::GpuDevice;
use unihal_gpu::library::Library;
use unihal_gpu::runtime::{HostFn, PreparedModule, Raw, Runtime};
use unihal_gpu::stream::GpuStream;
use unihal_hal::{DeviceId, FillValue, HalError, ModuleSource, NativeHandle, Result};

/// The null runtime (stateless; a port's holds its symbol table and what its loader found).
#[derive(Debug, Default)]
pub struct Null;

/// The one instance devices refer to.
pub static NULL: Null = Null;

/// A device of the null runtime, in the shared GPU layer.
pub type NullDevice = GpuDevice<Null>;
/// A stream of the null runtime, in the shared GPU layer.
pub type NullStream = GpuStream<Null>;

/// What makes a device current on a thread (CUDA: its primary context; HIP and ACL: its
/// ordinal, through `hipSetDevice` / `aclrtSetDevice`).
#[derive(Debug)]
pub struct NullContext {
    /// The device.
    pub id: DeviceId,
}

impl Runtime for Null {
    type Context = NullContext;
    /// A BLAS handle; `()` until the runtime has a BLAS (then also implement `blas_dtypes`,
    /// `blas_create`, `blas_bind` and `blas_gemm`: matmul's BLAS path, `ops.matmul.*`).
    type Blas = ();
    const VENDOR: &'static str = "null";

    fn enter<T>(
        &self,
        _ctx: &NullContext,
        _what: &str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        // A port makes the device current here (cuCtxSetCurrent, hipSetDevice, aclrtSetDevice).
        f()
    }

    fn native_device(ctx: &NullContext) -> NativeHandle {
        NativeHandle::Int(ctx.id.ordinal as i64)
    }

    fn poisons(&self, _e: &HalError) -> bool {
        // True for the vendor's codes after which the device is unusable (a kernel fault).
        false
    }

    fn device_synchronize(&self) -> Result<()> {
        Err(unimplemented(
            "device_synchronize",
            "cuCtxSynchronize, hipDeviceSynchronize, aclrtSynchronizeDevice",
            "streams.*",
        ))
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        Err(unimplemented(
            "mem_info",
            "cuMemGetInfo, hipMemGetInfo, aclrtGetMemInfo",
            "memory.alloc.*",
        ))
    }

    fn malloc(&self, _len: usize) -> Result<u64> {
        Err(unimplemented(
            "malloc",
            "cuMemAlloc, hipMalloc, aclrtMalloc",
            "memory.alloc.*, misuse.buffer.*",
        ))
    }

    fn malloc_async(&self, _len: usize, _stream: Raw) -> Result<u64> {
        Err(unimplemented(
            "malloc_async",
            "cuMemAllocAsync, hipMallocAsync",
            "alloc.* with stream_ordered_alloc",
        ))
    }

    unsafe fn free(&self, _ptr: u64, _pooled: bool) -> Result<()> {
        Err(unimplemented(
            "free",
            "cuMemFree, hipFree/hipFreeAsync, aclrtFree",
            "memory.alloc.*",
        ))
    }

    fn host_alloc(&self, _len: usize) -> Result<*mut u8> {
        Err(unimplemented(
            "host_alloc",
            "cuMemHostAlloc, hipHostMalloc, aclrtMallocHost",
            "memory.host.*",
        ))
    }

    unsafe fn host_free(&self, _ptr: *mut u8) -> Result<()> {
        Err(unimplemented(
            "host_free",
            "cuMemFreeHost, hipHostFree, aclrtFreeHost",
            "memory.host.*",
        ))
    }

    fn peers(&self, _ctx: &NullContext) -> Result<Vec<u32>> {
        Err(unimplemented(
            "peers",
            "cuDeviceCanAccessPeer, hipDeviceCanAccessPeer, aclrtDeviceCanAccessPeer",
            "memory.copy.peer*",
        ))
    }

    fn enable_peer(&self, _peer: &NullContext) -> Result<()> {
        Err(unimplemented(
            "enable_peer",
            "cuCtxEnablePeerAccess, hipDeviceEnablePeerAccess, aclrtDeviceEnablePeerAccess",
            "memory.copy.peer*",
        ))
    }

    fn stream_create(&self) -> Result<Raw> {
        Err(unimplemented(
            "stream_create",
            "cuStreamCreate(CU_STREAM_NON_BLOCKING), hipStreamCreateWithFlags, aclrtCreateStream",
            "streams.*",
        ))
    }

    unsafe fn stream_destroy(&self, _stream: Raw) -> Result<()> {
        Err(unimplemented(
            "stream_destroy",
            "cuStreamDestroy, hipStreamDestroy, aclrtDestroyStream",
            "streams.drop*",
        ))
    }

    fn stream_synchronize(&self, _stream: Raw) -> Result<()> {
        Err(unimplemented(
            "stream_synchronize",
            "cuStreamSynchronize, hipStreamSynchronize, aclrtSynchronizeStream",
            "streams.*",
        ))
    }

    fn stream_query(&self, _stream: Raw) -> Result<bool> {
        Err(unimplemented(
            "stream_query",
            "cuStreamQuery, hipStreamQuery, aclrtStreamQuery",
            "streams.query*",
        ))
    }

    fn stream_wait_event(&self, _stream: Raw, _event: Raw) -> Result<()> {
        Err(unimplemented(
            "stream_wait_event",
            "cuStreamWaitEvent, hipStreamWaitEvent, aclrtStreamWaitEvent",
            "events.wait*",
        ))
    }

    unsafe fn launch_host_fn(&self, _stream: Raw, _f: HostFn, _data: *mut c_void) -> Result<()> {
        Err(unimplemented(
            "launch_host_fn",
            "cuLaunchHostFunc, hipLaunchHostFunc, aclrtLaunchCallback",
            "streams.host_callback.*",
        ))
    }

    unsafe fn copy_h2d(&self, _dst: u64, _src: *const u8, _len: usize, _stream: Raw) -> Result<()> {
        Err(unimplemented(
            "copy_h2d",
            "cuMemcpyHtoDAsync, hipMemcpyHtoDAsync, aclrtMemcpyAsync(HOST_TO_DEVICE)",
            "memory.copy.h2d_d2h.*",
        ))
    }

    unsafe fn copy_d2h(&self, _dst: *mut u8, _src: u64, _len: usize, _stream: Raw) -> Result<()> {
        Err(unimplemented(
            "copy_d2h",
            "cuMemcpyDtoHAsync, hipMemcpyDtoHAsync, aclrtMemcpyAsync(DEVICE_TO_HOST)",
            "memory.copy.h2d_d2h.*",
        ))
    }

    unsafe fn copy_d2d(&self, _dst: u64, _src: u64, _len: usize, _stream: Raw) -> Result<()> {
        Err(unimplemented(
            "copy_d2d",
            "cuMemcpyDtoDAsync, hipMemcpyDtoDAsync, aclrtMemcpyAsync(DEVICE_TO_DEVICE)",
            "memory.copy.d2d*",
        ))
    }

    unsafe fn copy_peer(
        &self,
        _dst: (&NullContext, u64),
        _src: (&NullContext, u64),
        _len: usize,
        _stream: Raw,
    ) -> Result<()> {
        Err(unimplemented(
            "copy_peer",
            "cuMemcpyPeerAsync, hipMemcpyPeerAsync, aclrtMemcpyAsync across devices",
            "memory.copy.peer*",
        ))
    }

    unsafe fn fill(&self, _dst: u64, _value: FillValue, _count: usize, _stream: Raw) -> Result<()> {
        Err(unimplemented(
            "fill",
            "cuMemsetD8/D16/D32Async, hipMemsetD8/D16/D32Async, aclrtMemsetAsync",
            "memory.fill.*",
        ))
    }

    unsafe fn launch(
        &self,
        _function: Raw,
        _grid: [u32; 3],
        _block: [u32; 3],
        _shared_mem: u32,
        _stream: Raw,
        _params: &mut [*mut c_void],
    ) -> Result<()> {
        Err(unimplemented(
            "launch",
            "cuLaunchKernel, hipModuleLaunchKernel, aclrtLaunchKernel",
            "kernels.launch.*",
        ))
    }

    fn event_create(&self, _timing: bool) -> Result<Raw> {
        Err(unimplemented(
            "event_create",
            "cuEventCreate, hipEventCreateWithFlags, aclrtCreateEventWithFlag",
            "events.*",
        ))
    }

    unsafe fn event_destroy(&self, _event: Raw) -> Result<()> {
        Err(unimplemented(
            "event_destroy",
            "cuEventDestroy, hipEventDestroy, aclrtDestroyEvent",
            "events.*",
        ))
    }

    fn event_record(&self, _event: Raw, _stream: Raw) -> Result<()> {
        Err(unimplemented(
            "event_record",
            "cuEventRecord, hipEventRecord, aclrtRecordEvent",
            "events.record*",
        ))
    }

    fn event_query(&self, _event: Raw) -> Result<bool> {
        Err(unimplemented(
            "event_query",
            "cuEventQuery, hipEventQuery, aclrtQueryEventStatus",
            "events.query*",
        ))
    }

    fn event_synchronize(&self, _event: Raw) -> Result<()> {
        Err(unimplemented(
            "event_synchronize",
            "cuEventSynchronize, hipEventSynchronize, aclrtSynchronizeEvent",
            "events.*",
        ))
    }

    fn event_elapsed(&self, _start: Raw, _end: Raw) -> Result<f32> {
        Err(unimplemented(
            "event_elapsed",
            "cuEventElapsedTime, hipEventElapsedTime, aclrtEventElapsedTime",
            "events.timing*",
        ))
    }

    fn prepare_module(&self, _source: &ModuleSource) -> Result<PreparedModule> {
        Err(unimplemented(
            "prepare_module",
            "the formats the runtime loads (PTX, cubin, code objects)",
            "kernels.module.*",
        ))
    }

    fn module_load(&self, _image: &[u8]) -> Result<Raw> {
        Err(unimplemented(
            "module_load",
            "cuModuleLoadData, hipModuleLoadData, aclrtBinaryLoadFromData",
            "kernels.module.*",
        ))
    }

    fn module_function(&self, _module: Raw, _name: &CStr) -> Result<Option<Raw>> {
        Err(unimplemented(
            "module_function",
            "cuModuleGetFunction, hipModuleGetFunction, aclrtBinaryGetFunction",
            "kernels.module.*",
        ))
    }

    unsafe fn module_unload(&self, _module: Raw) -> Result<()> {
        Err(unimplemented(
            "module_unload",
            "cuModuleUnload, hipModuleUnload, aclrtBinaryUnLoad",
            "kernels.module.*",
        ))
    }

    fn load_library(&self, _device: &Arc<NullDevice>) -> Result<Library> {
        Err(unimplemented("load_library", "the portable kernel library compiled by the vendor's runtime compiler (NVRTC, hiprtc) through unihal_gpu::kernel_cache", "ops.*"))
    }
}
