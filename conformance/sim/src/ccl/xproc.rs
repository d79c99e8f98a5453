//! Ranks in several processes: a communicator whose data moves through its shared file
//! ([`super::shm`]), as NCCL's shared-memory transport moves it between the processes of a node.
//!
//! Each rank has a *proxy* thread (NCCL's proxy, or a GPU's copy engine): a rank's operations
//! take a sequence number in the order they are called, and the proxy runs them in that order,
//! each once its stream has reached it (its gate is *armed*), so the data a stream produced
//! before the operation is what moves. A gate finishes when the proxy has finished its
//! operation; the proxy writes the receive buffers while the gate still holds them, so the
//! device's checks keep them allocated.
//!
//! Collectives move in steps: in step `s` every rank writes its part (at most [`shm::SLOT`]
//! bytes) with a descriptor of the call into its slot, publishes `posted = s`, waits until every
//! rank posted `s`, checks that the descriptors agree (kind, dtype, count, root, collective
//! number: a mismatch fails the communicator for every rank, never a silent reduction), computes
//! its own output from every slot (reductions with [`unihal_hal::host_reduce`] in rank order,
//! as in one process) and publishes `consumed = s`; a rank writes step `s + 1` only once every
//! rank consumed `s`. Sends and receives of a group move through a ring per ordered pair of
//! ranks, each message led by its length (a receive of another size fails the communicator),
//! every send and receive of a group progressing together.
//!
//! Nothing hangs: while a proxy waits it watches its rank's abort (queued operations then finish
//! without data, as in one process), the communicator's failure (a mismatch, the watchdog of any
//! rank's device: [`super::CommError::Failed`]) and the peers' processes: a process that exited
//! becomes, within milliseconds, the communicator's asynchronous error naming the rank and
//! process ([`super::CommError::PeerExited`], NCCL's remote error), and the operations wait, as
//! NCCL's kernels do, until the rank aborts or its device's watchdog fires.

use super::rendezvous::Joined;
use super::shm::{self, Segment};
use super::{Collective, CommError, Kind, P2p};
use crate::{Blocker, Device, Gate, GatePoll, Memory, SimError, SimResult, StreamId};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::host_reduce::reduce;
use unihal_hal::{DType, ReduceOp};

/// What a rank's proxy runs.
#[derive(Clone)]
pub enum Call {
    /// The `k`-th collective of this rank.
    Coll(Collective, u64),
    Group(Vec<P2p>),
}

struct Op {
    call: Call,
    armed: bool,
}

#[derive(Default)]
struct Ops {
    /// The next sequence number to hand out.
    next: u64,
    /// The next operation the proxy runs.
    running: u64,
    queue: BTreeMap<u64, Op>,
    results: HashMap<u64, SimResult<()>>,
    /// Collectives called so far (their number is part of each step's descriptor).
    collectives: u64,
    shutdown: bool,
}

/// One rank of a communicator spanning processes. Thread-safe.
pub struct Rank {
    seg: Segment,
    rank: usize,
    nranks: usize,
    pids: Vec<u64>,
    ops: Mutex<Ops>,
    changed: Condvar,
    aborted: AtomicBool,
    /// What the proxy waits for now, for the watchdog's message.
    waiting: Mutex<String>,
}

/// Why a proxy stopped waiting.
enum Stop {
    Aborted,
    Shutdown,
    Failed(SimError),
}

impl Rank {
    /// The rank's side of a joined communicator, with its proxy thread running.
    ///
    /// # Errors
    /// [`SimError::InvalidUsage`] when no thread can be started.
    pub fn start(
        joined: Joined,
        rank: usize,
    ) -> SimResult<(Arc<Rank>, std::thread::JoinHandle<()>)> {
        let nranks = joined.pids.len();
        let me = Arc::new(Rank {
            seg: joined.seg,
            rank,
            nranks,
            pids: joined.pids,
            ops: Mutex::new(Ops::default()),
            changed: Condvar::new(),
            aborted: AtomicBool::new(false),
            waiting: Mutex::new(String::new()),
        });
        let proxy = me.clone();
        let thread = std::thread::Builder::new()
            .name(format!("unihal-sim-ccl-proxy-{rank}"))
            .spawn(move || proxy.serve())
            .map_err(|e| SimError::InvalidUsage(format!("cannot start a proxy thread: {e}")))?;
        Ok((me, thread))
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Refuses work after this rank aborted.
    ///
    /// # Errors
    /// [`SimError::InvalidUsage`] after this rank aborted.
    fn refuse_if_aborted(&self) -> SimResult<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(SimError::InvalidUsage(format!(
                "rank {} of this communicator was aborted",
                self.rank
            )));
        }
        Ok(())
    }

    /// Takes the next sequence number for `call` (collectives also their number).
    fn submit(&self, call: impl FnOnce(u64) -> Call) -> u64 {
        let mut ops = self.ops.lock();
        let call = call(ops.collectives);
        if matches!(call, Call::Coll(..)) {
            ops.collectives += 1;
        }
        let seq = ops.next;
        ops.next += 1;
        ops.queue.insert(seq, Op { call, armed: false });
        seq
    }

    /// Takes back operation `seq`, the last one submitted, whose gate could not be queued.
    fn cancel(&self, seq: u64) {
        let mut ops = self.ops.lock();
        if ops.next == seq + 1 {
            if let Some(op) = ops.queue.remove(&seq) {
                ops.next = seq;
                if matches!(op.call, Call::Coll(..)) {
                    ops.collectives -= 1;
                }
            }
        }
    }

    /// The gate of operation `seq`, for its stream.
    pub fn gate(self: &Arc<Self>, seq: u64) -> Box<dyn Gate> {
        Box::new(RankGate {
            rank: self.clone(),
            seq,
            armed: false,
        })
    }

    /// Aborts this rank: its queued operations finish without moving data, later ones are
    /// refused, peers see [`CommError::PeerAborted`]. Never blocks.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Release);
        self.seg.rank(self.rank).aborted.store(1, Ordering::Release);
        let _g = self.ops.lock();
        self.changed.notify_all();
    }

    /// The communicator's asynchronous error, if any (never blocks).
    pub fn error(&self) -> Option<CommError> {
        if self.aborted.load(Ordering::Acquire) {
            return Some(CommError::Aborted);
        }
        if let Some(e) = self.seg.failure() {
            return Some(match (self.seg.exited(), e) {
                (Some(rank), SimError::LaunchFailed(message)) => {
                    CommError::PeerExited { rank, message }
                }
                (_, e) => CommError::Failed(e),
            });
        }
        (0..self.nranks)
            .find(|&r| self.seg.rank(r).aborted.load(Ordering::Acquire) != 0)
            .map(CommError::PeerAborted)
    }

    /// Stops the proxy (after its current wait); operations still queued finish without data.
    pub fn shut_down(&self) {
        let mut ops = self.ops.lock();
        ops.shutdown = true;
        self.changed.notify_all();
    }

    /// The proxy: runs the operations in sequence, each once armed.
    fn serve(self: Arc<Self>) {
        let mut step = 0u64;
        loop {
            let (seq, call) = {
                let mut ops = self.ops.lock();
                loop {
                    let stop = ops.shutdown || self.aborted.load(Ordering::Acquire);
                    let running = ops.running;
                    match ops.queue.get(&running) {
                        Some(op) if op.armed || stop => {
                            let op = ops.queue.remove(&running).expect("present");
                            break (running, op.call);
                        }
                        None if ops.shutdown => return,
                        _ => {
                            self.changed.wait(&mut ops);
                        }
                    }
                }
            };
            let result = if self.aborted.load(Ordering::Acquire) || self.ops.lock().shutdown {
                Ok(())
            } else if let (None, Some(e)) = (self.seg.exited(), self.seg.failure()) {
                Err(e)
            } else {
                let r = match &call {
                    Call::Coll(c, k) => self.collective(c, *k, &mut step),
                    Call::Group(calls) => self.group(calls),
                };
                match r {
                    Ok(()) | Err(Stop::Aborted | Stop::Shutdown) => Ok(()),
                    Err(Stop::Failed(e)) => Err(e),
                }
            };
            let mut ops = self.ops.lock();
            ops.results.insert(seq, result);
            ops.running += 1;
            self.changed.notify_all();
        }
    }

    /// Waits until `ready` holds, watching the abort, the communicator's failure and the peers'
    /// processes. `what` says what it waits for (the watchdog's message).
    fn wait(&self, what: impl Fn() -> String, ready: impl Fn() -> bool) -> Result<(), Stop> {
        if ready() {
            return Ok(());
        }
        *self.waiting.lock() = what();
        let mut pause = Duration::from_micros(5);
        let mut checked = Instant::now();
        loop {
            if ready() {
                return Ok(());
            }
            if self.aborted.load(Ordering::Acquire) {
                return Err(Stop::Aborted);
            }
            if self.ops.lock().shutdown {
                return Err(Stop::Shutdown);
            }
            if self.seg.exited().is_none() {
                if let Some(e) = self.seg.failure() {
                    return Err(Stop::Failed(e));
                }
            }
            // A peer's exit is the communicator's asynchronous error; the operation waits, as an
            // NCCL kernel spins, until this rank aborts (a framework's watchdog does) or its
            // device's watchdog fires.
            if checked.elapsed() >= Duration::from_millis(20) && self.seg.failure().is_none() {
                checked = Instant::now();
                if let Some(r) = (0..self.nranks).find(|&r| !shm::alive(self.pids[r])) {
                    let message = format!(
                        "remote process exited: rank {r} (process {}) ended while rank {} waited \
                         for it ({})",
                        self.pids[r],
                        self.rank,
                        what()
                    );
                    self.seg.fail_exited(r, message);
                }
            }
            if pause < Duration::from_micros(40) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
            }
            pause = (pause * 2).min(Duration::from_micros(500));
        }
    }

    /// One collective, in steps of at most a slot per rank.
    fn collective(&self, c: &Collective, number: u64, step: &mut u64) -> Result<(), Stop> {
        let n = self.nranks;
        let me = self.rank;
        let e = c.dtype.size();
        let lanes = match c.kind {
            Kind::ReduceScatter(_) | Kind::AllToAll => n,
            _ => 1,
        };
        let per = (shm::SLOT / (lanes * e)).max(1) as u64;
        let desc = Desc::of(c, number);
        let mut first = 0u64;
        loop {
            let m = per.min(c.count - first);
            *step += 1;
            let s = *step;
            // My slot is free once every rank read the previous step.
            self.wait(
                || {
                    format!(
                        "collective #{number}: ranks {} still read step {}",
                        self.behind(s - 1, |b| &b.consumed),
                        s - 1
                    )
                },
                || (0..n).all(|r| self.seg.rank(r).consumed.load(Ordering::Acquire) >= s - 1),
            )?;
            let slot = self.seg.slot(me);
            let bytes = m as usize * e;
            // SAFETY: the send ranges were checked against this device's live allocations when
            // the operation was queued, and its gate keeps them until this returns; each copy
            // stays inside the slot (`lanes * m * e <= SLOT`).
            unsafe {
                let at = |addr: u64, elem: u64| (addr as *const u8).add(elem as usize * e);
                match c.kind {
                    Kind::Broadcast { root } if root != me => {}
                    Kind::ReduceScatter(_) | Kind::AllToAll => {
                        for j in 0..n as u64 {
                            std::ptr::copy_nonoverlapping(
                                at(c.send, j * c.count + first),
                                slot.add(j as usize * bytes),
                                bytes,
                            );
                        }
                    }
                    _ => std::ptr::copy_nonoverlapping(at(c.send, first), slot, bytes),
                }
            }
            let block = self.seg.rank(me);
            for (w, v) in block.desc.iter().zip(desc.0) {
                w.store(v, Ordering::Relaxed);
            }
            block.posted.store(s, Ordering::Release);
            self.wait(
                || {
                    format!(
                        "collective #{number}: ranks {} never posted step {s}",
                        self.behind(s, |b| &b.posted)
                    )
                },
                || (0..n).all(|r| self.seg.rank(r).posted.load(Ordering::Acquire) >= s),
            )?;
            for r in 0..n {
                let theirs = Desc(std::array::from_fn(|i| {
                    self.seg.rank(r).desc[i].load(Ordering::Relaxed)
                }));
                if theirs != desc {
                    let e = SimError::LaunchFailed(format!(
                        "collective #{number} mismatch: rank {me} calls {}, rank {r} calls {}",
                        desc.describe(),
                        theirs.describe()
                    ));
                    self.seg.fail(&e);
                    return Err(Stop::Failed(self.seg.failure().unwrap_or(e)));
                }
            }
            // SAFETY: every slot holds step `s` (acquired above) and is not rewritten before this
            // rank publishes `consumed = s`; the receive ranges are checked as the send ones.
            unsafe { self.output(c, first, m) };
            block.consumed.store(s, Ordering::Release);
            first += m;
            if first >= c.count {
                return Ok(());
            }
        }
    }

    /// Ranks whose counter is below `s`, for messages.
    fn behind(
        &self,
        s: u64,
        counter: impl Fn(&shm::RankBlock) -> &std::sync::atomic::AtomicU64,
    ) -> String {
        let v: Vec<String> = (0..self.nranks)
            .filter(|&r| counter(self.seg.rank(r)).load(Ordering::Acquire) < s)
            .map(|r| r.to_string())
            .collect();
        v.join(", ")
    }

    /// Writes this rank's output of elements `first..first + m` from the slots.
    ///
    /// # Safety
    /// Every slot must hold the current step; the receive buffer must be valid for the kind.
    unsafe fn output(&self, c: &Collective, first: u64, m: u64) {
        let n = self.nranks;
        let me = self.rank;
        let e = c.dtype.size();
        let bytes = m as usize * e;
        let recv = |elem: u64| (c.recv as *mut u8).wrapping_add(elem as usize * e);
        let reduce_lane = |op: ReduceOp, lane: usize, out: *mut u8| {
            let srcs: Vec<*const u8> = (0..n)
                .map(|r| self.seg.slot(r).wrapping_add(lane * bytes) as *const u8)
                .collect();
            // SAFETY: each slot lane holds `m` elements; `out` holds `m` (the caller's contract).
            unsafe { reduce(c.dtype, op, &srcs, out, m as usize) };
        };
        // SAFETY: the caller's contract; slots never overlap device memory.
        unsafe {
            match c.kind {
                Kind::AllReduce(op) => reduce_lane(op, 0, recv(first)),
                Kind::Reduce { op, root } => {
                    if me == root {
                        reduce_lane(op, 0, recv(first));
                    }
                }
                Kind::Broadcast { root } => {
                    std::ptr::copy_nonoverlapping(self.seg.slot(root), recv(first), bytes)
                }
                Kind::AllGather => {
                    for r in 0..n {
                        std::ptr::copy_nonoverlapping(
                            self.seg.slot(r),
                            recv(r as u64 * c.count + first),
                            bytes,
                        );
                    }
                }
                Kind::ReduceScatter(op) => reduce_lane(op, me, recv(first)),
                Kind::AllToAll => {
                    for r in 0..n {
                        std::ptr::copy_nonoverlapping(
                            self.seg.slot(r).add(me * bytes),
                            recv(r as u64 * c.count + first),
                            bytes,
                        );
                    }
                }
            }
        }
    }

    /// A group of sends and receives, all progressing together.
    fn group(&self, calls: &[P2p]) -> Result<(), Stop> {
        struct Leg {
            send: bool,
            peer: usize,
            addr: u64,
            len: u64,
            header: bool,
            done: u64,
        }
        let mut legs: Vec<Leg> = calls
            .iter()
            .map(|c| match *c {
                P2p::Send {
                    peer,
                    addr,
                    count,
                    dtype,
                } => Leg {
                    send: true,
                    peer,
                    addr,
                    len: count * dtype.size() as u64,
                    header: false,
                    done: 0,
                },
                P2p::Recv {
                    peer,
                    addr,
                    count,
                    dtype,
                } => Leg {
                    send: false,
                    peer,
                    addr,
                    len: count * dtype.size() as u64,
                    header: false,
                    done: 0,
                },
            })
            .collect();
        let ring = shm::RING as u64;
        loop {
            let mut moved = false;
            for leg in legs.iter_mut().filter(|l| !l.header || l.done < l.len) {
                let (src, dst) = if leg.send {
                    (self.rank, leg.peer)
                } else {
                    (leg.peer, self.rank)
                };
                let (ch, data) = self.seg.channel(src, dst);
                let written = ch.written.load(Ordering::Acquire);
                let read = ch.read.load(Ordering::Acquire);
                if leg.send {
                    let mut free = ring - (written - read);
                    let mut at = written;
                    if !leg.header {
                        if free < 8 {
                            continue;
                        }
                        // SAFETY: 8 free bytes of the ring (the receiver reads them only after
                        // the release store below).
                        unsafe { ring_copy(data, at, leg.len.to_le_bytes().as_ptr(), 8, true) };
                        at += 8;
                        free -= 8;
                        leg.header = true;
                    }
                    let k = free.min(leg.len - leg.done);
                    // SAFETY: `k` free bytes of the ring; the source range was checked when the
                    // group was queued and its gate holds it.
                    unsafe { ring_copy(data, at, (leg.addr + leg.done) as *const u8, k, true) };
                    leg.done += k;
                    at += k;
                    if at != written {
                        ch.written.store(at, Ordering::Release);
                        moved = true;
                    }
                } else {
                    let mut avail = written - read;
                    let mut at = read;
                    if !leg.header {
                        if avail < 8 {
                            continue;
                        }
                        let mut len = [0u8; 8];
                        // SAFETY: 8 written bytes of the ring (acquired above).
                        unsafe { ring_copy(data, at, len.as_mut_ptr(), 8, false) };
                        let theirs = u64::from_le_bytes(len);
                        if theirs != leg.len {
                            let e = SimError::LaunchFailed(format!(
                                "rank {} sends {theirs} bytes to rank {}, which receives {}",
                                leg.peer, self.rank, leg.len
                            ));
                            self.seg.fail(&e);
                            return Err(Stop::Failed(self.seg.failure().unwrap_or(e)));
                        }
                        at += 8;
                        avail -= 8;
                        leg.header = true;
                    }
                    let k = avail.min(leg.len - leg.done);
                    // SAFETY: `k` written bytes of the ring; the destination range was checked
                    // when the group was queued and its gate holds it.
                    unsafe { ring_copy(data, at, (leg.addr + leg.done) as *mut u8, k, false) };
                    leg.done += k;
                    at += k;
                    if at != read {
                        ch.read.store(at, Ordering::Release);
                        moved = true;
                    }
                }
            }
            if legs.iter().all(|l| l.header && l.done == l.len) {
                return Ok(());
            }
            if !moved {
                let pending: Vec<String> = legs
                    .iter()
                    .filter(|l| !l.header || l.done < l.len)
                    .map(|l| {
                        if l.send {
                            format!("the send to rank {}", l.peer)
                        } else {
                            format!("the receive from rank {}", l.peer)
                        }
                    })
                    .collect();
                let seen: Vec<(u64, u64)> = legs
                    .iter()
                    .map(|l| {
                        let (s, d) = if l.send {
                            (self.rank, l.peer)
                        } else {
                            (l.peer, self.rank)
                        };
                        let (ch, _) = self.seg.channel(s, d);
                        (
                            ch.written.load(Ordering::Acquire),
                            ch.read.load(Ordering::Acquire),
                        )
                    })
                    .collect();
                // Wait for any ring of the group to change.
                self.wait(
                    || format!("a group of sends and receives: {}", pending.join("; ")),
                    || {
                        legs.iter().zip(&seen).any(|(l, &old)| {
                            let (s, d) = if l.send {
                                (self.rank, l.peer)
                            } else {
                                (l.peer, self.rank)
                            };
                            let (ch, _) = self.seg.channel(s, d);
                            (
                                ch.written.load(Ordering::Acquire),
                                ch.read.load(Ordering::Acquire),
                            ) != old
                        })
                    },
                )?;
            }
        }
    }
}

/// Copies `k` bytes between the ring at stream position `at` (wrapping) and `other`.
///
/// # Safety
/// The ring's bytes `at..at + k` (mod its size) must be this side's to touch; `other` valid for
/// `k` bytes.
unsafe fn ring_copy(ring: *mut u8, at: u64, other: *const u8, k: u64, into_ring: bool) {
    let size = shm::RING as u64;
    let start = (at % size) as usize;
    let first = (k as usize).min(shm::RING - start);
    // SAFETY: the caller's contract, split at the ring's end.
    unsafe {
        let (a, b) = (ring.add(start), ring);
        if into_ring {
            std::ptr::copy_nonoverlapping(other, a, first);
            std::ptr::copy_nonoverlapping(other.add(first), b, k as usize - first);
        } else {
            std::ptr::copy_nonoverlapping(a, other as *mut u8, first);
            std::ptr::copy_nonoverlapping(b, (other as *mut u8).add(first), k as usize - first);
        }
    }
}

/// What a rank posts with each step: kind, reduction or root, dtype, count, collective number.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Desc([u64; 6]);

impl Desc {
    fn of(c: &Collective, number: u64) -> Desc {
        let op = |o: ReduceOp| ReduceOp::ALL.iter().position(|&x| x == o).unwrap_or(0) as u64;
        let (kind, arg) = match c.kind {
            Kind::AllReduce(o) => (1, op(o)),
            Kind::Broadcast { root } => (2, root as u64),
            Kind::Reduce { op: o, root } => (3, op(o) | (root as u64) << 8),
            Kind::AllGather => (4, 0),
            Kind::ReduceScatter(o) => (5, op(o)),
            Kind::AllToAll => (6, 0),
        };
        let dtype = DType::ALL.iter().position(|&d| d == c.dtype).unwrap_or(0) as u64;
        Desc([kind, arg, dtype, c.count, number, 0])
    }

    fn describe(&self) -> String {
        let [kind, arg, dtype, count, _, _] = self.0;
        let op = |i: u64| ReduceOp::ALL.get(i as usize & 0xff).copied();
        let kind = match kind {
            1 => format!("{:?}", op(arg).map(Kind::AllReduce)),
            2 => format!("{:?}", Kind::Broadcast { root: arg as usize }),
            3 => format!("Reduce {{ op: {:?}, root: {} }}", op(arg), arg >> 8),
            4 => "AllGather".into(),
            5 => format!("{:?}", op(arg).map(Kind::ReduceScatter)),
            6 => "AllToAll".into(),
            k => format!("kind {k}"),
        };
        let dtype = DType::ALL
            .get(dtype as usize)
            .map_or("?".into(), |d| format!("{d:?}"));
        format!("{kind} of {count} x {dtype}")
    }
}

/// A rank's queued operation: arms it when its stream reaches it, finishes with its result.
struct RankGate {
    rank: Arc<Rank>,
    seq: u64,
    armed: bool,
}

impl Gate for RankGate {
    fn poll(&mut self, _memory: &mut Memory) -> GatePoll {
        let mut ops = self.rank.ops.lock();
        if !self.armed {
            self.armed = true;
            if let Some(op) = ops.queue.get_mut(&self.seq) {
                op.armed = true;
                self.rank.changed.notify_all();
            }
        }
        match ops.results.remove(&self.seq) {
            Some(r) => GatePoll::Done(r),
            None => GatePoll::Blocked(Arc::new(Waiting {
                rank: self.rank.clone(),
                seq: self.seq,
            })),
        }
    }
}

/// A blocked gate's wait for its operation.
struct Waiting {
    rank: Arc<Rank>,
    seq: u64,
}

impl Blocker for Waiting {
    fn unblock(&self, timeout: Duration) {
        let mut ops = self.rank.ops.lock();
        if !ops.results.contains_key(&self.seq) {
            self.rank.changed.wait_for(&mut ops, timeout);
        }
    }

    fn expire(&self) -> String {
        let waiting = self.rank.waiting.lock().clone();
        let why = format!(
            "collective watchdog: rank {} (process {}): {}",
            self.rank.rank,
            std::process::id(),
            if waiting.is_empty() {
                "its operation never started".to_string()
            } else {
                waiting
            }
        );
        self.rank.seg.fail(&SimError::Timeout(why.clone()));
        why
    }
}

/// The rank's handle, owned by its [`super::Comm`]: stops and joins the proxy when dropped.
pub struct Handle {
    pub rank: Arc<Rank>,
    pub device: Arc<Device>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Handle {
    /// Forms this rank's side of a communicator whose ranks joined in several processes.
    ///
    /// # Errors
    /// [`SimError::InvalidUsage`] when the proxy thread cannot start.
    pub fn form(joined: Joined, rank: usize, device: Arc<Device>) -> SimResult<Handle> {
        let (r, thread) = Rank::start(joined, rank)?;
        Ok(Handle {
            rank: r,
            device,
            thread: Some(thread),
        })
    }

    /// Queues `call` on `stream` (a gate its proxy finishes), or records it into the stream's
    /// capture (each replay takes its sequence number at launch).
    ///
    /// # Errors
    /// The device's enqueue errors; [`SimError::InvalidUsage`] after an abort.
    pub fn enqueue(
        &self,
        stream: StreamId,
        touches: Vec<(u64, u64)>,
        call: impl Fn(u64) -> Call + Send + Sync + 'static,
    ) -> SimResult<()> {
        if self.device.is_capturing(stream) {
            let factory = Arc::new(Replayed {
                rank: self.rank.clone(),
                call: Box::new(call),
            });
            return self
                .device
                .enqueue_gate_repeatable(stream, touches, factory);
        }
        self.rank.refuse_if_aborted()?;
        let mut taken = None;
        let queued = self.device.enqueue_gate(stream, touches, |_| {
            // Under the device lock: the sequence number is taken in the stream's order.
            let seq = self.rank.submit(&call);
            taken = Some(seq);
            self.rank.gate(seq)
        });
        if let (Err(_), Some(seq)) = (&queued, taken) {
            self.rank.cancel(seq);
        }
        queued
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.rank.shut_down();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Makes a captured operation's gate at each replay.
struct Replayed {
    rank: Arc<Rank>,
    call: Box<dyn Fn(u64) -> Call + Send + Sync>,
}

impl crate::graph::GateFactory for Replayed {
    fn prepare(&self) -> SimResult<crate::graph::MakeGate> {
        self.rank.refuse_if_aborted()?;
        let seq = self.rank.submit(&self.call);
        let rank = self.rank.clone();
        Ok(Box::new(move |_stream, _position| rank.gate(seq)))
    }
}
