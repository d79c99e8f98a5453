//! Where the ranks of one in-process communicator meet: per-operation rounds with phase barriers,
//! and mailboxes for point-to-point messages. Every wait for a peer has a deadline and wakes on
//! abort, so a missing rank is a `Timeout` and `abort` unblocks everyone; nothing waits forever.
//!
//! # Who may touch whose memory
//!
//! A round publishes every rank's (send, recv) addresses; a rank that has received them (it is
//! *started*) reads and writes its peers' buffers until it leaves. So [`Rendezvous::run_round`]
//! does not let a rank leave (and its operation drop the buffers it holds) while any started peer
//! is still inside the round, whatever the outcome: on success, a timeout or an abort alike. The
//! wait is bounded: a started rank only copies, reduces and waits at barriers, and a failed round
//! wakes every barrier at once. A round that failed accepts no new arrivals (they fail at once and
//! never see the addresses), so a late rank can never start on buffers whose owners have gone.
//!
//! A round ends with a closing barrier that `run_round` itself runs after the body: a rank that
//! passed it knows every peer's body has returned, so none touches its buffers any more, and it
//! leaves at once. Only a rank whose round failed waits in [`Rendezvous::run_round`] for its
//! started peers to leave. A successful round thus costs its body's phase barriers plus two
//! meetings (arrival and closing), not three.
//!
//! # Waiting
//!
//! Every decision is taken under the state lock. A waiter first polls a change counter that every
//! state change bumps ([`unihal_hal::sync::poll_briefly`]: spinning when the communicator's ranks
//! can each have a core, yielding the core otherwise), since a peer that is already running
//! usually arrives within microseconds; only then does it sleep on the condition variable, and a
//! state change notifies only when someone sleeps. A sleeper registers under the lock before its
//! last check, and a changer reads the count under the lock after its change, so no wake-up is
//! lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};
#[cfg(loom)]
use unihal_hal::sync::AtomicBool;
use unihal_hal::sync::{AtomicU64, Condvar, Mutex, MutexGuard, Ordering, Polled};
use unihal_hal::{HalError, Invalid, Result};

/// What a rank says it is doing in a round; every rank must say the same.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Signature {
    pub what: String,
}

/// Where one rank is in a round.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Seat {
    /// Not arrived yet.
    Absent,
    /// Published its addresses, waiting for the others.
    Waiting,
    /// Has every rank's addresses: may touch peers' buffers.
    Started,
    /// Left (or was turned away); touches nothing of the round any more.
    Gone,
}

struct Round {
    sig: Option<Signature>,
    /// (send, recv) addresses of each rank.
    ptrs: Vec<(u64, u64)>,
    seats: Vec<Seat>,
    /// Ranks past each phase barrier.
    passed: Vec<usize>,
    /// Every rank has arrived (set by the last arrival; the round can then no longer fail
    /// before every rank is started).
    complete: bool,
    /// The first error a rank left with: the round can no longer complete.
    failed: Option<HalError>,
}

impl Round {
    fn new(n: usize) -> Round {
        Round {
            sig: None,
            ptrs: vec![(0, 0); n],
            seats: vec![Seat::Absent; n],
            passed: vec![0; PHASES],
            complete: false,
            failed: None,
        }
    }

    fn count(&self, s: Seat) -> usize {
        self.seats.iter().filter(|&&x| x == s).count()
    }
}

/// How long waits sleep without polling after a poll found the machine contended.
const CONTENDED_QUIET: Duration = Duration::from_millis(100);

/// Phase barriers a round's body may use: `0..CLOSING`.
pub(crate) const CLOSING: usize = 3;
const PHASES: usize = CLOSING + 1;

#[derive(Default)]
struct State {
    rounds: HashMap<u64, Round>,
    mail: HashMap<(usize, usize, u64), Vec<u8>>,
    aborted: bool,
    /// Waiters asleep on the condition variable.
    sleepers: usize,
}

/// The shared meeting point of one communicator. Thread-safe; every rank's worker calls it.
pub(crate) struct Rendezvous {
    pub nranks: usize,
    pub timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
    /// Bumped by every state change: what a polling waiter watches.
    changes: AtomicU64,
    /// Whether polling waiters spin (each rank can have a core) or yield.
    spin: bool,
    /// Until when (nanoseconds after `epoch`) waits sleep without polling: set when a poll found
    /// the machine contended (another process took the core at a yield).
    quiet_until: AtomicU64,
    epoch: Instant,
    /// Planted defect (loom's self-check): a successful round leaves without its closing barrier.
    #[cfg(loom)]
    planted_no_closing: AtomicBool,
}

/// The error a rank gets from a round a peer failed.
fn peer_failed(seq: u64, e: &HalError) -> HalError {
    match e {
        HalError::Aborted { .. } | HalError::Timeout { .. } => e.clone(),
        e => HalError::invalid(
            "call",
            Invalid::Other(format!("collective #{seq} failed on another rank: {e}")),
        ),
    }
}

impl Rendezvous {
    pub fn new(nranks: usize, timeout: Duration) -> Rendezvous {
        Rendezvous {
            nranks,
            timeout,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            changes: AtomicU64::new(0),
            spin: unihal_hal::sync::cores_for(nranks),
            quiet_until: AtomicU64::new(0),
            epoch: Instant::now(),
            #[cfg(loom)]
            planted_no_closing: AtomicBool::new(false),
        }
    }

    /// Plants the defect loom must catch: a successful round leaves without its closing barrier.
    #[cfg(loom)]
    pub(crate) fn plant_no_closing_barrier(&self) {
        self.planted_no_closing.store(true, Ordering::Relaxed);
    }

    /// Tells waiters that the state changed; called with the state lock held, after the change.
    /// `may_end_a_wait`: the change can end someone's wait (the last arrival or the last rank at
    /// a barrier, a failure, a message); sleepers are woken only then, since every wake-up of a
    /// sleeping rank costs a trip through the kernel. Polling waiters see every change.
    fn changed(&self, g: &State, may_end_a_wait: bool) {
        self.changes.fetch_add(1, Ordering::Release);
        if may_end_a_wait && g.sleepers > 0 {
            self.cv.notify_all();
        }
    }

    /// Sleeps on the condition variable until notified or `deadline` (`None`: no deadline);
    /// true when the deadline passed.
    fn sleep(&self, g: &mut MutexGuard<'_, State>, deadline: Option<Instant>) -> bool {
        g.sleepers += 1;
        let timed_out = match deadline {
            Some(d) => self.cv.wait_until(g, d),
            None => {
                self.cv.wait(g);
                false
            }
        };
        g.sleepers -= 1;
        timed_out
    }

    /// Releases the lock, polls briefly for a state change, and relocks; false when polling
    /// should stop for this wait (the machine is contended).
    fn poll<'a>(&'a self, g: MutexGuard<'a, State>) -> (MutexGuard<'a, State>, bool) {
        let seen = self.changes.load(Ordering::Acquire);
        drop(g);
        let polled = unihal_hal::sync::poll_briefly(self.spin, || {
            self.changes.load(Ordering::Acquire) != seen
        });
        if polled == Polled::Contended {
            // Waits sleep at once for a while, then polling is tried again: at most one lost
            // time slice (a few milliseconds) per quiet period.
            let until = self.epoch.elapsed() + CONTENDED_QUIET;
            self.quiet_until
                .store(until.as_nanos() as u64, Ordering::Relaxed);
        }
        (self.state.lock(), polled != Polled::Contended)
    }

    /// Fails every pending and later wait for a peer with `Aborted`.
    pub fn abort(&self) {
        let mut g = self.state.lock();
        g.aborted = true;
        self.changed(&g, true);
    }

    /// Model checking: wakes every waiter, taking the state lock first so that a waiter between
    /// its clock check and its sleep cannot miss it (see `unihal_hal::sync::loom_clock`).
    #[cfg(loom)]
    pub(crate) fn notify_all(&self) {
        drop(self.state.lock());
        self.cv.notify_all();
    }

    /// Waits until `done` (which may also end the wait with an error), an abort or `deadline`;
    /// `what` names the wait in the error (made only on an error).
    fn wait_until(
        &self,
        what: impl Fn() -> String,
        deadline: Instant,
        mut done: impl FnMut(&mut State) -> Option<Result<()>>,
    ) -> Result<MutexGuard<'_, State>> {
        let mut g = self.state.lock();
        let mut polls = 0;
        let quiet_until = self.quiet_until.load(Ordering::Relaxed);
        if quiet_until > 0 && (self.epoch.elapsed().as_nanos() as u64) < quiet_until {
            polls = unihal_hal::sync::POLLS_BEFORE_SLEEP;
        }
        loop {
            if g.aborted {
                return Err(HalError::Aborted {
                    what: format!("communicator aborted during {}", what()),
                });
            }
            if let Some(r) = done(&mut g) {
                return r.map(|()| g);
            }
            if polls < unihal_hal::sync::POLLS_BEFORE_SLEEP {
                polls += 1;
                let (relocked, go_on) = self.poll(g);
                g = relocked;
                if !go_on {
                    polls = unihal_hal::sync::POLLS_BEFORE_SLEEP;
                }
                continue;
            }
            if self.sleep(&mut g, Some(deadline)) && !g.aborted {
                if let Some(r) = done(&mut g) {
                    return r.map(|()| g);
                }
                return Err(HalError::Timeout {
                    what: what(),
                    millis: unihal_hal::deadline::millis(self.timeout),
                });
            }
        }
    }

    /// Runs round `seq` for `rank`: publishes (send, recv), waits until every rank has arrived
    /// with the same signature, runs `body` with all ranks' addresses, meets the others at the
    /// closing barrier, then leaves — only once no peer that received the addresses can still
    /// touch this rank's buffers (see the module docs), so the caller may release them when this
    /// returns, whatever the result. `body` touches peers' buffers only before it returns, and
    /// uses phase barriers `0..CLOSING` only.
    pub fn run_round<R>(
        &self,
        seq: u64,
        rank: usize,
        sig: &Signature,
        (send, recv): (u64, u64),
        body: impl FnOnce(&[(u64, u64)]) -> Result<R>,
    ) -> Result<R> {
        /// Leaves the round if `body` unwinds, so that peers waiting in `leave` for this rank
        /// never wait forever (the panic becomes the round's failure).
        struct Unwinding<'a> {
            rv: &'a Rendezvous,
            seq: u64,
            rank: usize,
        }
        impl Drop for Unwinding<'_> {
            fn drop(&mut self) {
                let e = HalError::Internal("a collective panicked on a rank's worker".into());
                self.rv.leave(self.seq, self.rank, Some(&e), false);
            }
        }
        let r = match self.arrive(seq, rank, sig, send, recv) {
            Ok(ptrs) => {
                let guard = Unwinding {
                    rv: self,
                    seq,
                    rank,
                };
                let r = body(&ptrs);
                std::mem::forget(guard);
                #[cfg(loom)]
                if r.is_ok() && self.planted_no_closing.load(Ordering::Relaxed) {
                    self.leave(seq, rank, None, true);
                    return r;
                }
                match r {
                    Ok(v) => match self.barrier(seq, CLOSING) {
                        // Every peer's body has returned: nobody touches our buffers any more.
                        Ok(()) => {
                            self.leave(seq, rank, None, true);
                            return Ok(v);
                        }
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                }
            }
            Err((e, true)) => Err(e),
            // Turned away before publishing anything: nothing to leave.
            Err((e, false)) => return Err(e),
        };
        self.leave(seq, rank, r.as_ref().err(), false);
        r
    }

    /// Joins round `seq`; returns every rank's addresses once all have arrived. On an error, says
    /// whether this rank had published its addresses (and so must leave).
    fn arrive(
        &self,
        seq: u64,
        rank: usize,
        sig: &Signature,
        send: u64,
        recv: u64,
    ) -> std::result::Result<Vec<(u64, u64)>, (HalError, bool)> {
        let deadline = unihal_hal::deadline::after(self.timeout);
        {
            let mut g = self.state.lock();
            let n = self.nranks;
            let r = g.rounds.entry(seq).or_insert_with(|| Round::new(n));
            if let Some(e) = &r.failed {
                // Turned away: this rank never sees the addresses of a round that cannot complete.
                let e = peer_failed(seq, e);
                r.seats[rank] = Seat::Gone;
                Self::retire(&mut g, seq);
                return Err((e, false));
            }
            match &r.sig {
                Some(s) if s != sig => {
                    let e = HalError::invalid(
                        "call",
                        Invalid::Other(format!(
                            "collective #{seq}: rank {rank} called {} but another rank called {}",
                            sig.what, s.what
                        )),
                    );
                    r.failed = Some(e.clone());
                    r.seats[rank] = Seat::Gone;
                    Self::retire(&mut g, seq);
                    self.changed(&g, true);
                    return Err((e, false));
                }
                _ => r.sig = Some(sig.clone()),
            }
            r.ptrs[rank] = (send, recv);
            r.seats[rank] = Seat::Waiting;
            r.complete = r.count(Seat::Absent) == 0;
            let last = r.complete;
            self.changed(&g, last);
        }
        let what = || {
            format!(
                "{} (collective #{seq}): waiting for the other ranks",
                sig.what
            )
        };
        let mut missing = Vec::new();
        let n = self.nranks;
        let g = self.wait_until(what, deadline, |s| {
            let r = &s.rounds[&seq];
            match &r.failed {
                // Peers that timed out waiting for the same missing ranks: time out on our own
                // deadline, with our own message.
                Some(HalError::Timeout { .. }) => None,
                Some(e) => Some(Err(peer_failed(seq, e))),
                None if r.complete => Some(Ok(())),
                None => {
                    missing = (0..n).filter(|&i| r.seats[i] == Seat::Absent).collect();
                    None
                }
            }
        });
        let mut g = g.map_err(|e| {
            let e = match e {
                HalError::Timeout { millis, .. } => HalError::Timeout {
                    what: format!("{}; ranks {missing:?} never arrived", what()),
                    millis,
                },
                e => e,
            };
            (e, true)
        })?;
        let r = g
            .rounds
            .get_mut(&seq)
            .expect("a round lives while a rank waits in it");
        r.seats[rank] = Seat::Started;
        Ok(r.ptrs.clone())
    }

    /// Waits until every rank has finished phase `phase` of round `seq`; fails at once when a
    /// peer left the round with an error.
    pub fn barrier(&self, seq: u64, phase: usize) -> Result<()> {
        let deadline = unihal_hal::deadline::after(self.timeout);
        {
            let mut g = self.state.lock();
            let last = g.rounds.get_mut(&seq).is_some_and(|r| {
                r.passed[phase] += 1;
                r.passed[phase] >= self.nranks
            });
            self.changed(&g, last);
        }
        let n = self.nranks;
        let what = || match phase {
            CLOSING => format!("collective #{seq}: closing"),
            _ => format!("collective #{seq} phase {phase}"),
        };
        self.wait_until(what, deadline, |s| {
            let r = s.rounds.get(&seq)?;
            match &r.failed {
                Some(e) => Some(Err(peer_failed(seq, e))),
                None => (r.passed[phase] >= n).then_some(Ok(())),
            }
        })
        .map(drop)
    }

    /// Leaves round `seq`, recording `error` as the round's failure, then — unless `closed` (every
    /// peer passed the closing barrier, so none touches this rank's buffers) — waits until no peer
    /// that has or may still get the addresses is inside the round (it may read or write this
    /// rank's buffers).
    fn leave(&self, seq: u64, rank: usize, error: Option<&HalError>, closed: bool) {
        let mut g = self.state.lock();
        let Some(r) = g.rounds.get_mut(&seq) else {
            return;
        };
        r.seats[rank] = Seat::Gone;
        if let (Some(e), None) = (error, &r.failed) {
            r.failed = Some(e.clone());
        }
        // Only a failed round has ranks waiting for others to leave (each records the failure
        // before it waits): a closed, successful round wakes nobody.
        let failed = r.failed.is_some();
        self.changed(&g, failed);
        if closed {
            Self::retire(&mut g, seq);
            return;
        }
        // No deadline and no abort check: a started peer is bounded (copies, then barriers that
        // wake on this round's failure, a timeout or an abort), and leaving earlier would free
        // memory it uses.
        // A waiting rank of a round that has not failed may still start (it has not yet seen that
        // everyone arrived); once the round failed, waiting ranks never start.
        while g.rounds.get(&seq).is_some_and(|r| {
            r.count(Seat::Started) > 0 || (r.failed.is_none() && r.count(Seat::Waiting) > 0)
        }) {
            self.sleep(&mut g, None);
        }
        Self::retire(&mut g, seq);
    }

    /// Frees round `seq` once every rank is gone from it. A failed round whose missing ranks never
    /// come stays as a small tombstone, so that they are turned away if they ever arrive.
    fn retire(g: &mut State, seq: u64) {
        if g.rounds
            .get(&seq)
            .is_some_and(|r| r.count(Seat::Gone) == r.seats.len())
        {
            g.rounds.remove(&seq);
        } else if let Some(r) = g.rounds.get_mut(&seq) {
            if r.failed.is_some() && r.count(Seat::Started) == 0 && r.count(Seat::Waiting) == 0 {
                r.ptrs.clear();
            }
        }
    }

    /// Posts message `k` from `src` to `dst` (eager: the bytes are copied now).
    pub fn post(&self, src: usize, dst: usize, k: u64, bytes: Vec<u8>) -> Result<()> {
        let mut g = self.state.lock();
        if g.aborted {
            return Err(HalError::Aborted {
                what: format!("communicator aborted during send {src}->{dst}"),
            });
        }
        g.mail.insert((src, dst, k), bytes);
        self.changed(&g, true);
        Ok(())
    }

    /// Takes message `k` from `src` to `dst`, waiting for it.
    pub fn take(&self, src: usize, dst: usize, k: u64) -> Result<Vec<u8>> {
        let deadline = unihal_hal::deadline::after(self.timeout);
        let what = || format!("recv on rank {dst} of message #{k} from rank {src}");
        let mut g = self.wait_until(what, deadline, |s| {
            s.mail.contains_key(&(src, dst, k)).then_some(Ok(()))
        })?;
        Ok(g.mail.remove(&(src, dst, k)).unwrap_or_default())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn sig() -> Signature {
        Signature { what: "op".into() }
    }

    /// A rank whose round fails returns only once its started peer has left: before, it freed
    /// buffers the peer was still copying.
    #[test]
    fn a_failing_rank_leaves_only_after_started_peers() {
        let rv = Arc::new(Rendezvous::new(2, Duration::from_secs(30)));
        let peer_started = Arc::new(AtomicBool::new(false));
        let peer_done = Arc::new(AtomicBool::new(false));
        let (rv0, started0, done0) = (rv.clone(), peer_started.clone(), peer_done.clone());
        let peer = std::thread::spawn(move || {
            rv0.run_round(0, 0, &sig(), (1, 2), |_| {
                started0.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
                done0.store(true, Ordering::SeqCst);
                Ok(())
            })
        });
        let r: Result<()> = rv.run_round(0, 1, &sig(), (3, 4), |p| {
            assert_eq!(p, &[(1, 2), (3, 4)]);
            // Fail only once the peer has started: a peer still waiting when the round fails
            // never starts (and never touches our buffers), which is not the case tested here.
            while !peer_started.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            Err(HalError::Aborted {
                what: "test".into(),
            })
        });
        assert!(matches!(r, Err(HalError::Aborted { .. })));
        assert!(
            peer_done.load(Ordering::SeqCst),
            "left before the started peer"
        );
        // The peer's body succeeded, but the round did not: its closing barrier reports the
        // failure.
        let peer = peer.join().unwrap();
        assert!(matches!(peer, Err(HalError::Aborted { .. })), "{peer:?}");
        assert!(rv.state.lock().rounds.is_empty(), "round not freed");
    }

    /// A rank whose body panics still leaves the round: its peers neither hang in `leave` nor
    /// wait out their barrier's timeout.
    #[test]
    fn a_panicking_rank_leaves_the_round() {
        let rv = Arc::new(Rendezvous::new(2, Duration::from_secs(30)));
        let rv0 = rv.clone();
        let panicking = std::thread::spawn(move || {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                rv0.run_round(0, 0, &sig(), (1, 2), |_| -> Result<()> {
                    panic!("planted")
                })
            }))
            .is_err()
        });
        let t0 = Instant::now();
        let r = rv.run_round(0, 1, &sig(), (3, 4), |_| rv.barrier(0, 1));
        assert!(matches!(r, Err(HalError::InvalidArgument { .. })), "{r:?}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "waited {:?}",
            t0.elapsed()
        );
        assert!(panicking.join().unwrap(), "the body did not panic");
        assert!(rv.state.lock().rounds.is_empty(), "round not freed");
    }

    /// Once a round failed, a late rank is turned away at once and never gets the addresses.
    #[test]
    fn late_ranks_are_turned_away_from_a_failed_round() {
        let rv = Rendezvous::new(2, Duration::from_millis(20));
        let r = rv.run_round(7, 0, &sig(), (1, 2), |_| Ok(()));
        match r {
            Err(HalError::Timeout { what, .. }) => assert!(what.contains("[1]"), "{what}"),
            other => panic!("{other:?}"),
        }
        let t0 = Instant::now();
        let late = rv.run_round(7, 1, &sig(), (3, 4), |_| -> Result<()> {
            panic!("a late rank started on a failed round")
        });
        assert!(matches!(late, Err(HalError::Timeout { .. })), "{late:?}");
        assert!(
            t0.elapsed() < Duration::from_millis(20),
            "the late rank waited"
        );
        assert!(rv.state.lock().rounds.is_empty(), "round not freed");
    }

    /// A rank that calls something else fails the round for every rank at once.
    #[test]
    fn a_mismatched_call_fails_every_rank_without_waiting() {
        let rv = Arc::new(Rendezvous::new(2, Duration::from_secs(30)));
        let rv0 = rv.clone();
        let t0 = Instant::now();
        let first = std::thread::spawn(move || rv0.run_round(0, 0, &sig(), (1, 2), |_| Ok(())));
        std::thread::sleep(Duration::from_millis(20));
        let other = Signature {
            what: "other".into(),
        };
        let r = rv.run_round(0, 1, &other, (3, 4), |_| Ok(()));
        assert!(matches!(r, Err(HalError::InvalidArgument { .. })), "{r:?}");
        let r0 = first.join().unwrap();
        assert!(
            matches!(r0, Err(HalError::InvalidArgument { .. })),
            "{r0:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
