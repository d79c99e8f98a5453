//! The block bookkeeping of one device: segments, their blocks in address order, the free lists
//! of both pools, splitting, coalescing and stream fences, with the statistics kept as blocks
//! change state. No device calls: every method runs under the allocator's lock.
//!
//! A *fence* marks memory that queued work on one stream still uses after the caller dropped its
//! handles (`Reclaim::ForStream`): a free block carrying fences serves only a request for the
//! stream all its fences name, and coalesces with nothing, until the work completes and the
//! fence is closed. A block handed out from fenced memory keeps the fences (its new owner's work
//! on another stream must not be the one to make it reusable elsewhere).
//!
//! *Graph pools* ([`crate::graph`]) hold the segments allocated for requests of stream captures:
//! each has free lists of its own, which only requests of its captures search, so its blocks are
//! never handed to other work while it lives. Requests of a capture key their stream-ordered
//! reuse on the capture's [`unihal_hal::CaptureId::stream_id`], the stream the captured work keeps
//! its buffers on: a block the capture freed while captured work uses it is fenced to that
//! identity and so serves the same capture's later requests, and nothing else until the graph
//! is destroyed (its uses end, the fence closes). A segment a capture made with `alloc_async`
//! is graph memory: it has free lists of its own in the pool, which only that capture searches,
//! and once idle with its capture over it is removed (never cached). A pool whose segments are
//! all idle again, with its captures over and no handle left, gives its remaining (reserved)
//! segments to the general cache ([`Pools::release_graph_pool`]).

use crate::bins::SizeBins;
use crate::graph::GraphPoolId;
use crate::size::{self, PoolKind};
use crate::stats::{BlockSnapshot, BlockState, MemoryStats, SegmentSnapshot, TraceEvent};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use unihal_hal::{
    counters, Buffer, CaptureId, DeviceId, PendingUses, Reclaim, Result, Segment, Stream, StreamId,
};

/// Index of a block or segment slot.
pub(crate) type Idx = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Allocated,
    /// Handles gone; queued work on several streams still uses it.
    PendingFree,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fence {
    id: u64,
    stream: StreamId,
}

#[derive(Debug)]
struct Block {
    seg: Idx,
    /// The segment's pool (kept here: looked up on every state change).
    pool: PoolKind,
    /// The segment's graph pool, if it belongs to one (kept here for the same reason).
    graph: Option<GraphPoolId>,
    /// The capture whose `alloc_async` made the segment, which alone may use it (kept here for
    /// the same reason); `None` for a segment of `Device::alloc`.
    captured: Option<CaptureId>,
    offset: u64,
    size: u64,
    requested: u64,
    /// The stream of the hand-out (`StreamId::get`; 0 while free).
    stream: u64,
    state: State,
    prev: Option<Idx>,
    next: Option<Idx>,
    fences: Vec<Fence>,
}

struct Slot {
    /// Bumped at every hand-out and every reuse of the slot, so a token names one hand-out.
    gen: u32,
    block: Option<Block>,
}

struct SegmentSlot {
    segment: Segment,
    size: u64,
    pool: PoolKind,
    graph: Option<GraphPoolId>,
    /// The capture whose `alloc_async` made it (see [`Block::captured`]).
    captured: Option<CaptureId>,
    first: Idx,
}

struct FreeLists {
    /// Free blocks without fences, by size (then slot, for a stable order).
    clean: SizeBins<Idx>,
    /// Free blocks with fences (few: memory whose work is still queued).
    fenced: Vec<Idx>,
}

impl FreeLists {
    fn new() -> FreeLists {
        FreeLists {
            clean: SizeBins::new(),
            fenced: Vec::new(),
        }
    }
}

impl GraphPoolState {
    /// Every free list of the pool for `pool`-kind blocks (reserved and captured segments).
    fn all_lists(&self, pool: PoolKind) -> impl Iterator<Item = &FreeLists> {
        std::iter::once((&self.small, &self.large))
            .chain(self.captured.values().map(|(s, l)| (s, l)))
            .map(move |(s, l)| match pool {
                PoolKind::Small => s,
                PoolKind::Large => l,
            })
    }
}

/// One graph-private pool: its free lists, its segments, the captures it serves and the
/// handles ([`crate::GraphPool`]) that keep it for captures to come.
struct GraphPoolState {
    /// Free lists of the segments reserved with `Device::alloc` (`reserve_graph_pool`), which
    /// every capture of the pool may use.
    small: FreeLists,
    large: FreeLists,
    /// Free lists of the segments a capture made with `alloc_async`, which only that capture may
    /// use (graph memory: its handles are unusable once the capture ends).
    captured: BTreeMap<CaptureId, (FreeLists, FreeLists)>,
    /// Its segments (slots of `Pools::segments`).
    segments: Vec<Idx>,
    /// Captures whose requests it serves, with the streams that made them (to learn, outside
    /// the owner callbacks, whether the capture is still going on).
    captures: Vec<(CaptureId, Weak<dyn Stream>)>,
    /// Live [`crate::GraphPool`] handles.
    handles: usize,
    /// Bytes of its blocks handed out and not yet freed.
    allocated: u64,
}

/// Segments, blocks and statistics of one device.
pub(crate) struct Pools {
    slots: Vec<Slot>,
    free_slots: Vec<Idx>,
    segments: Vec<Option<SegmentSlot>>,
    free_segments: Vec<Idx>,
    small: FreeLists,
    large: FreeLists,
    /// Open fences: id to segment.
    fences: HashMap<u64, Idx>,
    /// Graph-private pools.
    graph: BTreeMap<GraphPoolId, GraphPoolState>,
    /// Which pool serves each capture that has one.
    capture_pools: HashMap<CaptureId, GraphPoolId>,
    /// A graph pool may have become idle since the last look ([`Pools::idle_graph_pools`]).
    graph_idle_hint: bool,
    /// The next number of a pool made by `graph_pool_handle` (`(0, n)`).
    next_handle_pool: u64,
    pub stats: MemoryStats,
    pub max_split: u64,
    /// The allocation history, while recorded.
    pub history: Option<Vec<TraceEvent>>,
    /// The device, named in counter samples for a timeline (`unihal_hal::counters`).
    device: DeviceId,
}

fn token(idx: Idx, gen: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(idx)
}

impl Pools {
    pub fn new(max_split: u64, device: DeviceId) -> Pools {
        Pools {
            slots: Vec::new(),
            free_slots: Vec::new(),
            segments: Vec::new(),
            free_segments: Vec::new(),
            small: FreeLists::new(),
            large: FreeLists::new(),
            fences: HashMap::new(),
            graph: BTreeMap::new(),
            capture_pools: HashMap::new(),
            graph_idle_hint: false,
            next_handle_pool: 1,
            stats: MemoryStats {
                max_split_size: (max_split != u64::MAX).then_some(max_split),
                ..MemoryStats::default()
            },
            max_split,
            history: None,
            device,
        }
    }

    fn b(&self, i: Idx) -> &Block {
        self.slots[i as usize].block.as_ref().expect("live block")
    }

    fn bm(&mut self, i: Idx) -> &mut Block {
        self.slots[i as usize].block.as_mut().expect("live block")
    }

    fn seg(&self, i: Idx) -> &SegmentSlot {
        self.segments[i as usize].as_ref().expect("live segment")
    }

    fn pool_of(&self, i: Idx) -> PoolKind {
        self.b(i).pool
    }

    /// The free lists of `pool`-kind blocks of the general cache or of graph pool `graph`, those
    /// of the segments of capture `captured` there (made on first use), or of its reserved ones.
    fn lists(
        &mut self,
        pool: PoolKind,
        graph: Option<GraphPoolId>,
        captured: Option<CaptureId>,
    ) -> &mut FreeLists {
        let (small, large) = match graph {
            None => (&mut self.small, &mut self.large),
            Some(g) => {
                let g = self.graph.get_mut(&g).expect("live graph pool");
                match captured {
                    None => (&mut g.small, &mut g.large),
                    Some(c) => {
                        let (s, l) = g
                            .captured
                            .entry(c)
                            .or_insert_with(|| (FreeLists::new(), FreeLists::new()));
                        (s, l)
                    }
                }
            }
        };
        match pool {
            PoolKind::Small => small,
            PoolKind::Large => large,
        }
    }

    fn lists_ref(
        &self,
        pool: PoolKind,
        graph: Option<GraphPoolId>,
        captured: Option<CaptureId>,
    ) -> Option<&FreeLists> {
        let (small, large) = match graph {
            None => (&self.small, &self.large),
            Some(g) => {
                let g = self.graph.get(&g)?;
                match captured {
                    None => (&g.small, &g.large),
                    Some(c) => {
                        let (s, l) = g.captured.get(&c)?;
                        (s, l)
                    }
                }
            }
        };
        Some(match pool {
            PoolKind::Small => small,
            PoolKind::Large => large,
        })
    }

    fn new_slot(&mut self, block: Block) -> Idx {
        match self.free_slots.pop() {
            Some(i) => {
                let s = &mut self.slots[i as usize];
                s.gen = s.gen.wrapping_add(1);
                s.block = Some(block);
                i
            }
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    block: Some(block),
                });
                (self.slots.len() - 1) as Idx
            }
        }
    }

    fn delete_slot(&mut self, i: Idx) {
        self.slots[i as usize].block = None;
        self.free_slots.push(i);
    }

    /// The block a token names, if that hand-out is still the block's current one.
    /// Records `e` in the history, while it is recorded.
    /// Every change of the allocated or reserved bytes passes here: it also samples them for a
    /// timeline when one records (`UNIHAL_TRACE`).
    fn trace(&mut self, e: impl FnOnce() -> TraceEvent) {
        if let Some(h) = &mut self.history {
            h.push(e());
        }
        if counters::recording() {
            let (a, r) = (
                &self.stats.allocated_bytes.all,
                &self.stats.reserved_bytes.all,
            );
            counters::sample(
                self.device,
                "memory",
                &[
                    ("allocated", i64::try_from(a.current).unwrap_or(i64::MAX)),
                    ("reserved", i64::try_from(r.current).unwrap_or(i64::MAX)),
                ],
            );
        }
    }

    /// The device address of block `i`.
    fn addr(&self, i: Idx) -> u64 {
        let b = self.b(i);
        self.seg(b.seg).segment.device_addr() + b.offset
    }

    fn resolve(&self, token: u64) -> Option<Idx> {
        let (idx, gen) = ((token & 0xffff_ffff) as Idx, (token >> 32) as u32);
        let s = self.slots.get(idx as usize)?;
        (s.gen == gen && s.block.is_some()).then_some(idx)
    }

    fn is_split(&self, i: Idx) -> bool {
        let b = self.b(i);
        b.prev.is_some() || b.next.is_some()
    }

    /// What places a free block: size, fenced, pool, part of a split segment, graph pool and
    /// the capture that made its segment.
    #[allow(clippy::type_complexity)]
    fn free_key(
        &self,
        i: Idx,
    ) -> (
        u64,
        bool,
        PoolKind,
        bool,
        Option<GraphPoolId>,
        Option<CaptureId>,
    ) {
        let b = self.b(i);
        (
            b.size,
            !b.fences.is_empty(),
            b.pool,
            self.is_split(i),
            b.graph,
            b.captured,
        )
    }

    /// Puts a free block on its pool's free list (and counts it as inactive split memory).
    fn insert_free(&mut self, i: Idx) {
        let (size, fenced, pool, split, graph, captured) = self.free_key(i);
        if graph.is_some() {
            // Its pool may be idle now: the next look at the graph pools checks.
            self.graph_idle_hint = true;
        }
        let l = self.lists(pool, graph, captured);
        if fenced {
            l.fenced.push(i);
        } else {
            l.clean.insert(size, i);
        }
        if split {
            self.stats.inactive_split.add(pool, 1);
            self.stats.inactive_split_bytes.add(pool, size);
        }
    }

    /// Takes a free block off its free list (undoing [`Pools::insert_free`]).
    fn remove_free(&mut self, i: Idx) {
        let (size, fenced, pool, split, graph, captured) = self.free_key(i);
        let l = self.lists(pool, graph, captured);
        if fenced {
            l.fenced.retain(|&j| j != i);
        } else {
            l.clean.remove(size, i);
        }
        if split {
            self.stats.inactive_split.sub(pool, 1);
            self.stats.inactive_split_bytes.sub(pool, size);
        }
    }

    fn mergeable(&self, i: Option<Idx>) -> Option<Idx> {
        let i = i?;
        let b = self.b(i);
        (b.state == State::Free && b.fences.is_empty()).then_some(i)
    }

    /// Makes block `i` (not on a free list) free: coalesced with free neighbours when neither
    /// carries a fence, then put on its free list.
    fn make_free(&mut self, mut i: Idx) {
        {
            let b = self.bm(i);
            b.state = State::Free;
            b.requested = 0;
        }
        if self.b(i).fences.is_empty() {
            if let Some(p) = self.mergeable(self.b(i).prev) {
                self.remove_free(p);
                self.absorb_next(p);
                i = p;
            }
            if let Some(n) = self.mergeable(self.b(i).next) {
                self.remove_free(n);
                self.absorb_next(i);
            }
        }
        self.insert_free(i);
    }

    /// Merges the block after `i` into `i` (both off the free lists).
    fn absorb_next(&mut self, i: Idx) {
        let n = self.b(i).next.expect("a next block");
        let (nsize, nnext) = {
            let nb = self.b(n);
            (nb.size, nb.next)
        };
        {
            let b = self.bm(i);
            b.size += nsize;
            b.next = nnext;
        }
        if let Some(nn) = nnext {
            self.bm(nn).prev = Some(i);
        }
        self.delete_slot(n);
    }

    /// Adds a segment (one free block) of a fresh device allocation; returns that block, which
    /// the request the segment was allocated for takes ([`Pools::take`]) whatever [`Pools::find`]
    /// would say of it (PyTorch's rule: `max_split_size` decides which *cached* blocks may serve
    /// a request, never the segment made for it).
    ///
    /// `graph`: the graph pool the segment belongs to (which must exist), or `None` for the
    /// general cache. `captured`: the capture whose `alloc_async` made it (in `graph`), which
    /// alone may use it; `None` for a segment of `Device::alloc`.
    pub fn add_segment(
        &mut self,
        segment: Segment,
        pool: PoolKind,
        graph: Option<GraphPoolId>,
        captured: Option<CaptureId>,
    ) -> Idx {
        debug_assert!(captured.is_none() || graph.is_some());
        let size = segment.len();
        let seg = match self.free_segments.pop() {
            Some(s) => s,
            None => {
                self.segments.push(None);
                (self.segments.len() - 1) as Idx
            }
        };
        let first = self.new_slot(Block {
            seg,
            pool,
            graph,
            captured,
            offset: 0,
            size,
            requested: 0,
            stream: 0,
            state: State::Free,
            prev: None,
            next: None,
            fences: Vec::new(),
        });
        self.segments[seg as usize] = Some(SegmentSlot {
            segment,
            size,
            pool,
            graph,
            captured,
            first,
        });
        if let Some(g) = graph {
            self.graph
                .get_mut(&g)
                .expect("live graph pool")
                .segments
                .push(seg);
            self.stats.graph_pool_segment.add(1);
            self.stats.graph_pool_reserved_bytes.add(size);
        }
        self.stats.segment.add(pool, 1);
        self.stats.reserved_bytes.add(pool, size);
        self.stats.num_device_alloc += 1;
        if size >= self.max_split {
            self.stats.oversize_segments.add(1);
        }
        let addr = self.seg(seg).segment.device_addr();
        self.trace(|| TraceEvent::SegmentAlloc { addr, size });
        self.insert_free(first);
        first
    }

    /// The best-fitting free block of `pool` for `size` bytes of new work on `stream`: the
    /// smallest clean block that fits, or a smaller fenced block whose fences all name `stream`.
    /// `thrifty`: only blocks [`size::thrifty`] allows (the rule while the device has memory).
    /// `graph`: search that graph pool's free lists (a capture's request, `stream` then being the
    /// capture's stream identity), or the general cache's. `capture`: the requesting capture,
    /// whose own `alloc_async` segments of `graph` are searched besides the pool's reserved ones
    /// (another capture's never are).
    pub fn find(
        &self,
        pool: PoolKind,
        size: u64,
        stream: StreamId,
        thrifty: bool,
        graph: Option<GraphPoolId>,
        capture: Option<CaptureId>,
    ) -> Option<Idx> {
        let fits = |bsize: u64| {
            size::fits(bsize, size, self.max_split) && (!thrifty || size::thrifty(bsize, size))
        };
        let own = capture.filter(|_| graph.is_some());
        [self.lists_ref(pool, graph, None)]
            .into_iter()
            .chain(own.map(|c| self.lists_ref(pool, graph, Some(c))))
            .flatten()
            .flat_map(|l| {
                let clean = l
                    .clean
                    .best_fit(size)
                    .filter(|&(bsize, _)| fits(bsize))
                    .map(|(bsize, i)| (bsize, false, i));
                let fenced = l
                    .fenced
                    .iter()
                    .map(|&i| (self.b(i).size, i))
                    .filter(|&(bsize, i)| {
                        fits(bsize) && self.b(i).fences.iter().all(|f| f.stream == stream)
                    })
                    .min()
                    .map(|(bsize, i)| (bsize, true, i));
                clean.into_iter().chain(fenced)
            })
            // The smallest; a clean block before a fenced one of its size.
            .min_by_key(|&(bsize, fenced, _)| (bsize, fenced))
            .map(|x| x.2)
    }

    /// Hands out `size` bytes of free block `i` for a request of `requested` bytes on `stream`,
    /// splitting off the rest when the size classes say so.
    ///
    /// # Errors
    /// Those of `Segment::block` (none for a block inside its segment).
    pub fn take(&mut self, i: Idx, size: u64, requested: u64, stream: StreamId) -> Result<Buffer> {
        self.remove_free(i);
        let (block_size, offset, seg, next, fences) = {
            let b = self.b(i);
            (b.size, b.offset, b.seg, b.next, b.fences.clone())
        };
        if size::should_split(block_size, size, self.max_split) {
            let (pool, graph, captured) = (self.b(i).pool, self.b(i).graph, self.b(i).captured);
            let rest = self.new_slot(Block {
                seg,
                pool,
                graph,
                captured,
                offset: offset + size,
                size: block_size - size,
                requested: 0,
                stream: 0,
                state: State::Free,
                prev: Some(i),
                next,
                fences,
            });
            if let Some(n) = next {
                self.bm(n).prev = Some(rest);
            }
            let b = self.bm(i);
            b.next = Some(rest);
            b.size = size;
            self.insert_free(rest);
        }
        let pool = self.pool_of(i);
        let (size, graph) = {
            let b = self.bm(i);
            b.state = State::Allocated;
            b.requested = requested;
            b.stream = stream.get();
            (b.size, b.graph)
        };
        if let Some(g) = graph {
            self.graph.get_mut(&g).expect("live graph pool").allocated += size;
            self.stats.graph_pool_allocated_bytes.add(size);
        }
        let s = &mut self.slots[i as usize];
        s.gen = s.gen.wrapping_add(1);
        let token = token(i, s.gen);
        let st = &mut self.stats;
        st.allocation.add(pool, 1);
        st.allocated_bytes.add(pool, size);
        st.active.add(pool, 1);
        st.active_bytes.add(pool, size);
        st.requested_bytes.add(pool, requested);
        if size >= self.max_split {
            st.oversize_allocations.add(1);
        }
        let addr = self.addr(i);
        self.trace(|| TraceEvent::Alloc {
            id: token,
            addr,
            size: requested,
            stream: stream.get(),
        });
        self.seg(seg).segment.block(offset, requested, token)
    }

    fn deactivate(&mut self, i: Idx) {
        let (pool, size) = (self.pool_of(i), self.b(i).size);
        self.stats.active.sub(pool, 1);
        self.stats.active_bytes.sub(pool, size);
    }

    /// The caller's last handle of hand-out `token` is gone (see `BlockOwner::handles_dropped`).
    pub fn handles_dropped(&mut self, token: u64, pending: PendingUses) -> Reclaim {
        let Some(i) = self.resolve(token) else {
            return Reclaim::Later;
        };
        if self.b(i).state != State::Allocated {
            return Reclaim::Later;
        }
        let (pool, size, requested, graph) = {
            let b = self.b(i);
            (self.pool_of(i), b.size, b.requested, b.graph)
        };
        if let Some(g) = graph {
            self.graph.get_mut(&g).expect("live graph pool").allocated -= size;
            self.stats.graph_pool_allocated_bytes.sub(size);
        }
        let st = &mut self.stats;
        st.allocation.sub(pool, 1);
        st.allocated_bytes.sub(pool, size);
        st.requested_bytes.sub(pool, requested);
        if size >= self.max_split {
            st.oversize_allocations.sub(1);
        }
        let (addr, stream) = (self.addr(i), self.b(i).stream);
        let freed = TraceEvent::FreeRequested {
            id: token,
            addr,
            size: requested,
            stream,
        };
        self.trace(|| freed);
        match pending {
            PendingUses::None => {
                self.trace(|| freed.completed());
                self.deactivate(i);
                self.make_free(i);
                Reclaim::Now
            }
            PendingUses::OneStream(stream) => {
                // Back in the cache at once, for the stream whose work still uses it.
                self.trace(|| freed.completed());
                let seg = self.b(i).seg;
                self.bm(i).fences.push(Fence { id: token, stream });
                self.fences.insert(token, seg);
                self.deactivate(i);
                self.make_free(i);
                Reclaim::ForStream
            }
            PendingUses::Several => {
                self.bm(i).state = State::PendingFree;
                Reclaim::Later
            }
        }
    }

    /// Every use of hand-out `token` is gone (see `BlockOwner::retired`).
    pub fn retired(&mut self, token: u64, early: bool) {
        if early {
            self.close_fence(token);
        } else if let Some(i) = self.resolve(token) {
            if self.b(i).state == State::PendingFree {
                let b = self.b(i);
                let done = TraceEvent::FreeCompleted {
                    id: token,
                    addr: self.addr(i),
                    size: b.requested,
                    stream: b.stream,
                };
                self.trace(|| done);
                self.deactivate(i);
                self.make_free(i);
            }
        }
    }

    /// The work a fence waited for has completed: its memory serves every stream again.
    fn close_fence(&mut self, id: u64) {
        let Some(seg) = self.fences.remove(&id) else {
            return;
        };
        let Some(s) = self.segments.get(seg as usize).and_then(|s| s.as_ref()) else {
            return;
        };
        let mut carriers = Vec::new();
        let mut cur = Some(s.first);
        while let Some(i) = cur {
            let b = self.b(i);
            if b.fences.iter().any(|f| f.id == id) {
                carriers.push(i);
            }
            cur = b.next;
        }
        for i in carriers {
            // A carrier may have been merged away by an earlier one of this loop.
            if self.slots[i as usize].block.is_none() {
                continue;
            }
            let free = self.b(i).state == State::Free;
            if free {
                self.remove_free(i);
            }
            self.bm(i).fences.retain(|f| f.id != id);
            if free {
                self.make_free(i);
            }
        }
    }

    /// Removes every segment that is one clean free block, for the device to take back; the
    /// caller drops them after releasing its lock.
    pub fn release_cached(&mut self) -> Vec<Segment> {
        let mut out = Vec::new();
        for seg in 0..self.segments.len() as Idx {
            let Some(s) = &self.segments[seg as usize] else {
                continue;
            };
            if s.graph.is_some() {
                // A graph pool's segments stay in it while it lives.
                continue;
            }
            let first = s.first;
            let b = self.b(first);
            if b.next.is_some() || b.state != State::Free || !b.fences.is_empty() {
                continue;
            }
            self.remove_free(first);
            self.delete_slot(first);
            let s = self.segments[seg as usize].take().expect("live segment");
            self.free_segments.push(seg);
            self.stats.segment.sub(s.pool, 1);
            self.stats.reserved_bytes.sub(s.pool, s.size);
            self.stats.num_device_free += 1;
            if s.size >= self.max_split {
                self.stats.oversize_segments.sub(1);
            }
            let (addr, size) = (s.segment.device_addr(), s.size);
            self.trace(|| TraceEvent::SegmentFree { addr, size });
            out.push(s.segment);
        }
        out
    }

    /// Forgets every block and hands every segment back, for the allocator's drop (callbacks of
    /// blocks still out find nothing afterwards).
    pub fn clear(&mut self) -> Vec<Segment> {
        let out = self
            .segments
            .drain(..)
            .flatten()
            .map(|s| s.segment)
            .collect();
        for s in &mut self.slots {
            s.block = None;
        }
        self.small = FreeLists::new();
        self.large = FreeLists::new();
        self.fences.clear();
        self.graph.clear();
        self.capture_pools.clear();
        out
    }

    /// A new pool for `graph_pool_handle`, `(0, n)`, held by one handle.
    pub fn new_handle_pool(&mut self) -> GraphPoolId {
        let id = GraphPoolId(0, self.next_handle_pool);
        self.next_handle_pool += 1;
        self.new_graph_pool(id, 1);
        id
    }

    fn new_graph_pool(&mut self, id: GraphPoolId, handles: usize) {
        self.graph.insert(
            id,
            GraphPoolState {
                small: FreeLists::new(),
                large: FreeLists::new(),
                captured: BTreeMap::new(),
                segments: Vec::new(),
                captures: Vec::new(),
                handles,
                allocated: 0,
            },
        );
        self.stats.graph_pools.add(1);
        // A pool whose first segment never comes (the request failed) is idle from the start.
        self.graph_idle_hint = true;
    }

    /// A handle of pool `id` was cloned (`more`) or dropped.
    pub fn graph_pool_handle(&mut self, id: GraphPoolId, more: bool) {
        if let Some(g) = self.graph.get_mut(&id) {
            if more {
                g.handles += 1;
            } else {
                g.handles -= 1;
                self.graph_idle_hint = true;
            }
        }
    }

    /// Records that `stream` makes requests for capture `c`, whose pool is `id`.
    fn note_capture(&mut self, id: GraphPoolId, c: CaptureId, stream: &Arc<dyn Stream>) {
        let g = self.graph.get_mut(&id).expect("live graph pool");
        let known = g
            .captures
            .iter()
            .any(|(k, s)| *k == c && std::ptr::addr_eq(s.as_ptr(), Arc::as_ptr(stream)));
        if !known {
            g.captures.push((c, Arc::downgrade(stream)));
        }
    }

    /// The pool that serves requests of capture `c` made on `stream`: the one assigned to it
    /// ([`Pools::assign_capture`]), or a private one, `(c, 0)`, made at its first request.
    pub fn pool_for_capture(&mut self, c: CaptureId, stream: &Arc<dyn Stream>) -> GraphPoolId {
        let id = match self.capture_pools.get(&c) {
            Some(&id) => id,
            None => {
                let id = GraphPoolId(c.get(), 0);
                self.new_graph_pool(id, 0);
                self.capture_pools.insert(c, id);
                id
            }
        };
        self.note_capture(id, c, stream);
        id
    }

    /// The pool serving capture `c`, if any.
    pub fn capture_pool(&self, c: CaptureId) -> Option<GraphPoolId> {
        self.capture_pools.get(&c).copied()
    }

    /// The planted defect of `planted::set_graph_pools_shared`: a request outside any capture
    /// takes any free block of a graph pool that fits, fenced by the graph's uses or not (as if
    /// the pool's blocks were in the general cache without their graph's uses).
    #[cfg(feature = "planted-defects")]
    pub fn find_in_graph_pools(&self, pool: PoolKind, size: u64) -> Option<Idx> {
        self.graph
            .values()
            .flat_map(|g| g.all_lists(pool))
            .find_map(|l| {
                l.clean
                    .best_fit(size)
                    .map(|(_, i)| i)
                    .or_else(|| l.fenced.iter().copied().find(|&i| self.b(i).size >= size))
            })
    }

    /// Makes pool `id` (alive: a handle holds it) serve the requests of capture `c`.
    ///
    /// # Errors
    /// The pool already serving `c`, when it is another one.
    pub fn assign_capture(
        &mut self,
        c: CaptureId,
        stream: &Arc<dyn Stream>,
        id: GraphPoolId,
    ) -> std::result::Result<(), GraphPoolId> {
        match self.capture_pools.get(&c) {
            Some(&other) if other != id => return Err(other),
            Some(_) => {}
            None => {
                self.capture_pools.insert(c, id);
            }
        }
        self.note_capture(id, c, stream);
        Ok(())
    }

    /// True when segment `seg` is one free block no queued work uses.
    fn segment_idle(&self, seg: Idx) -> bool {
        let b = self.b(self.seg(seg).first);
        b.next.is_none() && b.state == State::Free && b.fences.is_empty()
    }

    /// True when every segment of pool `g` is one free block no queued work uses.
    fn graph_pool_idle(&self, g: &GraphPoolState) -> bool {
        g.segments.iter().all(|&seg| self.segment_idle(seg))
    }

    /// The pools that may give memory back, each with its captures: idle with no handle left (the
    /// whole pool may go), or holding an idle segment a capture made with `alloc_async` (which
    /// is dropped once that capture is over). Whether their captures are over the caller learns
    /// from the streams, outside the lock (then [`Pools::release_graph_pool`]). Empty unless a
    /// pool block was freed or a handle dropped since the last call, or [`Pools::look_again`]
    /// asked.
    #[allow(clippy::type_complexity)]
    pub fn idle_graph_pools(&mut self) -> Vec<(GraphPoolId, Vec<(CaptureId, Weak<dyn Stream>)>)> {
        if !std::mem::take(&mut self.graph_idle_hint) {
            return Vec::new();
        }
        self.graph
            .iter()
            .filter(|(_, g)| {
                (g.handles == 0 && self.graph_pool_idle(g))
                    || g.segments
                        .iter()
                        .any(|&seg| self.seg(seg).captured.is_some() && self.segment_idle(seg))
            })
            .map(|(&id, g)| (id, g.captures.clone()))
            .collect()
    }

    /// True when [`Pools::idle_graph_pools`] has something to look at.
    pub fn idle_hint(&self) -> bool {
        self.graph_idle_hint
    }

    /// Asks the next [`Pools::idle_graph_pools`] to look again (an idle pool's capture was
    /// still going on).
    pub fn look_again(&mut self) {
        self.graph_idle_hint = true;
    }

    /// Gives back what pool `id` no longer needs, the captures in `over` being over (the caller
    /// asked their streams): each idle segment one of them made with `alloc_async` is removed
    /// (graph memory: its handles are unusable once its capture ended, so it never joins the
    /// general cache; it counts as released reserved memory). Then, when `all_over` (every
    /// capture of the pool is over), the pool is idle and no handle holds it, its remaining
    /// segments (those of `reserve_graph_pool`) join the general cache and the pool is
    /// forgotten. Returns the removed segments, for the caller to drop after releasing its lock.
    pub fn release_graph_pool(
        &mut self,
        id: GraphPoolId,
        over: &[CaptureId],
        all_over: bool,
    ) -> Vec<Segment> {
        let mut out = Vec::new();
        let Some(g) = self.graph.get(&id) else {
            return out;
        };
        let dead: Vec<Idx> = g
            .segments
            .iter()
            .copied()
            .filter(|&seg| {
                self.seg(seg).captured.is_some_and(|c| over.contains(&c)) && self.segment_idle(seg)
            })
            .collect();
        for &seg in &dead {
            let first = self.seg(seg).first;
            self.remove_free(first);
            self.delete_slot(first);
            let s = self.segments[seg as usize].take().expect("live segment");
            self.free_segments.push(seg);
            let st = &mut self.stats;
            st.graph_pool_segment.sub(1);
            st.graph_pool_reserved_bytes.sub(s.size);
            st.segment.sub(s.pool, 1);
            st.reserved_bytes.sub(s.pool, s.size);
            st.num_device_free += 1;
            if s.size >= self.max_split {
                st.oversize_segments.sub(1);
            }
            let (addr, size) = (s.segment.device_addr(), s.size);
            self.trace(|| TraceEvent::SegmentFree { addr, size });
            out.push(s.segment);
        }
        let g = self.graph.get_mut(&id).expect("live graph pool");
        g.segments.retain(|s| !dead.contains(s));
        for c in over {
            // An over capture's lists are empty now (its idle segments went, and the others are
            // not free): forget them.
            let empty = |l: &FreeLists| l.clean.largest().is_none() && l.fenced.is_empty();
            if g.captured.get(c).is_some_and(|(s, l)| empty(s) && empty(l)) {
                g.captured.remove(c);
            }
        }
        let g = self.graph.get(&id).expect("live graph pool");
        // (A segment of a capture still listed: its capture is not over, so neither is the pool.)
        let captured_left = g.segments.iter().any(|&s| self.seg(s).captured.is_some());
        if !all_over || g.handles != 0 || captured_left || !self.graph_pool_idle(g) {
            return out;
        }
        let segments = g.segments.clone();
        for seg in segments {
            // Off the pool's lists (which still exist), onto the general cache's.
            let first = self.seg(seg).first;
            self.remove_free(first);
            self.bm(first).graph = None;
            let size = {
                let s = self.segments[seg as usize].as_mut().expect("live segment");
                s.graph = None;
                s.size
            };
            self.stats.graph_pool_segment.sub(1);
            self.stats.graph_pool_reserved_bytes.sub(size);
            self.insert_free(first);
        }
        self.graph.remove(&id);
        self.capture_pools.retain(|_, p| *p != id);
        self.stats.graph_pools.sub(1);
        out
    }

    /// Every graph pool: identity, captures, handles, segments, reserved and allocated bytes.
    pub fn graph_pools(&self) -> Vec<crate::graph::GraphPoolInfo> {
        self.graph
            .iter()
            .map(|(&id, g)| {
                let mut captures: Vec<CaptureId> = g.captures.iter().map(|c| c.0).collect();
                captures.sort_unstable();
                captures.dedup();
                crate::graph::GraphPoolInfo {
                    id,
                    captures,
                    handles: g.handles,
                    segments: g.segments.len(),
                    reserved_bytes: g.segments.iter().map(|&s| self.seg(s).size).sum(),
                    allocated_bytes: g.allocated,
                    idle: self.graph_pool_idle(g),
                }
            })
            .collect()
    }

    /// The largest free block (clean or fenced).
    pub fn largest_free(&self) -> u64 {
        [&self.small, &self.large]
            .into_iter()
            .chain(self.graph.values().flat_map(|g| {
                g.all_lists(PoolKind::Small)
                    .chain(g.all_lists(PoolKind::Large))
            }))
            .flat_map(|l| {
                l.clean
                    .largest()
                    .into_iter()
                    .chain(l.fenced.iter().map(|&i| self.b(i).size))
            })
            .max()
            .unwrap_or(0)
    }

    /// Segments and their blocks in address order.
    pub fn snapshot(&self) -> Vec<SegmentSnapshot> {
        let mut out: Vec<SegmentSnapshot> = self
            .segments
            .iter()
            .flatten()
            .map(|s| {
                let base = s.segment.device_addr();
                let mut blocks = Vec::new();
                let mut cur = Some(s.first);
                while let Some(i) = cur {
                    let b = self.b(i);
                    let mut pending: Vec<u64> = b.fences.iter().map(|f| f.stream.get()).collect();
                    pending.sort_unstable();
                    pending.dedup();
                    blocks.push(BlockSnapshot {
                        address: base + b.offset,
                        size: b.size,
                        requested_size: b.requested,
                        state: match b.state {
                            State::Allocated => BlockState::ActiveAllocated,
                            State::PendingFree => BlockState::ActivePendingFree,
                            State::Free => BlockState::Inactive,
                        },
                        pending_uses_on: pending,
                    });
                    cur = b.next;
                }
                let sum = |f: &dyn Fn(&BlockSnapshot) -> bool| {
                    blocks.iter().filter(|b| f(b)).map(|b| b.size).sum()
                };
                SegmentSnapshot {
                    address: base,
                    total_size: s.size,
                    allocated_size: sum(&|b| b.state == BlockState::ActiveAllocated),
                    active_size: sum(&|b| b.state != BlockState::Inactive),
                    requested_size: blocks.iter().map(|b| b.requested_size).sum(),
                    pool: s.pool,
                    graph_pool: s.graph,
                    blocks,
                }
            })
            .collect();
        out.sort_by_key(|s| s.address);
        out
    }
}
