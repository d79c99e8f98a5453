//! Device memory as host allocations tracked in a table. Device addresses are the host addresses
//! of the allocations (so host kernels dereference them directly), 256-byte aligned as CUDA
//! guarantees. Every access is checked against a live allocation; frees of unknown, already
//! freed or in-use addresses are errors; a capacity gives out-of-memory.

use crate::error::{SimError, SimResult};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashSet};

/// Alignment of every allocation.
pub const ALIGN: usize = 256;

struct Alloc {
    len: u64,
    layout: Layout,
}

/// The allocation table of one simulated device. Not thread-safe by itself: the simulator holds
/// it under its lock.
pub struct Memory {
    live: BTreeMap<u64, Alloc>,
    freed: HashSet<u64>,
    /// Allocations a graph made (its memory-allocation nodes): freeing one parks it instead of
    /// returning it, so that the graph's next replay allocates it at the same address again.
    reserved: HashSet<u64>,
    /// Reserved allocations not allocated now (between a free and the next replay's allocation):
    /// no access reaches them.
    parked: BTreeMap<u64, Alloc>,
    capacity: u64,
    used: u64,
}

impl Memory {
    /// An empty table with `capacity` bytes.
    pub fn new(capacity: u64) -> Memory {
        Memory {
            live: BTreeMap::new(),
            freed: HashSet::new(),
            reserved: HashSet::new(),
            parked: BTreeMap::new(),
            capacity,
            used: 0,
        }
    }

    /// (free, total) bytes.
    pub fn info(&self) -> (u64, u64) {
        (self.capacity - self.used, self.capacity)
    }

    /// Allocates `len` zeroed bytes (at least one byte is reserved for `len == 0`).
    ///
    /// # Errors
    /// [`SimError::OutOfMemory`] beyond the capacity (or when the host refuses).
    pub fn alloc(&mut self, len: u64) -> SimResult<u64> {
        let free = self.capacity - self.used;
        let oom = SimError::OutOfMemory {
            requested: len,
            free,
        };
        if len > free {
            return Err(oom);
        }
        let size = usize::try_from(len.max(1)).map_err(|_| oom.clone())?;
        let layout = Layout::from_size_align(size, ALIGN).map_err(|_| oom.clone())?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(oom);
        }
        let addr = p as u64;
        self.freed.remove(&addr);
        self.live.insert(addr, Alloc { len, layout });
        crate::fault::track(&crate::fault::LIVE_ALLOCATIONS, 1);
        crate::fault::track(&crate::fault::LIVE_BYTES, len as i64);
        self.used += len;
        Ok(addr)
    }

    /// Frees the allocation starting at `addr`.
    ///
    /// # Errors
    /// [`SimError::DoubleFree`] for an address freed before (and not reused),
    /// [`SimError::InvalidValue`] for an address that is not the start of an allocation.
    pub fn free(&mut self, addr: u64) -> SimResult<()> {
        if self.reserved.contains(&addr) {
            let a = self.live.remove(&addr).ok_or(SimError::DoubleFree(addr))?;
            self.parked.insert(addr, a);
            return Ok(());
        }
        let Some(a) = self.live.remove(&addr) else {
            return Err(if self.freed.contains(&addr) {
                SimError::DoubleFree(addr)
            } else {
                SimError::InvalidValue(format!("{addr:#x} is not the start of an allocation"))
            });
        };
        self.used -= a.len;
        self.freed.insert(addr);
        crate::fault::track(&crate::fault::LIVE_ALLOCATIONS, -1);
        crate::fault::track(&crate::fault::LIVE_BYTES, -(a.len as i64));
        // SAFETY: `addr` came from `alloc_zeroed` with this layout and is removed from the table,
        // so nothing checked against the table can reach it any more.
        unsafe { std::alloc::dealloc(addr as *mut u8, a.layout) };
        Ok(())
    }

    /// Allocates `len` bytes for a graph's memory-allocation node: reserved for the graph, and
    /// parked (not accessible) until a replay allocates it ([`Memory::unpark`]).
    ///
    /// # Errors
    /// As [`Memory::alloc`].
    pub fn reserve(&mut self, len: u64) -> SimResult<u64> {
        let addr = self.alloc(len)?;
        let a = self.live.remove(&addr).expect("just allocated");
        self.parked.insert(addr, a);
        self.reserved.insert(addr);
        Ok(addr)
    }

    /// A replay's allocation of reserved memory at its address.
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] when it is allocated already (a previous replay's allocation
    /// was never freed) or not reserved.
    pub fn unpark(&mut self, addr: u64) -> SimResult<()> {
        let a = self.parked.remove(&addr).ok_or_else(|| {
            SimError::InvalidValue(format!(
                "graph allocation {addr:#x} is still allocated (a previous launch's allocation was \
                 not freed)"
            ))
        })?;
        self.live.insert(addr, a);
        Ok(())
    }

    /// Ends a graph's reservation (the graph is gone): parked memory is returned; memory allocated
    /// now stays allocated until freed, as CUDA's graph allocations outlive their graph.
    pub fn unreserve(&mut self, addr: u64) {
        if !self.reserved.remove(&addr) {
            return;
        }
        if let Some(a) = self.parked.remove(&addr) {
            self.live.insert(addr, a);
            let _ = self.free(addr);
        }
    }

    /// True when `[addr, addr + len)` lies inside an allocation that is live or reserved for a
    /// graph (what captured work may name).
    pub fn check_reserved(&self, addr: u64, len: u64) -> bool {
        if self.check(addr, len).is_ok() {
            return true;
        }
        self.parked
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, a)| addr.checked_add(len).is_some_and(|e| e <= start + a.len))
    }

    /// The start of the live allocation that holds `[addr, addr + len)`.
    ///
    /// # Errors
    /// [`SimError::IllegalAddress`] when no live allocation holds the whole range.
    pub fn check(&self, addr: u64, len: u64) -> SimResult<u64> {
        let bad = SimError::IllegalAddress { addr, len };
        let (&start, a) = self.live.range(..=addr).next_back().ok_or(bad.clone())?;
        let end = addr.checked_add(len).ok_or(bad.clone())?;
        if end > start + a.len {
            return Err(bad);
        }
        Ok(start)
    }

    /// True when `addr` lies inside a live allocation (or is the start of an empty one).
    pub fn holds(&self, addr: u64) -> bool {
        self.live
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, a)| addr == start || addr < start + a.len)
    }

    /// Copies host bytes into device memory.
    ///
    /// # Errors
    /// As [`Memory::check`].
    pub fn write(&mut self, addr: u64, src: &[u8]) -> SimResult<()> {
        self.check(addr, src.len() as u64)?;
        // SAFETY: the range lies inside a live allocation owned by this table; `&mut self` means
        // no other access runs.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
        Ok(())
    }

    /// Copies device memory into host bytes.
    ///
    /// # Errors
    /// As [`Memory::check`].
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> SimResult<()> {
        self.check(addr, dst.len() as u64)?;
        // SAFETY: the range lies inside a live allocation; the simulator's lock orders accesses.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `len` bytes between device ranges (overlap allowed, as a memmove).
    ///
    /// # Errors
    /// As [`Memory::check`] for either range.
    pub fn copy(&mut self, dst: u64, src: u64, len: u64) -> SimResult<()> {
        self.check(src, len)?;
        self.check(dst, len)?;
        // SAFETY: both ranges lie inside live allocations; `copy` allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        Ok(())
    }

    /// Sets `count` elements of `width` bytes (1, 2 or 4) to `value`.
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] for another width; as [`Memory::check`].
    pub fn fill(&mut self, addr: u64, value: u32, width: u64, count: u64) -> SimResult<()> {
        if !matches!(width, 1 | 2 | 4) {
            return Err(SimError::InvalidValue(format!("fill width {width}")));
        }
        let len = count.checked_mul(width).ok_or(SimError::IllegalAddress {
            addr,
            len: u64::MAX,
        })?;
        self.check(addr, len)?;
        let bytes = value.to_le_bytes();
        for i in 0..len {
            // SAFETY: inside the checked range.
            unsafe { *((addr + i) as *mut u8) = bytes[(i % width) as usize] };
        }
        Ok(())
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        for (addr, a) in std::mem::take(&mut self.live).into_iter().chain(parked) {
            // SAFETY: every live entry came from `alloc_zeroed` with its layout.
            unsafe { std::alloc::dealloc(addr as *mut u8, a.layout) };
        }
    }
}
