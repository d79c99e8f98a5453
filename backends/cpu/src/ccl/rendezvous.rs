//! Where the ranks of one in-process communicator meet: per-operation rounds with phase barriers,
//! and mailboxes for point-to-point messages. Every wait has a deadline and wakes on abort, so a
//! missing rank is a `Timeout` and `abort` unblocks everyone; nothing waits forever.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use unihal_hal::{HalError, Result};

/// What a rank says it is doing in a round; every rank must say the same.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Signature {
    pub what: String,
}

#[derive(Default)]
struct Round {
    sig: Option<Signature>,
    /// (send, recv) addresses of each rank.
    ptrs: Vec<Option<(u64, u64)>>,
    arrived: usize,
    /// Ranks past each phase barrier.
    passed: Vec<usize>,
    left: usize,
}

#[derive(Default)]
struct State {
    rounds: HashMap<u64, Round>,
    mail: HashMap<(usize, usize, u64), Vec<u8>>,
    aborted: bool,
}

/// The shared meeting point of one communicator.
pub(crate) struct Rendezvous {
    pub nranks: usize,
    pub timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl Rendezvous {
    pub fn new(nranks: usize, timeout: Duration) -> Rendezvous {
        Rendezvous {
            nranks,
            timeout,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        }
    }

    /// Fails every pending and later wait with `Aborted`.
    pub fn abort(&self) {
        self.state.lock().aborted = true;
        self.cv.notify_all();
    }

    fn wait_until(
        &self,
        what: &str,
        deadline: Instant,
        mut done: impl FnMut(&mut State) -> bool,
    ) -> Result<parking_lot::MutexGuard<'_, State>> {
        let mut g = self.state.lock();
        loop {
            if g.aborted {
                return Err(HalError::Aborted {
                    what: format!("communicator aborted during {what}"),
                });
            }
            if done(&mut g) {
                return Ok(g);
            }
            if self.cv.wait_until(&mut g, deadline).timed_out() && !done(&mut g) {
                if g.aborted {
                    continue;
                }
                return Err(HalError::Timeout {
                    what: what.to_string(),
                    millis: self.timeout.as_millis() as u64,
                });
            }
        }
    }

    /// Joins round `seq`, publishing this rank's addresses; returns every rank's addresses once all
    /// have arrived with the same signature.
    pub fn arrive(
        &self,
        seq: u64,
        rank: usize,
        sig: &Signature,
        send: u64,
        recv: u64,
    ) -> Result<Vec<(u64, u64)>> {
        let deadline = Instant::now() + self.timeout;
        {
            let mut g = self.state.lock();
            let n = self.nranks;
            let r = g.rounds.entry(seq).or_insert_with(|| Round {
                ptrs: vec![None; n],
                passed: vec![0; 3],
                ..Default::default()
            });
            match &r.sig {
                Some(s) if s != sig => {
                    let msg = format!(
                        "collective #{seq}: rank {rank} called {} but another rank called {}",
                        sig.what, s.what
                    );
                    drop(g);
                    return Err(HalError::invalid("call", unihal_hal::Invalid::Other(msg)));
                }
                _ => r.sig = Some(sig.clone()),
            }
            r.ptrs[rank] = Some((send, recv));
            r.arrived += 1;
        }
        self.cv.notify_all();
        let what = format!(
            "{} (collective #{seq}): waiting for the other ranks",
            sig.what
        );
        let mut missing = Vec::new();
        let g = self.wait_until(&what, deadline, |s| {
            let r = &s.rounds[&seq];
            missing = r
                .ptrs
                .iter()
                .enumerate()
                .filter(|(_, p)| p.is_none())
                .map(|(i, _)| i)
                .collect();
            r.arrived == self.nranks
        });
        let g = g.map_err(|e| match e {
            HalError::Timeout { millis, .. } => HalError::Timeout {
                what: format!("{what}; ranks {missing:?} never arrived"),
                millis,
            },
            e => e,
        })?;
        Ok(g.rounds[&seq]
            .ptrs
            .iter()
            .map(|p| p.expect("all arrived"))
            .collect())
    }

    /// Waits until every rank has finished phase `phase` of round `seq`.
    pub fn barrier(&self, seq: u64, phase: usize) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        if let Some(r) = self.state.lock().rounds.get_mut(&seq) {
            r.passed[phase] += 1;
        }
        self.cv.notify_all();
        let n = self.nranks;
        self.wait_until(&format!("collective #{seq} phase {phase}"), deadline, |s| {
            s.rounds.get(&seq).is_none_or(|r| r.passed[phase] >= n)
        })
        .map(drop)
    }

    /// Leaves round `seq` (the last rank out frees it).
    pub fn leave(&self, seq: u64) {
        let mut g = self.state.lock();
        if let Some(r) = g.rounds.get_mut(&seq) {
            r.left += 1;
            if r.left == self.nranks {
                g.rounds.remove(&seq);
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
        drop(g);
        self.cv.notify_all();
        Ok(())
    }

    /// Takes message `k` from `src` to `dst`, waiting for it.
    pub fn take(&self, src: usize, dst: usize, k: u64) -> Result<Vec<u8>> {
        let deadline = Instant::now() + self.timeout;
        let what = format!("recv on rank {dst} of message #{k} from rank {src}");
        let mut g = self.wait_until(&what, deadline, |s| s.mail.contains_key(&(src, dst, k)))?;
        Ok(g.mail.remove(&(src, dst, k)).expect("present"))
    }
}
