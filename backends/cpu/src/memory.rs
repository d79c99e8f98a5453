//! Device and host memory of the CPU backend: aligned, zeroed heap allocations with per-device
//! accounting.

use std::alloc::Layout;
use std::any::Any;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use unihal_hal::{DeviceAllocation, DeviceId, HalError, HostAllocation, Keep, Result};

/// Alignment of every allocation, as `cudaMalloc` guarantees.
pub const ALLOC_ALIGN: usize = 256;

/// A device's memory budget. Allocations reserve from it before touching the heap.
#[derive(Debug)]
pub struct MemAccount {
    used: AtomicU64,
    capacity: u64,
}

impl MemAccount {
    pub fn new(capacity: u64) -> Self {
        MemAccount {
            used: AtomicU64::new(0),
            capacity,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn free(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used.load(Ordering::Acquire))
    }

    fn reserve(&self, n: u64) -> Result<()> {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            let next = cur.checked_add(n).filter(|&v| v <= self.capacity);
            let Some(next) = next else {
                return Err(HalError::OutOfMemory {
                    requested: n,
                    free: self.capacity.saturating_sub(cur),
                });
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(()),
                Err(v) => cur = v,
            }
        }
    }

    fn release(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// An aligned, zeroed heap block reserved from a budget; dropping it frees the memory and
/// returns the reservation. Zero-sized blocks use a dangling aligned pointer and no heap.
///
/// Zeroed because safe code sees these bytes (a mapped host buffer is a `&[u8]`, and device
/// bytes reach it through copies): uninitialised memory there is undefined behaviour and would
/// show one user's old data to the next. The block comes from `alloc_zeroed` with a small
/// alignment and is aligned by hand inside a slightly larger block, so the allocator can use
/// `calloc`, whose large blocks are fresh zero pages from the kernel, faulted in lazily: zeroing
/// costs nothing up front, where an aligned allocation plus `memset` would touch every page.
struct RawBlock {
    /// The aligned first byte, `off` bytes into the heap block.
    ptr: NonNull<u8>,
    len: usize,
    /// Offset of `ptr` from the start of the heap block.
    off: usize,
    /// The heap block's layout (`len + align` bytes, small alignment); `None` for `len == 0`.
    heap: Option<Layout>,
    account: Arc<MemAccount>,
}

/// Alignment asked of the allocator: no more than `malloc`'s, so that zeroed requests are `calloc`.
const HEAP_ALIGN: usize = 8;

impl RawBlock {
    fn new(len: usize, align: usize, account: Arc<MemAccount>) -> Result<RawBlock> {
        account.reserve(len as u64)?;
        if len == 0 {
            // An aligned, non-null, never-dereferenced address.
            let ptr = NonNull::new(align as *mut u8).expect("alignment is non-zero");
            return Ok(RawBlock {
                ptr,
                len,
                off: 0,
                heap: None,
                account,
            });
        }
        let fail = |account: &MemAccount| {
            account.release(len as u64);
            HalError::OutOfMemory {
                requested: len as u64,
                free: account.free(),
            }
        };
        let Some(layout) = len
            .checked_add(align)
            .and_then(|total| Layout::from_size_align(total, HEAP_ALIGN).ok())
        else {
            return Err(fail(&account));
        };
        // SAFETY: layout has a non-zero size (len > 0 checked above).
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(fail(&account));
        }
        let off = (align - base as usize % align) % align;
        // SAFETY: off < align, so base + off .. base + off + len lies inside the len + align bytes
        // of the block.
        let ptr = unsafe { NonNull::new_unchecked(base.add(off)) };
        crate::fault::track(crate::fault::Counter::Allocations, 1);
        crate::fault::track(crate::fault::Counter::Bytes, len as i64);
        Ok(RawBlock {
            ptr,
            len,
            off,
            heap: Some(layout),
            account,
        })
    }
}

impl Drop for RawBlock {
    fn drop(&mut self) {
        if let Some(layout) = self.heap {
            // SAFETY: ptr - off is the block alloc_zeroed returned for exactly this layout, freed
            // once (RawBlock is dropped once).
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().sub(self.off), layout) };
            crate::fault::track(crate::fault::Counter::Allocations, -1);
            crate::fault::track(crate::fault::Counter::Bytes, -(self.len as i64));
        }
        self.account.release(self.len as u64);
    }
}

/// Where a CPU allocation's bytes come from.
enum Memory {
    /// Allocated and freed by this backend.
    Owned(RawBlock),
    /// Another library's (`Device::import_memory`): never freed here; the owner is dropped
    /// with the allocation.
    Foreign {
        ptr: *mut u8,
        len: usize,
        _owner: Keep,
    },
}

/// A CPU "device" allocation.
pub struct CpuAllocation {
    memory: Memory,
    device: DeviceId,
}

// SAFETY: the block is plain bytes owned by (or, when foreign, lent to) this allocation; the HAL
// never hands out references to it, and all accesses go through raw pointers in stream workers
// and kernels. A foreign owner is `Send + Sync` (a `Keep`).
unsafe impl Send for CpuAllocation {}
// SAFETY: as above.
unsafe impl Sync for CpuAllocation {}

impl CpuAllocation {
    /// Reserves `len` bytes from `account` and allocates them, zeroed.
    pub(crate) fn new(len: usize, device: DeviceId, account: Arc<MemAccount>) -> Result<Self> {
        let block = RawBlock::new(len, ALLOC_ALIGN, account)?;
        tracing::trace!(%device, len, "cpu alloc");
        Ok(CpuAllocation {
            memory: Memory::Owned(block),
            device,
        })
    }

    /// Wraps `len` bytes at `ptr` that `owner` keeps valid (see `Device::import_memory`).
    pub(crate) fn foreign(ptr: *mut u8, len: usize, device: DeviceId, owner: Keep) -> Self {
        CpuAllocation {
            memory: Memory::Foreign {
                ptr,
                len,
                _owner: owner,
            },
            device,
        }
    }

    /// First byte.
    pub fn ptr(&self) -> *mut u8 {
        match &self.memory {
            Memory::Owned(b) => b.ptr.as_ptr(),
            Memory::Foreign { ptr, .. } => *ptr,
        }
    }
}

// SAFETY: the bytes are owned by the allocation (or kept valid by its foreign owner until the
// allocation drops), and their address and length are fixed at creation.
unsafe impl DeviceAllocation for CpuAllocation {
    fn device(&self) -> DeviceId {
        self.device
    }
    fn addr(&self) -> u64 {
        self.ptr() as u64
    }
    fn len(&self) -> u64 {
        match &self.memory {
            Memory::Owned(b) => b.len as u64,
            Memory::Foreign { len, .. } => *len as u64,
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Host memory handed out by `alloc_host`: page-aligned, so it behaves like pinned memory.
pub struct CpuHostAllocation {
    block: RawBlock,
    device: DeviceId,
}

// SAFETY: plain bytes; access is arbitrated by HostBuffer's map/use protocol.
unsafe impl Send for CpuHostAllocation {}
// SAFETY: as above.
unsafe impl Sync for CpuHostAllocation {}

const PAGE: usize = 4096;

impl CpuHostAllocation {
    /// Allocates `len` page-aligned, zeroed bytes, accounted against the host budget `account`.
    pub(crate) fn new(len: usize, device: DeviceId, account: Arc<MemAccount>) -> Result<Self> {
        let block = RawBlock::new(len, PAGE, account)?;
        Ok(CpuHostAllocation { block, device })
    }
}

// SAFETY: as for CpuAllocation; the block is readable and writable host memory.
unsafe impl HostAllocation for CpuHostAllocation {
    fn device(&self) -> DeviceId {
        self.device
    }
    fn ptr(&self) -> *mut u8 {
        self.block.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.block.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounting_gives_out_of_memory_and_recovers() {
        let acc = Arc::new(MemAccount::new(1000));
        let id = DeviceId {
            backend: "cpu",
            ordinal: 0,
        };
        let a = CpuAllocation::new(600, id, acc.clone()).unwrap();
        assert_eq!(a.addr() % ALLOC_ALIGN as u64, 0);
        let e = CpuAllocation::new(500, id, acc.clone()).err().unwrap();
        assert_eq!(
            e,
            HalError::OutOfMemory {
                requested: 500,
                free: 400
            }
        );
        drop(a);
        assert_eq!(acc.free(), 1000);
        let z = CpuAllocation::new(0, id, acc.clone()).unwrap();
        assert_eq!(z.len(), 0);
    }
}
