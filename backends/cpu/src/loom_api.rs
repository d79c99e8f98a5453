//! Entry points of the loom suite (`tests/loom.rs`), compiled only under `--cfg loom`: thin public
//! wrappers over the crate-private stream worker and collective rendezvous, so that the model
//! checker runs the production protocols themselves. Not an API.

use crate::ccl::rendezvous::{Rendezvous as Inner, Signature};
use crate::compute::ComputePool as PoolInner;
use crate::fault::FaultSwitch;
use crate::worker::WorkerShared;
use std::time::Duration;
use unihal_hal::sync::Arc;
use unihal_hal::{HalError, Result};

/// A stream worker (its thread is a loom model thread): [`Worker::shutdown`] it before the model
/// ends, so that the thread finishes.
pub struct Worker(Arc<WorkerShared>);

impl Worker {
    /// Starts a worker without faults.
    pub fn spawn() -> Worker {
        Worker(WorkerShared::spawn("loom-worker".into(), FaultSwitch::default()).expect("spawn"))
    }

    /// Starts a worker with the planted defect its model must catch: completion notifies waiters
    /// one operation late (a waiter asleep for the last operation is never woken).
    pub fn spawn_planted_late_wake() -> Worker {
        let w = Worker::spawn();
        w.0.planted_late_wake
            .store(true, unihal_hal::sync::Ordering::Relaxed);
        w
    }

    /// Queues `op` (it gets the sticky error, if set when its turn comes); returns its position.
    ///
    /// # Errors
    /// The sticky error.
    pub fn enqueue(
        &self,
        op: impl FnOnce(Option<&HalError>) -> Result<()> + Send + 'static,
    ) -> Result<u64> {
        let mut op = Some(op);
        self.0.enqueue(Box::new(move |err| match op.take() {
            Some(op) => op(err),
            None => Ok(()),
        }))
    }

    /// Operations enqueued so far.
    pub fn position(&self) -> u64 {
        self.0.position()
    }

    /// True once every operation up to `pos` has completed.
    pub fn reached(&self, pos: u64) -> bool {
        self.0.reached(pos)
    }

    /// Blocks until `pos` is reached.
    ///
    /// # Errors
    /// See the worker's `wait_for`.
    pub fn wait_for(&self, pos: u64) -> Result<()> {
        self.0.wait_for(pos)
    }

    /// Blocks until everything enqueued so far has completed.
    ///
    /// # Errors
    /// The sticky error.
    pub fn synchronize(&self) -> Result<()> {
        self.0.synchronize()
    }

    /// The sticky error.
    pub fn error(&self) -> Option<HalError> {
        self.0.error()
    }

    /// Asks the worker thread to exit once its queue is empty.
    pub fn shutdown(&self) {
        self.0.shutdown()
    }
}

impl Clone for Worker {
    fn clone(&self) -> Worker {
        Worker(self.0.clone())
    }
}

/// A collective rendezvous of `nranks` ranks (timeouts follow [`unihal_hal::sync::loom_clock`]).
pub struct Rendezvous(Inner);

impl Rendezvous {
    /// A rendezvous of `nranks` ranks.
    pub fn new(nranks: usize) -> Rendezvous {
        Rendezvous(Inner::new(nranks, Duration::from_secs(1)))
    }

    /// `run_round` of round `seq` for `rank`, every rank with the same signature.
    ///
    /// # Errors
    /// As the round's.
    pub fn run_round<R>(
        &self,
        seq: u64,
        rank: usize,
        ptrs: (u64, u64),
        body: impl FnOnce(&[(u64, u64)]) -> Result<R>,
    ) -> Result<R> {
        let sig = Signature {
            what: "loom".into(),
        };
        self.0.run_round(seq, rank, &sig, ptrs, body)
    }

    /// Phase barrier `phase` of round `seq`.
    ///
    /// # Errors
    /// As the barrier's.
    pub fn barrier(&self, seq: u64, phase: usize) -> Result<()> {
        self.0.barrier(seq, phase)
    }

    /// Plants the defect the planted model must catch: a successful round leaves without its
    /// closing barrier (a peer may still be touching this rank's buffers).
    pub fn plant_no_closing_barrier(&self) {
        self.0.plant_no_closing_barrier()
    }

    /// Aborts the communicator.
    pub fn abort(&self) {
        self.0.abort()
    }

    /// Wakes every waiter under the state lock (after [`unihal_hal::sync::loom_clock::expire`]).
    pub fn notify_all(&self) {
        self.0.notify_all()
    }
}

/// A device's compute pool of `threads` threads (the caller and `threads - 1` helpers, loom model
/// threads that end when the pool is dropped).
pub struct ComputePool(PoolInner);

impl ComputePool {
    /// A pool of `threads` compute threads, the caller included.
    pub fn new(threads: usize) -> ComputePool {
        ComputePool(PoolInner::new(threads, "loom-pool").expect("spawn"))
    }

    /// Runs `f(i)` for every `i` in `0..items` on the caller and the helpers that join.
    pub fn for_each(&self, items: u64, f: &(dyn Fn(u64) + Sync)) {
        self.0.for_each(items, f)
    }

    /// Plants the defect its model must catch: the caller returns without waiting for the
    /// helpers that joined its job.
    pub fn plant_no_wait(&self) {
        self.0.plant_no_wait()
    }
}
