//! Statistics with PyTorch's keys and meanings, and the snapshot of segments and blocks.
//!
//! | statistic | PyTorch key | counts |
//! |---|---|---|
//! | allocated | `allocation`, `allocated_bytes` | blocks handed to callers whose handles live |
//! | reserved | `segment`, `reserved_bytes` | memory held from the device (segments) |
//! | active | `active`, `active_bytes` | allocated blocks, and freed blocks that queued work still uses |
//! | inactive split | `inactive_split`, `inactive_split_bytes` | cached free blocks inside a split segment (fragmentation: they cannot be returned to the device) |
//! | requested | `requested_bytes` | what callers asked for, before rounding |
//! | oversize allocations | `oversize_allocations` | allocated blocks of at least `max_split_size` (one total, no pools) |
//! | oversize segments | `oversize_segments` | segments of at least `max_split_size` |
//!
//! | graph pools | `graph_pools` (unihal's) | graph-private pools alive ([`crate::graph`]) |
//! | graph pool segments | `graph_pool_segment` (unihal's) | segments of graph pools (counted in `segment` too) |
//! | graph pool reserved | `graph_pool_reserved_bytes` (unihal's) | bytes of those segments (in `reserved_bytes` too) |
//! | graph pool allocated | `graph_pool_allocated_bytes` (unihal's) | bytes of graph-pool blocks handed out (in `allocated_bytes` too) |
//!
//! And the counts `num_alloc_retries`, `num_ooms`, `num_device_alloc`, `num_device_free`,
//! `num_oom_rejections` (requests that failed because the memory-fraction limit refused their
//! segment before the device was asked), `num_sync_all_streams` (always 0: this allocator never synchronises every stream to
//! reclaim memory, it waits for each block's own uses through events), and `max_split_size` (the
//! configured bytes, -1 when unset, as PyTorch reports its default).
//!
//! Each is kept for `all`, `small_pool` and `large_pool` as `current`, `peak`, `allocated`
//! (everything ever added) and `freed` (everything ever taken away), so
//! `current == allocated - freed`. Block sizes are the rounded sizes, as PyTorch counts them.

use crate::size::PoolKind;
use serde::Serialize;
use std::collections::BTreeMap;

/// One statistic: current value, peak since the last reset, and the running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
    pub allocated: u64,
    pub freed: u64,
}

impl Stat {
    pub(crate) fn add(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }

    pub(crate) fn sub(&mut self, n: u64) {
        debug_assert!(self.current >= n, "statistic below zero");
        self.current = self.current.saturating_sub(n);
        self.freed += n;
    }
}

/// A statistic for all blocks and per pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatArray {
    pub all: Stat,
    pub small_pool: Stat,
    pub large_pool: Stat,
}

impl StatArray {
    pub(crate) fn add(&mut self, pool: PoolKind, n: u64) {
        self.all.add(n);
        self.pool(pool).add(n);
    }

    pub(crate) fn sub(&mut self, pool: PoolKind, n: u64) {
        self.all.sub(n);
        self.pool(pool).sub(n);
    }

    fn pool(&mut self, pool: PoolKind) -> &mut Stat {
        match pool {
            PoolKind::Small => &mut self.small_pool,
            PoolKind::Large => &mut self.large_pool,
        }
    }

    fn each(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }
}

/// Every statistic of one caching allocator (one device). A copy, taken under the allocator's
/// lock, so its numbers are consistent with each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStats {
    /// Allocated blocks (`allocation`).
    pub allocation: StatArray,
    /// Segments (`segment`).
    pub segment: StatArray,
    /// Active blocks (`active`).
    pub active: StatArray,
    /// Free blocks of split segments (`inactive_split`).
    pub inactive_split: StatArray,
    pub allocated_bytes: StatArray,
    pub reserved_bytes: StatArray,
    pub active_bytes: StatArray,
    pub inactive_split_bytes: StatArray,
    pub requested_bytes: StatArray,
    /// Allocations that failed on the device, released the cache and were tried again.
    pub num_alloc_retries: u64,
    /// Allocations that failed after the retry (an out-of-memory error to the caller).
    pub num_ooms: u64,
    /// `Device::alloc` calls made for segments.
    pub num_device_alloc: u64,
    /// Segments released to the device.
    pub num_device_free: u64,
    /// Allocated blocks of at least `max_split_size` bytes.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` bytes.
    pub oversize_segments: Stat,
    /// Requests that failed because the memory-fraction limit refused their segment before the
    /// device was asked (counted in `num_ooms` too).
    pub num_oom_rejections: u64,
    /// Synchronisations of every stream to reclaim memory: none in this allocator (kept for
    /// PyTorch's key).
    pub num_sync_all_streams: u64,
    /// The configured `max_split_size` in bytes (`None`: unset, no limit).
    pub max_split_size: Option<u64>,
    /// Graph-private pools alive (`graph_pools`, unihal's key; [`crate::graph`]).
    pub graph_pools: Stat,
    /// Segments of graph pools (`graph_pool_segment`; counted in `segment` too).
    pub graph_pool_segment: Stat,
    /// Bytes of graph pools' segments (`graph_pool_reserved_bytes`; in `reserved_bytes` too).
    pub graph_pool_reserved_bytes: Stat,
    /// Bytes of graph pools' blocks handed out (`graph_pool_allocated_bytes`; in
    /// `allocated_bytes` too).
    pub graph_pool_allocated_bytes: Stat,
}

impl MemoryStats {
    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// The statistics under PyTorch's flat keys, every key `torch.cuda.memory_stats()` gives
    /// (`allocated_bytes.all.current`, `oversize_segments.peak`, `num_alloc_retries`,
    /// `max_split_size`, ...), with its signed values, and unihal's graph-pool statistics
    /// (`graph_pools.current`, `graph_pool_reserved_bytes.peak`, ...).
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut m = BTreeMap::new();
        let stat = |m: &mut BTreeMap<String, i64>, prefix: &str, s: &Stat| {
            for (what, v) in [
                ("current", s.current),
                ("peak", s.peak),
                ("allocated", s.allocated),
                ("freed", s.freed),
            ] {
                m.insert(format!("{prefix}.{what}"), int(v));
            }
        };
        for (name, a) in self.arrays() {
            for (pool, s) in [
                ("all", &a.all),
                ("small_pool", &a.small_pool),
                ("large_pool", &a.large_pool),
            ] {
                stat(&mut m, &format!("{name}.{pool}"), s);
            }
        }
        stat(&mut m, "oversize_allocations", &self.oversize_allocations);
        stat(&mut m, "oversize_segments", &self.oversize_segments);
        for (k, s) in self.graph_stats() {
            stat(&mut m, k, s);
        }
        for (k, v) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("num_oom_rejections", self.num_oom_rejections),
            ("num_sync_all_streams", self.num_sync_all_streams),
        ] {
            m.insert(k.into(), int(v));
        }
        m.insert("max_split_size".into(), self.max_split_size.map_or(-1, int));
        m
    }

    /// The graph-pool statistics with their keys.
    pub(crate) fn graph_stats(&self) -> [(&'static str, &Stat); 4] {
        [
            ("graph_pools", &self.graph_pools),
            ("graph_pool_segment", &self.graph_pool_segment),
            ("graph_pool_reserved_bytes", &self.graph_pool_reserved_bytes),
            (
                "graph_pool_allocated_bytes",
                &self.graph_pool_allocated_bytes,
            ),
        ]
    }

    /// The statistics that are one [`Stat`], not a [`StatArray`].
    fn single_stats_mut(&mut self) -> [&mut Stat; 6] {
        [
            &mut self.oversize_allocations,
            &mut self.oversize_segments,
            &mut self.graph_pools,
            &mut self.graph_pool_segment,
            &mut self.graph_pool_reserved_bytes,
            &mut self.graph_pool_allocated_bytes,
        ]
    }

    /// Sets every peak to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub(crate) fn reset_peaks(&mut self) {
        for a in self.arrays_mut() {
            for s in a.each() {
                s.peak = s.current;
            }
        }
        for s in self.single_stats_mut() {
            s.peak = s.current;
        }
    }

    /// Zeroes the running totals and the retry and out-of-memory counts
    /// (`torch.cuda.reset_accumulated_memory_stats`).
    pub(crate) fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            for s in a.each() {
                s.allocated = s.current;
                s.freed = 0;
            }
        }
        for s in self.single_stats_mut() {
            s.allocated = s.current;
            s.freed = 0;
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.num_oom_rejections = 0;
        self.num_sync_all_streams = 0;
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

/// The state of a block in a [`SegmentSnapshot`] (PyTorch's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed to a caller whose handles live.
    ActiveAllocated,
    /// Freed by the caller while queued work on several streams still uses it.
    ActivePendingFree,
    /// Cached and free.
    Inactive,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockSnapshot {
    /// Device address of the first byte.
    pub address: u64,
    pub size: u64,
    /// What the caller asked for (0 for a free block).
    pub requested_size: u64,
    pub state: BlockState,
    /// Streams whose queued work still uses memory of this block although its caller dropped
    /// it ([`unihal_hal::StreamId::get`]). A free block with one such stream serves only that
    /// stream until the work completes; with several, none.
    pub pending_uses_on: Vec<u64>,
}

/// One segment (one `Device::alloc`) and its blocks in address order
/// (`torch.cuda.memory_snapshot()`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SegmentSnapshot {
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub pool: PoolKind,
    /// The graph pool the segment belongs to ([`crate::graph`]; torch's `segment_pool_id`),
    /// `None` in the general cache.
    pub graph_pool: Option<crate::graph::GraphPoolId>,
    pub blocks: Vec<BlockSnapshot>,
}

/// One entry of the allocation history (see `CachingAllocator::record_history`), with PyTorch's
/// actions (`torch.cuda.memory._record_memory_history`'s trace entries), in the order they
/// happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceEvent {
    /// A block at `addr` handed out for `size` requested bytes, for work on `stream`
    /// (`StreamId::get`); `id` names the hand-out until its free (torch's `alloc`).
    Alloc {
        id: u64,
        addr: u64,
        size: u64,
        stream: u64,
    },
    /// The caller's last handle of hand-out `id` was dropped (torch's `free_requested`).
    FreeRequested {
        id: u64,
        addr: u64,
        size: u64,
        stream: u64,
    },
    /// Hand-out `id`'s block is back in the cache (torch's `free_completed`): at once, or, when
    /// queued work of several streams used it, once that work completed.
    FreeCompleted {
        id: u64,
        addr: u64,
        size: u64,
        stream: u64,
    },
    /// A segment of `size` bytes at `addr` taken from the device (torch's `segment_alloc`).
    SegmentAlloc { addr: u64, size: u64 },
    /// A segment returned to the device (torch's `segment_free`).
    SegmentFree { addr: u64, size: u64 },
    /// A request of `size` bytes failed with `device_free` bytes free on the device (torch's
    /// `oom`).
    Oom { size: u64, device_free: u64 },
}

impl TraceEvent {
    /// The `FreeCompleted` of a `FreeRequested` (itself otherwise).
    pub(crate) fn completed(self) -> TraceEvent {
        match self {
            TraceEvent::FreeRequested {
                id,
                addr,
                size,
                stream,
            } => TraceEvent::FreeCompleted {
                id,
                addr,
                size,
                stream,
            },
            e => e,
        }
    }
}
