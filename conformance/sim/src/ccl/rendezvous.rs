//! Where a communicator's ranks meet, in this process or in several: every rank claims its block
//! in the communicator's shared file ([`super::shm`]) and waits until every rank has. Ranks that
//! all live in this process then form an in-process communicator ([`super::Registry`]); ranks in
//! several processes one that moves data through the file ([`super::xproc`]). As on a real node,
//! the unique id is all the ranks share, and each process has its own devices.

use super::shm::{self, Segment};
use crate::{SimError, SimResult};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Every rank of a communicator joined.
pub struct Joined {
    pub seg: Segment,
    /// Each rank's process.
    pub pids: Vec<u64>,
    /// Whether every rank lives in this process.
    pub local: bool,
}

/// Claims rank `rank` of the `nranks`-rank communicator named `id` (on device `ordinal`) and
/// waits until every rank has, or `deadline` passed.
///
/// # Errors
/// [`SimError::InvalidUsage`] when ranks disagree on `nranks`, a rank joins twice, two ranks of
/// one node share a device (every rank gets this one), or the file cannot be made;
/// [`SimError::Timeout`] naming the ranks that never came.
pub fn join(
    id: &[u8],
    nranks: usize,
    rank: usize,
    ordinal: u32,
    deadline: Instant,
) -> SimResult<Joined> {
    debug_assert!(rank < nranks && nranks <= shm::MAX_RANKS);
    let seg = Segment::open(id)?;
    let h = seg.header();
    if let Err(others) =
        h.nranks
            .compare_exchange(0, nranks as u64, Ordering::AcqRel, Ordering::Acquire)
    {
        if others != nranks as u64 {
            return Err(SimError::InvalidUsage(format!(
                "rank {rank} joins with {nranks} ranks, others with {others}"
            )));
        }
    }
    let me = seg.rank(rank);
    if me
        .state
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Err(SimError::InvalidUsage(format!("rank {rank} joined twice")));
    }
    let pid = u64::from(std::process::id());
    let (node, _) = shm::node();
    me.pid.store(pid, Ordering::Relaxed);
    me.node.store(node, Ordering::Relaxed);
    me.ordinal.store(u64::from(ordinal), Ordering::Relaxed);
    for counter in [&me.aborted, &me.posted, &me.consumed] {
        counter.store(0, Ordering::Relaxed);
    }
    me.state.store(2, Ordering::Release);
    let mut pause = Duration::from_micros(20);
    loop {
        if (0..nranks).all(|r| seg.rank(r).state.load(Ordering::Acquire) == 2) {
            break;
        }
        if Instant::now() >= deadline {
            me.state.store(0, Ordering::Release);
            let absent: Vec<String> = (0..nranks)
                .filter(|&r| r != rank && seg.rank(r).state.load(Ordering::Acquire) != 2)
                .map(|r| r.to_string())
                .collect();
            if (0..nranks).all(|r| seg.rank(r).state.load(Ordering::Acquire) == 0) {
                seg.unlink();
            }
            return Err(SimError::Timeout(format!(
                "communicator init: ranks {} never joined",
                absent.join(", ")
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    let pids: Vec<u64> = (0..nranks)
        .map(|r| seg.rank(r).pid.load(Ordering::Relaxed))
        .collect();
    let local = pids.iter().all(|&p| p == pid);
    if h.taken.fetch_add(1, Ordering::AcqRel) + 1 == nranks as u64 {
        // Every rank mapped the file: its name is no longer needed.
        seg.unlink();
    }
    if !local {
        for a in 0..nranks {
            for b in a + 1..nranks {
                let (x, y) = (seg.rank(a), seg.rank(b));
                let key = |k: &shm::RankBlock| {
                    (
                        k.node.load(Ordering::Relaxed),
                        k.ordinal.load(Ordering::Relaxed),
                    )
                };
                if key(x) == key(y) {
                    return Err(SimError::InvalidUsage(format!(
                        "ranks {a} and {b} are on the same device ({} of node {})",
                        key(x).1,
                        if key(x).0 == node {
                            shm::node().1
                        } else {
                            format!("{:016x}", key(x).0)
                        }
                    )));
                }
            }
        }
    }
    Ok(Joined { seg, pids, local })
}
