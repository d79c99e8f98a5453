//! Device and page-locked host allocations of a GPU runtime.

use crate::device::Core;
use crate::runtime::Runtime;
use std::any::Any;
use std::sync::Arc;
use unihal_hal::{DeviceAllocation, DeviceId, HostAllocation};

/// Device memory from [`Runtime::malloc`] or [`Runtime::malloc_async`] (none for zero bytes).
/// Freed when dropped: the HAL keeps a handle in every queued operation that uses it, so no
/// queued work can still touch it by then (which is also the condition under which CUDA and HIP
/// allow a plain free of pool memory, without synchronising).
pub struct GpuAllocation<R: Runtime> {
    pub(crate) core: Arc<Core<R>>,
    pub(crate) ptr: u64,
    pub(crate) len: u64,
    /// From a stream-ordered pool ([`Runtime::malloc_async`]).
    pub(crate) pooled: bool,
    /// Another library's memory (`Device::import_memory`): never freed here; its owner is
    /// dropped with the allocation.
    pub(crate) foreign: Option<unihal_hal::Keep>,
    /// A graph allocation (a memory node of this capture, [`crate::stream::GpuStream`]'s
    /// `alloc_async` while capturing): the address is mapped only while a replay runs between
    /// its allocation and free nodes, so the graph owns the memory and only work of the same
    /// capture may use it; never freed here.
    pub(crate) graph: Option<unihal_hal::CaptureId>,
}

// SAFETY: `ptr..ptr+len` is device memory this object owns until drop; fields never change.
unsafe impl<R: Runtime> DeviceAllocation for GpuAllocation<R> {
    fn device(&self) -> DeviceId {
        self.core.id
    }
    fn addr(&self) -> u64 {
        self.ptr
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<R: Runtime> Drop for GpuAllocation<R> {
    fn drop(&mut self) {
        if self.ptr == 0 || self.foreign.is_some() || self.graph.is_some() {
            return;
        }
        let (core, ptr, pooled) = (self.core.clone(), self.ptr, self.pooled);
        crate::deferred::release(move || {
            let rt = core.rt;
            core.release("free", move || {
                // A free is capture-unsafe: made for the backend's own bookkeeping, it must not
                // invalidate (or fail in) a capture active meanwhile.
                crate::graph::relaxed(rt, || {
                    // SAFETY: allocated by this runtime on this device and freed exactly once,
                    // here (a retried release runs only when the earlier attempt did not),
                    // after every queued use (see the type's doc).
                    unsafe { rt.free(ptr, pooled) }
                })
            });
        });
    }
}

/// Page-locked host memory from [`Runtime::host_alloc`] (none for zero bytes), zeroed before
/// safe code can see it.
pub struct PinnedHost<R: Runtime> {
    pub(crate) core: Arc<Core<R>>,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: the pointer is owned memory, accessed through the HAL's HostBuffer rules only.
unsafe impl<R: Runtime> Send for PinnedHost<R> {}
// SAFETY: as above.
unsafe impl<R: Runtime> Sync for PinnedHost<R> {}

// SAFETY: `ptr..ptr+len` is host memory this object owns until drop.
unsafe impl<R: Runtime> HostAllocation for PinnedHost<R> {
    fn device(&self) -> DeviceId {
        self.core.id
    }
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<R: Runtime> Drop for PinnedHost<R> {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let (core, ptr) = (self.core.clone(), self.ptr as usize);
        crate::deferred::release(move || {
            let rt = core.rt;
            core.release("free host", move || {
                // As for device memory: never refused by an active capture.
                crate::graph::relaxed(rt, || {
                    // SAFETY: allocated by host_alloc and freed exactly once, here (a retried
                    // release runs only when the earlier attempt did not); the HAL keeps a
                    // handle in every queued copy that uses it.
                    unsafe { rt.host_free(ptr as *mut u8) }
                })
            });
        });
    }
}
