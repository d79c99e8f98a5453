//! A rank of an in-process CPU communicator: validates at enqueue, then runs on the stream's worker,
//! meeting the other ranks at the communicator's rendezvous. Reductions are chunked: every rank
//! reduces its own 1/n of the data from every rank's buffer and the others copy it (reduce-scatter
//! then all-gather, all ranks working at once), so no rank gathers everything. Small all-reduces
//! (at most [`ONE_SHOT_MAX`] bytes) are one-shot instead: every rank reduces the whole message from
//! every rank's send buffer, which saves a meeting of the ranks (the phase between the two halves)
//! at the price of n times the arithmetic, cheaper below the threshold (docs/BENCHMARKS.md).

use super::rendezvous::{Rendezvous, Signature};
use super::{checked_stream, not_in_place, rank_arg};
use crate::stream::{cpu_addr, CpuStream};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use unihal_hal::ccl::{check_send_recv, checked_bytes, split_place, P2pParts};
use unihal_hal::host_reduce::{reduce, reducible};
use unihal_hal::{
    Buffer, CclCaps, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError,
    Invalid, ReduceOp, Result, Stream,
};

/// Shared by every rank of one communicator.
pub(crate) struct CommShared {
    pub rv: Rendezvous,
    pub error: Mutex<Option<HalError>>,
    pub caps: Arc<CclCaps>,
    /// Communicators being made by split number and color, with how many ranks still have to take
    /// theirs.
    children: Mutex<HashMap<SplitKey, (Arc<CommShared>, usize)>>,
}

/// (split number, color).
type SplitKey = (u64, u32);

/// Split rounds use this bit of the round number, so they never meet an operation's round.
const SPLIT_ROUND: u64 = 1 << 63;

impl CommShared {
    pub(crate) fn new(nranks: usize, timeout: Duration, caps: Arc<CclCaps>) -> Arc<CommShared> {
        Arc::new(CommShared {
            rv: Rendezvous::new(nranks, timeout),
            error: Mutex::new(None),
            caps,
            children: Mutex::new(HashMap::new()),
        })
    }

    fn fail(&self, e: &HalError) {
        let mut g = self.error.lock();
        if g.is_none() {
            *g = Some(e.clone());
            let n = self.rv.nranks;
            unihal_hal::ccl::log_failed(format_args!("of {n} ranks (in-process)"), e);
        }
    }
}

/// One rank.
pub struct CpuComm {
    pub(crate) rank: usize,
    pub(crate) device: Arc<dyn Device>,
    pub(crate) shared: Arc<CommShared>,
    /// The next round's number (shared with the launch hooks of captured rounds).
    pub(crate) seq: Arc<AtomicU64>,
    pub(crate) splits: AtomicU64,
    pub(crate) sent: Mutex<Vec<u64>>,
    pub(crate) received: Mutex<Vec<u64>>,
}

/// An address that crosses to the worker (the op holds the buffers it points into).
#[derive(Clone, Copy)]
struct Addr(u64);

/// The largest all-reduce, in bytes, that runs one-shot (see the module docs): measured on 4
/// ranks sharing 2 cores, where the one-shot's extra arithmetic costs less than the meeting it
/// saves up to this size (docs/BENCHMARKS.md, "Small messages").
pub(crate) const ONE_SHOT_MAX: u64 = 16 << 10;

unihal_hal::sync::thread_local! {
    /// A worker's scratch for one-shot all-reduces whose send and recv are the same buffer: the
    /// result is built here while peers still read the send, and copied once they are done.
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What a round's body leaves for after the closing barrier, when no peer reads this rank's
/// buffers any more.
pub(crate) enum Finish {
    /// Nothing: the body wrote its results in place.
    Done,
    /// Copy this many bytes from the worker's [`SCRATCH`] into the recv buffer.
    FromScratch(u64),
}

impl CpuComm {
    pub(crate) fn new(rank: usize, device: Arc<dyn Device>, shared: Arc<CommShared>) -> CpuComm {
        let n = shared.rv.nranks;
        CpuComm {
            rank,
            device,
            shared,
            seq: Arc::new(AtomicU64::new(0)),
            splits: AtomicU64::new(0),
            sent: Mutex::new(vec![0; n]),
            received: Mutex::new(vec![0; n]),
        }
    }

    fn n(&self) -> usize {
        self.shared.rv.nranks
    }

    /// Common checks; returns the CPU stream to enqueue on.
    fn check<'s>(
        &self,
        op: CollectiveOp,
        dtype: DType,
        red: Option<ReduceOp>,
        stream: &'s Arc<dyn Stream>,
    ) -> Result<&'s CpuStream> {
        crate::fault::point("collective")?;
        let sticky = self.shared.error.lock().clone();
        checked_stream(
            &self.device,
            &self.shared.caps,
            sticky,
            (op, dtype, red),
            stream,
        )
    }

    fn rank_arg(&self, arg: &'static str, r: usize) -> Result<()> {
        rank_arg(arg, r, self.n())
    }

    /// Enqueues a round: every rank publishes (send, recv), then `body` runs with all ranks'
    /// addresses. `in_place` is where send and recv may coincide ([`check_send_recv`]); any other
    /// overlap is rejected.
    fn round(
        &self,
        s: &CpuStream,
        what: String,
        (send, recv): ((&Buffer, u64), (&Buffer, u64)),
        in_place: (u64, u64),
        mut body: impl FnMut(&[(u64, u64)], &Rendezvous, u64) -> Result<Finish> + Send + 'static,
    ) -> Result<()> {
        let id = self.device.id();
        let sa = Addr(cpu_addr(send.0, "send", id, 0, send.1)? as u64);
        let ra = Addr(cpu_addr(recv.0, "recv", id, 0, recv.1)? as u64);
        check_send_recv(send.0, send.1, recv.0, recv.1, in_place)?;
        let (rank, shared, keep) = (
            self.rank,
            self.shared.clone(),
            (send.0.clone(), recv.0.clone()),
        );
        let sig = Signature { what };
        // The round's number matches the ranks' calls: taken at the enqueue, or in a capture at
        // each launch of the graph (the replay takes them in launch order).
        let (mut fixed, mut hook) = (None, None);
        let number = Arc::new(Mutex::new(None));
        let capture = s.capture();
        if capture.is_some() {
            let (counter, number) = (self.seq.clone(), number.clone());
            hook = Some(Box::new(move || {
                let seq = counter.fetch_add(1, Ordering::SeqCst);
                let number = number.clone();
                Ok(Box::new(move || *number.lock() = Some(seq)) as crate::graph::Setter)
            }) as crate::graph::Hook);
        } else {
            fixed = Some(self.seq.fetch_add(1, Ordering::SeqCst));
        }
        s.submit_to(
            capture,
            Box::new(move |err| {
                let Some(seq) = fixed.take().or_else(|| number.lock().take()) else {
                    return Err(HalError::Internal(
                        "a captured round ran without its number".into(),
                    ));
                };
                if err.is_some() {
                    return Ok(());
                }
                let (sa, ra) = (sa, ra);
                let r = shared.rv.run_round(seq, rank, &sig, (sa.0, ra.0), |ptrs| {
                    body(ptrs, &shared.rv, seq)
                });
                // Only now: run_round returns once no peer can still touch these buffers.
                let _ = &keep; // held until the operation is dropped
                match r {
                    Ok(Finish::Done) => Ok(()),
                    Ok(Finish::FromScratch(bytes)) => {
                        SCRATCH.with(|s| {
                            let s = s.borrow();
                            // SAFETY: recv holds `bytes` (checked at enqueue; the op holds it)
                            // and no peer touches it any more (the round is over); the scratch
                            // holds the body's `bytes` of result.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    s.as_ptr() as *const u8,
                                    ra.0 as *mut u8,
                                    bytes as usize,
                                )
                            }
                        });
                        Ok(())
                    }
                    Err(e) => {
                        shared.fail(&e);
                        Err(e)
                    }
                }
            }),
            hook,
        )
    }
}

/// One checked call of a group, ready for the worker.
struct P2p {
    sending: bool,
    peer: usize,
    /// Message number for this (source, destination) direction.
    k: u64,
    addr: Addr,
    bytes: u64,
}

impl CpuComm {
    /// Checks every call, numbers the messages (only once all are valid) and enqueues one
    /// operation that posts every send (eagerly, so nothing waits on a send), then takes every
    /// receive in call order.
    fn p2p_group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        let mut plan = Vec::with_capacity(calls.len());
        let mut keep = Vec::with_capacity(calls.len());
        let mut s = None;
        for c in calls {
            let P2pParts {
                buf,
                count,
                dtype,
                peer,
                recv,
            } = c.parts();
            s = Some(self.check(CollectiveOp::SendRecv, dtype, None, stream)?);
            self.rank_arg("peer", peer)?;
            let bytes = checked_bytes("count", count, 1, dtype)?;
            let addr = Addr(cpu_addr(buf, "buf", self.device.id(), 0, bytes)? as u64);
            plan.push(P2p {
                sending: !recv,
                peer,
                k: 0,
                addr,
                bytes,
            });
            keep.push(buf.clone());
        }
        let Some(s) = s else { return Ok(()) };
        if let Some(c) = s.capture() {
            // Message numbers are taken at the enqueue; a replay would need them per launch.
            return Err(c.refuse(
                "send/recv",
                HalError::unsupported(
                    "point-to-point sends and receives in a stream capture on the CPU backend",
                ),
            ));
        }
        {
            let (mut sent, mut received) = (self.sent.lock(), self.received.lock());
            for p in &mut plan {
                let g = if p.sending { &mut sent } else { &mut received };
                p.k = g[p.peer];
                g[p.peer] += 1;
            }
        }
        let (me, shared) = (self.rank, self.shared.clone());
        s.submit(Box::new(move |err| {
            if err.is_some() {
                return Ok(());
            }
            let r = run_p2p(&shared.rv, me, &plan);
            let _ = &keep; // held until the operation is dropped
            if let Err(e) = &r {
                shared.fail(e);
            }
            r
        }))
    }
}

/// Posts the sends, then takes the receives, of one group.
fn run_p2p(rv: &Rendezvous, me: usize, plan: &[P2p]) -> Result<()> {
    for p in plan.iter().filter(|p| p.sending) {
        // SAFETY: the range was checked at enqueue and the op holds the buffer.
        let data = unsafe { std::slice::from_raw_parts(p.addr.0 as *const u8, p.bytes as usize) };
        rv.post(me, p.peer, p.k, data.to_vec())?;
    }
    for p in plan.iter().filter(|p| !p.sending) {
        let data = rv.take(p.peer, me, p.k)?;
        if data.len() as u64 != p.bytes {
            return Err(HalError::invalid(
                "count",
                Invalid::Value {
                    value: format!("{} bytes expected by rank {me}", p.bytes),
                    accepted: format!("the {} bytes rank {} sent", data.len(), p.peer),
                },
            ));
        }
        // SAFETY: the range was checked at enqueue and the op holds the buffer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p.addr.0 as *mut u8, data.len()) };
    }
    Ok(())
}

/// Chunk `i` of `n` over `count` elements.
fn chunk(count: u64, n: usize, i: usize) -> (u64, u64) {
    (
        count * i as u64 / n as u64,
        count * (i as u64 + 1) / n as u64,
    )
}

/// Copies `bytes` from `src` to `dst` unless they are the same address.
///
/// # Safety
/// Both ranges are inside live CPU buffers: every rank's queued operation holds its buffers until
/// [`Rendezvous::run_round`] returns, which is only once every peer that received its addresses
/// has left the round. The ranges are disjoint unless `src == dst` (no copy): each rank's send and
/// recv are checked at enqueue to be disjoint or exactly in place, and different ranks' buffers
/// are allocations of different devices.
unsafe fn copy(src: u64, dst: u64, bytes: u64) {
    if src != dst && bytes > 0 {
        std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes as usize);
    }
}

impl Communicator for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.n()
    }
    fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check(CollectiveOp::AllReduce, dtype, Some(op), stream)?;
        if count == 0 {
            return Ok(());
        }
        let (esz, n, me) = (dtype.size() as u64, self.n(), self.rank);
        let bytes = checked_bytes("count", count, 1, dtype)?;
        self.round(
            s,
            format!("all_reduce {count} {dtype} {op}"),
            ((send, bytes), (recv, bytes)),
            (0, 0),
            move |p, rv, seq| {
                if bytes <= ONE_SHOT_MAX {
                    let srcs: Vec<*const u8> = p.iter().map(|&(sa, _)| sa as *const u8).collect();
                    let (sa, ra) = p[me];
                    if sa != ra {
                        // SAFETY: every rank's send holds `count` elements (checked at enqueue on
                        // every rank, and the signatures match) and is only read in this round;
                        // our recv is disjoint from our send (checked at enqueue) and no rank
                        // reads it in the one-shot algorithm.
                        unsafe { reduce(dtype, op, &srcs, ra as *mut u8, count as usize) };
                        return Ok(Finish::Done);
                    }
                    // In place: our send is our recv, which peers read until the round closes.
                    return SCRATCH.with(|s| {
                        let mut s = s.borrow_mut();
                        s.resize(bytes.div_ceil(8) as usize, 0);
                        // SAFETY: as above for the sources; the scratch holds `bytes`.
                        unsafe {
                            reduce(dtype, op, &srcs, s.as_mut_ptr() as *mut u8, count as usize)
                        };
                        Ok(Finish::FromScratch(bytes))
                    });
                }
                let (lo, hi) = chunk(count, n, me);
                let srcs: Vec<*const u8> = p
                    .iter()
                    .map(|&(sa, _)| (sa + lo * esz) as *const u8)
                    .collect();
                // SAFETY: every rank's buffers hold `count` elements (checked at enqueue on every rank,
                // and the signatures match); rank `me` writes only chunk `me` of its own recv, which no
                // rank reads in this phase.
                unsafe {
                    reduce(
                        dtype,
                        op,
                        &srcs,
                        (p[me].1 + lo * esz) as *mut u8,
                        (hi - lo) as usize,
                    )
                };
                rv.barrier(seq, 1)?;
                for (j, &(_, rj)) in p.iter().enumerate().filter(|&(j, _)| j != me) {
                    let (lo, hi) = chunk(count, n, j);
                    // SAFETY: chunk j of rank j's recv is final after barrier 1; we write only our own recv.
                    unsafe { copy(rj + lo * esz, p[me].1 + lo * esz, (hi - lo) * esz) };
                }
                Ok(Finish::Done)
            },
        )
    }

    fn broadcast(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check(CollectiveOp::Broadcast, dtype, None, stream)?;
        self.rank_arg("root", root)?;
        if count == 0 {
            return Ok(());
        }
        let (esz, me) = (dtype.size() as u64, self.rank);
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let send_len = if me == root { bytes } else { 0 };
        self.round(
            s,
            format!("broadcast {count} {dtype} root {root}"),
            ((send, send_len), (recv, bytes)),
            (0, 0),
            move |p, _, _| {
                // SAFETY: root's send holds count elements; each rank writes only its own recv.
                unsafe { copy(p[root].0, p[me].1, count * esz) };
                Ok(Finish::Done)
            },
        )
    }

    fn reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check(CollectiveOp::Reduce, dtype, Some(op), stream)?;
        self.rank_arg("root", root)?;
        if count == 0 {
            return Ok(());
        }
        let (esz, n, me) = (dtype.size() as u64, self.n(), self.rank);
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let recv_len = if me == root { bytes } else { 0 };
        self.round(
            s,
            format!("reduce {count} {dtype} {op} root {root}"),
            ((send, bytes), (recv, recv_len)),
            (0, 0),
            move |p, _, _| {
                let (lo, hi) = chunk(count, n, me);
                let srcs: Vec<*const u8> = p
                    .iter()
                    .map(|&(sa, _)| (sa + lo * esz) as *const u8)
                    .collect();
                // SAFETY: rank `me` writes chunk `me` of root's recv, which no rank reads this phase.
                unsafe {
                    reduce(
                        dtype,
                        op,
                        &srcs,
                        (p[root].1 + lo * esz) as *mut u8,
                        (hi - lo) as usize,
                    )
                };
                Ok(Finish::Done)
            },
        )
    }

    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check(CollectiveOp::AllGather, dtype, None, stream)?;
        if count == 0 {
            return Ok(());
        }
        let (esz, n, me) = (dtype.size() as u64, self.n() as u64, self.rank);
        let (bytes, world) = (
            checked_bytes("count", count, 1, dtype)?,
            checked_bytes("count", count, n, dtype)?,
        );
        self.round(
            s,
            format!("all_gather {count} {dtype}"),
            ((send, bytes), (recv, world)),
            (0, me as u64 * bytes),
            move |p, _, _| {
                for (j, &(sj, _)) in p.iter().enumerate() {
                    // SAFETY: each rank writes only its own recv; sends are only read.
                    unsafe { copy(sj, p[me].1 + j as u64 * count * esz, count * esz) };
                }
                Ok(Finish::Done)
            },
        )
    }

    fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check(CollectiveOp::ReduceScatter, dtype, Some(op), stream)?;
        if count == 0 {
            return Ok(());
        }
        let (esz, n, me) = (dtype.size() as u64, self.n() as u64, self.rank);
        let (bytes, world) = (
            checked_bytes("count", count, 1, dtype)?,
            checked_bytes("count", count, n, dtype)?,
        );
        self.round(
            s,
            format!("reduce_scatter {count} {dtype} {op}"),
            ((send, world), (recv, bytes)),
            (me as u64 * bytes, 0),
            move |p, _, _| {
                let off = me as u64 * count * esz;
                let srcs: Vec<*const u8> =
                    p.iter().map(|&(sa, _)| (sa + off) as *const u8).collect();
                // SAFETY: rank `me` writes its own recv; the others read only their own chunk of sends.
                unsafe { reduce(dtype, op, &srcs, p[me].1 as *mut u8, count as usize) };
                Ok(Finish::Done)
            },
        )
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        self.p2p_group(calls, stream)
    }

    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        // Checked before any exchange with the other ranks.
        let timeout = unihal_hal::ccl::timeout_or(config, self.shared.rv.timeout)?;
        if let Some(e) = self.shared.error.lock().clone() {
            return Err(e);
        }
        let no = self.splits.fetch_add(1, Ordering::SeqCst);
        let round = SPLIT_ROUND | no;
        let sig = Signature {
            what: "split".into(),
        };
        let enc = color.map_or(u64::MAX, u64::from);
        let all = self
            .shared
            .rv
            .run_round(round, self.rank, &sig, (enc, key as u32 as u64), |p| {
                Ok(p.to_vec())
            });
        let asks: Vec<(Option<u32>, i32)> = all?
            .iter()
            .map(|&(c, k)| ((c != u64::MAX).then_some(c as u32), k as u32 as i32))
            .collect();
        let (Some(color), Some((new_rank, size))) = (color, split_place(&asks, self.rank)) else {
            return Ok(None);
        };
        let child = {
            let mut g = self.shared.children.lock();
            let e = g.entry((no, color)).or_insert_with(|| {
                (
                    CommShared::new(size, timeout, self.shared.caps.clone()),
                    size,
                )
            });
            e.1 -= 1;
            let child = e.0.clone();
            if e.1 == 0 {
                g.remove(&(no, color));
            }
            child
        };
        Ok(Some(Arc::new(CpuComm::new(
            new_rank,
            self.device.clone(),
            child,
        ))))
    }

    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check(CollectiveOp::AllToAll, dtype, None, stream)?;
        not_in_place(send, recv)?;
        if count == 0 {
            return Ok(());
        }
        let (esz, n, me) = (dtype.size() as u64, self.n() as u64, self.rank as u64);
        let world = checked_bytes("count", count, n, dtype)?;
        self.round(
            s,
            format!("all_to_all {count} {dtype}"),
            ((send, world), (recv, world)),
            (0, 0),
            move |p, _, _| {
                for (j, &(sj, _)) in p.iter().enumerate() {
                    // SAFETY: each rank writes only its own recv, which is not any rank's send.
                    unsafe {
                        copy(
                            sj + me * count * esz,
                            p[me as usize].1 + j as u64 * count * esz,
                            count * esz,
                        )
                    };
                }
                Ok(Finish::Done)
            },
        )
    }

    fn abort(&self) {
        unihal_hal::ccl::log_aborted(self);
        self.shared.fail(&HalError::Aborted {
            what: format!("communicator aborted by rank {}", self.rank),
        });
        self.shared.rv.abort();
    }

    fn async_error(&self) -> Option<HalError> {
        self.shared.error.lock().clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// True when the engine reduces `d`.
pub(crate) fn reduces(d: DType) -> bool {
    reducible(d)
}
