//! The `alloc_blocks` driver: a byte string becomes a sequence of calls on blocks of the caching
//! allocator (`unihal-alloc`), one allocator per device of a two-device backend, checked against
//! a host model of every live block.
//!
//! Each step decodes one call: allocations (small-pool and large-pool sizes, up to 4 MiB, each
//! filled at once with a fresh byte), handle drops, `Buffer::slice` views kept or dropped at once,
//! clones, writes and fills through any handle, `copy_d2d` between handles of one device, reads,
//! `empty_cache`, and collectives across the two ranks (one thread per rank, each on its rank's
//! stream): `all_reduce` (Sum over i32, exact: integers wrap) in place or not, and `all_to_allv`
//! (the default implementation, which slices the caller's blocks into per-peer views).
//!
//! Invariants, checked after every step (a violation panics with `alloc_blocks:` and the last
//! steps, which libFuzzer reports as a crash):
//! * on each device the allocator's `allocation.all.current` equals the model's number of live
//!   blocks (a block lives while any handle or view of it does), and each live block appears in
//!   the allocator's snapshot as allocated, at its address, with its requested size;
//! * no two live blocks of one device overlap;
//! * every call on valid arguments succeeds (out of memory excepted for allocations);
//! * the bytes read through a handle equal the model: the range a step wrote or received into
//!   (and 256 bytes either side), the edges of a new block or kept view, the whole handle a read
//!   step names, and every handle at the end (whole up to 64 KiB, its edges above);
//! * at the end, with every handle gone, the statistics hold no block, `empty_cache` returns
//!   every segment and the devices' free memory is back where it started.

use crate::Input;
use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, BlockState, CachingAllocator};
use unihal_hal::{
    Backend, Buffer, CommConfig, Communicator, DType, Device, FillValue, HalError, Invalid,
    ReduceOp, Stream,
};

const MIB: u64 = 1 << 20;
/// Steps per input.
const MAX_STEPS: usize = 64;
/// Live handles (blocks, views and clones together).
const MAX_HANDLES: usize = 24;
/// Bytes of one `Stream::write`.
const MAX_WRITE: u64 = 4096;

/// The model of one block: where it is and what it holds.
struct Block {
    dev: usize,
    addr: u64,
    bytes: Vec<u8>,
    /// The handles of the model that view it (the block lives while this is above zero).
    handles: usize,
}

/// A live handle: a block and where in it the handle's view starts.
struct Handle {
    block: usize,
    off: u64,
    buf: Buffer,
}

struct World {
    devs: Vec<Arc<dyn Device>>,
    streams: Vec<Arc<dyn Stream>>,
    allocs: Vec<CachingAllocator>,
    backend: Arc<dyn Backend>,
    comms: Option<Vec<Arc<dyn Communicator>>>,
    /// By block id; `None` once its last handle is gone.
    blocks: Vec<Option<Block>>,
    handles: Vec<Handle>,
    next_byte: u8,
    log: Vec<String>,
}

/// Runs one input on the two devices of `backend` (which must have collectives). Panics on a
/// broken invariant.
pub fn run(backend: &Arc<dyn Backend>, data: &[u8]) {
    let devs: Vec<Arc<dyn Device>> = (0..2)
        .map(|i| backend.open(i).expect("open a device"))
        .collect();
    let free = |d: &Arc<dyn Device>| d.memory_info().expect("memory_info").free;
    let free0: Vec<u64> = devs.iter().map(free).collect();
    {
        let mut w = World::new(backend.clone(), devs.clone());
        let mut inp = Input(data);
        let mut steps = 0;
        while !inp.done() && steps < MAX_STEPS {
            w.step(&mut inp);
            steps += 1;
        }
        w.finish();
    }
    for d in &devs {
        let _ = d.synchronize();
    }
    let free1: Vec<u64> = devs.iter().map(free).collect();
    assert_eq!(
        free1, free0,
        "alloc_blocks: device memory not returned after every block and allocator dropped"
    );
}

/// `len` bytes of the model's write pattern starting with `seed`.
fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31) ^ seed ^ (k >> 8) as u8)
        .collect()
}

/// A 24-bit number.
fn u24(inp: &mut Input) -> u64 {
    inp.u16() as u64 | (inp.u8() as u64) << 16
}

/// An offset or length at most `max`: none, all, or something in between.
fn span(inp: &mut Input, max: u64) -> u64 {
    match inp.u8() % 4 {
        0 => 0,
        1 => max,
        2 => inp.u16() as u64 % (max + 1),
        _ => u24(inp) % (max + 1),
    }
}

impl World {
    fn new(backend: Arc<dyn Backend>, devs: Vec<Arc<dyn Device>>) -> World {
        let streams = devs
            .iter()
            .map(|d| d.create_stream().expect("create_stream"))
            .collect();
        let allocs = devs
            .iter()
            .map(|d| {
                CachingAllocator::new(d.clone(), AllocatorConfig::default()).expect("allocator")
            })
            .collect();
        World {
            devs,
            streams,
            allocs,
            backend,
            comms: None,
            blocks: Vec::new(),
            handles: Vec::new(),
            next_byte: 0,
            log: Vec::new(),
        }
    }

    /// Panics with `what` and the last steps.
    #[track_caller]
    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        panic!("alloc_blocks: {what}\nlast steps (newest first): {tail:#?}");
    }

    fn byte(&mut self) -> u8 {
        self.next_byte = self.next_byte.wrapping_add(1).max(1);
        self.next_byte
    }

    fn block(&self, h: usize) -> &Block {
        self.blocks[self.handles[h].block]
            .as_ref()
            .expect("a handle's block is live")
    }

    fn block_mut(&mut self, h: usize) -> &mut Block {
        let id = self.handles[h].block;
        self.blocks[id].as_mut().expect("a handle's block is live")
    }

    /// The handles of device `dev`.
    fn on(&self, dev: usize) -> Vec<usize> {
        (0..self.handles.len())
            .filter(|&h| self.block(h).dev == dev)
            .collect()
    }

    fn push_handle(&mut self, block: usize, off: u64, buf: Buffer) {
        self.blocks[block].as_mut().expect("live").handles += 1;
        self.handles.push(Handle { block, off, buf });
    }

    fn drop_handle(&mut self, h: usize) {
        let Handle { block, buf, .. } = self.handles.swap_remove(h);
        drop(buf);
        let b = self.blocks[block].as_mut().expect("live");
        b.handles -= 1;
        if b.handles == 0 {
            self.blocks[block] = None;
        }
    }

    fn step(&mut self, inp: &mut Input) {
        match inp.u8() % 12 {
            0 | 1 if self.handles.len() < MAX_HANDLES => {
                let large = inp.u8() % 2 == 1;
                let dev = inp.pick(2);
                let len = if large {
                    MIB + 1 + u24(inp) % (3 * MIB)
                } else {
                    1 + u24(inp) % MIB
                };
                self.alloc(dev, len);
            }
            2 if !self.handles.is_empty() => {
                let h = inp.pick(self.handles.len());
                self.log.push(format!(
                    "drop handle {h} (block {}, {} bytes)",
                    self.handles[h].block,
                    self.handles[h].buf.len()
                ));
                self.drop_handle(h);
                self.check("a handle drop");
            }
            3 if !self.handles.is_empty() => {
                let h = inp.pick(self.handles.len());
                let l = self.handles[h].buf.len();
                let off = span(inp, l);
                let len = span(inp, l - off);
                let keep = inp.u8().is_multiple_of(2) && self.handles.len() < MAX_HANDLES;
                self.log.push(format!(
                    "slice handle {h} (block {}) at {off}, {len} bytes, {}",
                    self.handles[h].block,
                    if keep { "kept" } else { "dropped at once" }
                ));
                let sub = match self.handles[h].buf.slice(off, len) {
                    Ok(s) => s,
                    Err(e) => self.fail(format!("slice in range refused: {e}")),
                };
                if keep {
                    let (block, boff) = (self.handles[h].block, self.handles[h].off + off);
                    self.push_handle(block, boff, sub);
                    let n = self.handles.len() - 1;
                    self.verify_edges(n, "a kept view");
                } else {
                    drop(sub);
                }
                self.check("a slice");
            }
            4 if !self.handles.is_empty() && self.handles.len() < MAX_HANDLES => {
                let h = inp.pick(self.handles.len());
                self.log.push(format!("clone handle {h}"));
                let (block, off, buf) = (
                    self.handles[h].block,
                    self.handles[h].off,
                    self.handles[h].buf.clone(),
                );
                self.push_handle(block, off, buf);
                self.check("a clone");
            }
            5 if !self.handles.is_empty() => {
                let h = inp.pick(self.handles.len());
                let l = self.handles[h].buf.len();
                let off = span(inp, l);
                let len = (inp.u16() as u64 % (MAX_WRITE + 1)).min(l - off);
                let bytes = pattern(self.byte(), len);
                self.log
                    .push(format!("write {len} bytes through handle {h} at {off}"));
                let dev = self.block(h).dev;
                if let Err(e) = self.streams[dev].write(&self.handles[h].buf, off, &bytes) {
                    self.fail(format!("write in range refused: {e}"));
                }
                let at = (self.handles[h].off + off) as usize;
                self.block_mut(h).bytes[at..at + bytes.len()].copy_from_slice(&bytes);
                self.check("a write");
                self.verify_range(h, off, len, "a write");
            }
            6 if !self.handles.is_empty() => {
                let h = inp.pick(self.handles.len());
                let l = self.handles[h].buf.len();
                let off = span(inp, l);
                let len = span(inp, l - off);
                let v = self.byte();
                let value = match inp.u8() % 3 {
                    0 => FillValue::U8(v),
                    1 => FillValue::U16(u16::from_le_bytes([v, v ^ 0x5a])),
                    _ => FillValue::U32(u32::from_le_bytes([v, 1, v, 2])),
                };
                let pat = match value {
                    FillValue::U8(v) => vec![v],
                    FillValue::U16(v) => v.to_le_bytes().to_vec(),
                    FillValue::U32(v) => v.to_le_bytes().to_vec(),
                };
                // Aligned to the pattern's width, as `fill` requires.
                let w = pat.len() as u64;
                let addr = self.handles[h].buf.device_addr();
                let off = off + (w - (addr + off) % w) % w;
                if off > l {
                    return;
                }
                let len = (len.min(l - off) / w) * w;
                self.log.push(format!(
                    "fill {len} bytes of {value:?} through handle {h} at {off}"
                ));
                let dev = self.block(h).dev;
                if let Err(e) = self.streams[dev].fill(&self.handles[h].buf, off, len, value) {
                    self.fail(format!("aligned fill in range refused: {e}"));
                }
                let at = (self.handles[h].off + off) as usize;
                let bytes = &mut self.block_mut(h).bytes[at..at + len as usize];
                for (b, p) in bytes.iter_mut().zip(pat.iter().cycle()) {
                    *b = *p;
                }
                self.check("a fill");
                self.verify_range(h, off, len, "a fill");
            }
            7 if !self.handles.is_empty() => {
                let (a, b) = (inp.pick(self.handles.len()), inp.pick(self.handles.len()));
                let dev = self.block(a).dev;
                if self.block(b).dev != dev {
                    return;
                }
                let (al, bl) = (self.handles[a].buf.len(), self.handles[b].buf.len());
                let (ao, bo) = (span(inp, al), span(inp, bl));
                let len = span(inp, (al - ao).min(bl - bo));
                self.log.push(format!(
                    "copy_d2d {len} bytes from handle {a} at {ao} to handle {b} at {bo}"
                ));
                let r = self.streams[dev].copy_d2d(
                    &self.handles[a].buf,
                    ao,
                    &self.handles[b].buf,
                    bo,
                    len,
                );
                let (sa, da) = (self.handles[a].off + ao, self.handles[b].off + bo);
                let same = self.handles[a].block == self.handles[b].block;
                let overlap = same && len > 0 && sa < da + len && da < sa + len;
                match r {
                    Ok(()) if overlap => self.fail("an overlapping copy_d2d was accepted".into()),
                    Ok(()) => {
                        let src = self.block(a).bytes[sa as usize..(sa + len) as usize].to_vec();
                        self.block_mut(b).bytes[da as usize..(da + len) as usize]
                            .copy_from_slice(&src);
                    }
                    Err(HalError::InvalidArgument {
                        reason: Invalid::Overlap { .. },
                        ..
                    }) if overlap => {}
                    Err(e) => self.fail(format!("copy_d2d in range refused: {e}")),
                }
                self.check("a copy_d2d");
                self.verify_range(a, ao, len, "a copy_d2d");
                self.verify_range(b, bo, len, "a copy_d2d");
            }
            8 if !self.handles.is_empty() => {
                let h = inp.pick(self.handles.len());
                self.log.push(format!("read handle {h}"));
                self.verify(h, "a read");
            }
            9 => {
                let dev = inp.pick(2);
                self.log.push(format!("empty_cache on device {dev}"));
                self.allocs[dev].empty_cache();
                self.check("empty_cache");
            }
            10 => self.all_reduce(inp),
            11 => self.all_to_allv(inp),
            _ => {}
        }
    }

    fn alloc(&mut self, dev: usize, len: u64) {
        let v = self.byte();
        self.log.push(format!(
            "alloc {len} bytes on device {dev}, filled with {v:#x}"
        ));
        let buf = match self.allocs[dev].alloc(&self.streams[dev], len as usize) {
            Ok(b) => b,
            Err(HalError::AllocatorOutOfMemory(_)) => return,
            Err(e) => self.fail(format!("alloc of {len} bytes: {e}")),
        };
        if buf.len() != len || !buf.is_sub_allocated() {
            self.fail(format!(
                "alloc of {len} bytes gave a {}-byte buffer (sub-allocated: {})",
                buf.len(),
                buf.is_sub_allocated()
            ));
        }
        if let Err(e) = self.streams[dev].fill(&buf, 0, len, FillValue::U8(v)) {
            self.fail(format!("fill of a new block: {e}"));
        }
        let id = self.blocks.len();
        self.blocks.push(Some(Block {
            dev,
            addr: buf.device_addr(),
            bytes: vec![v; len as usize],
            handles: 0,
        }));
        self.push_handle(id, 0, buf);
        self.check("an alloc");
        let h = self.handles.len() - 1;
        self.verify_edges(h, "an alloc");
    }

    /// The communicators of the two ranks, made on first use.
    fn comms(&mut self) -> Vec<Arc<dyn Communicator>> {
        if self.comms.is_none() {
            let ccl = self
                .backend
                .collectives()
                .expect("the backend has collectives");
            match ccl.init_all(&self.devs, &CommConfig::default()) {
                Ok(c) => self.comms = Some(c),
                Err(e) => self.fail(format!("init_all: {e}")),
            }
        }
        self.comms.clone().expect("made above")
    }

    /// Runs `call(rank)` on one thread per rank, then synchronises that rank's stream.
    fn on_ranks<F>(&self, what: &str, call: F)
    where
        F: Fn(usize) -> unihal_hal::Result<()> + Sync,
    {
        let results: Vec<unihal_hal::Result<()>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|r| {
                    let call = &call;
                    let stream = &self.streams[r];
                    s.spawn(move || call(r).and_then(|()| stream.synchronize()))
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a rank's thread panicked"))
                .collect()
        });
        for (r, res) in results.into_iter().enumerate() {
            if let Err(e) = res {
                self.fail(format!("{what} on rank {r}: {e}"));
            }
        }
    }

    fn all_reduce(&mut self, inp: &mut Input) {
        let on: Vec<Vec<usize>> = (0..2).map(|d| self.on(d)).collect();
        if on.iter().any(|v| v.is_empty()) {
            return;
        }
        // Per rank: the send handle and the receive handle (the same one: in place).
        let mut pick = [(0, 0); 2];
        for (r, p) in pick.iter_mut().enumerate() {
            let a = on[r][inp.pick(on[r].len())];
            let b = if inp.u8().is_multiple_of(2) {
                a
            } else {
                on[r][inp.pick(on[r].len())]
            };
            // Views of one block would overlap partly: in place instead.
            let b = if self.handles[a].block == self.handles[b].block {
                a
            } else {
                b
            };
            *p = (a, b);
        }
        let max = pick
            .iter()
            .flat_map(|&(a, b)| [a, b])
            .map(|h| self.handles[h].buf.len() / 4)
            .min()
            .expect("four handles");
        if max == 0 {
            return;
        }
        let count = 1 + inp.u16() as u64 % max;
        let bytes = count * 4;
        // Per rank: offsets of the send and receive views in their handles.
        let mut offs = [(0, 0); 2];
        for (r, o) in offs.iter_mut().enumerate() {
            let (a, b) = pick[r];
            let so = inp.u16() as u64 % (self.handles[a].buf.len() - bytes + 1);
            let ro = if a == b {
                so
            } else {
                inp.u16() as u64 % (self.handles[b].buf.len() - bytes + 1)
            };
            *o = (so, ro);
        }
        self.log.push(format!(
            "all_reduce Sum of {count} i32 from handles {:?} at {offs:?} (send, recv per rank)",
            pick
        ));
        let comms = self.comms();
        let mut views = Vec::new();
        for r in 0..2 {
            let ((a, b), (so, ro)) = (pick[r], offs[r]);
            let send = self.handles[a].buf.slice(so, bytes);
            let recv = if a == b {
                send.clone()
            } else {
                self.handles[b].buf.slice(ro, bytes)
            };
            match (send, recv) {
                (Ok(s), Ok(v)) => views.push((s, v)),
                (Err(e), _) | (_, Err(e)) => self.fail(format!("slice in range refused: {e}")),
            }
        }
        // The model: every receive view gets the wrapping sum of both send views.
        let sends: Vec<Vec<u8>> = (0..2)
            .map(|r| {
                let at = (self.handles[pick[r].0].off + offs[r].0) as usize;
                self.block(pick[r].0).bytes[at..at + bytes as usize].to_vec()
            })
            .collect();
        let sum: Vec<u8> = sends[0]
            .chunks(4)
            .zip(sends[1].chunks(4))
            .flat_map(|(x, y)| {
                let x = i32::from_le_bytes(x.try_into().expect("4 bytes"));
                let y = i32::from_le_bytes(y.try_into().expect("4 bytes"));
                x.wrapping_add(y).to_le_bytes()
            })
            .collect();
        self.on_ranks("all_reduce", |r| {
            let (s, v) = &views[r];
            comms[r].all_reduce(s, v, count, DType::I32, ReduceOp::Sum, &self.streams[r])
        });
        drop(views);
        for r in 0..2 {
            let b = pick[r].1;
            let at = (self.handles[b].off + offs[r].1) as usize;
            self.block_mut(b).bytes[at..at + bytes as usize].copy_from_slice(&sum);
        }
        self.check("an all_reduce");
        for r in 0..2 {
            let ((a, b), (so, ro)) = (pick[r], offs[r]);
            self.verify_range(a, so, bytes, "an all_reduce");
            self.verify_range(b, ro, bytes, "an all_reduce");
        }
    }

    fn all_to_allv(&mut self, inp: &mut Input) {
        let on: Vec<Vec<usize>> = (0..2).map(|d| self.on(d)).collect();
        if on.iter().any(|v| v.len() < 2) {
            return;
        }
        // Per rank: the send handle and the receive handle, of two blocks.
        let mut pick = [(0, 0); 2];
        for (r, p) in pick.iter_mut().enumerate() {
            let a = on[r][inp.pick(on[r].len())];
            let b = on[r][inp.pick(on[r].len())];
            if self.handles[a].block == self.handles[b].block {
                return;
            }
            *p = (a, b);
        }
        let elems = |h: usize| self.handles[h].buf.len() / 4;
        // Each rank's receive handle: peer j's part lies in its j-th half.
        let half: Vec<u64> = (0..2).map(|r| elems(pick[r].1) / 2).collect();
        // c[src][dst]: elements src sends dst.
        let mut c = [[0u64; 2]; 2];
        for (src, row) in c.iter_mut().enumerate() {
            for (dst, n) in row.iter_mut().enumerate() {
                *n = (inp.u8() as u64 % 65)
                    .min(elems(pick[src].0))
                    .min(half[dst]);
            }
        }
        let mut sd = [[0u64; 2]; 2]; // sd[src][dst]: where in src's send view dst's part starts
        let mut rd = [[0u64; 2]; 2]; // rd[dst][src]: where in dst's receive view src's part lands
        for src in 0..2 {
            for dst in 0..2 {
                sd[src][dst] = inp.u16() as u64 % (elems(pick[src].0) - c[src][dst] + 1);
                rd[dst][src] =
                    src as u64 * half[dst] + inp.u16() as u64 % (half[dst] - c[src][dst] + 1);
            }
        }
        self.log.push(format!(
            "all_to_allv of i32 from handles {pick:?} (send, recv per rank), counts {c:?}, \
             send displs {sd:?}, recv displs {rd:?}"
        ));
        let comms = self.comms();
        let ranks: Vec<(&Buffer, &Buffer)> = pick
            .iter()
            .map(|&(a, b)| (&self.handles[a].buf, &self.handles[b].buf))
            .collect();
        self.on_ranks("all_to_allv", |r| {
            let (s, v) = ranks[r];
            comms[r].all_to_allv(
                s,
                &[c[r][0], c[r][1]],
                &sd[r],
                v,
                &[c[0][r], c[1][r]],
                &rd[r],
                DType::I32,
                &self.streams[r],
            )
        });
        drop(ranks);
        for src in 0..2 {
            for dst in 0..2 {
                let (s, v) = (pick[src].0, pick[dst].1);
                let n = (c[src][dst] * 4) as usize;
                let from = (self.handles[s].off + sd[src][dst] * 4) as usize;
                let part = self.block(s).bytes[from..from + n].to_vec();
                let to = (self.handles[v].off + rd[dst][src] * 4) as usize;
                self.block_mut(v).bytes[to..to + n].copy_from_slice(&part);
            }
        }
        self.check("an all_to_allv");
        for src in 0..2 {
            for dst in 0..2 {
                let n = c[src][dst] * 4;
                self.verify_range(pick[src].0, sd[src][dst] * 4, n, "an all_to_allv");
                self.verify_range(pick[dst].1, rd[dst][src] * 4, n, "an all_to_allv");
            }
        }
    }

    /// The allocators hold exactly the model's live blocks, allocated, and no two overlap.
    fn check(&self, after: &str) {
        for dev in 0..2 {
            let mut live: Vec<(usize, &Block)> = self
                .blocks
                .iter()
                .enumerate()
                .filter_map(|(i, b)| b.as_ref().map(|b| (i, b)))
                .filter(|(_, b)| b.dev == dev)
                .collect();
            let st = self.allocs[dev].stats();
            if st.allocation.all.current != live.len() as u64 {
                self.fail(format!(
                    "allocator statistics after {after}: {} blocks allocated on device {dev}, \
                     the model holds {} live blocks",
                    st.allocation.all.current,
                    live.len()
                ));
            }
            live.sort_by_key(|(_, b)| b.addr);
            for pair in live.windows(2) {
                let ((i, a), (j, b)) = (pair[0], pair[1]);
                if a.addr + a.bytes.len() as u64 > b.addr {
                    self.fail(format!(
                        "live blocks overlap after {after} on device {dev}: block {i} \
                         [{:#x}, +{}) and block {j} [{:#x}, +{})",
                        a.addr,
                        a.bytes.len(),
                        b.addr,
                        b.bytes.len()
                    ));
                }
            }
            let snapshot = self.allocs[dev].snapshot();
            for (i, b) in &live {
                let found = snapshot
                    .iter()
                    .flat_map(|s| &s.blocks)
                    .find(|s| s.address == b.addr);
                match found {
                    Some(s)
                        if s.state == BlockState::ActiveAllocated
                            && s.requested_size == b.bytes.len() as u64 => {}
                    other => self.fail(format!(
                        "live block {i} [{:#x}, +{}) on device {dev} is not allocated in the \
                         allocator's snapshot after {after}: {other:?}",
                        b.addr,
                        b.bytes.len()
                    )),
                }
            }
        }
    }

    /// The bytes read through handle `h` equal the model.
    fn verify(&self, h: usize, after: &str) {
        self.verify_range(h, 0, self.handles[h].buf.len(), after);
    }

    /// Bytes `[off, off + len)` of handle `h` and `MARGIN` bytes either side equal the model:
    /// what a step wrote, with what a write past its range would have reached. (Whole reads of
    /// multi-MiB blocks after every step would make most of an execution's time.)
    fn verify_range(&self, h: usize, off: u64, len: u64, after: &str) {
        const MARGIN: u64 = 256;
        let l = self.handles[h].buf.len();
        let lo = off.saturating_sub(MARGIN).min(l);
        let hi = off.saturating_add(len).saturating_add(MARGIN).min(l);
        self.compare(h, lo, hi - lo, after);
    }

    /// The first and last `EDGE` bytes of handle `h` equal the model.
    fn verify_edges(&self, h: usize, after: &str) {
        const EDGE: u64 = 4096;
        let l = self.handles[h].buf.len();
        if l <= 2 * EDGE {
            self.compare(h, 0, l, after);
        } else {
            self.compare(h, 0, EDGE, after);
            self.compare(h, l - EDGE, EDGE, after);
        }
    }

    fn compare(&self, h: usize, off: u64, len: u64, after: &str) {
        let hd = &self.handles[h];
        let b = self.block(h);
        let mut out = vec![0u8; len as usize];
        if let Err(e) = self.streams[b.dev].read(&hd.buf, off, &mut out) {
            self.fail(format!("read of handle {h} after {after}: {e}"));
        }
        let at = (hd.off + off) as usize;
        let want = &b.bytes[at..at + out.len()];
        // `!=` first: a memcmp, where a byte loop would be instrumented byte by byte.
        if out[..] != want[..] {
            let k = out
                .iter()
                .zip(want)
                .position(|(x, y)| x != y)
                .expect("a difference");
            self.fail(format!(
                "bytes differ from the model after {after}: handle {h} (block {}, device {}, \
                 a view at {} of {} bytes) byte {} is {:#x}, the model says {:#x}",
                hd.block,
                b.dev,
                hd.off,
                hd.buf.len(),
                off as usize + k,
                out[k],
                want[k]
            ));
        }
    }

    /// Checks every handle's bytes, drops every handle and gives every segment back.
    fn finish(mut self) {
        // `ALLOC_BLOCKS_TRACE=1`: the steps of each input on stderr (for reading a reproducer).
        static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *TRACE.get_or_init(|| std::env::var_os("ALLOC_BLOCKS_TRACE").is_some()) {
            eprintln!("alloc_blocks steps: {:#?}", self.log);
        }
        for h in 0..self.handles.len() {
            if self.handles[h].buf.len() <= 64 << 10 {
                self.verify(h, "the last step");
            } else {
                self.verify_edges(h, "the last step");
            }
        }
        while !self.handles.is_empty() {
            let h = self.handles.len() - 1;
            self.drop_handle(h);
        }
        self.check("every handle dropped");
        for s in &self.streams {
            if let Err(e) = s.synchronize() {
                self.fail(format!("synchronize at the end: {e}"));
            }
        }
        self.comms = None;
        for (dev, a) in self.allocs.iter().enumerate() {
            a.empty_cache();
            let st = a.stats();
            if st.reserved_bytes.all.current != 0 {
                self.fail(format!(
                    "empty_cache with every block gone left {} bytes reserved on device {dev}",
                    st.reserved_bytes.all.current
                ));
            }
        }
    }
}
