//! The threads simulated kernels run on in [`crate::Mode::Concurrent`]: a pool of parked
//! threads, each running one job at a time and parking again when it returns.
//!
//! Why a pool rather than a thread per kernel: a thread that is still exiting when the process
//! exits races LeakSanitizer's exit-time check (it stops counting the thread as live before glibc
//! frees the thread's own bookkeeping, which it then reports as leaked: google/sanitizers#1836),
//! and a suite launches tens of thousands of kernels. Parked workers never exit, so they are
//! ordinary live threads to the leak check; the pool grows to the most kernels that ever ran at
//! once (one per stream at most) and a spawn costs once per worker, not per kernel.
//!
//! Thread-safety: [`run`] may be called from any thread, with any lock held (it never waits on a
//! job). A job that panics is caught on its worker (the panic message is printed by the hook as
//! usual) and the worker parks again.

use std::sync::mpsc::{channel, Sender};

use parking_lot::Mutex;

/// One unit of work for a worker.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The parked workers, each reachable through the sender of its own queue.
static IDLE: Mutex<Vec<Sender<Job>>> = Mutex::new(Vec::new());

/// Runs `job` on a parked worker, or on a new one when none is parked.
///
/// # Errors
/// The operating system's error when no worker is parked and no thread can be started (`job` is
/// dropped unrun).
pub(crate) fn run(job: Job) -> std::io::Result<()> {
    let mut job = job;
    while let Some(worker) = IDLE.lock().pop() {
        match worker.send(job) {
            Ok(()) => return Ok(()),
            // A worker that went away (never happens: workers never exit) gives the job back.
            Err(std::sync::mpsc::SendError(back)) => job = back,
        }
    }
    std::thread::Builder::new()
        .name("unihal-sim-kernel".into())
        .spawn(move || work(job))
        .map(|_| ())
}

/// A worker's life: run the job, park, run the next one.
fn work(first: Job) {
    let (tx, rx) = channel::<Job>();
    let mut job = first;
    loop {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        IDLE.lock().push(tx.clone());
        match rx.recv() {
            Ok(next) => job = next,
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    #[test]
    fn jobs_run_concurrently_and_workers_are_reused() {
        // Two jobs that wait for each other finish only if they run at once.
        let both = Arc::new(Barrier::new(3));
        for _ in 0..2 {
            let b = both.clone();
            run(Box::new(move || {
                b.wait();
            }))
            .unwrap();
        }
        both.wait();
        // A later job runs on a worker the first two left parked.
        let (tx, rx) = channel();
        let wait_parked = std::time::Instant::now();
        while IDLE.lock().is_empty() {
            assert!(wait_parked.elapsed() < std::time::Duration::from_secs(10));
            std::thread::yield_now();
        }
        run(Box::new(move || {
            tx.send(std::thread::current().name().map(str::to_owned))
                .unwrap()
        }))
        .unwrap();
        assert_eq!(rx.recv().unwrap().as_deref(), Some("unihal-sim-kernel"));
    }

    #[test]
    fn a_panicking_job_leaves_its_worker_alive() {
        run(Box::new(|| panic!("planted"))).unwrap();
        let (tx, rx) = channel();
        run(Box::new(move || tx.send(7).unwrap())).unwrap();
        assert_eq!(rx.recv().unwrap(), 7);
    }
}
