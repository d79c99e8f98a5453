//! Device memory: the RAII [`Buffer`] and the backend-side [`DeviceAllocation`].
//!
//! A `Buffer` is a cheap, clonable handle to a range of one allocation: an opaque device address, a
//! length and the owning device. Safe code never gets a Rust reference into device memory. The
//! allocation is released when the last handle is dropped; queued work holds handles of its own, so
//! dropping a buffer whose data a queued operation still uses is safe (the free waits for that work).
//! `Stream::free_async` frees earlier, in stream order, and marks every handle of the allocation as
//! unusable.
//!
//! Sub-allocators (the caching allocator) carve blocks out of a backend allocation with
//! [`Segment::block`]: a block is a `Buffer` every backend accepts, with handles of its own.
//! Queued work holds a block through [`Buffer::use_on`], which records the stream, so the block's
//! [`BlockOwner`] learns when the last handle is gone while only one stream's queued work still
//! uses it: the range may then serve new work on that stream at once, and other streams once the
//! work has completed, with nothing for the user to record.

use crate::device::DeviceId;
use crate::error::{check_range, HalError, Invalid, Result};
use crate::stream::{Keep, StreamId};
// The lease protocol (handles, queued uses, reclaim) is built on `crate::sync`, so that the loom
// build checks it (hal/tests/loom.rs); the backend allocation and the owner it reaches stay on
// `std`'s `Arc` (loom's cannot hold a trait object made by coercion, and they take no part in
// the protocol).
use crate::sync::{fence, Arc as SharedArc, AtomicBool, AtomicUsize, Mutex, Ordering};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// One device allocation, implemented by a backend. Dropping it returns the memory to the device.
///
/// Thread safety: shared between host threads and stream workers, hence `Send + Sync`.
///
/// # Safety
/// Implementers promise that `addr()..addr()+len()` is device memory owned by this object for its
/// whole life, and that `device`, `addr` and `len` never change. Backends trust these values when
/// they touch memory.
pub unsafe trait DeviceAllocation: Send + Sync + 'static {
    /// The device that owns the memory.
    fn device(&self) -> DeviceId;
    /// Device address of the first byte (opaque to the HAL; a host address on the CPU backend).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> u64;
    /// True for a zero-length allocation.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}

/// The queued uses a block still has when its last handle is dropped (see [`BlockOwner`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingUses {
    /// None: nothing can reach the block any more.
    None,
    /// Only work queued on this stream.
    OneStream(StreamId),
    /// Work queued on several streams.
    Several,
}

/// What a [`BlockOwner`] did with a block whose handles are gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    /// Nothing yet: [`BlockOwner::retired`] follows with `early == false` once the queued uses
    /// are gone.
    Later,
    /// Took the whole block back (only with [`PendingUses::None`]); nothing follows.
    Now,
    /// Took the block back for work on the one stream of [`PendingUses::OneStream`];
    /// [`BlockOwner::retired`] follows with `early == true` once the queued uses are gone.
    ForStream,
}

/// The owner of sub-allocated buffers (a caching allocator): told when a block's last handle
/// is gone and when its last queued use is, so that it can reuse the range. See
/// [`Segment::block`].
///
/// Thread safety: called from any thread (a host thread dropping a handle, a stream worker or a
/// stream's release of completed work); never with a HAL lock held, so an owner may take its own
/// lock, but must not call into a device or stream from these methods.
pub trait BlockOwner: Send + Sync + 'static {
    /// Every [`Buffer`] handle of block `token` is gone; `pending` says which streams' queued
    /// work (keeps made by [`Buffer::use_on`]) still uses it. No new work can reach the block
    /// through its handles any more, so with [`PendingUses::OneStream`] its range may serve new
    /// work on that stream at once: stream order puts that work after the queued uses.
    fn handles_dropped(&self, token: u64, pending: PendingUses) -> Reclaim;
    /// Every handle and every queued use of block `token` is gone: the range is idle. `early` is
    /// true when [`BlockOwner::handles_dropped`] answered [`Reclaim::ForStream`]. Not called
    /// after [`Reclaim::Now`].
    fn retired(&self, token: u64, early: bool);
}

/// What a sub-allocated buffer shares with its owner.
struct Lease {
    segment: Arc<SegmentInner>,
    token: u64,
    /// Live `Buffer` handles (not counting keeps of queued work).
    handles: AtomicUsize,
    /// Queued uses per stream (keeps made by [`Buffer::use_on`]); entries with a count only.
    uses: Mutex<Vec<(StreamId, usize)>>,
    /// The sum of `uses`' counts, so that a block never used by queued work is released
    /// without taking the lock.
    live_uses: AtomicUsize,
    /// What `handles_dropped` answered (one of the `RECLAIM_*` values; `Later` until then).
    reclaim: AtomicUsize,
}

const RECLAIM_LATER: usize = 0;
const RECLAIM_NOW: usize = 1;
const RECLAIM_FOR_STREAM: usize = 2;

/// The memory a [`Shared`] stands for.
enum Memory {
    /// A whole backend allocation.
    Whole(Arc<dyn DeviceAllocation>),
    /// A block of a [`Segment`].
    Block(Lease),
}

struct Shared {
    memory: Memory,
    /// The range of the backend allocation this object owns: all of it, or a block of it.
    start: u64,
    size: u64,
    free_enqueued: AtomicBool,
}

impl Shared {
    /// The backend allocation (for a block: its segment's).
    #[inline]
    fn alloc(&self) -> &dyn DeviceAllocation {
        match &self.memory {
            Memory::Whole(a) => &**a,
            Memory::Block(l) => &*l.segment.alloc,
        }
    }

    /// A shared handle of the backend allocation.
    fn alloc_arc(&self) -> Arc<dyn DeviceAllocation> {
        match &self.memory {
            Memory::Whole(a) => a.clone(),
            Memory::Block(l) => l.segment.alloc.clone(),
        }
    }

    #[inline]
    fn lease(&self) -> Option<&Lease> {
        match &self.memory {
            Memory::Whole(_) => None,
            Memory::Block(l) => Some(l),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(l) = self.lease() {
            match l.reclaim.load(Ordering::Acquire) {
                RECLAIM_NOW => {}
                r => l.segment.owner.retired(l.token, r == RECLAIM_FOR_STREAM),
            }
        }
    }
}

/// A backend allocation a sub-allocator (the caching allocator) carves blocks out of with
/// [`Segment::block`]. Blocks keep the segment, and so the allocation and the owner, alive.
///
/// Ownership: clones share the segment. Thread safety: `Send + Sync`.
#[derive(Clone)]
pub struct Segment {
    inner: Arc<SegmentInner>,
}

struct SegmentInner {
    alloc: Arc<dyn DeviceAllocation>,
    /// The segment's range of `alloc`.
    start: u64,
    len: u64,
    owner: Arc<dyn BlockOwner>,
}

impl Segment {
    /// A segment over all of `whole`, whose blocks `owner` hears of (see [`BlockOwner`]).
    ///
    /// # Errors
    /// [`Invalid::FreeEnqueued`] when `whole`'s free is enqueued.
    pub fn new(whole: &Buffer, owner: Arc<dyn BlockOwner>) -> Result<Segment> {
        if whole.is_free_enqueued() {
            return Err(whole.free_enqueued_error("whole"));
        }
        Ok(Segment {
            inner: Arc::new(SegmentInner {
                alloc: whole.shared.alloc_arc(),
                start: whole.offset,
                len: whole.len,
                owner,
            }),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// True for an empty segment.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Device address of the first byte.
    pub fn device_addr(&self) -> u64 {
        self.inner.alloc.addr() + self.inner.start
    }

    /// A block `[offset, offset+len)` of the segment with a life of its own. The block is a
    /// buffer like any other (every backend accepts it where it accepts the segment's memory),
    /// but its handles are its own: the owner learns through `token` when the last handle is
    /// gone and when the last queued use is (see [`BlockOwner`]).
    ///
    /// # Errors
    /// [`Invalid::OutOfRange`] when the block does not fit the segment.
    #[inline]
    pub fn block(&self, offset: u64, len: u64, token: u64) -> Result<Buffer> {
        check_range("offset", offset, len, self.inner.len)?;
        let start = self.inner.start + offset;
        Ok(Buffer {
            shared: SharedArc::new(Shared {
                memory: Memory::Block(Lease {
                    segment: self.inner.clone(),
                    token,
                    handles: AtomicUsize::new(1),
                    uses: Mutex::new(Vec::new()),
                    live_uses: AtomicUsize::new(0),
                    reclaim: AtomicUsize::new(RECLAIM_LATER),
                }),
                start,
                size: len,
                free_enqueued: AtomicBool::new(false),
            }),
            offset: start,
            len,
        })
    }
}

/// A queued use of a sub-allocated buffer on one stream (see [`Buffer::use_on`]): keeps the
/// memory alive without counting as a handle.
struct BufferUse {
    shared: SharedArc<Shared>,
    stream: StreamId,
}

impl Drop for BufferUse {
    fn drop(&mut self) {
        if let Some(l) = self.shared.lease() {
            let mut uses = l.uses.lock();
            if let Some(i) = uses.iter().position(|(s, _)| *s == self.stream) {
                uses[i].1 -= 1;
                if uses[i].1 == 0 {
                    uses.swap_remove(i);
                }
            }
            l.live_uses.fetch_sub(1, Ordering::Release);
        }
    }
}

/// A handle to a range of device memory. Clones share the allocation.
///
/// Ownership: the memory lives while any handle lives (including handles held by queued work), or
/// until `Stream::free_async` runs. Thread safety: `Send + Sync`; use from any thread.
pub struct Buffer {
    shared: SharedArc<Shared>,
    offset: u64,
    len: u64,
}

impl Clone for Buffer {
    #[inline]
    fn clone(&self) -> Buffer {
        self.handle(self.offset, self.len)
    }
}

impl Drop for Buffer {
    #[inline]
    fn drop(&mut self) {
        let Some(l) = self.shared.lease() else {
            return;
        };
        let pending = if SharedArc::strong_count(&self.shared) == 1 {
            // The only reference of any kind (no other handle or view, no queued use): nobody
            // can make another, so the handle count needs no update and nothing is pending.
            fence(Ordering::Acquire);
            PendingUses::None
        } else if l.handles.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        } else if l.live_uses.load(Ordering::Acquire) == 0 {
            // The last handle: no new use can be made. A use ends (its count falls) only after
            // its work ran, so a zero count means no queued work: nothing to look up.
            PendingUses::None
        } else {
            let uses = l.uses.lock();
            match uses[..] {
                [] => PendingUses::None,
                [(stream, _)] => PendingUses::OneStream(stream),
                _ => PendingUses::Several,
            }
        };
        // `self.shared` keeps `Shared` (and so the `retired` call) alive until this returns.
        let r = match (l.segment.owner.handles_dropped(l.token, pending), pending) {
            (Reclaim::Now, PendingUses::None) => RECLAIM_NOW,
            (Reclaim::ForStream, PendingUses::OneStream(_)) => RECLAIM_FOR_STREAM,
            // An answer the uses do not allow is taken as `Later`: the owner will still hear
            // of the retirement (a wrong owner can only delay its own reuse).
            _ => RECLAIM_LATER,
        };
        l.reclaim.store(r, Ordering::Release);
    }
}

impl Buffer {
    /// Wraps a backend allocation into a buffer covering all of it. For backends.
    pub fn from_allocation<A: DeviceAllocation>(alloc: A) -> Buffer {
        let len = alloc.len();
        Buffer {
            shared: SharedArc::new(Shared {
                memory: Memory::Whole(Arc::new(alloc)),
                start: 0,
                size: len,
                free_enqueued: AtomicBool::new(false),
            }),
            offset: 0,
            len,
        }
    }

    /// What queued work on `stream` keeps to hold this buffer's memory until it has run. For
    /// backends: every stream operation keeps its buffers this way, so that a sub-allocator
    /// knows which streams still use a block whose handles are gone (see [`BlockOwner`]).
    pub fn use_on(&self, stream: StreamId) -> Keep {
        let Some(l) = self.shared.lease() else {
            return Box::new(self.clone());
        };
        {
            let mut uses = l.uses.lock();
            match uses.iter_mut().find(|(s, _)| *s == stream) {
                Some(e) => e.1 += 1,
                None => uses.push((stream, 1)),
            }
            l.live_uses.fetch_add(1, Ordering::Relaxed);
        }
        Box::new(BufferUse {
            shared: self.shared.clone(),
            stream,
        })
    }

    /// The owning device.
    pub fn device(&self) -> DeviceId {
        self.shared.alloc().device()
    }

    /// Length of this view in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of this view inside its backend allocation (for a block of a sub-allocator: inside
    /// its segment).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Device address of the first byte of this view, for interop with vendor libraries. Using it
    /// after the buffer is freed is the caller's responsibility (it is only a number).
    pub fn device_addr(&self) -> u64 {
        self.shared.alloc().addr() + self.offset
    }

    /// A checked sub-range `[offset, offset+len)` of this view, sharing the allocation.
    ///
    /// # Errors
    /// [`Invalid::OutOfRange`] when the range does not fit.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Buffer> {
        check_range("slice", offset, len, self.len)?;
        #[cfg(feature = "planted-defects")]
        if crate::planted::uncounted_slice() {
            return Ok(Buffer {
                shared: self.shared.clone(),
                offset: self.offset + offset,
                len,
            });
        }
        Ok(self.handle(self.offset + offset, len))
    }

    /// A new handle viewing `[offset, offset+len)` of the memory (offsets as [`Buffer::offset`]).
    /// The one place that makes a `Buffer` from another's shared state: every clone and every
    /// view counts as a handle of a block, so its owner hears of the last handle only once the
    /// views are gone too.
    #[inline]
    fn handle(&self, offset: u64, len: u64) -> Buffer {
        if let Some(l) = self.shared.lease() {
            // Relaxed: a new handle is made from a live one, which keeps the count above zero.
            l.handles.fetch_add(1, Ordering::Relaxed);
        }
        Buffer {
            shared: self.shared.clone(),
            offset,
            len,
        }
    }

    /// The backend allocation behind this view (for the owning backend; for a block of a
    /// sub-allocator, its segment's allocation).
    pub fn allocation(&self) -> &dyn DeviceAllocation {
        self.shared.alloc()
    }

    /// True for a block of a [`Segment`].
    pub fn is_sub_allocated(&self) -> bool {
        self.shared.lease().is_some()
    }

    /// Downcasts the allocation to the backend's type.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] when the buffer was made by another backend.
    pub fn downcast_allocation<T: DeviceAllocation>(&self, arg: &'static str) -> Result<&T> {
        self.shared
            .alloc()
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| {
                HalError::invalid(
                    arg,
                    Invalid::ForeignHandle {
                        expected: std::any::type_name::<T>().to_string(),
                        found: format!(
                            "buffer [{:#x}, +{}) of {}",
                            self.shared.alloc().addr() + self.shared.start,
                            self.shared.size,
                            self.device()
                        ),
                    },
                )
            })
    }

    /// True when both handles view the same allocation (the same block, for sub-allocated
    /// buffers: two blocks of one segment never share bytes).
    pub fn same_allocation(&self, other: &Buffer) -> bool {
        SharedArc::ptr_eq(&self.shared, &other.shared)
    }

    /// True once `Stream::free_async` has been called for this allocation.
    pub fn is_free_enqueued(&self) -> bool {
        self.shared.free_enqueued.load(Ordering::Acquire)
    }

    /// Marks the allocation freed-in-stream-order. For backends implementing `free_async`.
    ///
    /// # Errors
    /// [`Invalid::FreeEnqueued`] when it was already marked.
    pub fn mark_free_enqueued(&self, arg: &'static str) -> Result<()> {
        if self.shared.free_enqueued.swap(true, Ordering::AcqRel) {
            return Err(self.free_enqueued_error(arg));
        }
        Ok(())
    }

    fn free_enqueued_error(&self, arg: &'static str) -> HalError {
        HalError::invalid(
            arg,
            Invalid::FreeEnqueued {
                addr: self.shared.alloc().addr() + self.shared.start,
                len: self.shared.size,
            },
        )
    }

    /// The checks every stream operation makes on a buffer argument: it belongs to `device`, its
    /// free is not enqueued, and `[offset, offset+len)` fits the view. Returns the device address of
    /// the range's first byte.
    ///
    /// # Errors
    /// [`Invalid::WrongDevice`], [`Invalid::FreeEnqueued`] or [`Invalid::OutOfRange`].
    pub fn check_use(
        &self,
        arg: &'static str,
        device: DeviceId,
        offset: u64,
        len: u64,
    ) -> Result<u64> {
        let found = self.device();
        if found != device {
            return Err(HalError::invalid(
                arg,
                Invalid::WrongDevice {
                    expected: device,
                    found,
                },
            ));
        }
        if self.is_free_enqueued() {
            return Err(self.free_enqueued_error(arg));
        }
        check_range(arg, offset, len, self.len)?;
        Ok(self.device_addr() + offset)
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Buffer({} @ {:#x}, {} bytes)",
            self.device(),
            self.device_addr(),
            self.len
        )
    }
}
