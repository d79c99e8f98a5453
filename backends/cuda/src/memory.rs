//! Device and pinned host allocations of the CUDA backend.

use crate::context::Context;
use crate::conv::vendor;
use crate::drv::result;
use cudarc::driver::sys;
use std::any::Any;
use std::sync::Arc;
use unihal_hal::{DeviceAllocation, DeviceId, HostAllocation};

/// A `cuMemAlloc` or `cuMemAllocAsync` allocation (none for zero bytes). Freed with `cuMemFree`
/// when dropped: the HAL keeps a handle in every queued operation that uses it, so no queued work
/// can still touch it by then (which is also the condition under which CUDA allows `cuMemFree` on
/// pool memory, without synchronising).
pub struct CudaAllocation {
    pub(crate) ctx: Arc<Context>,
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) len: u64,
}

// SAFETY: `ptr..ptr+len` is device memory this object owns until drop; fields never change.
unsafe impl DeviceAllocation for CudaAllocation {
    fn device(&self) -> DeviceId {
        self.ctx.id
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

impl Drop for CudaAllocation {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        let (ctx, ptr) = (self.ctx.clone(), self.ptr);
        crate::deferred::release(move || {
            let r = ctx.bind().and_then(|()| {
                // SAFETY: allocated by cuMemAlloc(Async) in this context and freed exactly once, here,
                // after every queued use (see the type's doc).
                unsafe { result::free_sync(ptr) }.map_err(|e| vendor("cuMemFree", e))
            });
            if let Err(e) = r {
                tracing::warn!(target: "unihal::cuda", "freeing device memory failed: {e}");
            }
        });
    }
}

/// Page-locked host memory from `cuMemHostAlloc` (none for zero bytes).
pub struct PinnedHost {
    pub(crate) ctx: Arc<Context>,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: the pointer is owned memory, accessed through the HAL's HostBuffer rules only.
unsafe impl Send for PinnedHost {}
// SAFETY: as above.
unsafe impl Sync for PinnedHost {}

// SAFETY: `ptr..ptr+len` is host memory this object owns until drop.
unsafe impl HostAllocation for PinnedHost {
    fn device(&self) -> DeviceId {
        self.ctx.id
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

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let (ctx, ptr) = (self.ctx.clone(), self.ptr as usize);
        crate::deferred::release(move || {
            let r = ctx.bind().and_then(|()| {
                // SAFETY: allocated by cuMemHostAlloc and freed exactly once, here; the HAL keeps
                // a handle in every queued copy that uses it.
                unsafe { result::free_host(ptr as *mut std::ffi::c_void) }
                    .map_err(|e| vendor("cuMemFreeHost", e))
            });
            if let Err(e) = r {
                tracing::warn!(target: "unihal::cuda", "freeing pinned memory failed: {e}");
            }
        });
    }
}
