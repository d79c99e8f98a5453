//! HAL-owned host memory for asynchronous copies: [`HostBuffer`].
//!
//! Asynchronous copies never take a borrowed `&[u8]`: the caller could free it while a stream worker
//! (or a GPU's DMA engine) still reads it. They take a `HostBuffer`, whose memory the HAL owns and keeps
//! alive while queued work uses it. Host access goes through [`HostBuffer::map`], which refuses while
//! queued work uses the buffer, and queued work refuses a buffer the host has mapped, so the host and a
//! stream never touch the same bytes at once.

use crate::device::DeviceId;
use crate::error::{HalError, Invalid, Result};
use crate::sync::{Arc, AtomicU64, Mutex, Ordering};
use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Weak;

/// Host memory allocated by a backend (pinned where it can). Dropping it frees the memory.
///
/// # Safety
/// Implementers promise that `ptr()..ptr()+len()` is readable and writable host memory owned by this
/// object for its whole life (any pointer when `len()` is 0), initialised (zeroed at allocation:
/// the vendor calls do not clear it, so backends do), and that `ptr` and `len` never change:
/// [`HostBuffer::map`] hands it out as a slice.
pub unsafe trait HostAllocation: Send + Sync + 'static {
    /// The device whose backend allocated it.
    fn device(&self) -> DeviceId;
    /// First byte. Valid for `len()` bytes while `self` lives.
    fn ptr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for a zero-length allocation.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}

const MAPPED: u64 = 1 << 63;

/// Told of every successful [`HostBuffer::map`] and [`HostBuffer::lend`]: how a validation layer
/// learns that the host touched a buffer, with the caller's location, to check that the host knew
/// the buffer's queued work had completed (a map succeeds whenever the work *has* completed, which
/// may be luck of timing rather than a synchronisation).
///
/// Thread safety: called from the mapping thread, with no HAL lock held; must not map.
pub trait MapObserver: Send + Sync {
    /// `buffer` was just mapped (or lent) at `site`.
    fn mapped(&self, buffer: &HostBuffer, site: &'static std::panic::Location<'static>);
}

/// Observers registered with [`observe_maps`]; dead ones are pruned as new ones come.
static MAP_OBSERVERS: std::sync::RwLock<Vec<Weak<dyn MapObserver>>> =
    std::sync::RwLock::new(Vec::new());
/// True once an observer was registered: maps skip the lock until then.
static MAP_OBSERVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Registers `observer` for every later map of every host buffer of the process, for as long as
/// it lives. Thread safety: any thread.
pub fn observe_maps(observer: Weak<dyn MapObserver>) {
    let mut all = MAP_OBSERVERS.write().unwrap_or_else(|e| e.into_inner());
    all.retain(|o| o.strong_count() > 0);
    all.push(observer);
    MAP_OBSERVED.store(true, std::sync::atomic::Ordering::Release);
}

fn notify_map_observers(buffer: &HostBuffer, site: &'static std::panic::Location<'static>) {
    if !MAP_OBSERVED.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    let live: Vec<std::sync::Arc<dyn MapObserver>> = MAP_OBSERVERS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    for o in live {
        o.mapped(buffer, site);
    }
}

/// Something that holds uses of host buffers for queued work and learns that the work completed
/// only when asked: a GPU stream keeps what its work uses behind vendor events and releases it
/// when it checks them. [`HostBuffer::map`] and [`HostBuffer::pending_uses`] ask the holders of a
/// busy buffer, so a buffer is mappable as soon as its work has completed, however the caller
/// learned it (a stream, event or device synchronisation, a query, a wait on another stream).
///
/// Thread safety: called from any thread, with no HAL lock held.
pub trait UseHolder: Send + Sync {
    /// Releases what the holder keeps for work that has completed. Must not wait for queued
    /// work; may do nothing where it cannot check (inside a host callback, where vendor calls are
    /// forbidden).
    fn release_completed(&self);
}

struct Shared {
    alloc: Box<dyn HostAllocation>,
    /// Bit 63: mapped by the host. Low bits: number of queued operations using the buffer.
    state: AtomicU64,
    /// Held by stream workers while they read or write the bytes, so two queued operations on
    /// different streams never access them at once.
    device_side: Mutex<()>,
    /// Who holds uses (see [`UseHolder`]); dead entries are pruned as new ones come.
    holders: Mutex<Vec<Weak<dyn UseHolder>>>,
    /// Model-checking only: the planted bug of the loom suite (see [`HostBuffer::plant_relaxed_use_end`]).
    #[cfg(loom)]
    planted_relaxed: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// The ordering with which a use ends: `AcqRel`, so that a later `map` (whose `Acquire` reads the
    /// count this drop leaves) sees every byte the use wrote. Under loom, `Relaxed` when the planted
    /// bug is switched on.
    #[inline(always)]
    fn use_end_order(&self) -> Ordering {
        #[cfg(loom)]
        if self
            .planted_relaxed
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Ordering::Relaxed;
        }
        Ordering::AcqRel
    }
}

/// A handle to HAL-owned host memory. Clones share the memory.
///
/// Ownership: freed when the last handle (including those held by queued work) is dropped.
/// Thread safety: `Send + Sync`; exclusive host access is checked at run time by [`HostBuffer::map`].
#[derive(Clone)]
pub struct HostBuffer {
    shared: Arc<Shared>,
}

impl HostBuffer {
    /// Wraps a backend host allocation. For backends.
    pub fn from_allocation(alloc: Box<dyn HostAllocation>) -> HostBuffer {
        HostBuffer {
            shared: Arc::new(Shared {
                alloc,
                state: AtomicU64::new(0),
                device_side: Mutex::new(()),
                holders: Mutex::new(Vec::new()),
                #[cfg(loom)]
                planted_relaxed: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Model-checking only (`--cfg loom`): plants a bug — uses of this buffer end with a `Relaxed`
    /// decrement instead of `AcqRel`, so a host `map` no longer synchronises with the bytes a use
    /// wrote. The loom suite switches it on to prove it catches exactly this class of bug.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn plant_relaxed_use_end(&self) {
        self.shared
            .planted_relaxed
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.shared.alloc.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device whose backend allocated the memory.
    pub fn device(&self) -> DeviceId {
        self.shared.alloc.device()
    }

    /// Host address of the first byte, for interop (e.g. registering with a vendor library).
    pub fn host_addr(&self) -> usize {
        self.shared.alloc.ptr() as usize
    }

    /// The backend allocation (for the owning backend).
    pub fn allocation(&self) -> &dyn HostAllocation {
        &*self.shared.alloc
    }

    /// Number of queued operations that still use this buffer (after asking its holders to
    /// release what completed).
    pub fn pending_uses(&self) -> u64 {
        let n = self.shared.state.load(Ordering::Acquire) & !MAPPED;
        if n == 0 {
            return 0;
        }
        self.release_completed();
        self.shared.state.load(Ordering::Acquire) & !MAPPED
    }

    /// Asks every live [`UseHolder`] of this buffer to release what completed work kept.
    fn release_completed(&self) {
        let live: Vec<std::sync::Arc<dyn UseHolder>> = {
            let mut hs = self.shared.holders.lock();
            hs.retain(|h| h.strong_count() > 0);
            hs.iter().filter_map(Weak::upgrade).collect()
        };
        for h in live {
            h.release_completed();
        }
    }

    /// Exclusive host access to the bytes. Succeeds once every queued use has completed: holders
    /// that learn of completion lazily are asked first (see [`UseHolder`]).
    ///
    /// # Errors
    /// [`Invalid::Busy`] when queued work still uses the buffer (wait for it first) or when it is
    /// already mapped.
    #[track_caller]
    pub fn map(&self) -> Result<HostMap<'_>> {
        self.set_mapped()?;
        notify_map_observers(self, std::panic::Location::caller());
        Ok(HostMap { buf: self })
    }

    /// Lends the bytes to a foreign consumer (a DLPack export) for as long as the returned loan
    /// lives: the buffer counts as mapped, so queued work refuses it and the host cannot map it,
    /// and the loan keeps the memory alive. The consumer reaches the bytes through
    /// [`HostLoan::addr`] only.
    ///
    /// # Errors
    /// As [`HostBuffer::map`].
    #[track_caller]
    pub fn lend(&self) -> Result<HostLoan> {
        self.set_mapped()?;
        notify_map_observers(self, std::panic::Location::caller());
        Ok(HostLoan { buf: self.clone() })
    }

    /// Sets the mapped bit once no queued work uses the buffer.
    fn set_mapped(&self) -> Result<()> {
        let state = &self.shared.state;
        let mut first = state.compare_exchange(0, MAPPED, Ordering::AcqRel, Ordering::Acquire);
        if matches!(first, Err(s) if s & MAPPED == 0) {
            self.release_completed();
            first = state.compare_exchange(0, MAPPED, Ordering::AcqRel, Ordering::Acquire);
        }
        match first {
            Ok(_) => Ok(()),
            Err(s) if s & MAPPED != 0 => Err(HalError::invalid(
                "host buffer",
                Invalid::Busy("already mapped by the host".into()),
            )),
            Err(s) => Err(HalError::invalid(
                "host buffer",
                Invalid::Busy(format!(
                    "{} queued operation(s) still use it; wait for them first",
                    s & !MAPPED
                )),
            )),
        }
    }

    /// Registers one use by queued work, checking `[offset, offset+len)`. For backends: hold the
    /// returned [`HostUse`] in the queued operation and drop it before the operation counts as done.
    ///
    /// # Errors
    /// [`Invalid::Busy`] when the host has the buffer mapped; [`Invalid::OutOfRange`].
    pub fn begin_use(&self, arg: &'static str, offset: u64, len: u64) -> Result<HostUse> {
        crate::error::check_range(arg, offset, len, self.len() as u64)?;
        let state = &self.shared.state;
        let mut cur = state.load(Ordering::Acquire);
        loop {
            if cur & MAPPED != 0 {
                return Err(HalError::invalid(
                    arg,
                    Invalid::Busy("mapped by the host; drop the HostMap first".into()),
                ));
            }
            match state.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(s) => cur = s,
            }
        }
        Ok(HostUse {
            buf: self.clone(),
            offset: offset as usize,
            len: len as usize,
        })
    }

    /// As [`HostBuffer::begin_use`], for a holder that releases the use only when it checks its
    /// work (see [`UseHolder`]): `map` asks it before refusing.
    ///
    /// # Errors
    /// As [`HostBuffer::begin_use`].
    pub fn begin_use_by(
        &self,
        arg: &'static str,
        offset: u64,
        len: u64,
        holder: Weak<dyn UseHolder>,
    ) -> Result<HostUse> {
        let u = self.begin_use(arg, offset, len)?;
        let mut hs = self.shared.holders.lock();
        if !hs.iter().any(|h| h.ptr_eq(&holder)) {
            hs.retain(|h| h.strong_count() > 0);
            hs.push(holder);
        }
        Ok(u)
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBuffer({} bytes, {})", self.len(), self.device())
    }
}

/// Exclusive host access to a [`HostBuffer`]'s bytes; dereferences to `[u8]`.
pub struct HostMap<'a> {
    buf: &'a HostBuffer,
}

impl Deref for HostMap<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let a = &self.buf.shared.alloc;
        if a.is_empty() {
            return &[];
        }
        // SAFETY: the allocation is valid and initialised for len bytes while the HostBuffer lives
        // (we borrow it; HostAllocation's contract: zeroed at allocation, and since then written
        // only with initialised bytes by copies), and the MAPPED bit guarantees no queued operation
        // accesses it while this map exists.
        unsafe { std::slice::from_raw_parts(a.ptr(), a.len()) }
    }
}

impl DerefMut for HostMap<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let a = &self.buf.shared.alloc;
        if a.is_empty() {
            return &mut [];
        }
        // SAFETY: as in deref; the MAPPED bit also makes this the only host-side map.
        unsafe { std::slice::from_raw_parts_mut(a.ptr(), a.len()) }
    }
}

impl Drop for HostMap<'_> {
    fn drop(&mut self) {
        self.buf.shared.state.fetch_and(!MAPPED, Ordering::AcqRel);
    }
}

/// A [`HostBuffer`] lent to a foreign consumer (see [`HostBuffer::lend`]); dropping it ends the
/// loan.
pub struct HostLoan {
    buf: HostBuffer,
}

impl HostLoan {
    /// Host address of the first byte; the consumer may read and write `len()` bytes from it
    /// while the loan lives.
    pub fn addr(&self) -> usize {
        self.buf.host_addr()
    }

    /// The buffer lent.
    pub fn buffer(&self) -> &HostBuffer {
        &self.buf
    }
}

impl Drop for HostLoan {
    fn drop(&mut self) {
        self.buf.shared.state.fetch_and(!MAPPED, Ordering::AcqRel);
    }
}

/// One queued operation's use of a [`HostBuffer`] range. Keeps the memory alive; dropping it ends
/// the use.
pub struct HostUse {
    buf: HostBuffer,
    offset: usize,
    len: usize,
}

impl HostUse {
    /// Runs `f` with a pointer to the range's first byte, holding the device-side lock so that no
    /// other queued operation touches the bytes at the same time. For stream workers.
    pub fn with_ptr<R>(&self, f: impl FnOnce(*mut u8, usize) -> R) -> R {
        let _guard = self.buf.shared.device_side.lock();
        // SAFETY: begin_use checked offset+len <= len, so the pointer stays inside the allocation.
        let p = unsafe { self.buf.shared.alloc.ptr().add(self.offset) };
        f(p, self.len)
    }

    /// Host address of the range (for vendor DMA calls that complete in stream order).
    pub fn addr(&self) -> usize {
        self.buf.host_addr() + self.offset
    }

    /// The buffer in use (a clone of the handle: keeping it keeps the memory, not the use).
    pub fn buffer(&self) -> &HostBuffer {
        &self.buf
    }
}

impl Drop for HostUse {
    fn drop(&mut self) {
        let shared = &self.buf.shared;
        shared.state.fetch_sub(1, shared.use_end_order());
    }
}
