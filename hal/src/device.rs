//! The device trait and the descriptive types around it.

use crate::buffer::Buffer;
use crate::caps::Capabilities;
use crate::error::Result;
use crate::event::{Event, EventFlags};
use crate::host::HostBuffer;
use crate::module::{Module, ModuleSource};
use crate::stream::{Keep, Stream};
use serde::Serialize;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Identity of a device: the backend's registry name and the ordinal within that backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct DeviceId {
    pub backend: &'static str,
    pub ordinal: u32,
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.backend, self.ordinal)
    }
}

/// Descriptive, unchanging facts about a device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceInfo {
    pub id: DeviceId,
    /// Marketing or driver name (`NVIDIA H200`, `unihal virtual CPU device 0`).
    pub name: String,
    /// Vendor (`NVIDIA`, `AMD`, `Hygon`, `Huawei`, `host`).
    pub vendor: String,
}

/// Memory use of a device at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryInfo {
    pub total: u64,
    pub free: u64,
}

/// A backend's native handle, for interop with vendor libraries (cuBLAS, NCCL, aclnn ...).
///
/// The HAL does not interpret it. The pointer stays valid while the HAL object that returned it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeHandle {
    /// No native object stands behind this HAL object (e.g. the CPU backend's context).
    None,
    /// A vendor pointer (`CUcontext`, `CUstream`, `hipStream_t`, `aclrtStream`, ...).
    Ptr(*mut std::ffi::c_void),
    /// A vendor integer handle (a device ordinal, an id).
    Int(i64),
}

// SAFETY: a NativeHandle is an opaque value that unihal never dereferences; what a caller does with it
// through a vendor library is governed by that library's threading rules, not by this type.
unsafe impl Send for NativeHandle {}
// SAFETY: as above; the handle is a plain value.
unsafe impl Sync for NativeHandle {}

/// An opened accelerator (or virtual CPU device).
///
/// Ownership: held as `Arc<dyn Device>`; buffers, streams, events and modules it creates keep it alive.
/// Thread safety: every method may be called from any host thread at any time; the backend makes its
/// context current itself.
pub trait Device: Send + Sync {
    /// This device's identity.
    fn id(&self) -> DeviceId;

    /// Name and vendor.
    fn info(&self) -> &DeviceInfo;

    /// What the device can do; stable for the device's lifetime.
    fn capabilities(&self) -> &Capabilities;

    /// Current total and free memory.
    ///
    /// # Errors
    /// [`crate::HalError::Vendor`] or [`crate::HalError::DeviceLost`] when the query fails.
    fn memory_info(&self) -> Result<MemoryInfo>;

    /// Allocates `len` bytes of device memory. Contents: zeroed on the CPU backend (where device
    /// memory is host memory that copies hand to safe code); unspecified but initialised on GPU
    /// backends, as `cuMemAlloc` gives it (observable only through copies, never as a Rust
    /// reference). `len == 0` gives a valid empty
    /// buffer. The memory is freed when the last handle to it, including those held by queued work,
    /// is gone, or earlier in stream order by `Stream::free_async`.
    ///
    /// Capture-unsafe (see [`crate::graph`]): refused while a capture in
    /// [`crate::CaptureMode::Global`] is active on the device, or one in
    /// [`crate::CaptureMode::ThreadLocal`] begun by this thread (allocate with
    /// `Stream::alloc_async` inside a capture, or before it).
    ///
    /// # Errors
    /// [`crate::HalError::OutOfMemory`] with the request and the free bytes;
    /// [`crate::Invalid::Capture`] as above (the capture is then invalidated).
    fn alloc(&self, len: usize) -> Result<Buffer>;

    /// Allocates `len` bytes of host memory owned by the HAL (pinned where the backend can), usable
    /// as the source or destination of asynchronous copies. Zeroed on every backend: the bytes
    /// become a `&[u8]` through [`crate::HostBuffer::map`], and must never be uninitialised nor
    /// show a previous user's data.
    ///
    /// # Errors
    /// [`crate::HalError::OutOfMemory`].
    fn alloc_host(&self, len: usize) -> Result<HostBuffer>;

    /// Wraps `len` bytes at device address `addr` that another library owns (a DLPack
    /// producer's tensor) into a [`Buffer`] this device's streams accept. unihal never frees
    /// the memory: `owner` is dropped once the last handle and the last queued use of the buffer
    /// are gone (a DLPack deleter runs then). The address needs no particular alignment.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be memory this device's streams can use as device memory (host
    /// memory on the CPU backend), valid until `owner` is dropped, and not written by anyone
    /// else while queued work uses it.
    ///
    /// # Errors
    /// [`crate::HalError::Unsupported`] on a backend that cannot wrap foreign memory;
    /// [`crate::HalError::InvalidArgument`] for a null address with a non-zero length.
    unsafe fn import_memory(&self, addr: u64, len: u64, owner: Keep) -> Result<Buffer> {
        let _ = (addr, len, owner);
        Err(crate::HalError::unsupported(format!(
            "wrapping foreign memory on {}",
            self.id()
        )))
    }

    /// Told by a sub-allocator (the caching allocator) that `block`, carved out of memory this
    /// device allocated, is handed out for work on `stream`: whatever earlier blocks over the
    /// same bytes did is over, because the sub-allocator reuses a range only once its earlier
    /// work is ordered before the new owner's (see [`crate::BlockOwner`]). For layers that track
    /// memory, such as the validation layer, which then treats the hand-out as an allocation on
    /// `stream`; backends need not care (the default does nothing).
    ///
    /// Thread safety: any thread; called with no allocator lock held. Errors: none (a layer
    /// that cannot follow reports it its own way).
    fn block_handed_out(&self, block: &Buffer, stream: &Arc<dyn Stream>) {
        let _ = (block, stream);
    }

    /// Creates an in-order stream on this device.
    ///
    /// # Errors
    /// Vendor errors when the runtime cannot create one.
    fn create_stream(&self) -> Result<Arc<dyn Stream>>;

    /// Creates an event. Events record points in a stream's work, for waits and timing.
    ///
    /// # Errors
    /// Vendor errors when the runtime cannot create one.
    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>>;

    /// Loads a kernel module in one of `capabilities().mandatory.module_formats`.
    ///
    /// # Errors
    /// [`crate::HalError::Unsupported`] for a format the device does not load;
    /// [`crate::HalError::InvalidArgument`] or a vendor error for a malformed module.
    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>>;

    /// Blocks until all work on every stream of this device has completed.
    ///
    /// # Errors
    /// The first sticky asynchronous error of any of the device's streams;
    /// [`crate::Invalid::Capture`] while any stream of the device is capturing, in any mode (the
    /// capture is then invalidated).
    fn synchronize(&self) -> Result<()>;

    /// The backend's native context or device handle.
    fn native_handle(&self) -> NativeHandle;

    /// For backend-specific fast paths: downcast to the concrete type.
    fn as_any(&self) -> &dyn Any;
}

impl fmt::Debug for dyn Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({}, {:?})", self.id(), self.info().name)
    }
}
