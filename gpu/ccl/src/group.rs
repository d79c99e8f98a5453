//! The ranks of one communicator that live in this process ([`Group`]), and what stands in for
//! the abort a library lacks (HCCL).
//!
//! Without an abort, nothing ends an operation already posted on a stream: an operation whose
//! peers never post theirs waits until the library's own execution timeout (HCCL's
//! `HCCL_EXEC_TIMEOUT`), and a stream synchronisation waits with it. Where every rank of the
//! communicator lives in this process (`init_all`, or `init_rank` from threads), the group knows
//! what each rank posted, so a failure of one rank (its timeout, an asynchronous error, `abort`)
//! can end the others' posted operations: every rank stops issuing, the streams with pending
//! work fail, and each rank then posts **stand-ins** — the collectives and the sends and
//! receives its peers are still waiting for, on scratch buffers and streams of its own — so that
//! every posted round completes (moving nothing anyone reads: the streams that wait on them have
//! failed already). Only then are the communicators destroyed ([`crate::comm`]).
//!
//! What each rank posted is logged only while every rank has arrived in this process (ranks
//! announce themselves before their blocking init, which returns only once every rank called
//! it, so by the first operation the group knows whether it is complete); a group with ranks in
//! other processes logs nothing, and its posted operations end at the library's execution
//! timeout. The log holds only what some rank posted and a peer did not yet: collective rounds
//! by their number (the library matches the k-th collective of every rank), sends and receives
//! per ordered pair of ranks in issue order.

use crate::library::{P2p, Round};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use unihal_hal::HalError;

/// Most entries the log holds before it gives up (a rank far behind its peers): failures then
/// end posted operations at the library's own timeout only.
const LOG_LIMIT: usize = 1 << 16;

/// What a rank posted, or what a stand-in posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Collective(Round),
    P2p(P2p),
}

/// A rank of a group: what failing the group does to it ([`crate::comm`]'s rank state).
pub trait Member: Send + Sync {
    /// Stops issuing with `e` as the sticky error and fails the streams with pending work;
    /// true when this call stopped it.
    fn stop(&self, e: HalError) -> bool;
    /// Posts `ops` as stand-ins.
    fn stand_in(&self, ops: &[Op]);
    /// Gives the communicator to a reaper (destroyed once its operations drained).
    fn hand_to_reaper(&self);
}

/// The calls of one ordered pair (sender, receiver) that the other side has not matched yet.
#[derive(Default)]
struct Unmatched {
    /// True when the sends are ahead (the entries are sends), false for receives.
    sends_ahead: bool,
    calls: VecDeque<(u64, unihal_hal::DType)>,
}

#[derive(Default)]
struct Log {
    /// Off: a rank fell too far behind (or the group is not complete in this process).
    off: bool,
    /// Collectives each rank posted.
    issued: Vec<u64>,
    /// The number of the first round of `rounds` (every rank posted the ones before).
    base: u64,
    rounds: VecDeque<Round>,
    p2p: HashMap<(usize, usize), Unmatched>,
}

impl Log {
    fn collective(&mut self, rank: usize, round: Round) {
        let k = self.issued[rank];
        if (k - self.base) as usize >= self.rounds.len() {
            self.rounds.push_back(round);
        }
        self.issued[rank] += 1;
        while self.issued.iter().all(|&i| i > self.base) {
            self.rounds.pop_front();
            self.base += 1;
        }
    }

    fn p2p(&mut self, pair: (usize, usize), is_send: bool, call: (u64, unihal_hal::DType)) {
        let u = self.p2p.entry(pair).or_default();
        if !u.calls.is_empty() && u.sends_ahead != is_send {
            u.calls.pop_front();
        } else {
            u.sends_ahead = is_send;
            u.calls.push_back(call);
        }
    }

    fn size(&self) -> usize {
        self.rounds.len() + self.p2p.values().map(|u| u.calls.len()).sum::<usize>()
    }

    /// The stand-ins each rank must post so that every posted round and every posted send and
    /// receive completes.
    fn stand_ins(&self) -> Vec<Vec<Op>> {
        let n = self.issued.len();
        let mut out = vec![Vec::new(); n];
        let last = self.issued.iter().copied().max().unwrap_or(0);
        for (r, ops) in out.iter_mut().enumerate() {
            for k in self.issued[r]..last {
                ops.push(Op::Collective(self.rounds[(k - self.base) as usize]));
            }
        }
        for (&(src, dst), u) in &self.p2p {
            for &(count, dtype) in &u.calls {
                // Sends ahead: the receiver receives; receives ahead: the sender sends.
                let (at, peer) = if u.sends_ahead {
                    (dst, src)
                } else {
                    (src, dst)
                };
                out[at].push(Op::P2p(P2p {
                    peer,
                    recv: u.sends_ahead,
                    count,
                    dtype,
                }));
            }
        }
        out
    }
}

struct State {
    /// Ranks that announced themselves (before their blocking init).
    arrived: Vec<bool>,
    /// Ranks whose communicator exists.
    members: Vec<Option<Weak<dyn Member>>>,
    log: Log,
}

/// The ranks of one communicator in this process. Thread-safe.
pub struct Group {
    pub nranks: usize,
    state: Mutex<State>,
    failed: AtomicBool,
}

impl Group {
    fn new(nranks: usize) -> Group {
        Group {
            nranks,
            state: Mutex::new(State {
                arrived: vec![false; nranks],
                members: (0..nranks).map(|_| None).collect(),
                log: Log {
                    issued: vec![0; nranks],
                    ..Log::default()
                },
            }),
            failed: AtomicBool::new(false),
        }
    }

    /// The group of the communicator of unique id `id` of library `label` (one per id while any
    /// of its ranks lives in this process).
    pub fn of(label: &str, id: &[u8], nranks: usize) -> Arc<Group> {
        type Groups = HashMap<(String, Vec<u8>), Weak<Group>>;
        static GROUPS: OnceLock<Mutex<Groups>> = OnceLock::new();
        let mut groups = GROUPS.get_or_init(Default::default).lock();
        groups.retain(|_, g| g.strong_count() > 0);
        let key = (label.to_string(), id.to_vec());
        if let Some(g) = groups.get(&key).and_then(Weak::upgrade) {
            if g.nranks == nranks {
                return g;
            }
            // Another size for the same id: the library refuses it; this rank gets a group of
            // its own.
            return Arc::new(Group::new(nranks));
        }
        let g = Arc::new(Group::new(nranks));
        groups.insert(key, Arc::downgrade(&g));
        g
    }

    /// A group with every rank in this process (`init_all`).
    pub fn complete(nranks: usize) -> Arc<Group> {
        let g = Group::new(nranks);
        g.state.lock().arrived.fill(true);
        Arc::new(g)
    }

    /// A group whose other ranks are unknown (a native split's child): it never logs, so a
    /// failure leaves posted operations to the library's own timeout.
    pub fn unknown(nranks: usize) -> Arc<Group> {
        Arc::new(Group::new(nranks))
    }

    /// Rank `rank` is about to join (before its blocking init).
    pub fn arrive(&self, rank: usize) {
        if let Some(a) = self.state.lock().arrived.get_mut(rank) {
            *a = true;
        }
    }

    /// Rank `rank`'s communicator exists.
    pub fn join(&self, rank: usize, member: Weak<dyn Member>) {
        if let Some(m) = self.state.lock().members.get_mut(rank) {
            *m = Some(member);
        }
    }

    /// Logs what rank `rank` just posted (called under its communicator's lock, right after
    /// the library took the call, so the log is in the order the library matches).
    pub fn record(&self, rank: usize, ops: &[Op]) {
        let mut st = self.state.lock();
        if st.log.off || ops.is_empty() {
            return;
        }
        if !st.arrived.iter().all(|&a| a) {
            // Ranks in other processes: nothing can stand in for them.
            st.log = Log {
                off: true,
                ..Log::default()
            };
            return;
        }
        for op in ops {
            match *op {
                Op::Collective(round) => st.log.collective(rank, round),
                Op::P2p(P2p {
                    peer,
                    recv,
                    count,
                    dtype,
                }) => {
                    let pair = if recv { (peer, rank) } else { (rank, peer) };
                    st.log.p2p(pair, !recv, (count, dtype));
                }
            }
        }
        if st.log.size() > LOG_LIMIT {
            tracing::warn!(target: "unihal::coll", "a rank is more than {LOG_LIMIT} operations behind its peers; a failure will leave posted operations to the library's own timeout");
            st.log = Log {
                off: true,
                ..Log::default()
            };
        }
    }

    /// Rank `origin` failed with `own`: every rank of the group in this process stops issuing
    /// and fails the streams with pending work (`origin` with `own`, the others with `peers`),
    /// posts the stand-ins its peers wait for, and hands its communicator to a reaper that
    /// destroys it once its operations drained. Once per group.
    pub fn fail(&self, origin: &dyn Member, own: HalError, peers: HalError) {
        let is_origin =
            |m: &Arc<dyn Member>| std::ptr::addr_eq(Arc::as_ptr(m), origin as *const dyn Member);
        if self.failed.swap(true, Ordering::SeqCst) {
            // Failing already: every rank that existed then is stopped.
            if origin.stop(own) {
                origin.hand_to_reaper();
            }
            return;
        }
        let members: Vec<Option<Arc<dyn Member>>> = self
            .state
            .lock()
            .members
            .iter()
            .map(|m| m.as_ref().and_then(Weak::upgrade))
            .collect();
        let live: Vec<&Arc<dyn Member>> = members.iter().flatten().collect();
        let origin_is_member = live.iter().any(|m| is_origin(m));
        // Stopping takes each rank's operation lock: an issue in progress finishes (and is
        // logged) first, and none starts after.
        for m in &live {
            m.stop(if is_origin(m) {
                own.clone()
            } else {
                peers.clone()
            });
        }
        if !origin_is_member {
            origin.stop(own);
        }
        let stand_ins = {
            let st = self.state.lock();
            (!st.log.off && live.len() == self.nranks).then(|| st.log.stand_ins())
        };
        match stand_ins {
            Some(plan) => {
                for (m, ops) in members.iter().zip(&plan) {
                    if let Some(m) = m {
                        m.stand_in(ops);
                    }
                }
            }
            None => tracing::warn!(
                target: "unihal::coll",
                "not every rank of the failed communicator is in this process; their posted \
                 operations end at the library's own timeout (HCCL_EXEC_TIMEOUT)"
            ),
        }
        for m in &live {
            m.hand_to_reaper();
        }
        if !origin_is_member {
            origin.hand_to_reaper();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::library::Call;
    use unihal_hal::{DType, ReduceOp};

    fn round(count: u64) -> Round {
        Round {
            call: Call::AllReduce(ReduceOp::Sum),
            dtype: DType::F32,
            count,
        }
    }

    fn log(n: usize) -> Log {
        Log {
            issued: vec![0; n],
            ..Log::default()
        }
    }

    #[test]
    fn stand_ins_repeat_the_rounds_a_rank_has_not_posted() {
        let mut l = log(3);
        l.collective(0, round(1));
        l.collective(0, round(2));
        l.collective(1, round(1));
        l.collective(2, round(1));
        // Round 0 is complete and forgotten; round 1 waits for ranks 1 and 2.
        assert_eq!((l.base, l.rounds.len()), (1, 1));
        let s = l.stand_ins();
        assert!(s[0].is_empty());
        assert_eq!(s[1], vec![Op::Collective(round(2))]);
        assert_eq!(s[2], vec![Op::Collective(round(2))]);
    }

    #[test]
    fn stand_ins_match_unmatched_sends_and_receives_in_order() {
        let mut l = log(2);
        // Rank 0 sends twice to rank 1, which received once.
        l.p2p((0, 1), true, (5, DType::F32));
        l.p2p((0, 1), true, (7, DType::F32));
        l.p2p((0, 1), false, (5, DType::F32));
        // Rank 0 receives from rank 1, which never sends.
        l.p2p((1, 0), false, (3, DType::I32));
        let s = l.stand_ins();
        assert!(s[0].is_empty());
        assert_eq!(s[1].len(), 2);
        for want in [
            Op::P2p(P2p {
                peer: 0,
                recv: true,
                count: 7,
                dtype: DType::F32,
            }),
            Op::P2p(P2p {
                peer: 0,
                recv: false,
                count: 3,
                dtype: DType::I32,
            }),
        ] {
            assert!(s[1].contains(&want), "{want:?} in {:?}", s[1]);
        }
    }
}
