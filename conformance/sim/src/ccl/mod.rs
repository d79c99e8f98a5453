//! In-process ranks: communicators whose ranks live in one process (a thread per rank, or one
//! thread driving several devices), each rank on its own simulated [`Device`]. Vendor-neutral: an
//! NCCL face (later RCCL and HCCL faces) maps its C API onto [`Registry::init_rank`] and
//! [`Comm`].
//!
//! A collective (or a group of sends and receives) is a [`Gate`] on the caller's stream: when the
//! stream reaches it, the rank *posts* its part to a round shared by the participants; the
//! participant that completes a round moves the data for everyone (host memory: device addresses
//! are host addresses), and each participant's gate then finishes. Until then the gate blocks its
//! stream, as an NCCL kernel waiting for its peers does. In deferred mode nothing runs before a
//! synchronisation point, so a rank waiting on a round *runs its peers' streams up to their part*
//! ([`Device::advance`]): one thread can drive every rank (`ncclCommInitAll` style), and only real
//! dependencies order work.
//!
//! Operations are matched as NCCL matches them: the k-th collective of every rank forms one round
//! (their kinds, dtypes, counts, reductions and roots must agree, else every rank fails with
//! [`SimError::LaunchFailed`]: a mismatch is never silently "reduced"); the k-th send from `a` to
//! `b` meets the k-th receive at `b` from `a` (sizes must agree).
//!
//! Nothing hangs: a rank that never comes makes the waiting synchronisation fail after the
//! device's watchdog with [`SimError::Timeout`], which also fails the round for every peer;
//! [`Comm::abort`] finishes the aborting rank's queued operations without moving data and shows
//! the peers a [`CommError::PeerAborted`] (their operations wait, as NCCL's do, until they abort
//! too or the watchdog fires).
//!
//! Reductions run on the host with [`unihal_hal::host_reduce`]: f16/bf16 accumulate in f32 and
//! round once (tighter than a ring that rounds at every hop), in rank order (deterministic).
//!
//! Ranks meet through a shared file named by the unique id ([`rendezvous`]), so ranks in
//! different processes (one per GPU, as torchrun and mpirun start them) join as ranks in one do;
//! a communicator whose ranks span processes moves its data through that file ([`xproc`]), with
//! the same matching rules, the same strictness and a dead process failing every survivor.

mod rendezvous;
pub mod shm;
mod xproc;

use crate::{Blocker, Device, Gate, GatePoll, Memory, SimError, SimResult, StreamId};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use unihal_hal::ccl::split_place;
use unihal_hal::host_reduce::{reduce, reducible};
use unihal_hal::{DType, ReduceOp};

/// A collective's kind, with its reduction and root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `count` elements in and out, reduced over ranks.
    AllReduce(ReduceOp),
    /// `count` elements from the root to every rank (only the root's send buffer is read).
    Broadcast { root: usize },
    /// `count` elements reduced into the root's receive buffer (only the root's is written).
    Reduce { op: ReduceOp, root: usize },
    /// `count` elements from each rank, `nranks * count` out, in rank order.
    AllGather,
    /// `nranks * count` elements in, block `r` reduced into rank `r`'s `count` elements.
    ReduceScatter(ReduceOp),
    /// `nranks * count` elements in and out: block `j` of rank `r` goes to block `r` of rank `j`.
    AllToAll,
}

/// One rank's collective call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collective {
    pub kind: Kind,
    pub dtype: DType,
    /// Elements per rank, as NCCL counts them (per block for gather/scatter/all-to-all).
    pub count: u64,
    /// Device address of the send buffer (ignored where the kind reads none on this rank).
    pub send: u64,
    /// Device address of the receive buffer.
    pub recv: u64,
}

/// One send or receive of a point-to-point group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2p {
    Send {
        peer: usize,
        addr: u64,
        count: u64,
        dtype: DType,
    },
    Recv {
        peer: usize,
        addr: u64,
        count: u64,
        dtype: DType,
    },
}

/// Why a communicator is unusable, as its asynchronous error reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommError {
    /// This rank aborted.
    Aborted,
    /// Another rank aborted: operations that need it will not finish.
    PeerAborted(usize),
    /// A round failed for everyone (a mismatch, a timeout).
    Failed(SimError),
    /// Another rank's process exited while the communicator needed it (NCCL's remote error).
    PeerExited { rank: usize, message: String },
}

/// The role of a participant in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Member,
    Sender,
    Receiver,
}

type Slot = (usize, Role);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Coll(u64),
    P2p { src: usize, dst: usize, k: u64 },
}

#[derive(Debug, Clone, Copy)]
enum Part {
    Coll(Collective),
    Bytes { addr: u64, len: u64 },
}

/// Where a participant's gate sits, so a waiting peer can run that stream up to it.
#[derive(Clone)]
struct Loc {
    device: Weak<Device>,
    stream: StreamId,
    position: u64,
}

struct Round {
    expected: usize,
    parts: HashMap<Slot, Part>,
    locs: HashMap<Slot, Loc>,
    outcome: Option<SimResult<()>>,
    observed: usize,
}

impl Round {
    fn new(expected: usize) -> Round {
        Round {
            expected,
            parts: HashMap::new(),
            locs: HashMap::new(),
            outcome: None,
            observed: 0,
        }
    }
}

struct CliqueState {
    rounds: HashMap<Key, Round>,
    /// The (color, key) of every rank for each split, by split number; removed once all took it.
    splits: HashMap<u64, Split>,
    aborted: Vec<bool>,
    failed: Option<SimError>,
    /// Bumped on every post, registration, completion and failure (waiters sleep on a change).
    version: u64,
}

/// The shared state of one communicator's ranks.
struct Clique {
    /// Unique in the process for its whole life (an address may be reused once it is freed).
    serial: u64,
    nranks: usize,
    state: Mutex<CliqueState>,
    changed: Condvar,
}

impl Clique {
    fn round<'a>(&self, st: &'a mut CliqueState, key: Key) -> &'a mut Round {
        // Every rank posts to a collective's round; a sender and a receiver to a p2p one.
        let expected = match key {
            Key::Coll(_) => self.nranks,
            Key::P2p { .. } => 2,
        };
        st.rounds.entry(key).or_insert_with(|| Round::new(expected))
    }

    fn bump(&self, st: &mut CliqueState) {
        st.version += 1;
        self.changed.notify_all();
    }
}

/// One rank of a communicator, whose ranks live in this process or in several. Thread-safe;
/// operations on one rank are matched in the order they are called (callers serialise them, as
/// with NCCL).
pub struct Comm(Inner);

enum Inner {
    Local(LocalComm),
    Remote(xproc::Handle),
}

/// A rank of a communicator whose ranks all live in this process.
struct LocalComm {
    clique: Arc<Clique>,
    rank: usize,
    device: Arc<Device>,
    /// Shared with the gate factories of captured operations, which take their sequence numbers
    /// at each replay.
    counters: Arc<Mutex<Counters>>,
}

/// One `split` of a communicator: what each rank asked for.
struct Split {
    asks: Vec<Option<(Option<u32>, i32)>>,
    taken: usize,
}

struct Counters {
    coll: u64,
    splits: u64,
    sends: Vec<u64>,
    recvs: Vec<u64>,
}

impl Comm {
    /// This rank.
    pub fn rank(&self) -> usize {
        match &self.0 {
            Inner::Local(c) => c.rank,
            Inner::Remote(h) => h.rank.rank(),
        }
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        match &self.0 {
            Inner::Local(c) => c.clique.nranks,
            Inner::Remote(h) => h.rank.nranks(),
        }
    }

    /// The device this rank runs on.
    pub fn device(&self) -> &Arc<Device> {
        match &self.0 {
            Inner::Local(c) => &c.device,
            Inner::Remote(h) => &h.device,
        }
    }

    /// Whether the communicator's ranks span processes.
    pub fn spans_processes(&self) -> bool {
        matches!(self.0, Inner::Remote(_))
    }

    /// Queues a collective on `stream` of this rank's device.
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] for a bad root, a dtype that does not reduce, a size overflow or
    /// a buffer outside this device's live allocations; the device's sticky error;
    /// [`SimError::InvalidUsage`] after this rank aborted.
    pub fn collective(&self, stream: StreamId, call: Collective) -> SimResult<()> {
        let touches = collective_touches(&call, self.nranks(), self.rank())?;
        match &self.0 {
            Inner::Local(c) => c.collective(stream, call, touches),
            Inner::Remote(h) => h.enqueue(stream, touches, move |k| xproc::Call::Coll(call, k)),
        }
    }

    /// Queues a group of sends and receives on `stream` as one operation: it finishes when all of
    /// them have, so a group may send and receive between the same ranks without deadlock.
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] for a bad peer, a size overflow or a buffer outside this
    /// device's live allocations; the device's sticky error.
    pub fn group(&self, stream: StreamId, calls: &[P2p]) -> SimResult<()> {
        if calls.is_empty() {
            return Ok(());
        }
        match &self.0 {
            Inner::Local(c) => c.group(stream, calls),
            Inner::Remote(h) => {
                let touches = group_touches(calls, h.rank.nranks())?;
                let calls = calls.to_vec();
                h.enqueue(stream, touches, move |_| xproc::Call::Group(calls.clone()))
            }
        }
    }

    /// Splits the communicator as `ncclCommSplit` does: every rank calls (host-blocking); ranks
    /// with the same `color` form a new communicator ordered by (`key`, old rank); `None` joins
    /// none. Each split of a communicator is matched by its number (the k-th split of every rank).
    ///
    /// # Errors
    /// [`SimError::InvalidUsage`] after an abort (this rank's or a peer's);
    /// [`SimError::Timeout`] naming the ranks that did not call within `timeout`; errors of the
    /// new communicator's initialisation (ranks of one color on one device);
    /// [`SimError::Unsupported`] for a communicator whose ranks span processes.
    pub fn split(
        &self,
        registry: &Registry,
        color: Option<u32>,
        key: i32,
        timeout: Duration,
    ) -> SimResult<Option<Comm>> {
        match &self.0 {
            Inner::Local(c) => c.split(registry, color, key, timeout),
            Inner::Remote(_) => Err(SimError::Unsupported(
                "splitting a communicator whose ranks span processes".into(),
            )),
        }
    }

    /// Aborts this rank: its queued operations finish without moving data, later ones are
    /// refused, and peers see [`CommError::PeerAborted`]. Never blocks.
    pub fn abort(&self) {
        match &self.0 {
            Inner::Local(c) => c.abort(),
            Inner::Remote(h) => h.rank.abort(),
        }
    }

    /// The communicator's asynchronous error, if any (never blocks).
    pub fn error(&self) -> Option<CommError> {
        match &self.0 {
            Inner::Local(c) => c.error(),
            Inner::Remote(h) => h.rank.error(),
        }
    }
}

/// The ranges a collective touches on this rank, after checking its root, dtype and size.
fn collective_touches(call: &Collective, nranks: usize, me: usize) -> SimResult<Vec<(u64, u64)>> {
    let n = nranks as u64;
    let e = call.dtype.size() as u64;
    let overflow = || SimError::InvalidValue(format!("{} elements overflow", call.count));
    let one = call.count.checked_mul(e).ok_or_else(overflow)?;
    let all = one.checked_mul(n).ok_or_else(overflow)?;
    let reducing = |op: ReduceOp| -> SimResult<()> {
        if reducible(call.dtype) {
            Ok(())
        } else {
            Err(SimError::InvalidValue(format!(
                "{:?} does not reduce with {op:?}",
                call.dtype
            )))
        }
    };
    let root_ok = |root: usize| -> SimResult<()> {
        if root < nranks {
            Ok(())
        } else {
            Err(SimError::InvalidValue(format!(
                "root {root} of {nranks} ranks"
            )))
        }
    };
    let (send, recv) = match call.kind {
        Kind::AllReduce(op) => {
            reducing(op)?;
            (one, one)
        }
        Kind::Broadcast { root } => {
            root_ok(root)?;
            (if me == root { one } else { 0 }, one)
        }
        Kind::Reduce { op, root } => {
            reducing(op)?;
            root_ok(root)?;
            (one, if me == root { one } else { 0 })
        }
        Kind::AllGather => (one, all),
        Kind::ReduceScatter(op) => {
            reducing(op)?;
            (all, one)
        }
        Kind::AllToAll => (all, all),
    };
    Ok([(call.send, send), (call.recv, recv)]
        .into_iter()
        .filter(|&(_, len)| len > 0)
        .collect())
}

/// The ranges a group of sends and receives touches, after checking its peers and sizes.
fn group_touches(calls: &[P2p], nranks: usize) -> SimResult<Vec<(u64, u64)>> {
    let mut touches = Vec::new();
    for call in calls {
        let (P2p::Send {
            peer,
            addr,
            count,
            dtype,
        }
        | P2p::Recv {
            peer,
            addr,
            count,
            dtype,
        }) = *call;
        if peer >= nranks {
            return Err(SimError::InvalidValue(format!(
                "peer {peer} of {nranks} ranks"
            )));
        }
        let len = count
            .checked_mul(dtype.size() as u64)
            .ok_or_else(|| SimError::InvalidValue(format!("{count} elements overflow")))?;
        if len > 0 {
            touches.push((addr, len));
        }
    }
    Ok(touches)
}

impl LocalComm {
    fn nranks(&self) -> usize {
        self.clique.nranks
    }

    /// See [`Comm::collective`]; `touches` are its checked ranges.
    fn collective(
        &self,
        stream: StreamId,
        call: Collective,
        touches: Vec<(u64, u64)>,
    ) -> SimResult<()> {
        let me = self.rank;
        if self.device.is_capturing(stream) {
            return self.capture(stream, touches, Captured::Coll(call));
        }
        let mut c = self.counters.lock();
        let key = Key::Coll(c.coll);
        self.enqueue(
            stream,
            touches,
            vec![(key, (me, Role::Member), Part::Coll(call))],
        )?;
        c.coll += 1;
        Ok(())
    }

    /// See [`Comm::group`] (`calls` is not empty).
    fn group(&self, stream: StreamId, calls: &[P2p]) -> SimResult<()> {
        if self.device.is_capturing(stream) {
            let touches = calls
                .iter()
                .filter_map(|c| {
                    let (P2p::Send {
                        addr, count, dtype, ..
                    }
                    | P2p::Recv {
                        addr, count, dtype, ..
                    }) = *c;
                    let len = count.checked_mul(dtype.size() as u64)?;
                    (len > 0).then_some((addr, len))
                })
                .collect();
            // Peers and sizes are checked at each replay, when the sequence numbers are taken.
            return self.capture(stream, touches, Captured::Group(calls.to_vec()));
        }
        let mut c = self.counters.lock();
        let (mut sends, mut recvs) = (c.sends.clone(), c.recvs.clone());
        let mut slots = Vec::with_capacity(calls.len());
        let mut touches = Vec::new();
        for call in calls {
            let (P2p::Send {
                peer,
                addr,
                count,
                dtype,
            }
            | P2p::Recv {
                peer,
                addr,
                count,
                dtype,
            }) = *call;
            if peer >= self.nranks() {
                return Err(SimError::InvalidValue(format!(
                    "peer {peer} of {} ranks",
                    self.nranks()
                )));
            }
            let len = count
                .checked_mul(dtype.size() as u64)
                .ok_or_else(|| SimError::InvalidValue(format!("{count} elements overflow")))?;
            if len > 0 {
                touches.push((addr, len));
            }
            let part = Part::Bytes { addr, len };
            slots.push(match call {
                P2p::Send { .. } => {
                    let k = sends[peer];
                    sends[peer] += 1;
                    let key = Key::P2p {
                        src: self.rank,
                        dst: peer,
                        k,
                    };
                    (key, (self.rank, Role::Sender), part)
                }
                P2p::Recv { .. } => {
                    let k = recvs[peer];
                    recvs[peer] += 1;
                    let key = Key::P2p {
                        src: peer,
                        dst: self.rank,
                        k,
                    };
                    (key, (self.rank, Role::Receiver), part)
                }
            });
        }
        self.enqueue(stream, touches, slots)?;
        c.sends = sends;
        c.recvs = recvs;
        Ok(())
    }

    fn enqueue(
        &self,
        stream: StreamId,
        touches: Vec<(u64, u64)>,
        slots: Vec<(Key, Slot, Part)>,
    ) -> SimResult<()> {
        if self.clique.state.lock().aborted[self.rank] {
            return Err(SimError::InvalidUsage(format!(
                "rank {} of this communicator was aborted",
                self.rank
            )));
        }
        let keys: Vec<(Key, Slot)> = slots.iter().map(|&(k, s, _)| (k, s)).collect();
        let gate = RankGate {
            clique: self.clique.clone(),
            rank: self.rank,
            slots: slots.into_iter().map(|(k, s, p)| (k, s, Some(p))).collect(),
        };
        self.device.enqueue_gate(stream, touches, |position| {
            let loc = Loc {
                device: Arc::downgrade(&self.device),
                stream,
                position,
            };
            let mut st = self.clique.state.lock();
            for (key, slot) in keys {
                self.clique
                    .round(&mut st, key)
                    .locs
                    .insert(slot, loc.clone());
            }
            self.clique.bump(&mut st);
            Box::new(gate)
        })
    }

    /// Records the operation into the capture of `stream`: every replay takes its sequence
    /// numbers when it is launched (in launch order, as ranks calling the operation would), so
    /// that ranks replaying their graphs match.
    fn capture(&self, stream: StreamId, touches: Vec<(u64, u64)>, call: Captured) -> SimResult<()> {
        let factory = Arc::new(Replayed {
            clique: self.clique.clone(),
            rank: self.rank,
            device: Arc::downgrade(&self.device),
            counters: self.counters.clone(),
            call,
        });
        self.device
            .enqueue_gate_repeatable(stream, touches, factory)
    }

    /// Splits the communicator as `ncclCommSplit` does: every rank calls (host-blocking); ranks
    /// with the same `color` form a new communicator ordered by (`key`, old rank); `None` joins
    /// none. Each split of a communicator is matched by its number (the k-th split of every rank).
    ///
    /// # Errors
    /// [`SimError::InvalidUsage`] after an abort (this rank's or a peer's);
    /// [`SimError::Timeout`] naming the ranks that did not call within `timeout`; errors of the
    /// new communicator's initialisation (ranks of one color on one device).
    pub fn split(
        &self,
        registry: &Registry,
        color: Option<u32>,
        key: i32,
        timeout: Duration,
    ) -> SimResult<Option<Comm>> {
        let n = self.nranks();
        let number = {
            let mut c = self.counters.lock();
            c.splits += 1;
            c.splits
        };
        let deadline = unihal_hal::deadline::after(timeout);
        let mut st = self.clique.state.lock();
        let asks = loop {
            if let Some(r) = st.aborted.iter().position(|&a| a) {
                return Err(SimError::InvalidUsage(format!(
                    "split after rank {r} aborted the communicator"
                )));
            }
            let split = st.splits.entry(number).or_insert_with(|| Split {
                asks: vec![None; n],
                taken: 0,
            });
            if split.asks[self.rank].is_none() {
                split.asks[self.rank] = Some((color, key));
                self.clique.bump(&mut st);
                continue;
            }
            let split = st.splits.get_mut(&number).expect("inserted above");
            if split.asks.iter().all(Option::is_some) {
                let asks: Vec<(Option<u32>, i32)> = split.asks.iter().flatten().copied().collect();
                split.taken += 1;
                if split.taken == n {
                    st.splits.remove(&number);
                }
                break asks;
            }
            if self
                .clique
                .changed
                .wait_until(&mut st, deadline)
                .timed_out()
            {
                let split = st.splits.get(&number).expect("not every rank took it");
                let absent: Vec<String> = (0..n)
                    .filter(|&r| split.asks[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                if absent.is_empty() {
                    continue;
                }
                return Err(SimError::Timeout(format!(
                    "split: ranks {} never called",
                    absent.join(", ")
                )));
            }
        };
        drop(st);
        let (Some(color), Some((new_rank, size))) = (color, split_place(&asks, self.rank)) else {
            return Ok(None);
        };
        // Unique on the machine: the process, the parent's serial, the split's number and the
        // color (an id makes one communicator, and names its rendezvous file).
        let mut id = b"unihal-sim-split".to_vec();
        id.extend_from_slice(&std::process::id().to_le_bytes());
        id.extend_from_slice(&self.clique.serial.to_le_bytes());
        id.extend_from_slice(&number.to_le_bytes());
        id.extend_from_slice(&color.to_le_bytes());
        registry
            .init_rank(&id, size, new_rank, self.device.clone(), timeout)
            .map(Some)
    }

    /// Aborts this rank: its queued operations finish without moving data, later ones are
    /// refused, and peers see [`CommError::PeerAborted`]. Never blocks.
    pub fn abort(&self) {
        let mut st = self.clique.state.lock();
        st.aborted[self.rank] = true;
        self.clique.bump(&mut st);
    }

    /// The communicator's asynchronous error, if any (never blocks).
    pub fn error(&self) -> Option<CommError> {
        let st = self.clique.state.lock();
        if st.aborted[self.rank] {
            return Some(CommError::Aborted);
        }
        if let Some(e) = &st.failed {
            return Some(CommError::Failed(e.clone()));
        }
        st.aborted
            .iter()
            .position(|&a| a)
            .map(CommError::PeerAborted)
    }
}

/// A rank's queued operation: its parts, each posted once its stream reaches it.
struct RankGate {
    clique: Arc<Clique>,
    rank: usize,
    slots: Vec<(Key, Slot, Option<Part>)>,
}

impl Gate for RankGate {
    fn poll(&mut self, _memory: &mut Memory) -> GatePoll {
        let clique = &self.clique;
        let mut st = clique.state.lock();
        if st.aborted[self.rank] {
            return GatePoll::Done(Ok(()));
        }
        if let Some(e) = &st.failed {
            return GatePoll::Done(Err(e.clone()));
        }
        let mut changed = false;
        for (key, slot, part) in &mut self.slots {
            if let Some(p) = part.take() {
                clique.round(&mut st, *key).parts.insert(*slot, p);
                changed = true;
            }
            let n = clique.nranks;
            // A rank that aborted finished its operations without data: a round it had posted
            // a part of never runs (its buffers may be freed by now), and the peers wait, as
            // NCCL's do, until they abort or time out.
            let any_aborted = st.aborted.iter().any(|&a| a);
            let round = clique.round(&mut st, *key);
            if round.outcome.is_none() && round.parts.len() == round.expected && !any_aborted {
                let outcome = execute(n, *key, &round.parts);
                round.outcome = Some(outcome.clone());
                changed = true;
                if let Err(e) = outcome {
                    st.failed = Some(e);
                }
            }
        }
        if changed {
            clique.bump(&mut st);
        }
        if let Some(e) = &st.failed {
            return GatePoll::Done(Err(e.clone()));
        }
        let done = self
            .slots
            .iter()
            .all(|(key, _, _)| st.rounds.get(key).is_some_and(|r| r.outcome.is_some()));
        if !done {
            let keys = self.slots.iter().map(|(k, _, _)| *k).collect();
            return GatePoll::Blocked(Arc::new(RoundWait {
                clique: clique.clone(),
                keys,
            }));
        }
        for (key, _, _) in &self.slots {
            let round = st.rounds.get_mut(key).expect("checked above");
            round.observed += 1;
            if round.observed == round.expected {
                st.rounds.remove(key);
            }
        }
        GatePoll::Done(Ok(()))
    }
}

/// What a blocked rank waits for: the missing parts of its rounds.
struct RoundWait {
    clique: Arc<Clique>,
    keys: Vec<Key>,
}

impl RoundWait {
    /// Participants that have not posted yet, with where their gates sit (if queued).
    fn missing(&self, st: &CliqueState) -> Vec<(Slot, Option<Loc>)> {
        let mut out = Vec::new();
        for key in &self.keys {
            let Some(round) = st.rounds.get(key) else {
                continue;
            };
            if round.outcome.is_some() {
                continue;
            }
            let slots: Vec<Slot> = match *key {
                Key::Coll(_) => (0..self.clique.nranks).map(|r| (r, Role::Member)).collect(),
                Key::P2p { src, dst, .. } => vec![(src, Role::Sender), (dst, Role::Receiver)],
            };
            for slot in slots {
                if !round.parts.contains_key(&slot) {
                    out.push((slot, round.locs.get(&slot).cloned()));
                }
            }
        }
        out
    }
}

impl Blocker for RoundWait {
    fn unblock(&self, timeout: Duration) {
        let (version, missing) = {
            let st = self.clique.state.lock();
            (st.version, self.missing(&st))
        };
        for (_, loc) in missing {
            if let Some(loc) = loc {
                if let Some(device) = loc.device.upgrade() {
                    device.advance(loc.stream, loc.position);
                }
            }
        }
        let mut st = self.clique.state.lock();
        if st.version == version {
            self.clique.changed.wait_for(&mut st, timeout);
        }
    }

    fn expire(&self) -> String {
        let mut st = self.clique.state.lock();
        let missing: Vec<String> = self
            .missing(&st)
            .into_iter()
            .map(|((rank, role), loc)| {
                let what = match role {
                    Role::Member => "the collective",
                    Role::Sender => "the send",
                    Role::Receiver => "the receive",
                };
                let state = if loc.is_some() {
                    "queued it but its stream never reached it"
                } else {
                    "never called it"
                };
                format!("rank {rank} {state} ({what})")
            })
            .collect();
        let why = format!(
            "collective watchdog: {}",
            if missing.is_empty() {
                "peers never finished".to_string()
            } else {
                missing.join("; ")
            }
        );
        st.failed.get_or_insert(SimError::Timeout(why.clone()));
        self.clique.bump(&mut st);
        why
    }
}

/// Moves a complete round's data. Runs under the clique lock; every range was checked against
/// its device's allocations when queued and stays allocated while its gate is queued.
fn execute(n: usize, key: Key, parts: &HashMap<Slot, Part>) -> SimResult<()> {
    match key {
        Key::P2p { src, dst, .. } => {
            let (
                Some(&Part::Bytes { addr: from, len: a }),
                Some(&Part::Bytes { addr: to, len: b }),
            ) = (
                parts.get(&(src, Role::Sender)),
                parts.get(&(dst, Role::Receiver)),
            )
            else {
                unreachable!("a complete point-to-point round has a sender and a receiver");
            };
            if a != b {
                return Err(SimError::LaunchFailed(format!(
                    "rank {src} sends {a} bytes to rank {dst}, which receives {b}"
                )));
            }
            // SAFETY: both ranges are live allocations (see above); memmove allows a self-send.
            unsafe { std::ptr::copy(from as *const u8, to as *mut u8, a as usize) };
            Ok(())
        }
        Key::Coll(seq) => {
            let calls: Vec<Collective> = (0..n)
                .map(|r| match parts.get(&(r, Role::Member)) {
                    Some(Part::Coll(c)) => *c,
                    _ => unreachable!("a complete collective round has every member"),
                })
                .collect();
            let c0 = calls[0];
            if let Some((r, c)) = calls
                .iter()
                .enumerate()
                .find(|(_, c)| (c.kind, c.dtype, c.count) != (c0.kind, c0.dtype, c0.count))
            {
                return Err(SimError::LaunchFailed(format!(
                    "collective #{seq} mismatch: rank 0 calls {:?} of {} x {:?}, rank {r} calls \
                     {:?} of {} x {:?}",
                    c0.kind, c0.count, c0.dtype, c.kind, c.count, c.dtype
                )));
            }
            // SAFETY: as above: every buffer's range was checked for this kind and count.
            unsafe { move_collective(&calls) };
            Ok(())
        }
    }
}

/// The data movement of one matched collective.
///
/// # Safety
/// Every rank's buffers must be valid for the ranges its kind reads and writes.
unsafe fn move_collective(calls: &[Collective]) {
    let n = calls.len();
    let c = calls[0];
    let e = c.dtype.size();
    let one = c.count as usize * e;
    let read = |addr: u64, off: usize, len: usize| -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping((addr as *const u8).add(off), v.as_mut_ptr(), len) };
        v
    };
    let write = |addr: u64, off: usize, data: &[u8]| {
        // SAFETY: the caller's contract; staged data never overlaps device memory.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), (addr as *mut u8).add(off), data.len())
        };
    };
    let reduced = |op: ReduceOp, off: usize| -> Vec<u8> {
        let srcs: Vec<*const u8> = calls
            .iter()
            // SAFETY: inside each send range (the caller's contract).
            .map(|k| unsafe { (k.send as *const u8).add(off) })
            .collect();
        let mut out = vec![0u8; one];
        // SAFETY: each source holds `count` elements; `out` is a separate buffer of that size.
        unsafe { reduce(c.dtype, op, &srcs, out.as_mut_ptr(), c.count as usize) };
        out
    };
    match c.kind {
        Kind::AllReduce(op) => {
            let v = reduced(op, 0);
            calls.iter().for_each(|k| write(k.recv, 0, &v));
        }
        Kind::Broadcast { root } => {
            let v = read(calls[root].send, 0, one);
            calls.iter().for_each(|k| write(k.recv, 0, &v));
        }
        Kind::Reduce { op, root } => write(calls[root].recv, 0, &reduced(op, 0)),
        Kind::AllGather => {
            let v: Vec<u8> = calls.iter().flat_map(|k| read(k.send, 0, one)).collect();
            calls.iter().for_each(|k| write(k.recv, 0, &v));
        }
        Kind::ReduceScatter(op) => {
            let blocks: Vec<Vec<u8>> = (0..n).map(|r| reduced(op, r * one)).collect();
            calls
                .iter()
                .zip(&blocks)
                .for_each(|(k, v)| write(k.recv, 0, v));
        }
        Kind::AllToAll => {
            let staged: Vec<Vec<u8>> = calls.iter().map(|k| read(k.send, 0, n * one)).collect();
            for (r, k) in calls.iter().enumerate() {
                for (j, s) in staged.iter().enumerate() {
                    write(k.recv, j * one, &s[r * one..(r + 1) * one]);
                }
            }
        }
    }
}

struct Joining {
    nranks: usize,
    members: Vec<Option<Arc<Device>>>,
    result: Option<SimResult<Arc<Clique>>>,
    taken: usize,
}

/// Communicators being formed, by unique id. One per process (a face keeps it in a static).
#[derive(Default)]
pub struct Registry {
    joining: Mutex<HashMap<Vec<u8>, Joining>>,
    changed: Condvar,
    /// Ids whose communicator was formed: an id makes one communicator (NCCL's bootstrap root
    /// stops listening once every rank connected), so a stale id is refused.
    spent: Mutex<std::collections::HashSet<Vec<u8>>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Joins rank `rank` of the `nranks`-rank communicator named `id`, on `device`; blocks until
    /// every rank joined or `timeout` passed. The ranks may live in several processes (each with
    /// its own devices) when `nranks` is at most [`shm::MAX_RANKS`].
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] for `rank >= nranks` or `nranks == 0`;
    /// [`SimError::InvalidUsage`] when ranks disagree on `nranks`, a rank joins twice or two ranks
    /// share a device (every rank gets it), or when `id` already made a communicator;
    /// [`SimError::Timeout`] naming the ranks that never came.
    pub fn init_rank(
        &self,
        id: &[u8],
        nranks: usize,
        rank: usize,
        device: Arc<Device>,
        timeout: Duration,
    ) -> SimResult<Comm> {
        if nranks == 0 || rank >= nranks {
            return Err(SimError::InvalidValue(format!("rank {rank} of {nranks}")));
        }
        let deadline = unihal_hal::deadline::after(timeout);
        if self.spent.lock().contains(id) {
            return Err(SimError::InvalidUsage(
                "the unique id already made a communicator (a stale id)".into(),
            ));
        }
        if nranks <= shm::MAX_RANKS {
            let joined = rendezvous::join(id, nranks, rank, device.ordinal(), deadline)?;
            if !joined.local {
                return xproc::Handle::form(joined, rank, device).map(|h| Comm(Inner::Remote(h)));
            }
        }
        // Every rank lives in this process (or the communicator is too large to span
        // processes): they meet again here, with their devices.

        let mut map = self.joining.lock();
        // Under `joining`, which formation also holds when it marks the id spent.
        if self.spent.lock().contains(id) {
            return Err(SimError::InvalidUsage(
                "the unique id already made a communicator (a stale id)".into(),
            ));
        }
        let j = map.entry(id.to_vec()).or_insert_with(|| Joining {
            nranks,
            members: vec![None; nranks],
            result: None,
            taken: 0,
        });
        if j.nranks != nranks {
            return Err(SimError::InvalidUsage(format!(
                "rank {rank} joins with {nranks} ranks, others with {}",
                j.nranks
            )));
        }
        if j.members[rank].is_some() || j.result.is_some() {
            return Err(SimError::InvalidUsage(format!("rank {rank} joined twice")));
        }
        j.members[rank] = Some(device.clone());
        if j.members.iter().all(Option::is_some) {
            j.result = Some(form(&j.members));
            self.changed.notify_all();
        }
        loop {
            let j = map
                .get_mut(id)
                .expect("removed only once every rank took it");
            if let Some(result) = j.result.clone() {
                j.taken += 1;
                if j.taken == nranks {
                    map.remove(id);
                }
                if result.is_ok() {
                    self.spent.lock().insert(id.to_vec());
                }
                let clique = result?;
                return Ok(Comm(Inner::Local(LocalComm {
                    clique,
                    rank,
                    device,
                    counters: Arc::new(Mutex::new(Counters {
                        coll: 0,
                        splits: 0,
                        sends: vec![0; nranks],
                        recvs: vec![0; nranks],
                    })),
                })));
            }
            if self.changed.wait_until(&mut map, deadline).timed_out() {
                let j = map.get_mut(id).expect("this rank is still a member");
                if j.result.is_some() {
                    continue;
                }
                j.members[rank] = None;
                let absent: Vec<String> = (0..nranks)
                    .filter(|&r| r != rank && j.members[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                if j.members.iter().all(Option::is_none) {
                    map.remove(id);
                }
                return Err(SimError::Timeout(format!(
                    "communicator init: ranks {} never joined",
                    absent.join(", ")
                )));
            }
        }
    }
}

fn form(members: &[Option<Arc<Device>>]) -> SimResult<Arc<Clique>> {
    for (a, da) in members.iter().enumerate() {
        for (b, db) in members.iter().enumerate().skip(a + 1) {
            if let (Some(x), Some(y)) = (da, db) {
                if Arc::ptr_eq(x, y) {
                    return Err(SimError::InvalidUsage(format!(
                        "ranks {a} and {b} are on the same device ({})",
                        x.ordinal()
                    )));
                }
            }
        }
    }
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    Ok(Arc::new(Clique {
        serial: SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        nranks: members.len(),
        state: Mutex::new(CliqueState {
            rounds: HashMap::new(),
            splits: HashMap::new(),
            aborted: vec![false; members.len()],
            failed: None,
            version: 0,
        }),
        changed: Condvar::new(),
    }))
}

/// The operations a communicator queued on its device's streams, so that a destroy can wait
/// for them (as NCCL's and HCCL's destroys do) without synchronising the whole device.
/// Thread-safe.
#[derive(Default)]
pub struct Queued {
    events: Mutex<Vec<crate::EventId>>,
}

impl Queued {
    /// Records that an operation was queued on `stream` of `dev` (an event after it); forgets
    /// the completed ones.
    pub fn track(&self, dev: &Device, stream: StreamId) {
        if dev.is_capturing(stream) {
            // Captured, not queued: its replays are the graph launches' work.
            return;
        }
        let mut queued = self.events.lock();
        queued.retain(|&ev| {
            let done = dev.query(ev).is_ok();
            if done {
                let _ = dev.destroy_event(ev);
            }
            !done
        });
        if let Ok(ev) = dev.create_event() {
            if dev.record(ev, stream).is_ok() {
                queued.push(ev);
            } else {
                let _ = dev.destroy_event(ev);
            }
        }
    }

    /// Waits until every queued operation completed or failed (a wait for a peer that never
    /// comes ends after the device's watchdog, with the device failed). Their failures are the
    /// communicator's asynchronous errors, not the caller's.
    pub fn drain(&self, dev: &Device) {
        for ev in std::mem::take(&mut *self.events.lock()) {
            let _ = dev.event_synchronize(ev);
            let _ = dev.destroy_event(ev);
        }
    }

    /// Forgets the queued operations (after an abort, which ends them).
    pub fn forget(&self, dev: &Device) {
        for ev in std::mem::take(&mut *self.events.lock()) {
            let _ = dev.destroy_event(ev);
        }
    }
}

/// A fresh communicator id (unique within this process and very likely across processes).
pub fn fresh_id() -> [u8; 16] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&n.to_le_bytes());
    id[8..].copy_from_slice(&(t ^ u64::from(std::process::id()).rotate_left(40)).to_le_bytes());
    id
}

/// A captured operation of one rank.
enum Captured {
    Coll(Collective),
    Group(Vec<P2p>),
}

/// Makes a captured operation's gate for each replay.
struct Replayed {
    clique: Arc<Clique>,
    rank: usize,
    device: Weak<Device>,
    counters: Arc<Mutex<Counters>>,
    call: Captured,
}

impl crate::graph::GateFactory for Replayed {
    fn prepare(&self) -> SimResult<crate::graph::MakeGate> {
        if self.clique.state.lock().aborted[self.rank] {
            return Err(SimError::InvalidUsage(format!(
                "rank {} of this communicator was aborted",
                self.rank
            )));
        }
        let me = self.rank;
        let mut c = self.counters.lock();
        let slots: Vec<(Key, Slot, Part)> = match &self.call {
            Captured::Coll(call) => {
                let key = Key::Coll(c.coll);
                c.coll += 1;
                vec![(key, (me, Role::Member), Part::Coll(*call))]
            }
            Captured::Group(calls) => {
                let mut slots = Vec::with_capacity(calls.len());
                for call in calls {
                    let (P2p::Send {
                        peer,
                        addr,
                        count,
                        dtype,
                    }
                    | P2p::Recv {
                        peer,
                        addr,
                        count,
                        dtype,
                    }) = *call;
                    if peer >= self.clique.nranks {
                        return Err(SimError::InvalidValue(format!(
                            "peer {peer} of {} ranks",
                            self.clique.nranks
                        )));
                    }
                    let part = Part::Bytes {
                        addr,
                        len: count * dtype.size() as u64,
                    };
                    slots.push(match call {
                        P2p::Send { .. } => {
                            let k = c.sends[peer];
                            c.sends[peer] += 1;
                            let key = Key::P2p {
                                src: me,
                                dst: peer,
                                k,
                            };
                            (key, (me, Role::Sender), part)
                        }
                        P2p::Recv { .. } => {
                            let k = c.recvs[peer];
                            c.recvs[peer] += 1;
                            let key = Key::P2p {
                                src: peer,
                                dst: me,
                                k,
                            };
                            (key, (me, Role::Receiver), part)
                        }
                    });
                }
                slots
            }
        };
        drop(c);
        let clique = self.clique.clone();
        let device = self.device.clone();
        Ok(Box::new(move |stream, position| {
            let loc = Loc {
                device,
                stream,
                position,
            };
            {
                let mut st = clique.state.lock();
                for (key, slot, _) in &slots {
                    clique.round(&mut st, *key).locs.insert(*slot, loc.clone());
                }
                clique.bump(&mut st);
            }
            Box::new(RankGate {
                clique,
                rank: me,
                slots: slots.into_iter().map(|(k, s, p)| (k, s, Some(p))).collect(),
            })
        }))
    }
}
