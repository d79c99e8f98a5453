//! The fuzz driver: a byte string becomes a sequence of public HAL calls on one backend, checked
//! against a simple model.
//!
//! Each step decodes one call: allocations and drops of device and host buffers, copies and fills
//! with arbitrary offsets and lengths on any of three streams, synchronous reads and writes, host
//! maps, events and waits, stream drops, `free_async`/`alloc_async`, elementwise ops with arbitrary
//! views and dtypes, host callbacks that wait on their own stream, and collectives on a two-rank
//! communicator where a rank may be missing or abort.
//!
//! Invariants (a violation panics, which the fuzzer reports as a crash):
//! * no panic, no crash, no hang inside the HAL (libFuzzer's timeout catches hangs);
//! * every error is typed and expected for the call: never `Internal`, and `Vendor` only from a
//!   vendor backend;
//! * contents equal the model wherever they are defined: the model follows every write ordered on
//!   the model stream (stream 0) and the synchronous calls; a write from another stream, an op or a
//!   collective makes the bytes unknown;
//! * when every handle is dropped, the device's free memory is back where it started.

use std::sync::Arc;
use std::time::Duration;
use unihal_hal::{
    Backend, Buffer, CommConfig, Communicator, DType, Device, Event, EventFlags, FillValue,
    HalError, HostBuffer, OpCall, OpId, ReduceOp, Stream, TensorView,
};

pub mod alloc_blocks;
pub mod planted;

/// Reads the input a byte at a time; zeros once it runs out.
pub(crate) struct Input<'a>(pub(crate) &'a [u8]);

impl Input<'_> {
    pub(crate) fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub(crate) fn done(&self) -> bool {
        self.0.is_empty()
    }
    /// An index below `n` (n > 0).
    pub(crate) fn pick(&mut self, n: usize) -> usize {
        self.u8() as usize % n
    }
    /// A length or offset: mostly small, sometimes around a buffer's edge, sometimes absurd.
    fn size(&mut self, around: u64) -> u64 {
        match self.u8() % 8 {
            0 => 0,
            1 => around,
            2 => around.wrapping_add(self.u8() as u64 % 5).wrapping_sub(2),
            3 => u64::MAX - self.u8() as u64,
            4 => 1 << (self.u8() % 64),
            _ => self.u16() as u64 % (around + 9),
        }
    }
}

/// What the model knows of some bytes.
#[derive(Clone)]
enum Known {
    Bytes(Vec<u8>),
    Unknown,
}

struct DevBuf {
    buf: Buffer,
    model: Known,
}

struct HostBuf {
    buf: HostBuffer,
    model: Known,
}

/// A two-rank communicator over devices 0 and 1.
struct Pair {
    comms: Vec<Arc<dyn Communicator>>,
    streams: Vec<Arc<dyn Stream>>,
}

/// One backend under test, with what the invariants need to know of it.
pub struct Target {
    pub backend: Arc<dyn Backend>,
    /// Device memory is zeroed at allocation (the CPU backend; unspecified on GPUs).
    pub zeroed_device_memory: bool,
    /// Vendor errors may happen (out of memory inside the vendor runtime, ...).
    pub vendor_errors: bool,
}

/// Errors a call may return; anything else is a bug.
fn allowed(t: &Target, e: &HalError) -> bool {
    match e {
        HalError::Internal(_) => false,
        HalError::Vendor { .. } => t.vendor_errors,
        _ => true,
    }
}

fn check<T>(t: &Target, what: &str, r: unihal_hal::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(allowed(t, &e), "{what}: unexpected error {e:?}");
            None
        }
    }
}

const DTYPES: [DType; 5] = [DType::F32, DType::F16, DType::Bf16, DType::I32, DType::U8];
const UNARY: [OpId; 3] = [OpId::Neg, OpId::Relu, OpId::Abs];
const BINARY: [OpId; 3] = [OpId::Add, OpId::Mul, OpId::Maximum];

/// Runs one input on `t`. Panics on a broken invariant.
pub fn run(t: &Target, data: &[u8]) {
    let mut inp = Input(data);
    let Some(dev) = check(t, "open", t.backend.open(0)) else {
        return;
    };
    let devices: Vec<Arc<dyn Device>> = (0..t.backend.probe().unwrap_or(1).min(2))
        .filter_map(|i| t.backend.open(i).ok())
        .collect();
    let free = |d: &Arc<dyn Device>| d.memory_info().expect("memory_info").free;
    let free0: Vec<u64> = devices.iter().map(free).collect();
    {
        let mut st = State::new(t, dev.clone());
        let mut steps = 0;
        while !inp.done() && steps < 64 {
            st.step(&mut inp);
            steps += 1;
        }
        st.finish();
    }
    // Every handle is gone; once the devices are idle (a dropped stream's queued work still
    // completes), the memory is back.
    for d in &devices {
        let _ = d.synchronize();
    }
    let free1: Vec<u64> = devices.iter().map(free).collect();
    assert_eq!(
        free1, free0,
        "device memory not returned after every handle dropped"
    );
}

struct State<'t> {
    t: &'t Target,
    dev: Arc<dyn Device>,
    streams: Vec<Arc<dyn Stream>>,
    bufs: Vec<DevBuf>,
    hosts: Vec<HostBuf>,
    events: Vec<Arc<dyn Event>>,
    pair: Option<Pair>,
    /// Set by a host callback that saw an invariant broken.
    callback_violation: Arc<std::sync::atomic::AtomicBool>,
}

impl<'t> State<'t> {
    fn new(t: &'t Target, dev: Arc<dyn Device>) -> State<'t> {
        let streams = (0..3)
            .filter_map(|_| check(t, "create_stream", dev.create_stream()))
            .collect();
        State {
            t,
            dev,
            streams,
            bufs: Vec::new(),
            hosts: Vec::new(),
            events: Vec::new(),
            pair: None,
            callback_violation: Default::default(),
        }
    }

    fn stream(&mut self, inp: &mut Input) -> Option<(usize, Arc<dyn Stream>)> {
        if self.streams.is_empty() {
            return None;
        }
        let i = inp.pick(self.streams.len());
        Some((i, self.streams[i].clone()))
    }

    fn alloc(&mut self, len: usize) {
        if let Some(buf) = check(self.t, "alloc", self.dev.alloc(len)) {
            let model = if self.t.zeroed_device_memory {
                Known::Bytes(vec![0; len])
            } else {
                Known::Unknown
            };
            self.bufs.push(DevBuf { buf, model });
        }
    }

    fn step(&mut self, inp: &mut Input) {
        let t = self.t;
        match inp.u8() % 22 {
            0 => {
                let len = (inp.u16() % 8192) as usize;
                self.alloc(len);
            }
            1 if !self.bufs.is_empty() => {
                let i = inp.pick(self.bufs.len());
                self.bufs.swap_remove(i);
            }
            2 => {
                let len = (inp.u16() % 8192) as usize;
                if let Some(buf) = check(t, "alloc_host", self.dev.alloc_host(len)) {
                    // Zeroed at allocation on every backend.
                    let m = buf.map().expect("a fresh host buffer maps");
                    assert!(m.iter().all(|&b| b == 0), "fresh host buffer not zeroed");
                    drop(m);
                    self.hosts.push(HostBuf {
                        model: Known::Bytes(vec![0; len]),
                        buf,
                    });
                }
            }
            3 if !self.hosts.is_empty() => {
                let i = inp.pick(self.hosts.len());
                self.hosts.swap_remove(i);
            }
            4 | 5 if !self.bufs.is_empty() && !self.hosts.is_empty() => {
                let h2d = inp.u8().is_multiple_of(2);
                let (si, s) = match self.stream(inp) {
                    Some(v) => v,
                    None => return,
                };
                let (bi, hi) = (inp.pick(self.bufs.len()), inp.pick(self.hosts.len()));
                let (blen, hlen) = (self.bufs[bi].buf.len(), self.hosts[hi].buf.len() as u64);
                let (boff, hoff) = (inp.size(blen), inp.size(hlen));
                let len = inp.size(blen.min(hlen));
                let r = if h2d {
                    s.copy_h2d(&self.hosts[hi].buf, hoff, &self.bufs[bi].buf, boff, len)
                } else {
                    s.copy_d2h(&self.bufs[bi].buf, boff, &self.hosts[hi].buf, hoff, len)
                };
                if check(t, "copy h2d/d2h", r).is_some() {
                    let (src, dst) = if h2d {
                        (self.hosts[hi].model.clone(), &mut self.bufs[bi].model)
                    } else {
                        (self.bufs[bi].model.clone(), &mut self.hosts[hi].model)
                    };
                    let (so, doff) = if h2d { (hoff, boff) } else { (boff, hoff) };
                    copy_model(&src, so, dst, doff, len, si == 0);
                    if h2d {
                        self.touched(bi);
                    }
                }
            }
            6 if !self.bufs.is_empty() => {
                let (si, s) = match self.stream(inp) {
                    Some(v) => v,
                    None => return,
                };
                let (a, b) = (inp.pick(self.bufs.len()), inp.pick(self.bufs.len()));
                let (alen, blen) = (self.bufs[a].buf.len(), self.bufs[b].buf.len());
                let (ao, bo, len) = (inp.size(alen), inp.size(blen), inp.size(alen.min(blen)));
                let r = s.copy_d2d(&self.bufs[a].buf, ao, &self.bufs[b].buf, bo, len);
                if check(t, "copy_d2d", r).is_some() {
                    let src = self.bufs[a].model.clone();
                    copy_model(&src, ao, &mut self.bufs[b].model, bo, len, si == 0);
                    self.touched(b);
                }
            }
            7 if !self.bufs.is_empty() => {
                let (si, s) = match self.stream(inp) {
                    Some(v) => v,
                    None => return,
                };
                let i = inp.pick(self.bufs.len());
                let blen = self.bufs[i].buf.len();
                let (off, len) = (inp.size(blen), inp.size(blen));
                let v = inp.u8();
                assert!(
                    !(planted::panic() && (0x4a..=0x4d).contains(&v)),
                    "planted panic: the fuzzer found a fill with a byte in 0x4a..=0x4d"
                );
                let value = match inp.u8() % 3 {
                    0 => FillValue::U8(v),
                    1 => FillValue::U16(u16::from_le_bytes([v, v ^ 0x5a])),
                    _ => FillValue::U32(u32::from_le_bytes([v, 1, v, 2])),
                };
                if check(t, "fill", s.fill(&self.bufs[i].buf, off, len, value)).is_some() {
                    let pattern = match value {
                        FillValue::U8(v) => vec![v],
                        FillValue::U16(v) => v.to_le_bytes().to_vec(),
                        FillValue::U32(v) => v.to_le_bytes().to_vec(),
                    };
                    let bytes: Vec<u8> =
                        pattern.iter().copied().cycle().take(len as usize).collect();
                    write_model(&mut self.bufs[i].model, off, &Known::Bytes(bytes), si == 0);
                    self.touched(i);
                }
            }
            8 if !self.bufs.is_empty() && !self.streams.is_empty() => {
                // Synchronous write on stream 0 (ordered like stream 0's work).
                let i = inp.pick(self.bufs.len());
                let off = inp.size(self.bufs[i].buf.len());
                let len = (inp.u8() as usize) % 300;
                let bytes: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(7) ^ 0x33).collect();
                let r = self.streams[0].write(&self.bufs[i].buf, off, &bytes);
                if check(t, "write", r).is_some() {
                    write_model(&mut self.bufs[i].model, off, &Known::Bytes(bytes), true);
                    self.touched(i);
                }
            }
            9 if !self.bufs.is_empty() && !self.streams.is_empty() => {
                // Synchronous read after every stream is done: compare with the model.
                for s in &self.streams {
                    let _ = check(t, "synchronize", s.synchronize());
                }
                let i = inp.pick(self.bufs.len());
                let len = self.bufs[i].buf.len() as usize;
                let mut out = vec![0u8; len];
                if check(
                    t,
                    "read",
                    self.streams[0].read(&self.bufs[i].buf, 0, &mut out),
                )
                .is_some()
                {
                    if let Known::Bytes(want) = &self.bufs[i].model {
                        assert!(&out == want, "device buffer differs from the model");
                    }
                }
            }
            10 if !self.hosts.is_empty() => {
                let i = inp.pick(self.hosts.len());
                let write = inp.u8();
                let h = &mut self.hosts[i];
                match h.buf.map() {
                    Ok(mut m) => {
                        if let Known::Bytes(want) = &h.model {
                            assert!(m[..] == want[..], "host buffer differs from the model");
                        }
                        if write.is_multiple_of(2) {
                            m.fill(write);
                            h.model = Known::Bytes(vec![write; m.len()]);
                        }
                    }
                    Err(e) => assert!(matches!(e, HalError::InvalidArgument { .. }), "map: {e:?}"),
                }
            }
            11 => {
                let flags = EventFlags::default();
                if self.events.len() < 4 {
                    if let Some(e) = check(t, "create_event", self.dev.create_event(flags)) {
                        self.events.push(e);
                    }
                }
                if let (Some((_, s)), false) = (self.stream(inp), self.events.is_empty()) {
                    let e = &self.events[inp.pick(self.events.len())];
                    let _ = check(t, "record_event", s.record_event(e));
                }
            }
            12 if !self.events.is_empty() => {
                if let Some((_, s)) = self.stream(inp) {
                    let e = &self.events[inp.pick(self.events.len())];
                    let _ = check(t, "wait_event", s.wait_event(e));
                }
            }
            13 if !self.events.is_empty() => {
                let e = self.events[inp.pick(self.events.len())].clone();
                if inp.u8().is_multiple_of(2) {
                    let _ = check(t, "event synchronize", e.synchronize());
                } else {
                    let _ = check(t, "event query", e.query());
                }
            }
            14 => {
                if let Some((_, s)) = self.stream(inp) {
                    if inp.u8().is_multiple_of(2) {
                        let _ = check(t, "synchronize", s.synchronize());
                    } else {
                        let _ = check(t, "query", s.query());
                    }
                }
            }
            15 if !self.streams.is_empty() => {
                // Drop a stream with whatever is queued (it still completes) and make a new one.
                let i = inp.pick(self.streams.len());
                if i == 0 {
                    let _ = check(t, "synchronize", self.streams[0].synchronize());
                } else {
                    // Its writes are unordered with the model stream from now on anyway.
                }
                if let Some(s) = check(t, "create_stream", self.dev.create_stream()) {
                    self.streams[i] = s;
                }
            }
            16 if !self.bufs.is_empty() => {
                if let Some((_, s)) = self.stream(inp) {
                    let i = inp.pick(self.bufs.len());
                    let keep = inp.u8().is_multiple_of(2);
                    let _ = check(t, "free_async", s.free_async(&self.bufs[i].buf));
                    if keep {
                        // The handle stays, unusable: every use must be FreeEnqueued.
                        let r = s.fill(&self.bufs[i].buf, 0, 1, FillValue::U8(1));
                        if self.bufs[i].buf.is_free_enqueued() {
                            assert!(r.is_err(), "a freed buffer accepted a fill");
                        }
                        self.bufs[i].model = Known::Unknown;
                    } else {
                        self.bufs.swap_remove(i);
                    }
                }
            }
            17 => {
                if let Some((_, s)) = self.stream(inp) {
                    let len = (inp.u16() % 4096) as usize;
                    if let Some(buf) = check(t, "alloc_async", s.alloc_async(len)) {
                        self.bufs.push(DevBuf {
                            buf,
                            model: Known::Unknown,
                        });
                    }
                }
            }
            18 if !self.bufs.is_empty() => self.op(inp),
            19 => self.collective(inp),
            20 => {
                if let Some((_, s)) = self.stream(inp) {
                    let (s2, bad) = (s.clone(), self.callback_violation.clone());
                    let r = s.host_callback(Box::new(move || {
                        // Waiting for itself would never return: an error, never a hang. (A
                        // panic here would become the stream's error, so it is recorded.)
                        if s2.synchronize().is_ok() {
                            bad.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                    }));
                    if let Err(e) = r {
                        assert!(allowed(t, &e), "host_callback: unexpected error {e:?}");
                    }
                }
            }
            21 if !self.bufs.is_empty() => {
                let i = inp.pick(self.bufs.len());
                let blen = self.bufs[i].buf.len();
                let (off, len) = (inp.size(blen), inp.size(blen));
                if let Some(sub) = check(t, "slice", self.bufs[i].buf.slice(off, len)) {
                    let model = match &self.bufs[i].model {
                        Known::Bytes(b) => {
                            Known::Bytes(b[off as usize..(off + len) as usize].to_vec())
                        }
                        Known::Unknown => Known::Unknown,
                    };
                    // The slice aliases the parent: the parent's model no longer follows writes
                    // made through it.
                    self.bufs[i].model = Known::Unknown;
                    self.bufs.push(DevBuf { buf: sub, model });
                }
            }
            _ => {}
        }
    }

    /// An elementwise op over arbitrary views; its output becomes unknown.
    fn op(&mut self, inp: &mut Input) {
        let t = self.t;
        let Some((_, s)) = self.stream(inp) else {
            return;
        };
        let d = DTYPES[inp.pick(DTYPES.len())];
        let ndim = inp.pick(4);
        let shape: Vec<u64> = (0..ndim).map(|_| inp.size(6) % 1000).collect();
        let view = |inp: &mut Input, bufs: &[DevBuf]| {
            let b = &bufs[inp.pick(bufs.len())].buf;
            let strides: Vec<i64> = (0..ndim)
                .map(|_| match inp.u8() % 4 {
                    0 => 0,
                    1 => -(inp.u8() as i64 % 9),
                    2 => i64::MAX - inp.u8() as i64,
                    _ => inp.u8() as i64 % 17,
                })
                .collect();
            let off = inp.size(b.len());
            TensorView::contiguous(b, d, &shape).strided(off, &strides)
        };
        let (x, y) = (view(inp, &self.bufs), view(inp, &self.bufs));
        let call = if inp.u8().is_multiple_of(2) {
            OpCall::unary(UNARY[inp.pick(UNARY.len())], x, y.clone())
        } else {
            let z = view(inp, &self.bufs);
            OpCall::binary(BINARY[inp.pick(BINARY.len())], x, y, z)
        };
        let out = call.tensors.last().expect("an output").buffer.clone();
        let r = s.run_op(&call);
        if let Err(e) = &r {
            assert!(allowed(t, e), "run_op: unexpected error {e:?}");
        }
        for b in &mut self.bufs {
            if b.buf.same_allocation(&out) {
                b.model = Known::Unknown;
            }
        }
    }

    /// A collective round on a two-rank communicator: both ranks, a missing rank, or an abort.
    fn collective(&mut self, inp: &mut Input) {
        let t = self.t;
        let Some(ccl) = t.backend.collectives() else {
            return;
        };
        if t.backend.probe().unwrap_or(0) < 2 {
            return;
        }
        if self.pair.is_none() {
            let devs: Vec<Arc<dyn Device>> = match (t.backend.open(0), t.backend.open(1)) {
                (Ok(a), Ok(b)) => vec![a, b],
                _ => return,
            };
            let cfg = CommConfig {
                timeout: Some(Duration::from_millis(20)),
            };
            let Some(comms) = check(t, "init_all", ccl.init_all(&devs, &cfg)) else {
                return;
            };
            let streams = devs
                .iter()
                .filter_map(|d| check(t, "create_stream", d.create_stream()))
                .collect::<Vec<_>>();
            if streams.len() != 2 {
                return;
            }
            self.pair = Some(Pair { comms, streams });
        }
        let pair = self.pair.as_ref().expect("made above");
        let count = inp.u16() as u64 % 3000 + 1;
        let how = inp.u8() % 4; // 0, 1: both ranks; 2: rank 1 missing; 3: rank 1 aborts
        let kind = inp.u8() % 3;
        for (r, (c, s)) in pair.comms.iter().zip(&pair.streams).enumerate() {
            if how == 2 && r == 1 {
                break;
            }
            let dev = c.device();
            let Some(b) = check(t, "alloc", dev.alloc(count as usize * 4 * 2)) else {
                return;
            };
            let r = match kind {
                0 => c.all_reduce(&b, &b, count, DType::F32, ReduceOp::Sum, s),
                1 => c.broadcast(&b, &b, count, DType::F32, 1, s),
                _ => {
                    let recv = b.clone();
                    let send = b.slice(r as u64 * count * 4, count * 4).expect("in range");
                    c.all_gather(&send, &recv, count, DType::F32, s)
                }
            };
            if let Err(e) = &r {
                assert!(allowed(t, e), "collective: unexpected error {e:?}");
            }
            // The buffer handle drops here: only the queued operation keeps it.
        }
        if how == 3 {
            pair.comms[1].abort();
        }
        let mut failed = false;
        for s in &pair.streams {
            if let Err(e) = s.synchronize() {
                assert!(allowed(t, &e), "collective outcome: {e:?}");
                failed = true;
            }
        }
        if failed || how >= 2 {
            // A failed communicator stays failed (and its streams keep the error): start afresh.
            self.pair = None;
        }
    }

    /// Synchronises everything and drops every handle (streams last).
    fn finish(mut self) {
        for s in &self.streams {
            let _ = s.synchronize();
        }
        if let Some(p) = &self.pair {
            for s in &p.streams {
                let _ = s.synchronize();
            }
        }
        self.bufs.clear();
        self.hosts.clear();
        self.events.clear();
        self.pair = None;
        self.streams.clear();
        assert!(
            !self
                .callback_violation
                .load(std::sync::atomic::Ordering::SeqCst),
            "a host callback synchronised its own stream successfully"
        );
    }

    /// After a write through `bufs[i]`: other handles of the same allocation no longer follow.
    fn touched(&mut self, i: usize) {
        let a = self.bufs[i].buf.clone();
        for (j, b) in self.bufs.iter_mut().enumerate() {
            if j != i && b.buf.same_allocation(&a) {
                b.model = Known::Unknown;
            }
        }
    }
}

/// The model of `len` bytes copied from `src` at `so` to `dst` at `doff` (only when the copy is
/// ordered with the model, `ordered`; otherwise the destination becomes unknown).
fn copy_model(src: &Known, so: u64, dst: &mut Known, doff: u64, len: u64, ordered: bool) {
    let part = match src {
        Known::Bytes(b) => Known::Bytes(b[so as usize..(so + len) as usize].to_vec()),
        Known::Unknown => Known::Unknown,
    };
    write_model(dst, doff, &part, ordered);
}

fn write_model(dst: &mut Known, off: u64, part: &Known, ordered: bool) {
    match (ordered, part, &mut *dst) {
        (true, Known::Bytes(p), Known::Bytes(d)) => {
            d[off as usize..off as usize + p.len()].copy_from_slice(p);
        }
        _ => *dst = Known::Unknown,
    }
}
