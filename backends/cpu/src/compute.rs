//! A device's compute pool: the fork-join that runs a kernel launch's blocks and a matmul's
//! panels on `UNIHAL_CPU_THREADS` threads, where the calling stream worker is one of them.
//!
//! A training step is hundreds of small operations one after another on one stream. A pool the
//! worker hands each operation to and then sleeps on (as a rayon `install` from outside the pool
//! does) pays two thread hand-offs per operation and runs one thread more than it has cores for:
//! on 2 cores, 2 compute threads and the sleeping worker. Here the worker publishes the job and
//! runs its items itself; helpers (threads − 1 of them) that are awake join and claim items from
//! the same counter, a chunk at a time. Nothing waits for a helper that has not joined: when the
//! helpers are asleep or descheduled, the worker runs every item, and it waits only for the
//! chunks helpers have claimed. Between jobs a helper polls for the next one for a while
//! (yielding, so the host thread that enqueues keeps its core), then sleeps.
//!
//! One job at a time: a second stream of the device whose job finds the pool busy runs its items
//! alone, on its own worker, rather than wait.
//!
//! The protocol (model-checked in `tests/loom.rs`): the caller publishes a job under the lock and
//! bumps `generation`; a helper joins only under the lock while the job is published, and counts
//! itself in `joined`; the caller, out of items, withdraws the job under the lock (no one joins
//! after) and waits until every helper that joined has left (`left == joined`). Only then does
//! `for_each` return, so the job, which lives on the caller's stack, outlives every use of it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use unihal_hal::sync::{self, Arc, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

/// How many times a helper polls ([`sync::poll_briefly`], about 20 µs each) for the next job
/// before it sleeps. Consecutive operations of a stream are microseconds apart; a step's
/// synchronisation, the host's own work between steps, much longer. Under loom, once.
const HELPER_POLLS: usize = if cfg!(loom) { 1 } else { 16 };

/// Items per claim: a few claims per participant, so a participant that loses its core holds
/// back little, without an atomic operation per small item.
fn chunk_for(items: u64, participants: usize) -> u64 {
    (items / (participants as u64 * 4)).max(1)
}

/// The pool of one device. `Sync`: any of the device's stream workers may call
/// [`ComputePool::for_each`]; dropping it ends the helper threads once they finish their job.
pub(crate) struct ComputePool {
    shared: Arc<Shared>,
    threads: usize,
}

struct Shared {
    state: Mutex<State>,
    /// Sleeping helpers wait here for a job or the shutdown.
    job_ready: Condvar,
    /// A caller waits here for the helpers that joined its job to leave.
    helpers_left: Condvar,
    /// Bumped (under the lock) at each publication and at shutdown: what polling helpers watch.
    generation: AtomicU64,
    /// Mirrors of `State::{joined, left}` for the caller's polling (decisions are under the lock).
    joined: AtomicUsize,
    left: AtomicUsize,
    /// Some caller owns the job slot.
    busy: AtomicBool,
    /// The planted defect of the loom model: the caller returns without waiting for the helpers
    /// that joined its job.
    #[cfg(loom)]
    planted_no_wait: AtomicBool,
}

struct State {
    /// The published job, while helpers may still join it.
    job: Option<JobRef>,
    joined: usize,
    left: usize,
    /// Helpers asleep on `job_ready`.
    sleepers: usize,
    /// The caller sleeps on `helpers_left`.
    caller_sleeps: bool,
    shutdown: bool,
}

/// The items of one `for_each` call.
struct Job<'a> {
    next: AtomicU64,
    items: u64,
    chunk: u64,
    f: &'a (dyn Fn(u64) + Sync),
    panicked: AtomicBool,
    /// Under loom: the job's lifetime as a model-checked cell. A helper reads it before each
    /// claim and the caller writes it when `for_each` ends, so a helper's use that is not ordered
    /// before the end is a reported race (the job itself is leaked there, never freed under it).
    #[cfg(loom)]
    alive: loom::cell::UnsafeCell<bool>,
}

impl Job<'_> {
    /// Claims and runs chunks until none is left; a panic of `f` ends this participant's share
    /// and is reported to the caller.
    fn run(&self) {
        let ran = catch_unwind(AssertUnwindSafe(|| loop {
            #[cfg(loom)]
            // SAFETY: a loom cell: the model checks this read against the caller's end.
            self.alive
                .with(|a| assert!(unsafe { *a }, "a helper used a finished job"));
            let start = self.next.fetch_add(self.chunk, Ordering::Relaxed);
            if start >= self.items {
                return;
            }
            for i in start..(start + self.chunk).min(self.items) {
                (self.f)(i);
            }
        }));
        if ran.is_err() {
            self.panicked.store(true, Ordering::Relaxed);
        }
    }
}

/// A published job's address, its lifetime erased.
#[derive(Clone, Copy)]
struct JobRef(*const Job<'static>);
// SAFETY: a `Job` is `Sync` (atomics and a `Sync` closure), and the protocol (module docs) keeps
// it alive while any helper holds this reference.
unsafe impl Send for JobRef {}

impl ComputePool {
    /// A pool of `threads` compute threads in all: the caller and `threads - 1` helper threads,
    /// named `{name}-{i}`. With 1 thread, every job runs on its caller.
    ///
    /// # Errors
    /// The OS refused a thread (the helpers already started end with the pool).
    pub(crate) fn new(threads: usize, name: &str) -> std::io::Result<ComputePool> {
        let pool = ComputePool {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    job: None,
                    joined: 0,
                    left: 0,
                    sleepers: 0,
                    caller_sleeps: false,
                    shutdown: false,
                }),
                job_ready: Condvar::new(),
                helpers_left: Condvar::new(),
                generation: AtomicU64::new(0),
                joined: AtomicUsize::new(0),
                left: AtomicUsize::new(0),
                busy: AtomicBool::new(false),
                #[cfg(loom)]
                planted_no_wait: AtomicBool::new(false),
            }),
            threads: threads.max(1),
        };
        // Helpers spin between jobs only when they, the caller and the thread that enqueues the
        // work can each have a core; otherwise they yield, so those threads run at once.
        let spin = sync::cores_for(pool.threads + 1);
        for i in 1..pool.threads {
            let s = pool.shared.clone();
            sync::spawn(format!("{name}-{i}"), move || s.help(spin))?;
        }
        Ok(pool)
    }

    /// The compute threads, the caller included.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i` in `0..items`, each once, on the caller and the helpers that
    /// join; returns once every call has returned. Calls run concurrently and in no set order.
    ///
    /// # Panics
    /// When a call of `f` panicked (after every other call has returned).
    pub(crate) fn for_each(&self, items: u64, f: &(dyn Fn(u64) + Sync)) {
        let s = &*self.shared;
        if self.threads == 1 || items < 2 || s.busy.swap(true, Ordering::Acquire) {
            (0..items).for_each(f);
            return;
        }
        let job = Job {
            next: AtomicU64::new(0),
            items,
            chunk: chunk_for(items, self.threads),
            f,
            panicked: AtomicBool::new(false),
            #[cfg(loom)]
            alive: loom::cell::UnsafeCell::new(true),
        };
        #[cfg(not(loom))]
        let job = &job;
        #[cfg(loom)]
        let job: &Job<'_> = Box::leak(Box::new(job));
        {
            let mut g = s.state.lock();
            // SAFETY (of the erased lifetime): `Withdraw` below takes the job back and waits for
            // every helper that joined before `job` goes out of scope, on every path.
            let erased = JobRef(std::ptr::from_ref(job).cast::<Job<'static>>());
            g.job = Some(erased);
            g.joined = 0;
            g.left = 0;
            s.joined.store(0, Ordering::Relaxed);
            s.left.store(0, Ordering::Relaxed);
            s.generation.fetch_add(1, Ordering::Release);
            if g.sleepers > 0 {
                s.job_ready.notify_all();
            }
        }
        let withdraw = Withdraw(s);
        job.run();
        drop(withdraw);
        #[cfg(loom)]
        // SAFETY: a loom cell: the model checks this write against every helper's reads.
        job.alive.with_mut(|a| unsafe { *a = false });
        if job.panicked.load(Ordering::Relaxed) {
            panic!("a compute pool item panicked");
        }
    }

    /// Plants the defect the loom model must catch (see `Shared::planted_no_wait`).
    #[cfg(loom)]
    pub(crate) fn plant_no_wait(&self) {
        self.shared.planted_no_wait.store(true, Ordering::Relaxed);
    }
}

impl Drop for ComputePool {
    fn drop(&mut self) {
        let mut g = self.shared.state.lock();
        g.shutdown = true;
        self.shared.generation.fetch_add(1, Ordering::Release);
        self.shared.job_ready.notify_all();
    }
}

/// Withdraws the published job and waits for the helpers that joined it, also when the caller's
/// own share unwinds: the job must outlive every helper's use.
struct Withdraw<'a>(&'a Shared);

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        let s = self.0;
        let mut g = s.state.lock();
        g.job = None;
        #[cfg(loom)]
        if s.planted_no_wait.load(Ordering::Relaxed) {
            drop(g);
            s.busy.store(false, Ordering::Release);
            return;
        }
        let mut polls = 0;
        while g.left < g.joined {
            if polls < sync::POLLS_BEFORE_SLEEP {
                // A joined helper holds at most one chunk: poll for it rather than sleep.
                polls += 1;
                drop(g);
                sync::poll_briefly(false, || {
                    s.left.load(Ordering::Acquire) >= s.joined.load(Ordering::Acquire)
                });
                g = s.state.lock();
                continue;
            }
            g.caller_sleeps = true;
            s.helpers_left.wait(&mut g);
            g.caller_sleeps = false;
        }
        drop(g);
        s.busy.store(false, Ordering::Release);
    }
}

impl Shared {
    /// A helper thread's loop: wait for a job (polling, then asleep), join it, run its share,
    /// leave; until the pool is dropped.
    fn help(&self, spin: bool) {
        // The generation the pool started with, not a fresh load: a helper that starts late must
        // still see the publications (and the shutdown) made before it ran.
        let mut seen = 0;
        loop {
            let mut polls = 0;
            while polls < HELPER_POLLS && self.generation.load(Ordering::Acquire) == seen {
                polls += 1;
                let p =
                    sync::poll_briefly(spin, || self.generation.load(Ordering::Acquire) != seen);
                if p == sync::Polled::Contended {
                    break;
                }
            }
            let mut g = self.state.lock();
            // The generation only changes under the lock: unchanged here means asleep until the
            // next publication's notification.
            while self.generation.load(Ordering::Acquire) == seen {
                g.sleepers += 1;
                self.job_ready.wait(&mut g);
                g.sleepers -= 1;
            }
            seen = self.generation.load(Ordering::Acquire);
            if g.shutdown {
                return;
            }
            // Withdrawn already (the caller ran every item): nothing to join.
            let Some(job) = g.job else { continue };
            g.joined += 1;
            self.joined.store(g.joined, Ordering::Release);
            drop(g);
            // SAFETY: joined under the lock while published: the caller waits for this helper's
            // leave below before the job goes (module docs).
            unsafe { &*job.0 }.run();
            let mut g = self.state.lock();
            g.left += 1;
            self.left.store(g.left, Ordering::Release);
            if g.caller_sleeps && g.left == g.joined {
                self.helpers_left.notify_one();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_item_runs_once_on_any_number_of_threads() {
        for threads in [1, 2, 3, 8] {
            let pool = ComputePool::new(threads, "test-pool").unwrap();
            for items in [0u64, 1, 2, 7, 1000] {
                let hits: Vec<AtomicU32> = (0..items).map(|_| AtomicU32::new(0)).collect();
                pool.for_each(items, &|i| {
                    hits[i as usize].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn concurrent_callers_each_run_their_items() {
        let pool = std::sync::Arc::new(ComputePool::new(2, "test-pool").unwrap());
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        let sum = AtomicU64::new(0);
                        pool.for_each(100, &|i| {
                            sum.fetch_add(i, Ordering::Relaxed);
                        });
                        assert_eq!(sum.load(Ordering::Relaxed), 4950);
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
    }

    #[test]
    fn a_panicking_item_panics_the_caller_after_the_others_ran() {
        let pool = ComputePool::new(2, "test-pool").unwrap();
        let ran = AtomicU32::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.for_each(64, &|i| {
                if i == 5 {
                    panic!("item 5");
                }
                ran.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(r.is_err());
        // The pool works again afterwards.
        let n = AtomicU32::new(0);
        pool.for_each(10, &|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 10);
    }
}
