//! Model-based test of the caching allocator: random sequences over three streams of alloc, drop,
//! slice, clone, queued fills, held streams and their completion, `free_async`, `empty_cache`,
//! memory fractions and `max_split_size`, on the CPU backend, checked against a simple model
//! after every step:
//!
//! * no two live handles that are not views of one block overlap, and views of one block are
//!   `same_allocation`;
//! * the statistics equal the model's (blocks held, requested bytes, at most one device
//!   allocation per request);
//! * an out-of-memory is true: what stays reserved afterwards is only segments that hold a block
//!   in use, and the request's segment would not fit beside them under the limit;
//! * every live block holds the bytes its fills wrote (checked after completions: memory reused
//!   while another stream's queued work could still write it shows up here);
//! * at the end, with every handle gone, `empty_cache` gives everything back to the device.
//!
//! And stream captures (relaxed, so that the other streams' requests may still reach the
//! device): a capture's requests are served from its graph pool, its fills are recorded, graphs
//! are replayed on any stream and destroyed. A capture's blocks are not checked byte for byte
//! (their bytes are what the last replay wrote), but every other live block is, after replays:
//! a block a live graph uses handed to other work shows up as bytes the replay wrote. At the
//! end, with every graph gone, the pools' segments are back in the general cache and released.
//!
//! With feature `planted-defects` the test also proves the model catches the uncounted view and
//! the search of a new segment through the cached-block rules (RELIABILITY.md, defects 25, 27),
//! and graph pools searched by other work with the graph's uses ignored.

use std::sync::{mpsc, Arc, Mutex};
use unihal_alloc::{size, AllocatorConfig, BlockState, CachingAllocator};
use unihal_hal::{Backend, Buffer, CaptureMode, Device, FillValue, Graph, HalError, Stream};

const MIB: u64 = 1 << 20;
/// The CPU device's memory: small enough that long sequences reach out-of-memory.
const DEVICE_MEMORY: &str = "96M";
const STREAMS: usize = 3;

/// The planted switches are process-wide: one model run at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

use crate::support;
use support::Rng;

/// One block the model knows of: what it asked for and what its fills wrote.
struct Block {
    id: usize,
    stream: usize,
    requested: u64,
    /// The block's first byte (the address of its first handle).
    addr: u64,
    /// Fills through its handles, in order: (offset in the block, length, byte).
    fills: Vec<(u64, u64, u8)>,
    freed: bool,
    /// Allocated by a capture: its bytes are the graph's, not checked.
    captured: bool,
}

/// A live handle: a block and the range of it the handle views.
struct Handle {
    block: usize,
    buf: Buffer,
}

struct World {
    alloc: CachingAllocator,
    device: Arc<dyn Device>,
    total: u64,
    streams: Vec<Arc<dyn Stream>>,
    /// A blocked host callback per held stream (dropping the sender releases it).
    holds: Vec<Option<mpsc::Sender<()>>>,
    blocks: Vec<Block>,
    handles: Vec<Handle>,
    next_byte: u8,
    log: Vec<String>,
    /// The stream capturing, if one is.
    capturing: Option<usize>,
    /// Graphs alive.
    graphs: Vec<Arc<dyn Graph>>,
}

type Check = Result<(), String>;

impl World {
    fn new(config: AllocatorConfig) -> World {
        let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some(DEVICE_MEMORY), Some("1"))
            .expect("a valid CPU configuration");
        let device = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
        let total = device.memory_info().unwrap().total;
        World {
            alloc: CachingAllocator::new(device.clone(), config).unwrap(),
            streams: (0..STREAMS)
                .map(|_| device.create_stream().unwrap())
                .collect(),
            device,
            total,
            holds: (0..STREAMS).map(|_| None).collect(),
            blocks: Vec::new(),
            handles: Vec::new(),
            next_byte: 1,
            log: Vec::new(),
            capturing: None,
            graphs: Vec::new(),
        }
    }

    fn fail(&self, what: String) -> Check {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        Err(format!("{what}\nlast steps (newest first): {tail:#?}"))
    }

    fn byte(&mut self) -> u8 {
        self.next_byte = self.next_byte.wrapping_add(1).max(1);
        self.next_byte
    }

    /// A request size: mostly small-pool, some large-pool below and above 10 MiB.
    fn size(rng: &mut Rng) -> u64 {
        match rng.below(20) {
            0 => 0,
            1..=13 => 1 + rng.below(MIB),
            14..=18 => MIB + 1 + rng.below(9 * MIB),
            _ => 10 * MIB + rng.below(14 * MIB),
        }
    }

    fn alloc(&mut self, rng: &mut Rng) -> Check {
        let s = rng.below(STREAMS as u64) as usize;
        let len = World::size(rng);
        self.log.push(format!("alloc {len} on stream {s}"));
        let before = self.alloc.stats();
        match self.alloc.alloc(&self.streams[s], len as usize) {
            Ok(buf) => {
                let after = self.alloc.stats();
                let new_segments = after.num_device_alloc - before.num_device_alloc;
                if new_segments > 1 {
                    return self.fail(format!(
                        "one request of {len} bytes reserved {new_segments} segments"
                    ));
                }
                if len == 0 {
                    return Ok(());
                }
                let byte = self.byte();
                self.streams[s]
                    .fill(&buf, 0, len, FillValue::U8(byte))
                    .map_err(|e| format!("fill of a new block: {e}"))?;
                let id = self.blocks.len();
                self.blocks.push(Block {
                    id,
                    stream: s,
                    requested: len,
                    addr: buf.device_addr(),
                    fills: vec![(0, len, byte)],
                    freed: false,
                    captured: self.capturing == Some(s),
                });
                self.handles.push(Handle { block: id, buf });
                Ok(())
            }
            Err(e @ HalError::AllocatorOutOfMemory(_)) => {
                self.true_oom(len, &e, self.capturing == Some(s))
            }
            Err(e) => self.fail(format!("alloc of {len} bytes: {e}")),
        }
    }

    /// An out-of-memory must be true, and must leave reserved only what blocks in use need.
    /// `capture`: a capture's request, which never releases the general cache (only the
    /// out-of-memory itself must be true).
    fn true_oom(&self, len: u64, e: &HalError, capture: bool) -> Check {
        let st = self.alloc.stats();
        // A graph pool's segments stay while the pool lives (its capture goes on, or a graph
        // uses them), idle or not.
        for seg in self
            .alloc
            .snapshot()
            .into_iter()
            .filter(|g| !capture && g.graph_pool.is_none())
        {
            let idle = seg
                .blocks
                .iter()
                .all(|b| b.state == BlockState::Inactive && b.pending_uses_on.is_empty());
            if idle {
                return self.fail(format!(
                    "out of memory for {len} bytes left an idle segment of {} bytes reserved \
                     ({e}; reserved {})",
                    seg.total_size, st.reserved_bytes.all.current
                ));
            }
        }
        let seg = size::round_size(len).and_then(size::segment_size).unwrap();
        let limit = self.alloc.limit().unwrap_or(self.total).min(self.total);
        let reserved = st.reserved_bytes.all.current;
        if reserved + seg <= limit {
            return self.fail(format!(
                "a false out of memory for {len} bytes: its {seg}-byte segment fits beside the \
                 {reserved} bytes reserved under the limit of {limit} ({e})"
            ));
        }
        Ok(())
    }

    fn drop_handle(&mut self, rng: &mut Rng) -> Check {
        if self.handles.is_empty() {
            return Ok(());
        }
        let i = rng.below(self.handles.len() as u64) as usize;
        let h = self.handles.swap_remove(i);
        self.log.push(format!(
            "drop a handle of block {} ({} bytes)",
            h.block,
            h.buf.len()
        ));
        drop(h);
        Ok(())
    }

    fn slice(&mut self, rng: &mut Rng) -> Check {
        if self.handles.is_empty() {
            return Ok(());
        }
        let i = rng.below(self.handles.len() as u64) as usize;
        let (block, len) = (self.handles[i].block, self.handles[i].buf.len());
        let off = rng.below(len + 1);
        let n = rng.below(len - off + 1);
        let view = self.handles[i]
            .buf
            .slice(off, n)
            .map_err(|e| format!("slice {off}+{n} of {len}: {e}"))?;
        self.log.push(format!(
            "slice {off}+{n} of a {len}-byte view of block {block}"
        ));
        if rng.below(2) == 0 {
            // A transient view: made and dropped while the block is held.
            drop(view);
        } else {
            self.handles.push(Handle { block, buf: view });
        }
        Ok(())
    }

    fn clone_handle(&mut self, rng: &mut Rng) -> Check {
        if self.handles.is_empty() {
            return Ok(());
        }
        let i = rng.below(self.handles.len() as u64) as usize;
        let h = Handle {
            block: self.handles[i].block,
            buf: self.handles[i].buf.clone(),
        };
        self.log
            .push(format!("clone a handle of block {}", h.block));
        self.handles.push(h);
        Ok(())
    }

    /// A fill through a handle, on its block's stream (the stream it was allocated for).
    fn fill(&mut self, rng: &mut Rng) -> Check {
        if self.handles.is_empty() {
            return Ok(());
        }
        let i = rng.below(self.handles.len() as u64) as usize;
        let bi = self.handles[i].block;
        let byte = self.byte();
        let (s, freed) = (self.blocks[bi].stream, self.blocks[bi].freed);
        let captured = self.blocks[bi].captured;
        if self.capturing == Some(s) && !captured {
            // It would be recorded, not run: the model's bytes would be wrong.
            return Ok(());
        }
        let h = &self.handles[i];
        let off = h.buf.device_addr() - self.blocks[bi].addr;
        let len = h.buf.len();
        self.log.push(format!(
            "fill {len} bytes of block {bi} at {off} on stream {s}"
        ));
        let r = self.streams[s].fill(&h.buf, 0, len, FillValue::U8(byte));
        match (r, freed) {
            (Ok(()), false) => {
                if !captured {
                    self.blocks[bi].fills.push((off, len, byte));
                }
                Ok(())
            }
            (Err(HalError::InvalidArgument { .. }), true) => Ok(()),
            (r, freed) => self.fail(format!(
                "a fill through a handle of block {bi} (free enqueued: {freed}): {r:?}"
            )),
        }
    }

    fn hold(&mut self, rng: &mut Rng) -> Check {
        let s = rng.below(STREAMS as u64) as usize;
        if self.holds[s].is_some() || self.capturing == Some(s) {
            return Ok(());
        }
        self.log.push(format!("hold stream {s}"));
        let (tx, rx) = mpsc::channel::<()>();
        self.streams[s]
            .host_callback(Box::new(move || {
                let _ = rx.recv();
            }))
            .map_err(|e| format!("hold: {e}"))?;
        self.holds[s] = Some(tx);
        Ok(())
    }

    fn free_async(&mut self, rng: &mut Rng) -> Check {
        if self.handles.is_empty() || !self.device.capabilities().optional.stream_ordered_alloc {
            return Ok(());
        }
        let i = rng.below(self.handles.len() as u64) as usize;
        let bi = self.handles[i].block;
        if self.blocks[bi].freed || self.capturing == Some(self.blocks[bi].stream) {
            return Ok(());
        }
        let s = self.blocks[bi].stream;
        self.log
            .push(format!("free_async block {bi} on stream {s}"));
        self.streams[s]
            .free_async(&self.handles[i].buf)
            .map_err(|e| format!("free_async: {e}"))?;
        self.blocks[bi].freed = true;
        Ok(())
    }

    /// Releases every hold, synchronises every stream, and checks every live block's bytes.
    fn complete(&mut self) -> Check {
        self.log.push("complete every stream".into());
        for h in &mut self.holds {
            drop(h.take());
        }
        for (i, s) in self.streams.iter().enumerate() {
            if self.capturing != Some(i) {
                s.synchronize().map_err(|e| format!("synchronize: {e}"))?;
            }
        }
        let live: std::collections::BTreeSet<usize> =
            self.handles.iter().map(|h| h.block).collect();
        for &bi in &live {
            let b = &self.blocks[bi];
            if b.freed || b.captured || self.capturing == Some(b.stream) {
                continue;
            }
            let h = self.handles.iter().find(|h| h.block == bi).unwrap();
            let view_off = h.buf.device_addr() - b.addr;
            // Sample the first and last byte of each fill range that the handle views.
            for &(off, len, _) in &b.fills {
                for p in [off, off + len.saturating_sub(1)] {
                    if len == 0 || p < view_off || p >= view_off + h.buf.len() {
                        continue;
                    }
                    let want = b
                        .fills
                        .iter()
                        .rev()
                        .find(|&&(o, l, _)| o <= p && p < o + l)
                        .map(|f| f.2)
                        .unwrap();
                    let mut got = [0u8];
                    self.streams[b.stream]
                        .read(&h.buf, p - view_off, &mut got)
                        .map_err(|e| format!("read: {e}"))?;
                    if got[0] != want {
                        return self.fail(format!(
                            "byte {p} of block {} ({} bytes at {:#x}) is {:#x}, its last fill \
                             wrote {want:#x}: another user wrote its memory",
                            b.id, b.requested, b.addr, got[0]
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// The invariants that hold after every step.
    fn invariants(&self) -> Check {
        let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
        for h in &self.handles {
            let b = &self.blocks[h.block];
            ranges.push((b.addr, b.addr + b.requested, h.block));
            let first = self.handles.iter().find(|g| g.block == h.block).unwrap();
            if !first.buf.same_allocation(&h.buf) {
                return self.fail(format!("views of block {} are not one allocation", h.block));
            }
        }
        ranges.sort_unstable();
        ranges.dedup();
        for w in ranges.windows(2) {
            if w[0].2 != w[1].2 && w[1].0 < w[0].1 {
                return self.fail(format!(
                    "live blocks {} [{:#x}, {:#x}) and {} [{:#x}, {:#x}) overlap",
                    w[0].2, w[0].0, w[0].1, w[1].2, w[1].0, w[1].1
                ));
            }
        }
        let live: std::collections::BTreeSet<usize> =
            self.handles.iter().map(|h| h.block).collect();
        let st = self.alloc.stats();
        let requested: u64 = live.iter().map(|&b| self.blocks[b].requested).sum();
        let want = (live.len() as u64, requested);
        let got = (st.allocation.all.current, st.requested_bytes.all.current);
        if got != want {
            return self.fail(format!(
                "statistics (blocks allocated, requested bytes) are {got:?}, the model holds \
                 {want:?}"
            ));
        }
        let rounded: u64 = live
            .iter()
            .map(|&b| size::round_size(self.blocks[b].requested).unwrap())
            .sum();
        if st.allocated_bytes.all.current < rounded
            || st.reserved_bytes.all.current < st.allocated_bytes.all.current
        {
            return self.fail(format!(
                "allocated {} bytes, reserved {}, for blocks of {rounded} rounded bytes",
                st.allocated_bytes.all.current, st.reserved_bytes.all.current
            ));
        }
        Ok(())
    }

    /// Begins a capture on a stream, ends the one going on, replays a graph or destroys one.
    fn graph_step(&mut self, rng: &mut Rng) -> Check {
        match (self.capturing, rng.below(4)) {
            (None, 0) => {
                let s = rng.below(STREAMS as u64) as usize;
                self.log.push(format!("begin capture on stream {s}"));
                self.streams[s]
                    .begin_capture(CaptureMode::Relaxed)
                    .map_err(|e| format!("begin_capture: {e}"))?;
                self.capturing = Some(s);
            }
            (Some(s), 0) => {
                self.log.push(format!("end capture on stream {s}"));
                let g = self.streams[s]
                    .end_capture()
                    .map_err(|e| format!("end_capture: {e}"))?;
                self.capturing = None;
                self.graphs.push(g);
            }
            (_, 1 | 2) if !self.graphs.is_empty() => {
                let g = rng.below(self.graphs.len() as u64) as usize;
                let s = rng.below(STREAMS as u64) as usize;
                if self.capturing == Some(s) {
                    return Ok(());
                }
                self.log.push(format!("replay graph {g} on stream {s}"));
                self.streams[s]
                    .launch_graph(&self.graphs[g])
                    .map_err(|e| format!("launch_graph: {e}"))?;
            }
            (_, 3) if !self.graphs.is_empty() => {
                let g = rng.below(self.graphs.len() as u64) as usize;
                self.log.push(format!("destroy graph {g}"));
                drop(self.graphs.swap_remove(g));
            }
            _ => {}
        }
        Ok(())
    }

    fn step(&mut self, rng: &mut Rng) -> Check {
        if rng.below(100) < 4 {
            self.graph_step(rng)?;
            return self.invariants();
        }
        match rng.below(100) {
            0..=29 => self.alloc(rng)?,
            30..=49 => self.drop_handle(rng)?,
            50..=61 => self.slice(rng)?,
            62..=66 => self.clone_handle(rng)?,
            67..=78 => self.fill(rng)?,
            79..=84 => self.hold(rng)?,
            85..=91 => self.complete()?,
            92..=94 => self.free_async(rng)?,
            95..=97 => {
                self.log.push("empty_cache".into());
                self.alloc.empty_cache();
            }
            _ => {
                let f = 0.25 + rng.below(76) as f64 / 100.0;
                self.log.push(format!("memory fraction {f}"));
                self.alloc
                    .set_memory_fraction(f)
                    .map_err(|e| format!("memory fraction {f}: {e}"))?;
            }
        }
        self.invariants()
    }

    /// Everything goes: every handle, every hold, the cache; the device has all its memory back.
    fn finish(mut self) -> Check {
        if let Some(s) = self.capturing.take() {
            self.log.push(format!("end capture on stream {s}"));
            let g = self.streams[s]
                .end_capture()
                .map_err(|e| format!("end_capture: {e}"))?;
            self.graphs.push(g);
        }
        self.complete()?;
        self.graphs.clear();
        self.handles.clear();
        for s in &self.streams {
            s.synchronize().map_err(|e| format!("synchronize: {e}"))?;
        }
        self.alloc.empty_cache();
        let st = self.alloc.stats();
        let left = [
            st.allocation.all.current,
            st.active_bytes.all.current,
            st.reserved_bytes.all.current,
            st.graph_pools.current,
        ];
        if left != [0, 0, 0, 0] {
            return self.fail(format!(
                "after every handle and graph went and empty_cache: (allocations, active, \
                 reserved, graph pools) {left:?}"
            ));
        }
        let m = self.device.memory_info().unwrap();
        if m.free != m.total {
            return self.fail(format!(
                "the device has {} of {} bytes free at the end",
                m.free, m.total
            ));
        }
        Ok(())
    }
}

/// The configuration of run `seed`: `max_split_size` none, 20 MiB (PyTorch's smallest) or
/// 48 MiB; thrifty or PyTorch's best fit.
fn config(seed: u64) -> AllocatorConfig {
    AllocatorConfig {
        max_split_size: [None, Some(20 * MIB), Some(48 * MIB)][(seed % 3) as usize],
        memory_fraction: None,
        thrifty: seed % 2 == 0,
    }
}

/// One random sequence of `steps` steps; the first violated invariant, with the steps before it.
fn run(seed: u64, config: AllocatorConfig, steps: usize) -> Check {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut w = World::new(config);
    for i in 0..steps {
        w.step(&mut rng)
            .map_err(|e| format!("seed {seed}, step {i}: {e}"))?;
    }
    w.finish()
        .map_err(|e| format!("seed {seed}, at the end: {e}"))
}

#[test]
fn random_sequences_keep_the_allocator_equal_to_its_model() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for seed in 1..=12 {
        if let Err(e) = run(seed, config(seed), 400) {
            panic!("{e}");
        }
    }
}

/// The planted uncounted view (`unihal_hal::planted::set_uncounted_slice`): the model must
/// report a block handed out again while a handle of it lives.
#[cfg(feature = "planted-defects")]
#[test]
fn the_model_catches_a_planted_uncounted_view() {
    // The planted switches are process-wide: the other modules' tests must not see them.
    if crate::own_process() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    unihal_hal::planted::set_uncounted_slice(true);
    let found = (1..=12).find_map(|seed| run(seed, config(seed), 400).err());
    unihal_hal::planted::set_uncounted_slice(false);
    let e = found.expect("the model passed with the planted uncounted view");
    eprintln!(
        "planted uncounted view caught: {}",
        e.lines().next().unwrap_or("")
    );
    assert!(
        e.contains("overlap") || e.contains("statistics") || e.contains("another user"),
        "the model failed, but not on the planted view: {e}"
    );
}

/// The planted search of a new segment through the cached-block rules
/// (`unihal_alloc::planted::set_search_new_segment`): under `max_split_size_mb:20` the model
/// must report a request reserving several segments or a false out-of-memory.
#[cfg(feature = "planted-defects")]
#[test]
fn the_model_catches_a_planted_search_of_the_new_segment() {
    // The planted switches are process-wide: the other modules' tests must not see them.
    if crate::own_process() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    unihal_alloc::planted::set_search_new_segment(true);
    let twenty = AllocatorConfig {
        max_split_size: Some(20 * MIB),
        ..AllocatorConfig::default()
    };
    let found = (1..=12).find_map(|seed| run(seed, twenty, 400).err());
    unihal_alloc::planted::set_search_new_segment(false);
    let e = found.expect("the model passed with the planted search of the new segment");
    eprintln!("planted search caught: {}", e.lines().next().unwrap_or(""));
    assert!(
        e.contains("segments") || e.contains("out of memory"),
        "the model failed, but not on the planted search: {e}"
    );
}

/// The planted search of graph pools by other work, the graph's uses ignored
/// (`unihal_alloc::planted::set_graph_pools_shared`): the model must report a block a replay
/// wrote although another user held it.
#[cfg(feature = "planted-defects")]
#[test]
fn the_model_catches_graph_pools_shared_with_other_work() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    unihal_alloc::planted::set_graph_pools_shared(true);
    let found = (1..=24).find_map(|seed| run(seed, config(seed), 400).err());
    unihal_alloc::planted::set_graph_pools_shared(false);
    let e = found.expect("the model passed with graph pools shared with other work");
    eprintln!(
        "planted shared graph pools caught: {}",
        e.lines().next().unwrap_or("")
    );
    assert!(
        e.contains("another user") || e.contains("overlap"),
        "the model failed, but not on the planted sharing: {e}"
    );
}
