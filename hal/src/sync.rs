//! The synchronisation primitives of unihal's own concurrency protocols (host buffer states, the
//! buffer lease of sub-allocated blocks, the CPU stream worker, the collective rendezvous), in one
//! place so that a model checker can replace
//! them.
//!
//! Normally these are `parking_lot`'s lock and condition variable and `std`'s atomics. Built with
//! `RUSTFLAGS="--cfg loom"`, they are [loom](https://docs.rs/loom)'s, and the same production code
//! runs under loom's exhaustive scheduler (see `tests/loom.rs` in the crates that use it). A timed
//! wait is modelled as "may time out": under loom, [`Condvar::wait_until`] waits for a
//! notification and then reports a timeout when the test's clock ([`loom_clock`]) has expired, so
//! every interleaving of a timeout with the other threads' steps is explored.
//!
//! The API is `parking_lot`'s shape (no poisoning, guards waited on in place), which both
//! implementations provide. Thread-safe: these are synchronisation primitives. Besides the lock,
//! condition variable, atomics and `Arc`, the module has what a protocol needs around them so that
//! it has no `cfg(loom)` branches of its own: [`spawn`] (a named, detached thread), [`spin_loop`]
//! (a busy-wait hint; a yield under loom) and [`thread_local!`] (loom's per-model-thread locals
//! under loom: loom runs every model thread on one OS thread, so `std`'s would be shared).
//! [`AtomicPtr`] is for lock-free lists of raw nodes, and [`UnsafeCell`] (loom's API shape: `with`,
//! `with_mut`) for the plain memory such a protocol hands between threads, whose every access loom
//! then checks for races.
//!
//! Normal builds are unchanged: every wrapper is a `#[inline]` call of the `parking_lot` or `std`
//! item it wraps.

#[cfg(not(loom))]
pub use std::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub use std::sync::Arc;

#[cfg(loom)]
pub use loom::sync::atomic::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub use loom::sync::Arc;

/// `std::thread_local!` (loom's under `cfg(loom)`: one value per model thread).
#[cfg(not(loom))]
pub use std::thread_local;

/// `std::thread_local!` (loom's under `cfg(loom)`: one value per model thread).
#[cfg(loom)]
pub use loom::thread_local;

/// Starts a detached thread named `name` running `f` (`std::thread::Builder`; under loom, a model
/// thread, which the model must let finish).
///
/// # Errors
/// The OS refused to create the thread.
#[inline]
pub fn spawn<F>(name: String, f: F) -> std::io::Result<()>
where
    F: FnOnce() + Send + 'static,
{
    #[cfg(not(loom))]
    let spawned = std::thread::Builder::new().name(name).spawn(f);
    #[cfg(loom)]
    let spawned = loom::thread::Builder::new().name(name).spawn(f);
    spawned.map(drop)
}

/// Marks where a protocol relies on `SeqCst` accesses to order a store before a later load of
/// *another* atomic (the store-buffering / Dekker pattern: "I announce, then check yours; you
/// announce, then check mine; one of us sees the other"). Normally a no-op: the `SeqCst` accesses
/// themselves give that order. Under loom a `SeqCst` fence, because loom models `SeqCst` accesses
/// as `AcqRel` (it does not forbid store buffering between them: tokio-rs/loom#180) but does model
/// `SeqCst` fences. Call it between the store (or read-modify-write) and the load, on both sides.
///
/// The fence only restores what the production accesses already guarantee; it cannot stand in for
/// them, so keep those `SeqCst` (loom would not notice them weakened to `AcqRel` at these points).
#[inline(always)]
pub fn seq_cst_store_load() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// One step of a busy wait: `std::hint::spin_loop`; under loom a yield, so that the model
/// scheduler runs the other threads (a loom spin must also be bounded by a count, not by time:
/// executions must be deterministic).
#[inline(always)]
pub fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// How many times a waiter polls ([`poll_briefly`]) before it sleeps on its condition variable:
/// a wake-up through the kernel costs several microseconds, more than most waits for a peer that
/// is already running. Under loom, once (the path is explored, the state space stays small).
pub const POLLS_BEFORE_SLEEP: usize = if cfg!(loom) { 1 } else { 4 };

/// What [`poll_briefly`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// The awaited change happened.
    Changed,
    /// The time ran out.
    Quiet,
    /// A yield lost the core for over 500 µs: another process is busy on this
    /// machine, and polling by yielding now costs whole time slices; better sleep for a while.
    Contended,
}

/// Waits a short while (about 20 µs; under loom, one yield) for `changed` without sleeping. With
/// `spin`, busy-waits ([`spin_loop`]), for when every thread of the protocol has a core of its own;
/// without, yields the core between looks, for when the threads it waits for may need this core
/// (more runnable threads than cores): a yield lets them run at once, where sleeping would let the
/// core go idle (on a virtual machine an idle core halts, and waking it costs tens of
/// microseconds). A hint only: a protocol decides under its lock, never on this result.
#[inline]
pub fn poll_briefly(spin: bool, mut changed: impl FnMut() -> bool) -> Polled {
    #[cfg(not(loom))]
    {
        use std::time::{Duration, Instant};
        const POLL: Duration = Duration::from_micros(20);
        let until = Instant::now() + POLL;
        loop {
            if changed() {
                return Polled::Changed;
            }
            if spin {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            } else {
                let t0 = Instant::now();
                std::thread::yield_now();
                // Peers of the protocol run for microseconds between changes; a yield that lost
                // the core for longer than this ran someone else's work.
                if t0.elapsed() > Duration::from_micros(500) {
                    return if changed() {
                        Polled::Changed
                    } else {
                        Polled::Contended
                    };
                }
            }
            if Instant::now() >= until {
                return if changed() {
                    Polled::Changed
                } else {
                    Polled::Quiet
                };
            }
        }
    }
    #[cfg(loom)]
    {
        let _ = spin;
        if changed() {
            return Polled::Changed;
        }
        loom::thread::yield_now();
        if changed() {
            Polled::Changed
        } else {
            Polled::Quiet
        }
    }
}

/// True when `threads` busy threads can each have a core of their own: the CPUs this process may
/// run on (`std::thread::available_parallelism`, which follows affinity masks and cgroup quotas),
/// read once. Under loom, false.
pub fn cores_for(threads: usize) -> bool {
    #[cfg(not(loom))]
    {
        static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        threads <= cores
    }
    #[cfg(loom)]
    {
        let _ = threads;
        false
    }
}

#[cfg(not(loom))]
mod imp {
    use std::time::Instant;

    /// A mutex without poisoning.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(parking_lot::Mutex<T>);

    /// The guard of a locked [`Mutex`].
    pub type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        /// A new unlocked mutex holding `v`.
        #[inline]
        pub fn new(v: T) -> Mutex<T> {
            Mutex(parking_lot::Mutex::new(v))
        }
        /// Locks, blocking until the mutex is free.
        #[inline]
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
    }

    /// A condition variable for [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(parking_lot::Condvar);

    impl Condvar {
        /// A new condition variable.
        #[inline]
        pub fn new() -> Condvar {
            Condvar(parking_lot::Condvar::new())
        }
        /// Releases the guard's lock until notified (or spuriously woken), then relocks.
        #[inline]
        pub fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
            self.0.wait(g)
        }
        /// As [`Condvar::wait`], also waking at `deadline`; true when the deadline has passed.
        #[inline]
        pub fn wait_until<T>(&self, g: &mut MutexGuard<'_, T>, deadline: Instant) -> bool {
            self.0.wait_until(g, deadline).timed_out()
        }
        /// Wakes every waiter.
        #[inline]
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
        /// Wakes one waiter.
        #[inline]
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
    }
}

#[cfg(loom)]
mod imp {
    use std::ops::{Deref, DerefMut};
    use std::time::Instant;

    /// loom's mutex, without poisoning.
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard of a locked [`Mutex`]; `None` only while a wait has lent it to loom.
    pub struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard present outside a wait")
        }
    }
    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard present outside a wait")
        }
    }

    impl<T> Mutex<T> {
        /// A new unlocked mutex holding `v`.
        pub fn new(v: T) -> Mutex<T> {
            Mutex(loom::sync::Mutex::new(v))
        }
        /// Locks, blocking until the mutex is free.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(|e| e.into_inner())))
        }
    }

    /// loom's condition variable.
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        /// A new condition variable.
        pub fn new() -> Condvar {
            Condvar(loom::sync::Condvar::new())
        }
        /// Releases the guard's lock until notified, then relocks.
        pub fn wait<T>(&self, g: &mut MutexGuard<'_, T>) {
            let inner = g.0.take().expect("guard present");
            g.0 = Some(self.0.wait(inner).unwrap_or_else(|e| e.into_inner()));
        }
        /// Waits for a notification; true when the model's clock has expired ("may time out").
        pub fn wait_until<T>(&self, g: &mut MutexGuard<'_, T>, _deadline: Instant) -> bool {
            if super::loom_clock::expired() {
                return true;
            }
            self.wait(g);
            super::loom_clock::expired()
        }
        /// Wakes every waiter.
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
        /// Wakes one waiter.
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
    }
}

pub use imp::{Condvar, Mutex, MutexGuard};

/// Memory whose accesses a protocol orders itself: `std::cell::UnsafeCell` behind loom's API
/// (`with`, `with_mut`: a closure gets the raw pointer), so that under `--cfg loom` it is
/// `loom::cell::UnsafeCell` and loom reports every pair of accesses not ordered by the protocol
/// (a write concurrent with another access) as a race. Normally each call is the plain
/// `UnsafeCell::get`.
///
/// Not `Sync`, as `std`'s: the type that holds one states why sharing it is sound.
#[cfg(not(loom))]
#[derive(Debug, Default)]
pub struct UnsafeCell<T: ?Sized>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// A cell holding `v`.
    #[inline]
    pub const fn new(v: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    /// The value, consuming the cell.
    #[inline]
    pub fn into_inner(self) -> T {
        self.0.into_inner()
    }
}

#[cfg(not(loom))]
impl<T: ?Sized> UnsafeCell<T> {
    /// Calls `f` with a pointer for reading the value (a read access, under loom).
    #[inline(always)]
    pub fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a pointer for writing the value (a write access, under loom).
    #[inline(always)]
    pub fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Memory whose accesses a protocol orders itself (loom's cell: every access is checked).
#[cfg(loom)]
pub use loom::cell::UnsafeCell;

/// The clock of timed waits under loom: a test thread calls [`loom_clock::expire`] at some point
/// of the model, then notifies the condition variables it wants woken **while holding (or after
/// locking once) their mutex** — a waiter checks the clock under its mutex before it sleeps, so a
/// notification sent without the lock could fall between the check and the sleep and be lost.
/// From then on every timed wait reports a timeout. Fresh (not expired) in each loom execution.
///
/// Call [`loom_clock::start`] first thing in a model that uses timed waits: the clock is a loom
/// lazy static, and loom makes every later reader of a lazy static synchronise with the thread
/// that initialised it (it models `std::sync::Once`); initialised on the model's main thread before
/// it spawns, that edge adds nothing, initialised by whichever thread first waits it would order
/// that thread before every later waiter — an edge production code does not have, which could hide
/// a race. The clock's own load and store are `Relaxed` for the same reason: a timeout does not
/// synchronise with the thread that let the time pass; the mutex of the notified condition variable
/// orders the store before the woken waiter's check.
#[cfg(loom)]
pub mod loom_clock {
    use loom::sync::atomic::{AtomicBool, Ordering};

    loom::lazy_static! {
        static ref EXPIRED: AtomicBool = AtomicBool::new(false);
    }

    /// Initialises the clock (not expired) on the calling thread; see the module docs.
    pub fn start() {
        let _: &AtomicBool = &EXPIRED;
    }

    /// True once the clock has expired in this execution.
    pub fn expired() -> bool {
        EXPIRED.load(Ordering::Relaxed)
    }

    /// Expires the clock: every later timed wait times out (once woken; see the module docs).
    pub fn expire() {
        EXPIRED.store(true, Ordering::Relaxed);
    }
}
