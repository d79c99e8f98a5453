//! The stream worker: one host thread per stream, running its queue in order.
//!
//! Enqueue pushes a closure under a short lock and wakes the worker only if it sleeps. The worker
//! spins for a few microseconds after draining its queue (to keep enqueue-to-start latency low under
//! a steady stream of work), then sleeps on a condition variable: an idle stream uses no CPU.
//! Completion is a counter; host waiters sleep on a second condition variable and are notified only
//! when the counter reaches the lowest position someone waits for (not after every operation: a
//! thread waiting in `synchronize` behind a hundred queued operations is woken once, not a hundred
//! times, which on a machine with fewer cores than threads took the core from the workers).
//!
//! The protocol's primitives come from [`unihal_hal::sync`], so the loom suite
//! (`tests/loom.rs`, `--cfg loom`) model-checks this very code. Under loom the spin phase is bounded
//! by a count (one look at the push counter, a yield, a second look) instead of a time: executions
//! must be deterministic, and the spin only decides how soon the worker sleeps, never what it runs
//! (it always takes the queue lock before popping).

use crate::fault::{Fault, FaultSwitch};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use unihal_hal::sync::{self, Arc, AtomicBool, AtomicU64, Condvar, Mutex, Ordering};
use unihal_hal::{HalError, Invalid, Result};

#[cfg(not(loom))]
std::thread_local! {
    /// The worker whose thread this is (its shared state's address), or 0 on other threads.
    static CURRENT_WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}
// The same under loom, one per model thread (loom's `thread_local!` takes no `const { }`).
#[cfg(loom)]
sync::thread_local! {
    static CURRENT_WORKER: std::cell::Cell<usize> = std::cell::Cell::new(0);
}

/// A queued operation. It receives the stream's sticky error, if one is set when its turn comes: it
/// must then only signal events, not do its work. `FnMut`, not `FnOnce`, so that the very
/// operation a stream capture records can run at every replay of the graph (`crate::graph`); an
/// eager operation runs once and is dropped (with everything it holds) before its completion is
/// visible.
pub(crate) type Op = Box<dyn FnMut(Option<&HalError>) -> Result<()> + Send>;

struct Queue {
    ops: VecDeque<Op>,
    sleeping: bool,
    shutdown: bool,
}

/// State shared by a stream handle, its worker and the device.
pub(crate) struct WorkerShared {
    queue: Mutex<Queue>,
    wake: Condvar,
    enqueued: AtomicU64,
    /// Operations pushed to the queue (the worker compares it with its own pop count while spinning).
    pushed: AtomicU64,
    completed: AtomicU64,
    /// The positions host threads wait for (one entry per waiter), under the lock `done` uses.
    waiting_for: Mutex<Vec<u64>>,
    done: Condvar,
    /// The lowest entry of `waiting_for` (`u64::MAX` when nobody waits): completion notifies
    /// only once it reaches this.
    wake_at: AtomicU64,
    has_error: AtomicBool,
    error: Mutex<Option<HalError>>,
    fault: FaultSwitch,
    /// Planted defect (loom's self-check): completion notifies one operation late.
    #[cfg(loom)]
    pub(crate) planted_late_wake: AtomicBool,
}

/// How long an idle worker spins before sleeping.
const SPIN: Duration = Duration::from_micros(20);

/// Whether the idle spin is over after `spins` looks at the push counter: at `until` (checked every
/// 64 looks); under loom after 2 looks (see the module docs).
#[inline(always)]
fn spin_over(spins: u32, until: Instant) -> bool {
    #[cfg(not(loom))]
    return spins % 64 == 0 && Instant::now() >= until;
    #[cfg(loom)]
    {
        let _ = until;
        spins >= 2
    }
}

impl WorkerShared {
    /// Starts a worker thread named `name`.
    pub(crate) fn spawn(name: String, fault: FaultSwitch) -> Result<Arc<WorkerShared>> {
        let shared = Arc::new(WorkerShared {
            queue: Mutex::new(Queue {
                ops: VecDeque::new(),
                sleeping: false,
                shutdown: false,
            }),
            wake: Condvar::new(),
            enqueued: AtomicU64::new(0),
            pushed: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            waiting_for: Mutex::new(Vec::new()),
            done: Condvar::new(),
            wake_at: AtomicU64::new(u64::MAX),
            has_error: AtomicBool::new(false),
            error: Mutex::new(None),
            fault,
            #[cfg(loom)]
            planted_late_wake: AtomicBool::new(false),
        });
        let w = shared.clone();
        sync::spawn(name, move || {
            crate::fault::track(crate::fault::Counter::Streams, 1);
            WorkerShared::run(w);
            crate::fault::track(crate::fault::Counter::Streams, -1);
        })
        .map_err(|e| HalError::Internal(format!("cannot start a stream worker thread: {e}")))?;
        Ok(shared)
    }

    /// The sticky error, if any.
    pub(crate) fn error(&self) -> Option<HalError> {
        if !self.has_error.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().clone()
    }

    /// Sets the sticky error unless one is set already.
    pub(crate) fn set_error(&self, e: HalError) {
        let mut slot = self.error.lock();
        if slot.is_none() {
            tracing::debug!(error = %e, "stream error (sticky)");
            *slot = Some(e);
            self.has_error.store(true, Ordering::Release);
        }
    }

    /// Queues `op` and returns its position (the stream is past it once `reached(position)`).
    /// Returns the sticky error instead when one is set.
    pub(crate) fn enqueue(&self, op: Op) -> Result<u64> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        if self.fault.is(Fault::InlineExecution) {
            let pos = self.enqueued.fetch_add(1, Ordering::SeqCst) + 1;
            self.execute(op);
            return Ok(pos);
        }
        let (pos, wake) = {
            let mut q = self.queue.lock();
            q.ops.push_back(op);
            let pos = self.enqueued.fetch_add(1, Ordering::SeqCst) + 1;
            self.pushed.fetch_add(1, Ordering::Release);
            (pos, std::mem::replace(&mut q.sleeping, false))
        };
        if wake {
            self.wake.notify_one();
        }
        Ok(pos)
    }

    /// Number of operations enqueued so far (a position in the stream).
    pub(crate) fn position(&self) -> u64 {
        self.enqueued.load(Ordering::SeqCst)
    }

    /// True when every operation up to `pos` has completed.
    pub(crate) fn reached(&self, pos: u64) -> bool {
        self.completed.load(Ordering::SeqCst) >= pos
    }

    /// Blocks until the operations enqueued so far have completed; returns the sticky error.
    ///
    /// # Errors
    /// The sticky error; `InvalidArgument` when called from one of this stream's own operations
    /// (a host callback), which would wait for itself forever.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.wait_for(self.position())?;
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// True on this worker's own thread (inside one of its operations, e.g. a host callback).
    pub(crate) fn is_current(&self) -> bool {
        CURRENT_WORKER.with(|c| c.get()) == self as *const WorkerShared as usize
    }

    /// The error of a wait, from one of a stream's own operations, for work queued after it.
    pub(crate) fn self_wait() -> HalError {
        HalError::invalid(
            "stream",
            Invalid::Other(
                "a host callback waited for work queued on its own stream after it, which would \
                 never complete (deadlock)"
                    .into(),
            ),
        )
    }

    /// Blocks until position `pos` is reached.
    ///
    /// # Errors
    /// `InvalidArgument` when called on this worker's own thread (from a host callback) for a
    /// position it has not reached: the worker would wait for itself forever.
    pub(crate) fn wait_for(&self, pos: u64) -> Result<()> {
        if self.reached(pos) {
            return Ok(());
        }
        if self.is_current() {
            return Err(Self::self_wait());
        }
        let mut g = self.waiting_for.lock();
        g.push(pos);
        self.wake_at.fetch_min(pos, Ordering::SeqCst);
        // Announce, then check `completed`; `execute` adds to `completed`, then checks `wake_at`:
        // one of the two sees the other, so a waiter never sleeps through its completion (and
        // the notification takes this lock, so it cannot fall between the check and the sleep).
        sync::seq_cst_store_load();
        while !self.reached(pos) {
            self.done.wait(&mut g);
        }
        if let Some(i) = g.iter().position(|&p| p == pos) {
            g.swap_remove(i);
        }
        let lowest = g.iter().copied().min().unwrap_or(u64::MAX);
        self.wake_at.store(lowest, Ordering::SeqCst);
        Ok(())
    }

    /// Asks the worker to exit once its queue is empty.
    pub(crate) fn shutdown(&self) {
        self.queue.lock().shutdown = true;
        self.wake.notify_one();
    }

    fn execute(&self, mut op: Op) {
        let err = self.error();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let r = op(err.as_ref());
            // Dropped here, with everything it holds, before completion becomes visible below.
            drop(op);
            r
        }));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.set_error(e),
            Err(_) => self.set_error(HalError::Internal(
                "an operation panicked on the stream worker".into(),
            )),
        }
        // The op (and everything it held: buffers, host-buffer uses) is dropped before completion
        // becomes visible.
        #[allow(unused_mut)]
        let mut completed = self.completed.fetch_add(1, Ordering::SeqCst) + 1;
        #[cfg(loom)]
        if self.planted_late_wake.load(Ordering::Relaxed) {
            completed -= 1;
        }
        sync::seq_cst_store_load(); // Pairs with `wait_for`'s.
        if completed >= self.wake_at.load(Ordering::SeqCst) {
            let _g = self.waiting_for.lock();
            self.done.notify_all();
        }
    }

    /// Takes the next operation: spins briefly (lock-free, on the push counter), then sleeps.
    fn next(&self, popped: &mut u64) -> Option<Op> {
        let reorder = self.fault.is(Fault::ReorderQueue);
        let spin_until = Instant::now() + SPIN;
        let mut spins = 0u32;
        while self.pushed.load(Ordering::Acquire) == *popped {
            spins += 1;
            if spin_over(spins, spin_until) {
                break;
            }
            sync::spin_loop();
        }
        let mut q = self.queue.lock();
        while q.ops.is_empty() && !q.shutdown {
            q.sleeping = true;
            self.wake.wait(&mut q);
        }
        q.sleeping = false;
        let op = if reorder {
            q.ops.pop_back()
        } else {
            q.ops.pop_front()
        };
        if op.is_some() {
            *popped += 1;
        }
        op
    }

    /// The worker thread's loop (`this` keeps the shared state alive until the thread exits).
    fn run(this: Arc<Self>) {
        CURRENT_WORKER.with(|c| c.set(Arc::as_ptr(&this) as usize));
        let mut popped = 0;
        while let Some(op) = this.next(&mut popped) {
            this.execute(op);
        }
    }
}
