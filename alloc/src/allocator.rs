//! [`CachingAllocator`]: one device's allocator above `Device::alloc`.

use crate::graph::{GraphPool, GraphPoolId, GraphPoolInfo};
use crate::pool::Pools;
use crate::size::{self, PoolKind};
use crate::stats::{MemoryStats, SegmentSnapshot, TraceEvent};
use parking_lot::Mutex;
use std::sync::Arc;
use unihal_hal::{
    BlockOwner, Buffer, CaptureStatus, Device, DeviceId, HalError, Invalid, OomReport, PendingUses,
    Reclaim, Result, Segment, Stream,
};

/// Settings of a [`CachingAllocator`] (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` keys that apply, and
/// unihal's own).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocatorConfig {
    /// Cached blocks of this size or more are never split, and serve only requests that waste
    /// less than a large segment (`max_split_size_mb`); `None`: no limit. At least
    /// [`crate::size::LARGE_SEGMENT`] (20 MiB, PyTorch's minimum): below it the 20 MiB segments
    /// of mid-sized requests could never serve again once cached.
    pub max_split_size: Option<u64>,
    /// The share of the device's total memory the allocator may reserve
    /// (`torch.cuda.set_per_process_memory_fraction`); `None`: no limit.
    pub memory_fraction: Option<f64>,
    /// Thrifty best fit ([`crate::size::thrifty`], default `true`): a cached block more than
    /// twice a request is left for requests of its size while the device has memory. `false`:
    /// PyTorch's rule, any cached block that fits (`thrifty:false`).
    pub thrifty: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: None,
            memory_fraction: None,
            thrifty: true,
        }
    }
}

impl AllocatorConfig {
    /// Checks the settings ([`CachingAllocator::new`] does).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for a `max_split_size` below 20 MiB or a memory fraction
    /// outside (0, 1].
    pub fn check(&self) -> Result<()> {
        if let Some(m) = self.max_split_size.filter(|&m| m < size::LARGE_SEGMENT) {
            return Err(HalError::invalid(
                "max_split_size",
                Invalid::Value {
                    value: format!("{m} bytes"),
                    accepted: format!(
                        "at least {} bytes (max_split_size_mb:20, PyTorch's minimum)",
                        size::LARGE_SEGMENT
                    ),
                },
            ));
        }
        self.memory_fraction.map_or(Ok(()), check_fraction)
    }

    /// Parses `key:value` pairs separated by commas: `max_split_size_mb:<MiB>`,
    /// `memory_fraction:<0..=1>` and `thrifty:<true|false>` (the form of `UNIHAL_ALLOC_CONF`).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the pair that is not understood.
    pub fn parse(conf: &str) -> Result<AllocatorConfig> {
        let mut c = AllocatorConfig::default();
        for pair in conf.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = || {
                HalError::invalid(
                    "UNIHAL_ALLOC_CONF",
                    Invalid::Value {
                        value: pair.to_string(),
                        accepted:
                            "max_split_size_mb:<MiB, at least 20>, memory_fraction:<0 to 1>, \
                                   thrifty:<true|false>"
                                .into(),
                    },
                )
            };
            let (k, v) = pair.split_once(':').ok_or_else(bad)?;
            match k.trim() {
                "max_split_size_mb" => {
                    let mb: u64 = v.trim().parse().map_err(|_| bad())?;
                    c.max_split_size = Some(mb.checked_mul(1 << 20).ok_or_else(bad)?);
                    c.check().map_err(|_| bad())?;
                }
                "memory_fraction" => {
                    let f: f64 = v.trim().parse().map_err(|_| bad())?;
                    check_fraction(f).map_err(|_| bad())?;
                    c.memory_fraction = Some(f);
                }
                "thrifty" => c.thrifty = v.trim().parse().map_err(|_| bad())?,
                _ => return Err(bad()),
            }
        }
        Ok(c)
    }
}

fn check_fraction(f: f64) -> Result<()> {
    if f > 0.0 && f <= 1.0 {
        Ok(())
    } else {
        Err(HalError::invalid(
            "fraction",
            Invalid::Value {
                value: f.to_string(),
                accepted: "(0, 1]".into(),
            },
        ))
    }
}

/// What blocks hold of their allocator: the pools, which learn through [`BlockOwner`] when a
/// block's handles and queued uses are gone.
pub(crate) struct Shared {
    pub(crate) pools: Mutex<Pools>,
}

impl BlockOwner for Shared {
    fn handles_dropped(&self, token: u64, pending: PendingUses) -> Reclaim {
        self.pools.lock().handles_dropped(token, pending)
    }

    fn retired(&self, token: u64, early: bool) {
        self.pools.lock().retired(token, early);
    }
}

/// A caching allocator for one device, in the manner of PyTorch's: requests are rounded to size
/// classes and served from cached segments (a small pool of 2 MiB segments for requests up to
/// 1 MiB, a large pool above), best fit, splitting blocks and coalescing freed neighbours; unlike
/// PyTorch, a cached block more than twice a request's size (and above a large segment) serves
/// it only when the device is out of memory ([`crate::size::thrifty`]).
///
/// Blocks are ordinary [`Buffer`]s that every backend accepts. Reuse follows the HAL's own
/// tracking of queued uses, so there is no `record_stream` to forget: when a block's last handle
/// is dropped while queued work on one stream S still uses it, the block serves new requests for
/// S at once (stream order puts their work after the queued uses) and other streams only once
/// that work has completed (when the stream releases what it kept for it: after a
/// synchronisation, a query or an event that shows it done). A request that the cache cannot
/// serve allocates a segment; when the device is out of memory (or the memory fraction is
/// reached), the allocator first lets any cached block that fits serve it, then releases every
/// cached segment and tries the device once more (`num_alloc_retries`) before failing with
/// [`HalError::AllocatorOutOfMemory`] (`num_ooms`).
///
/// Ownership: blocks keep the allocator's pools and their segment alive; dropping the allocator
/// releases the cached segments as their blocks go. Thread safety: `Send + Sync`; one lock per
/// device, never held across a device call.
pub struct CachingAllocator {
    device: Arc<dyn Device>,
    id: DeviceId,
    total: u64,
    limit: Mutex<Option<u64>>,
    thrifty: bool,
    shared: Arc<Shared>,
    /// Where the drop writes the snapshot in PyTorch's layout (`snapshot_at_drop`).
    snapshot_to: Mutex<Option<std::path::PathBuf>>,
}

impl CachingAllocator {
    /// An allocator for `device`.
    ///
    /// # Errors
    /// The device's error when its memory cannot be queried; [`HalError::InvalidArgument`] for
    /// settings [`AllocatorConfig::check`] refuses.
    pub fn new(device: Arc<dyn Device>, config: AllocatorConfig) -> Result<CachingAllocator> {
        config.check()?;
        let total = device.memory_info()?.total;
        let id = device.id();
        let a = CachingAllocator {
            device,
            id,
            total,
            limit: Mutex::new(None),
            thrifty: config.thrifty,
            shared: Arc::new(Shared {
                pools: Mutex::new(Pools::new(config.max_split_size.unwrap_or(u64::MAX), id)),
            }),
            snapshot_to: Mutex::new(None),
        };
        if let Some(f) = config.memory_fraction {
            a.set_memory_fraction(f)?;
        }
        Ok(a)
    }

    /// An allocator configured from `UNIHAL_ALLOC_CONF` (see [`AllocatorConfig::parse`]); with
    /// `UNIHAL_MEMORY_SNAPSHOT=FILE` it records its history and writes the snapshot in PyTorch's
    /// layout when dropped ([`CachingAllocator::snapshot_at_drop`]).
    ///
    /// # Errors
    /// As [`CachingAllocator::new`] and [`AllocatorConfig::parse`].
    pub fn from_env(device: Arc<dyn Device>) -> Result<CachingAllocator> {
        let conf = std::env::var("UNIHAL_ALLOC_CONF").unwrap_or_default();
        let a = CachingAllocator::new(device, AllocatorConfig::parse(&conf)?)?;
        if let Some(path) = std::env::var_os("UNIHAL_MEMORY_SNAPSHOT").filter(|p| !p.is_empty()) {
            a.snapshot_at_drop(path.into());
        }
        Ok(a)
    }

    /// Records the history from now on and writes [`CachingAllocator::torch_snapshot`] to `path`
    /// when the allocator is dropped (the end of a run), `%d` in the file name replaced by the
    /// device ordinal (put it there when several devices run). A write that fails is logged.
    pub fn snapshot_at_drop(&self, path: std::path::PathBuf) {
        self.record_history(true);
        *self.snapshot_to.lock() = Some(path);
    }

    /// The device it allocates on.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Allocates `len` bytes for work on `stream` (usable by work enqueued on it after this call;
    /// other streams must be ordered after it, as with `Stream::alloc_async`). Contents are
    /// unspecified: a reused block holds what its previous user left there. `len == 0` gives a
    /// valid empty buffer outside the statistics (PyTorch's null pointer).
    ///
    /// # Errors
    /// [`Invalid::WrongDevice`] for a stream of another device;
    /// [`HalError::AllocatorOutOfMemory`] when neither the cache nor the device (after the cache
    /// is released) can serve the request; other device errors as they come.
    pub fn alloc(&self, stream: &Arc<dyn Stream>, len: usize) -> Result<Buffer> {
        let block = self.alloc_block(stream, len)?;
        if block.is_sub_allocated() {
            self.device.block_handed_out(&block, stream);
        }
        Ok(block)
    }

    /// [`CachingAllocator::alloc`] without telling the device of the hand-out.
    fn alloc_block(&self, stream: &Arc<dyn Stream>, len: usize) -> Result<Buffer> {
        if !std::ptr::addr_eq(Arc::as_ptr(stream.device()), Arc::as_ptr(&self.device)) {
            return Err(self.foreign_stream(stream));
        }
        if len == 0 {
            return self.device.alloc(0);
        }
        let requested = len as u64;
        let oom = |s: &MemoryStats, p: &Pools, free: u64| {
            HalError::AllocatorOutOfMemory(Box::new(OomReport {
                device: self.id.to_string(),
                requested,
                allocated: s.allocated_bytes.all.current,
                reserved: s.reserved_bytes.all.current,
                free,
                total: self.total,
                largest_free_block: p.largest_free(),
                limit: *self.limit.lock(),
            }))
        };
        let size = size::round_size(requested);
        let (Some(size), Some(seg_size)) = (size, size.and_then(size::segment_size)) else {
            let p = self.shared.pools.lock();
            let free = self.device.memory_info().map(|m| m.free).unwrap_or(0);
            return Err(oom(&p.stats, &p, free));
        };
        let pool = PoolKind::of(size);
        // A capture's request: from its graph pool, keyed on the capture's stream identity (the
        // one its captured work keeps buffers on), never releasing the cache (see `graph`).
        let capture = stream.capture_status().capture();
        let sid = capture.map_or_else(|| stream.stream_id(), |c| c.stream_id());
        let mut retried = capture.is_some();
        // While the device has memory, cached blocks much larger than the request are left for
        // requests of their size (`size::thrifty`); once it has not, any block that fits.
        let mut thrifty = self.thrifty;
        let mut first_try = true;
        loop {
            let mut p = self.shared.pools.lock();
            if std::mem::take(&mut first_try) && p.idle_hint() {
                // A graph pool may be idle: give it back first (the streams are asked outside
                // the lock), so its segments can serve this request.
                drop(p);
                self.release_idle_graph_pools();
                p = self.shared.pools.lock();
            }
            let graph = capture.map(|c| p.pool_for_capture(c, stream));
            if let Some(i) = p.find(pool, size, sid, thrifty, graph, capture) {
                return p.take(i, size, requested, sid);
            }
            #[cfg(feature = "planted-defects")]
            if graph.is_none() && crate::planted::graph_pools_shared() {
                if let Some(i) = p.find_in_graph_pools(pool, size) {
                    return p.take(i, size, requested, sid);
                }
            }
            // `checked_add`: a request near `u64::MAX` is over any limit, never a wrapped sum.
            let within_limit = self.limit.lock().is_none_or(|l| {
                p.stats
                    .reserved_bytes
                    .all
                    .current
                    .checked_add(seg_size)
                    .is_some_and(|r| r <= l)
            });
            drop(p);
            let got = if within_limit {
                self.new_segment(stream, capture, seg_size)
            } else {
                Err(HalError::OutOfMemory {
                    requested: seg_size,
                    free: 0,
                })
            };
            match got {
                Ok(whole) => {
                    let owner: Arc<dyn BlockOwner> = self.shared.clone();
                    let segment = Segment::new(&whole, owner)?;
                    let mut p = self.shared.pools.lock();
                    // The pool again: a capture's pool cannot have gone meanwhile (it is not
                    // released while its capture goes on), but looking it up costs nothing.
                    let graph = capture.map(|c| p.pool_for_capture(c, stream));
                    // A capture's segment came from `alloc_async`: graph memory, its capture's
                    // alone.
                    let first = p.add_segment(segment, pool, graph, capture);
                    // The new segment's block serves the request it was made for. Searching
                    // again (`find`) would apply the rules for cached blocks to it: under
                    // `max_split_size` a segment can be one no cached-block rule lets a request
                    // take, and every retry would reserve another segment until the device is
                    // full.
                    #[cfg(feature = "planted-defects")]
                    if crate::planted::search_new_segment() {
                        continue;
                    }
                    return p.take(first, size, requested, sid);
                }
                Err(e) if e.is_out_of_memory() && thrifty => thrifty = false,
                Err(e) if e.is_out_of_memory() && !retried => {
                    retried = true;
                    let released = {
                        let mut p = self.shared.pools.lock();
                        p.stats.num_alloc_retries += 1;
                        p.release_cached()
                    };
                    drop(released);
                }
                Err(e) if e.is_out_of_memory() => {
                    let free = self.device.memory_info().map(|m| m.free).unwrap_or(0);
                    let mut p = self.shared.pools.lock();
                    p.stats.num_ooms += 1;
                    // Refused by the memory-fraction limit, not by the device.
                    p.stats.num_oom_rejections += u64::from(!within_limit);
                    if let Some(h) = &mut p.history {
                        h.push(TraceEvent::Oom {
                            size: requested,
                            device_free: free,
                        });
                    }
                    return Err(oom(&p.stats, &p, free));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A new segment of `len` bytes: from `Device::alloc`, or for a capture's graph pool
    /// (`capture`) from `alloc_async` on the capturing stream, the HAL's capture-safe
    /// allocation, where the device may capture it (`GraphCaps::stream_alloc`). Elsewhere a
    /// capture cannot get a segment: `Device::alloc` is capture-unsafe and would invalidate the
    /// capture (in every mode but relaxed, which a stream does not tell), so the request is
    /// refused, the capture intact, pointing at [`CachingAllocator::reserve_graph_pool`].
    fn new_segment(
        &self,
        stream: &Arc<dyn Stream>,
        capture: Option<unihal_hal::CaptureId>,
        len: u64,
    ) -> Result<Buffer> {
        let Some(c) = capture else {
            return self.device.alloc(len as usize);
        };
        if self.device.capabilities().optional.graphs.stream_alloc {
            return stream.alloc_async(len as usize);
        }
        Err(HalError::invalid(
            "stream",
            Invalid::Capture {
                capture: Some(c),
                call: "CachingAllocator::alloc".into(),
                detail: format!(
                    "the capture's graph pool has no free block for the request and {} cannot \
                     allocate inside a capture (GraphCaps::stream_alloc is false; \
                     Device::alloc would invalidate the capture): reserve the pool's memory \
                     before begin_capture (CachingAllocator::graph_pool_handle, \
                     reserve_graph_pool, then capture_into); the capture is not invalidated",
                    self.id
                ),
            },
        ))
    }

    /// Drops the idle `alloc_async` segments of graph pools whose capture is over (graph
    /// memory, unusable after its capture), and gives the segments of every graph pool that is
    /// idle, whose captures are over and that no handle holds, to the general cache. Cheap unless
    /// a graph pool's block was freed (or a handle dropped) since the last call; asks the
    /// capturing streams outside the lock, and drops the segments outside it.
    fn release_idle_graph_pools(&self) {
        let candidates = self.shared.pools.lock().idle_graph_pools();
        if candidates.is_empty() {
            return;
        }
        let mut verdicts = Vec::new();
        let mut still_capturing = false;
        for (id, captures) in candidates {
            // A capture is going on while any stream that made its requests is still in it.
            let going_on: Vec<unihal_hal::CaptureId> = captures
                .iter()
                .filter(|(c, s)| {
                    s.upgrade().is_some_and(|s| match s.capture_status() {
                        CaptureStatus::Active(k) | CaptureStatus::Invalidated(k) => k == *c,
                        CaptureStatus::None => false,
                    })
                })
                .map(|(c, _)| *c)
                .collect();
            let mut over: Vec<unihal_hal::CaptureId> = captures
                .iter()
                .map(|(c, _)| *c)
                .filter(|c| !going_on.contains(c))
                .collect();
            over.sort_unstable();
            over.dedup();
            let all_over = going_on.is_empty();
            still_capturing |= !all_over;
            verdicts.push((id, over, all_over));
        }
        let mut dropped = Vec::new();
        let mut p = self.shared.pools.lock();
        for (id, over, all_over) in verdicts {
            dropped.extend(p.release_graph_pool(id, &over, all_over));
        }
        if still_capturing {
            p.look_again();
        }
        drop(p);
        drop(dropped);
    }

    /// A new graph pool that captures may share (PyTorch's `torch.cuda.graph_pool_handle()`):
    /// give it to [`CachingAllocator::capture_into`] for each capture that should allocate from
    /// it. It keeps its reserved segments while the handle (or a clone) lives, and goes back to
    /// the general cache like a capture's own pool once the handles are gone (its captures'
    /// `alloc_async` segments, their graph memory, are released once idle, never cached).
    pub fn graph_pool_handle(&self) -> GraphPool {
        let id = self.shared.pools.lock().new_handle_pool();
        GraphPool {
            id,
            owner: self.shared.clone(),
        }
    }

    /// Makes the requests of the capture `stream` is in allocate from `pool` (PyTorch's
    /// `torch.cuda.graph(g, pool=...)`): call it after `begin_capture`, before the capture's
    /// first request. Several captures may share one pool (see [`crate::graph`] for what they
    /// share).
    ///
    /// # Errors
    /// [`Invalid::Capture`] when `stream` is not capturing, or when its capture already
    /// allocates from another pool (its own, made at its first request, or another handle's);
    /// [`Invalid::ForeignHandle`] for a pool of another allocator; [`Invalid::WrongDevice`] for
    /// a stream of another device.
    pub fn capture_into(&self, stream: &Arc<dyn Stream>, pool: &GraphPool) -> Result<()> {
        if !std::ptr::addr_eq(Arc::as_ptr(stream.device()), Arc::as_ptr(&self.device)) {
            return Err(self.foreign_stream(stream));
        }
        if !Arc::ptr_eq(&pool.owner, &self.shared) {
            return Err(self.foreign_pool(pool));
        }
        let refused = |capture, detail: String| {
            HalError::invalid(
                "stream",
                Invalid::Capture {
                    capture,
                    call: "CachingAllocator::capture_into".into(),
                    detail,
                },
            )
        };
        let CaptureStatus::Active(c) = stream.capture_status() else {
            return Err(refused(
                stream.capture_status().capture(),
                "the stream is not in an active capture".into(),
            ));
        };
        self.shared
            .pools
            .lock()
            .assign_capture(c, stream, pool.id)
            .map_err(|other| {
                refused(
                    Some(c),
                    format!(
                        "the capture already allocates from graph pool ({}, {})",
                        other.0, other.1
                    ),
                )
            })
    }

    /// Reserves a segment for `bytes`-byte requests in `pool` with `Device::alloc`, before a
    /// capture, for a device whose captures cannot allocate (`GraphCaps::stream_alloc` false:
    /// its `Device::alloc` is refused inside a capture). The capture's requests that fit use it;
    /// every capture of the pool may, and it joins the general cache when the pool goes.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] for a pool of another allocator; the device's error
    /// ([`Invalid::Capture`] during a capture that refuses it, [`HalError::OutOfMemory`]).
    pub fn reserve_graph_pool(&self, pool: &GraphPool, bytes: usize) -> Result<()> {
        if !Arc::ptr_eq(&pool.owner, &self.shared) {
            return Err(self.foreign_pool(pool));
        }
        let size = size::round_size(bytes.max(1) as u64);
        let Some(seg_size) = size.and_then(size::segment_size) else {
            return Err(HalError::OutOfMemory {
                requested: bytes as u64,
                free: 0,
            });
        };
        let kind = PoolKind::of(size.unwrap_or(seg_size));
        let whole = self.device.alloc(seg_size as usize)?;
        let owner: Arc<dyn BlockOwner> = self.shared.clone();
        let segment = Segment::new(&whole, owner)?;
        self.shared
            .pools
            .lock()
            .add_segment(segment, kind, Some(pool.id), None);
        Ok(())
    }

    /// Every graph pool: its identity, captures, segments, reserved and allocated bytes.
    pub fn graph_pools(&self) -> Vec<GraphPoolInfo> {
        self.release_idle_graph_pools();
        self.shared.pools.lock().graph_pools()
    }

    /// The graph pool that serves the requests of `capture`, if it has one yet.
    pub fn graph_pool_of(&self, capture: unihal_hal::CaptureId) -> Option<GraphPoolId> {
        self.shared.pools.lock().capture_pool(capture)
    }

    /// The error for a graph pool of another allocator.
    fn foreign_pool(&self, pool: &GraphPool) -> HalError {
        HalError::invalid(
            "pool",
            Invalid::ForeignHandle {
                expected: format!("graph pool of the allocator of {}", self.id),
                found: format!("{pool:?} of another allocator"),
            },
        )
    }

    /// The error for a stream of another device (or of another opened instance of it).
    fn foreign_stream(&self, stream: &Arc<dyn Stream>) -> HalError {
        let found = stream.device_id();
        if found != self.id {
            return HalError::invalid(
                "stream",
                Invalid::WrongDevice {
                    expected: self.id,
                    found,
                },
            );
        }
        HalError::invalid(
            "stream",
            Invalid::Other(format!(
                "the stream belongs to another opened instance of {}",
                self.id
            )),
        )
    }

    /// Returns every cached segment that holds no block in use to the device
    /// (`torch.cuda.empty_cache`). Segments with a block in use, or with free memory that queued
    /// work still uses, stay.
    pub fn empty_cache(&self) {
        self.release_idle_graph_pools();
        let released = self.shared.pools.lock().release_cached();
        drop(released);
    }

    /// Limits the memory the allocator reserves to `fraction` of the device's total
    /// (`torch.cuda.set_per_process_memory_fraction`). Segments already reserved stay.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for a fraction outside (0, 1].
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        check_fraction(fraction)?;
        *self.limit.lock() = Some((self.total as f64 * fraction) as u64);
        Ok(())
    }

    /// The limit in bytes set by a memory fraction, if any.
    pub fn limit(&self) -> Option<u64> {
        *self.limit.lock()
    }

    /// A consistent copy of the statistics.
    pub fn stats(&self) -> MemoryStats {
        self.release_idle_graph_pools();
        self.shared.pools.lock().stats
    }

    /// Sets every peak statistic to its current value.
    pub fn reset_peak_stats(&self) {
        self.release_idle_graph_pools();
        self.shared.pools.lock().stats.reset_peaks();
    }

    /// Zeroes the running totals and the retry, out-of-memory and device-call counts.
    pub fn reset_accumulated_stats(&self) {
        self.shared.pools.lock().stats.reset_accumulated();
    }

    /// Starts (`true`) or stops recording the allocation history: every hand-out and every
    /// free, in order (PyTorch's `_record_memory_history`, without stack traces). Stopping
    /// discards what was not taken.
    pub fn record_history(&self, on: bool) {
        let mut p = self.shared.pools.lock();
        match (on, p.history.is_some()) {
            (true, false) => p.history = Some(Vec::new()),
            (false, _) => p.history = None,
            _ => {}
        }
    }

    /// The history recorded since the last call (empty when not recording).
    pub fn take_history(&self) -> Vec<TraceEvent> {
        self.shared
            .pools
            .lock()
            .history
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The segments and their blocks, in address order.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        self.release_idle_graph_pools();
        self.shared.pools.lock().snapshot()
    }

    /// The snapshot in PyTorch's layout, pickled as `torch.cuda.memory._dump_snapshot` writes
    /// it ([`crate::torch`]): the segments, and the history recorded so far (left in place) as
    /// device `device_index`'s trace, for `python -m torch.cuda._memory_viz` and the memory
    /// visualiser. Taken under the allocator's lock, so segments and trace agree.
    pub fn torch_snapshot(&self, device_index: u64) -> Vec<u8> {
        self.release_idle_graph_pools();
        let p = self.shared.pools.lock();
        let history = p.history.as_deref().unwrap_or_default();
        let max_split = p.stats.max_split_size;
        crate::torch::snapshot(device_index, &p.snapshot(), history, max_split).pickle()
    }
}

impl Drop for CachingAllocator {
    /// Releases the cached segments. Segments hold their owner (the pools) for their blocks'
    /// callbacks, so the pools would otherwise keep themselves alive; blocks still out keep
    /// their segment until they go, and their callbacks then find nothing to do.
    fn drop(&mut self) {
        if let Some(path) = self.snapshot_to.get_mut().take() {
            let ordinal = self.id.ordinal;
            let name = path.to_string_lossy().replace("%d", &ordinal.to_string());
            match std::fs::write(&name, self.torch_snapshot(ordinal as u64)) {
                Ok(()) => {
                    tracing::info!(target: "unihal::alloc", "{}: memory snapshot written to {name}", self.id)
                }
                Err(e) => {
                    tracing::warn!(target: "unihal::alloc", "{}: memory snapshot not written to {name}: {e}", self.id)
                }
            }
        }
        let segments = self.shared.pools.lock().clear();
        drop(segments);
    }
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CachingAllocator({})", self.id)
    }
}
