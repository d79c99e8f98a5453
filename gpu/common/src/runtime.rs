//! What a vendor GPU runtime must provide: [`Runtime`], the raw calls under the shared device,
//! memory, stream, event and module implementations of this crate.
//!
//! A backend implements [`Runtime`] once over its symbol table (CUDA's driver API, HIP's runtime
//! API); everything above the raw calls (what queued work keeps, the HAL's argument checks, host
//! callbacks, sticky errors, deferred releases, the library ops) is written once in this crate.
//! Every method maps the vendor's failure to a [`HalError::Vendor`] naming the vendor call, so
//! the shared code never sees a vendor code.

use crate::device::GpuDevice;
use crate::library::Library;
use crate::stream::GpuStream;
use std::ffi::{c_void, CStr};
use std::sync::Arc;
use unihal_hal::{
    Capabilities, CaptureId, CaptureMode, DType, DeviceInfo, FillValue, HalError, ModuleSource,
    NativeHandle, OpCall, Result,
};

/// A raw handle of a vendor runtime (a stream, an event, a module or a function): an opaque
/// pointer, never dereferenced on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Raw(pub *mut c_void);

// SAFETY: the vendor runtimes' stream, event, module and function handles may be used from any
// thread (CUDA and HIP document their APIs as thread-safe); `Raw` is only passed back to them.
unsafe impl Send for Raw {}
// SAFETY: as above; a `Raw` is an immutable value.
unsafe impl Sync for Raw {}

impl Raw {
    /// The null handle (a runtime's default stream, or "none").
    pub const NULL: Raw = Raw(std::ptr::null_mut());
}

/// A host function as the runtimes queue it: called once with its data pointer.
pub type HostFn = unsafe extern "C" fn(*mut c_void);

/// A device the backend opened: what the shared [`GpuDevice`] is built from.
pub struct DeviceSetup<C> {
    /// What makes the device current on a thread (CUDA: its primary context; HIP: its ordinal).
    pub ctx: C,
    /// Name, vendor and id.
    pub info: DeviceInfo,
    /// Capabilities, read from the runtime's attributes.
    pub caps: Capabilities,
}

/// A stream's capture state as the runtime reports it (`cuStreamGetCaptureInfo`,
/// `hipStreamGetCaptureInfo`): the status and the runtime's own capture sequence id (unique in the
/// process; meaningful only when not [`RawCaptureStatus::None`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawCaptureStatus {
    /// Not capturing.
    None,
    /// Capturing, into the capture with this runtime id.
    Active(u64),
    /// In a capture (this runtime id) that an illegal call invalidated.
    Invalidated(u64),
}

/// A module image ready for [`Runtime::module_load`], with the parameter sizes of its entries
/// where the format carries them (launches are then size-checked).
#[derive(Debug, Clone)]
pub struct PreparedModule {
    /// The bytes the runtime loads (NUL-terminated for text formats).
    pub image: Vec<u8>,
    /// Parameter sizes in bytes, per entry name.
    pub params: std::collections::HashMap<String, Vec<usize>>,
}

/// The raw calls of one vendor GPU runtime, and the backend's hooks for what differs between
/// vendors (module formats, the kernel library's compiler, BLAS).
///
/// Ownership: a backend keeps one instance for the process (`&'static`). Thread safety: every
/// method may be called from any thread, with the device made current by [`Runtime::enter`].
/// Errors: vendor failures as [`HalError::Vendor`] naming the call; allocation failures as
/// [`HalError::OutOfMemory`].
pub trait Runtime: Send + Sync + Sized + 'static {
    /// What binds a device to the calling thread.
    type Context: Send + Sync + 'static;
    /// A BLAS handle (bound to one stream at a time; pooled per device, never destroyed).
    type Blas: Send + 'static;

    /// The vendor's name for messages ("CUDA", "HIP").
    const VENDOR: &'static str;

    /// Runs `f` with `ctx` current on this thread (and, for a loader that may panic, panics
    /// turned into [`HalError::Unavailable`]).
    fn enter<T>(&self, ctx: &Self::Context, what: &str, f: impl FnOnce() -> Result<T>)
        -> Result<T>;
    /// The native handle of a device (`CUcontext`, HIP's ordinal).
    fn native_device(ctx: &Self::Context) -> NativeHandle;
    /// True for errors after which the device is unusable (a kernel fault): sticky on streams.
    fn poisons(&self, e: &HalError) -> bool;

    /// Waits for all work of the current device.
    fn device_synchronize(&self) -> Result<()>;
    /// Free and total bytes of the current device.
    fn mem_info(&self) -> Result<(u64, u64)>;
    /// `len > 0` bytes of device memory.
    fn malloc(&self, len: usize) -> Result<u64>;
    /// `len > 0` bytes of device memory in `stream`'s order (stream-ordered pools).
    fn malloc_async(&self, len: usize, stream: Raw) -> Result<u64>;
    /// Frees device memory from [`Runtime::malloc`] or (`pooled`) [`Runtime::malloc_async`], once
    /// no queued work uses it.
    ///
    /// # Safety
    /// `ptr` came from this runtime's allocation on the current device and is freed once.
    unsafe fn free(&self, ptr: u64, pooled: bool) -> Result<()>;
    /// `len > 0` bytes of page-locked host memory (not yet zeroed).
    fn host_alloc(&self, len: usize) -> Result<*mut u8>;
    /// Frees host memory of [`Runtime::host_alloc`].
    ///
    /// # Safety
    /// `ptr` came from [`Runtime::host_alloc`] and is freed once, after every use.
    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()>;
    /// The other devices the current one can access directly.
    fn peers(&self, ctx: &Self::Context) -> Result<Vec<u32>>;
    /// Gives the current device access to `peer`'s memory ("already enabled" is success).
    fn enable_peer(&self, peer: &Self::Context) -> Result<()>;

    /// A non-blocking stream of the current device.
    fn stream_create(&self) -> Result<Raw>;
    /// Destroys a stream; its queued work still completes.
    ///
    /// # Safety
    /// A live stream of this runtime, destroyed once.
    unsafe fn stream_destroy(&self, stream: Raw) -> Result<()>;
    /// Waits for the stream's work.
    fn stream_synchronize(&self, stream: Raw) -> Result<()>;
    /// True when the stream's work has completed (not-ready is `Ok(false)`).
    fn stream_query(&self, stream: Raw) -> Result<bool>;
    /// Makes `stream`'s later work wait for `event`'s last record (any device's event).
    fn stream_wait_event(&self, stream: Raw, event: Raw) -> Result<()>;
    /// Queues `f(data)` on `stream`, called once after the work before it completed.
    ///
    /// # Safety
    /// `f` must accept `data` once; the runtime never calls it when this fails.
    unsafe fn launch_host_fn(&self, stream: Raw, f: HostFn, data: *mut c_void) -> Result<()>;

    /// Host to device copy in stream order.
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes until the copy ran.
    unsafe fn copy_h2d(&self, dst: u64, src: *const u8, len: usize, stream: Raw) -> Result<()>;
    /// Device to host copy in stream order.
    ///
    /// # Safety
    /// As [`Runtime::copy_h2d`].
    unsafe fn copy_d2h(&self, dst: *mut u8, src: u64, len: usize, stream: Raw) -> Result<()>;
    /// Device to device copy (one device) in stream order.
    ///
    /// # Safety
    /// As [`Runtime::copy_h2d`]; the ranges are disjoint.
    unsafe fn copy_d2d(&self, dst: u64, src: u64, len: usize, stream: Raw) -> Result<()>;
    /// Copy between two devices' memories in stream order.
    ///
    /// # Safety
    /// As [`Runtime::copy_h2d`], each range on its context's device.
    unsafe fn copy_peer(
        &self,
        dst: (&Self::Context, u64),
        src: (&Self::Context, u64),
        len: usize,
        stream: Raw,
    ) -> Result<()>;
    /// Fills `count` elements of `value`'s width at `dst` in stream order.
    ///
    /// # Safety
    /// The range is valid and aligned to the width until the fill ran.
    unsafe fn fill(&self, dst: u64, value: FillValue, count: usize, stream: Raw) -> Result<()>;
    /// Launches `function` with `params` (pointers to each argument's bytes, copied during the
    /// call).
    ///
    /// # Safety
    /// The arguments match the kernel's parameters and the memory they name stays valid until
    /// the kernel ran.
    unsafe fn launch(
        &self,
        function: Raw,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        stream: Raw,
        params: &mut [*mut c_void],
    ) -> Result<()>;

    /// An event of the current device (`timing`: it records timestamps).
    fn event_create(&self, timing: bool) -> Result<Raw>;
    /// Destroys an event (pending records complete first).
    ///
    /// # Safety
    /// A live event of this runtime, destroyed once.
    unsafe fn event_destroy(&self, event: Raw) -> Result<()>;
    /// Records `event` on `stream`.
    fn event_record(&self, event: Raw, stream: Raw) -> Result<()>;
    /// True when the event's last record completed (not-ready is `Ok(false)`).
    fn event_query(&self, event: Raw) -> Result<bool>;
    /// Waits for the event's last record.
    fn event_synchronize(&self, event: Raw) -> Result<()>;
    /// Milliseconds between two completed timing events.
    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32>;

    /// Turns a HAL module source into an image this runtime loads (or says the format is not
    /// supported, naming what is).
    fn prepare_module(&self, source: &ModuleSource) -> Result<PreparedModule>;
    /// Loads a prepared image into the current device.
    fn module_load(&self, image: &[u8]) -> Result<Raw>;
    /// The entry `name` of a module; `None` when the module has no such entry.
    fn module_function(&self, module: Raw, name: &CStr) -> Result<Option<Raw>>;
    /// Unloads a module.
    ///
    /// # Safety
    /// A loaded module, unloaded once, after every launch of its functions completed.
    unsafe fn module_unload(&self, module: Raw) -> Result<()>;

    /// Compiles (or reads from the cache) and loads the portable kernel library on `device`.
    fn load_library(&self, device: &Arc<GpuDevice<Self>>) -> Result<Library>;
    /// A library op through an operator library (Ascend's aclnn), or `None` when there is none
    /// or it does not take this call: BLAS matmul ([`Runtime::blas_gemm`]) or the portable
    /// kernel library runs it then. Called after the shared checks (buffers of this device, the
    /// op × dtype in the capabilities).
    fn vendor_op(&self, _stream: &GpuStream<Self>, _call: &OpCall) -> Option<Result<()>> {
        None
    }
    /// Stream-ordered memory from the backend's own allocator, for runtimes without
    /// stream-ordered pools (ACL: the caching allocator's blocks, reused in stream order), or
    /// `None` to use [`Runtime::malloc_async`]. Called only when the device reports
    /// `stream_ordered_alloc`.
    fn stream_alloc(
        &self,
        _stream: &GpuStream<Self>,
        _len: usize,
    ) -> Option<Result<unihal_hal::Buffer>> {
        None
    }
    /// Whether the runtime has every entry stream capture and graphs need: `Err` names what it
    /// lacks (the missing symbols), and the devices then report `GraphCaps::unsupported` with
    /// it. The default: no graphs (a runtime that implements the graph calls below overrides
    /// this).
    fn graph_support(&self) -> std::result::Result<(), String> {
        Err(format!(
            "stream capture is not implemented over the {} runtime",
            Self::VENDOR
        ))
    }
    /// Whether stream-ordered allocation and free may be captured: [`Runtime::malloc_async`]
    /// and [`Runtime::free_async`] on a capturing stream record memory nodes
    /// (`cuMemAllocAsync`/`cuMemFreeAsync`, `hipMallocAsync`/`hipFreeAsync`). Asked only where
    /// [`Runtime::graph_support`] is `Ok`. The default: not.
    fn graph_mem_nodes(&self) -> bool {
        false
    }
    /// Frees `ptr` in `stream`'s order (`cuMemFreeAsync`, `hipFreeAsync`); on a capturing stream,
    /// a free node of the graph.
    ///
    /// # Safety
    /// `ptr` came from [`Runtime::malloc_async`] on the current device (in the capture `stream`
    /// is in, when it captures) and no work ordered after this point uses it.
    unsafe fn free_async(&self, _ptr: u64, _stream: Raw) -> Result<()> {
        Err(no_graphs::<Self>())
    }
    /// Begins capturing `stream` in `mode` (`cuStreamBeginCapture`).
    fn stream_begin_capture(&self, _stream: Raw, _mode: CaptureMode) -> Result<()> {
        Err(no_graphs::<Self>())
    }
    /// Ends the capture `stream` began and returns the captured graph (`cuStreamEndCapture`);
    /// the stream leaves capture whether or not this succeeds.
    fn stream_end_capture(&self, _stream: Raw) -> Result<Raw> {
        Err(no_graphs::<Self>())
    }
    /// The stream's capture status and the runtime's capture id (`cuStreamGetCaptureInfo`).
    fn stream_capture_info(&self, _stream: Raw) -> Result<RawCaptureStatus> {
        Err(no_graphs::<Self>())
    }
    /// Sets the calling thread's capture mode and returns the previous one
    /// (`cuThreadExchangeStreamCaptureMode`).
    fn exchange_capture_mode(&self, _mode: CaptureMode) -> Result<CaptureMode> {
        Err(no_graphs::<Self>())
    }
    /// An executable graph of `graph` (`cuGraphInstantiateWithFlags`, `hipGraphInstantiate`).
    fn graph_instantiate(&self, _graph: Raw) -> Result<Raw> {
        Err(no_graphs::<Self>())
    }
    /// Queues a replay of an executable graph on `stream` (`cuGraphLaunch`).
    fn graph_launch(&self, _exec: Raw, _stream: Raw) -> Result<()> {
        Err(no_graphs::<Self>())
    }
    /// The number of nodes of a graph (`cuGraphGetNodes`).
    fn graph_node_count(&self, _graph: Raw) -> Result<usize> {
        Err(no_graphs::<Self>())
    }
    /// Destroys a graph (`cuGraphDestroy`).
    ///
    /// # Safety
    /// A graph of [`Runtime::stream_end_capture`], destroyed once.
    unsafe fn graph_destroy(&self, _graph: Raw) -> Result<()> {
        Err(no_graphs::<Self>())
    }
    /// Destroys an executable graph (`cuGraphExecDestroy`).
    ///
    /// # Safety
    /// An executable graph of [`Runtime::graph_instantiate`], destroyed once, after its queued
    /// launches ran.
    unsafe fn graph_exec_destroy(&self, _exec: Raw) -> Result<()> {
        Err(no_graphs::<Self>())
    }
    /// `e` as the capture error it is, when the runtime's code is one of its capture errors
    /// (CUDA's and HIP's 900-908): [`HalError::InvalidArgument`] with
    /// [`unihal_hal::Invalid::Capture`] naming `capture()` (the capture the stream or device is
    /// in) and argument `arg`. Any other error comes back as it is (the default).
    fn capture_error(
        &self,
        e: HalError,
        _arg: &'static str,
        _capture: &dyn Fn() -> Option<CaptureId>,
    ) -> HalError {
        e
    }

    /// The element types the vendor's BLAS takes for matmul; empty (the default) when the
    /// runtime has no BLAS or it did not load. The shared stream maps every matmul it can
    /// express onto one strided-batched GEMM (`crate::gemm`) and calls [`Runtime::blas_gemm`].
    fn blas_dtypes(&self) -> &'static [DType] {
        &[]
    }
    /// A new BLAS handle of the current device.
    fn blas_create(&self) -> Result<Self::Blas> {
        Err(HalError::unsupported(format!(
            "{} has no BLAS",
            Self::VENDOR
        )))
    }
    /// Makes the handle's later calls run on `stream`.
    fn blas_bind(&self, _handle: &Self::Blas, _stream: Raw) -> Result<()> {
        Err(HalError::unsupported(format!(
            "{} has no BLAS",
            Self::VENDOR
        )))
    }
    /// Queues one strided-batched GEMM (`call`, in the shared column-major form) on the stream
    /// the handle is bound to.
    ///
    /// # Safety
    /// `call` came from `crate::gemm::BlasCall::of` (every operand's extent validated against
    /// its buffer) and the buffers are kept until the work ran; the handle is bound to a live
    /// stream of the current device.
    unsafe fn blas_gemm(&self, _handle: &Self::Blas, _call: &crate::gemm::BlasCall) -> Result<()> {
        Err(HalError::unsupported(format!(
            "{} has no BLAS",
            Self::VENDOR
        )))
    }
}

fn no_graphs<R: Runtime>() -> HalError {
    HalError::unsupported(format!("stream capture on the {} runtime", R::VENDOR))
}

/// An "unsupported module format" error naming what the runtime loads.
pub fn unsupported_format(vendor: &str, accepted: &str, source: &ModuleSource) -> HalError {
    HalError::unsupported(format!(
        "the {vendor} backend loads {accepted}, not {:?} modules",
        source.format()
    ))
}
