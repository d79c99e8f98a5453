//! Model checking with loom of the CPU backend's own concurrency protocols, over the production
//! code: the stream worker (`src/worker.rs`) and the collective rendezvous
//! (`src/ccl/rendezvous.rs`), both built on `unihal_hal::sync`, which is loom's under
//! `--cfg loom`. The loom build of the crate compiles only those (see `src/lib.rs`), reached through
//! `unihal_cpu::loom_api`.
//!
//! Run by `scripts/loom.sh`:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p unihal-cpu --test loom`.
//!
//! Effects are `Relaxed` atomics or loom `UnsafeCell` accesses: neither adds synchronisation, so
//! loom reports any outcome the protocols' own orderings allow (a stale value, a race) and any
//! execution in which a thread sleeps forever (a lost wake-up) as a deadlock.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use loom::sync::Arc;
use loom::thread;
use unihal_cpu::loom_api::{ComputePool, Rendezvous, Worker};
use unihal_hal::sync::loom_clock;
use unihal_hal::{HalError, Result};

/// The message of a panic's payload (empty when it carries none).
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    unihal_hal::panic_message(p).unwrap_or_default()
}

/// A model with at most `preemption_bound` preemptions per execution (`None`: exhaustive). The
/// bounds below keep each model within seconds on a 2-core machine (measured; the next bound up is
/// noted where it is too slow for CI).
fn builder(preemption_bound: Option<usize>) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = preemption_bound;
    b
}

/// The worker runs an operation enqueued by one thread while another waits for its position:
/// the waiter returns only once the operation completed, sees its effect, and is woken (no lost
/// wake-up: a waiter asleep forever is a loom deadlock); `synchronize` after the enqueue sees it
/// too. Preemption bound 3 (four threads: main, worker, enqueuer, waiter; ~25 s; 4 takes minutes).
#[test]
fn worker_enqueue_wait_complete() {
    builder(Some(3)).check(|| {
        let w = Worker::spawn();
        let effect = Arc::new(AtomicUsize::new(0));
        let (w1, e1) = (w.clone(), effect.clone());
        let enqueuer = thread::spawn(move || {
            w1.enqueue(move |err| {
                assert!(err.is_none());
                e1.store(1, Relaxed);
                Ok(())
            })
            .unwrap()
        });
        let (w2, e2) = (w.clone(), effect.clone());
        let waiter = thread::spawn(move || {
            w2.wait_for(1).unwrap();
            assert!(w2.reached(1));
            assert_eq!(
                e2.load(Relaxed),
                1,
                "completion observed before the op's effect"
            );
        });
        assert_eq!(enqueuer.join().unwrap(), 1);
        w.synchronize().unwrap();
        assert_eq!(
            effect.load(Relaxed),
            1,
            "synchronize returned before the op's effect"
        );
        waiter.join().unwrap();
        assert!(w.error().is_none());
        w.shutdown();
    });
}

/// The planted defect (`Worker::spawn_planted_late_wake`): completion notifies a waiter only one
/// operation past its position. A waiter asleep for the last operation then sleeps forever, which
/// loom must report as a deadlock. loom's deadlock report aborts the process (a panic while its
/// threads unwind), so the model runs in a child process (`planted_late_wake_model`, ignored
/// unless asked for), which must fail with loom's deadlock message. Exhaustive (under 1 s).
#[test]
fn planted_late_wake_is_caught() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "planted_late_wake_model",
            "--nocapture",
        ])
        .output()
        .expect("run the planted model in a child process");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "the model passed with the planted late wake-up:\n{text}"
    );
    assert!(
        text.contains("deadlock"),
        "the model failed, but not with a deadlock:\n{text}"
    );
    eprintln!("planted late wake-up caught (loom: deadlock)");
}

/// The model of `planted_late_wake_is_caught` (run only by it: it must fail).
#[test]
#[ignore = "must fail: run by planted_late_wake_is_caught in a child process"]
fn planted_late_wake_model() {
    loom::model(|| {
        let w = Worker::spawn_planted_late_wake();
        let w1 = w.clone();
        let waiter = thread::spawn(move || w1.wait_for(1).unwrap());
        w.enqueue(|_| Ok(())).unwrap();
        waiter.join().unwrap();
        w.shutdown();
    });
}

/// Two operations from two threads, and a host thread that synchronizes: whatever position it
/// saw is complete, with its effects, when `synchronize` returns; every effect is visible after
/// both enqueues and a final synchronize. Preemption bound 2 (~4 s; 3 takes ~50 s).
#[test]
fn worker_two_enqueuers_and_synchronize() {
    builder(Some(2)).check(|| {
        let w = Worker::spawn();
        let effects = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let enqueuers: Vec<_> = (0..2)
            .map(|i| {
                let (w, e) = (w.clone(), effects.clone());
                thread::spawn(move || {
                    w.enqueue(move |_| {
                        e[i].store(1, Relaxed);
                        Ok(())
                    })
                    .unwrap()
                })
            })
            .collect();
        let pos = w.position();
        w.synchronize().unwrap();
        let done = effects.iter().filter(|e| e.load(Relaxed) == 1).count() as u64;
        assert!(done >= pos, "synchronize returned before position {pos}");
        for t in enqueuers {
            t.join().unwrap();
        }
        w.synchronize().unwrap();
        assert!(effects.iter().all(|e| e.load(Relaxed) == 1));
        w.shutdown();
    });
}

/// Each rank's "buffer": a loom cell whose accesses loom checks for races, and a `Relaxed` flag
/// cleared when its owner's `run_round` has returned (the buffer is freed).
struct Buffers {
    cells: [UnsafeCell<()>; 2],
    alive: [AtomicBool; 2],
}

// SAFETY: the cells hold `()` and are only used to record accesses (`with_mut` without
// dereferencing), which loom checks; nothing is read or written through them.
unsafe impl Sync for Buffers {}
// SAFETY: as for Sync.
unsafe impl Send for Buffers {}

impl Buffers {
    fn new() -> Arc<Buffers> {
        Arc::new(Buffers {
            cells: [UnsafeCell::new(()), UnsafeCell::new(())],
            alive: [AtomicBool::new(true), AtomicBool::new(true)],
        })
    }

    /// A peer copies into rank `r`'s buffer.
    fn touch(&self, r: usize) {
        assert!(
            self.alive[r].load(Relaxed),
            "rank {r}'s buffer touched after its run_round returned"
        );
        self.cells[r].with_mut(|_| ());
    }

    /// Rank `r`'s run_round returned: its operation frees the buffer.
    fn free(&self, r: usize) {
        self.alive[r].store(false, Relaxed);
        self.cells[r].with_mut(|_| ());
    }
}

/// How a rank behaves in a round.
#[derive(Clone, Copy)]
struct Plan {
    /// The body fails after copying.
    fail: bool,
    /// The body waits at phase barrier 0 after its first copy, then copies again.
    barrier: bool,
}

/// One rank: a round whose body writes into the peer's buffer; frees its own on return.
fn rank(rv: &Rendezvous, bufs: &Buffers, r: usize, plan: Plan) -> Result<()> {
    let res = rv.run_round(0, r, (r as u64, r as u64 + 10), |ptrs| {
        assert_eq!(ptrs, &[(0, 10), (1, 11)]);
        let peer = 1 - r;
        bufs.touch(peer);
        if plan.barrier {
            rv.barrier(0, 0)?;
            bufs.touch(peer);
        }
        if plan.fail {
            return Err(HalError::Internal("the body failed".into()));
        }
        Ok(())
    });
    bufs.free(r);
    res
}

/// Spawns the two ranks; returns their results.
fn two_ranks(
    rv: &Arc<Rendezvous>,
    bufs: &Arc<Buffers>,
    plans: [Plan; 2],
) -> Vec<thread::JoinHandle<Result<()>>> {
    (0..2)
        .map(|r| {
            let (rv, bufs) = (rv.clone(), bufs.clone());
            thread::spawn(move || rank(&rv, &bufs, r, plans[r]))
        })
        .collect()
}

const OK: Plan = Plan {
    fail: false,
    barrier: false,
};

/// Both ranks succeed, through a phase barrier. Preemption bound 4 (under 1 s; exhaustive takes
/// ~35 s).
#[test]
fn rendezvous_success() {
    builder(Some(4)).check(|| {
        let rv = Arc::new(Rendezvous::new(2));
        let bufs = Buffers::new();
        let plan = Plan {
            fail: false,
            barrier: true,
        };
        for t in two_ranks(&rv, &bufs, [plan, plan]) {
            t.join().unwrap().unwrap();
        }
    });
}

/// The planted defect (`Rendezvous::plant_no_closing_barrier`): a rank whose body succeeded
/// leaves without meeting the others at the closing barrier, while its peer may still copy into
/// its buffer after their phase barrier. The model must fail on the freed buffer.
#[test]
fn planted_leave_without_closing_barrier_is_caught() {
    let r = std::panic::catch_unwind(|| {
        builder(Some(3)).check(|| {
            let rv = Arc::new(Rendezvous::new(2));
            rv.plant_no_closing_barrier();
            let bufs = Buffers::new();
            let plan = Plan {
                fail: false,
                barrier: true,
            };
            for t in two_ranks(&rv, &bufs, [plan, plan]) {
                if let Err(p) = t.join() {
                    // The rank's own panic (a loom model thread's), re-raised with its message.
                    panic!("{}", panic_message(&*p));
                }
            }
        })
    });
    let e = r.expect_err("the model passed with the planted early leave");
    let msg = panic_message(&*e);
    assert!(
        msg.contains("touched after its run_round returned") || msg.contains("Causality"),
        "the model failed, but not on the planted early leave: {msg}"
    );
    eprintln!("planted early leave caught: {msg}");
}

/// Rank 1's body fails (after copying into rank 0's buffer) while rank 0 is started or still
/// waiting: rank 1 returns only once rank 0 no longer touches its buffer; rank 0 either ran its
/// body or failed without touching anything. Exhaustive (under 1 s).
#[test]
fn rendezvous_one_rank_fails() {
    builder(None).check(|| {
        let rv = Arc::new(Rendezvous::new(2));
        let bufs = Buffers::new();
        let fail = Plan {
            fail: true,
            barrier: false,
        };
        let mut ts = two_ranks(&rv, &bufs, [OK, fail]);
        let r1 = ts.pop().unwrap().join().unwrap();
        let r0 = ts.pop().unwrap().join().unwrap();
        assert!(matches!(r1, Err(HalError::Internal(_))), "{r1:?}");
        if let Err(e) = r0 {
            assert!(matches!(e, HalError::InvalidArgument { .. }), "{e:?}");
        }
    });
}

/// A third thread aborts the communicator at any point, ranks meeting at a phase barrier: every
/// rank finishes (Ok or Aborted), none touches a freed buffer. Preemption bound 2 (3 took 112 s
/// once the waits poll before sleeping; 2 keeps CI's loom step short).
#[test]
fn rendezvous_abort() {
    builder(Some(2)).check(|| {
        let rv = Arc::new(Rendezvous::new(2));
        let bufs = Buffers::new();
        let plan = Plan {
            fail: false,
            barrier: true,
        };
        let ts = two_ranks(&rv, &bufs, [plan, plan]);
        let rv2 = rv.clone();
        let aborter = thread::spawn(move || rv2.abort());
        for t in ts {
            match t.join().unwrap() {
                Ok(()) | Err(HalError::Aborted { .. }) => {}
                Err(HalError::InvalidArgument { .. }) => {} // the peer left aborted
                Err(e) => panic!("{e:?}"),
            }
        }
        aborter.join().unwrap();
    });
}

/// The clock expires at any point (a third thread expires it, then wakes the waiters through the
/// state lock), ranks meeting at a phase barrier: every rank finishes (Ok or Timeout), none
/// touches a freed buffer, a rank arriving after its peer timed out is turned away.
/// Preemption bound 2 (3 took 98 s once the waits poll before sleeping; 2 keeps CI's loom step
/// short).
#[test]
fn rendezvous_timeout() {
    builder(Some(2)).check(|| {
        loom_clock::start();
        let rv = Arc::new(Rendezvous::new(2));
        let bufs = Buffers::new();
        let plan = Plan {
            fail: false,
            barrier: true,
        };
        let ts = two_ranks(&rv, &bufs, [plan, plan]);
        let rv2 = rv.clone();
        let clock = thread::spawn(move || {
            loom_clock::expire();
            rv2.notify_all();
        });
        for t in ts {
            match t.join().unwrap() {
                Ok(()) | Err(HalError::Timeout { .. }) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        clock.join().unwrap();
    });
}

/// The items of one compute pool job, written by whichever thread runs them (loom cells: an
/// access the pool does not order is a reported race).
struct Items([UnsafeCell<u32>; 2]);
// SAFETY: the cells are loom's, which check every access; sharing them is what the model tests.
unsafe impl Sync for Items {}

impl Items {
    /// Item `i` ran once more.
    fn run(&self, i: u64) {
        // SAFETY: loom cells; the model checks that the pool orders these accesses.
        self.0[i as usize].with_mut(|c| unsafe { *c += 1 });
    }
}

/// Two jobs of two items on a pool of 2 threads (the caller and one helper that joins at any
/// point, or not at all), then the pool is dropped and the helper ends: every item runs once,
/// its effect is visible to the caller when `for_each` returns, and no helper touches a job after
/// its `for_each` returned. `planted` makes the caller skip the wait for joined helpers.
fn compute_pool_model(planted: bool) {
    let pool = ComputePool::new(2);
    if planted {
        pool.plant_no_wait();
    }
    for _ in 0..2 {
        let items = Items([UnsafeCell::new(0), UnsafeCell::new(0)]);
        pool.for_each(2, &|i| items.run(i));
        for c in &items.0 {
            // SAFETY: loom cells; the model checks that the pool ordered the items' writes.
            c.with(|v| assert_eq!(unsafe { *v }, 1, "an item ran other than once"));
        }
    }
    drop(pool);
}

/// The compute pool (`src/compute.rs`) over its production code. Preemption bound 4 (~3 s; the
/// exhaustive model did not finish in 5 minutes).
#[test]
fn compute_pool_jobs() {
    builder(Some(4)).check(|| compute_pool_model(false));
}

/// The planted defect (`ComputePool::plant_no_wait`): the caller returns while a helper that
/// joined may still run an item or claim the next. The model must fail on the race.
#[test]
fn planted_compute_pool_no_wait_is_caught() {
    let r = std::panic::catch_unwind(|| builder(Some(3)).check(|| compute_pool_model(true)));
    let e = r.expect_err("the model passed with the planted early return");
    let msg = panic_message(&*e);
    assert!(
        msg.contains("Causality") || msg.contains("a helper used a finished job"),
        "the model failed, but not on the planted early return: {msg}"
    );
    eprintln!("planted early return caught: {msg}");
}
