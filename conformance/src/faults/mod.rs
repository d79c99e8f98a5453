//! Fault sweeps: every call a workload makes into a backend's runtime fails once, in turn, and
//! the failure must end well.
//!
//! A sweep first runs the workload cleanly while an [`Injector`] counts the calls of each fault
//! point (an entry point of a simulated vendor runtime, or a kind of call in the CPU backend's own
//! code). Then, for each point and each `n` up to its count, it makes the `n`th call of that
//! point fail with one of the point's codes, runs the workload on a fresh backend, drops it and
//! checks:
//!
//! * **surfaced**: the workload returned a typed error that names the injected code (its number
//!   in a vendor error, or the out-of-memory kind for an allocation code), or it succeeded with
//!   exactly the clean run's bytes (a failure a backend may absorb, such as a release in a drop
//!   path, which it logs); an `Internal` error is a bug;
//! * **no panic, no hang**: each trial runs on its own thread under a deadline;
//! * **nothing leaked**: once the backend and every handle dropped, the runtime's live objects
//!   (allocations, bytes, streams, events, modules) are back to the clean baseline;
//! * **the rest keeps working**: the next trial starts on the same (simulated) devices, and a
//!   clean run after the sweep must give the clean bytes again.
//!
//! [`workload::training_step`] is the workload the backends share: one data-parallel step of a linear
//! layer on two devices (host-to-device copies, fills, matmuls, relu, a gradient all-reduce, an
//! update, an event between two streams, a device-to-host copy), which also loads the kernel
//! library on a fresh backend.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{Backend, HalError, Result};

pub mod sim;
pub mod workload;

/// Objects alive in a runtime, compared before and after a trial.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Live {
    /// Device allocations.
    pub allocations: i64,
    /// Their bytes.
    pub bytes: i64,
    /// Streams.
    pub streams: i64,
    /// Events.
    pub events: i64,
    /// Loaded modules.
    pub modules: i64,
}

impl Live {
    /// True when any count is above `other`'s (a decrease is no leak).
    pub fn exceeds(&self, other: &Live) -> bool {
        self.allocations > other.allocations
            || self.bytes > other.bytes
            || self.streams > other.streams
            || self.events > other.events
            || self.modules > other.modules
    }
}

/// One way to make a fault point fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    /// The number the call returns.
    pub code: i32,
    /// Its name (for the report).
    pub name: String,
    /// The HAL error kind the backend may report instead of naming the number.
    pub kind: Option<Kind>,
}

/// A HAL error kind a vendor code maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// [`HalError::OutOfMemory`] (or the caching allocator's).
    OutOfMemory,
    /// [`HalError::Timeout`].
    Timeout,
}

impl Code {
    /// A code and its name.
    pub fn new(code: i32, name: &str) -> Code {
        Code {
            code,
            name: name.to_string(),
            kind: None,
        }
    }

    /// An out-of-memory code.
    pub fn oom(code: i32, name: &str) -> Code {
        Code {
            kind: Some(Kind::OutOfMemory),
            ..Code::new(code, name)
        }
    }

    /// A timeout code.
    pub fn timeout(code: i32, name: &str) -> Code {
        Code {
            kind: Some(Kind::Timeout),
            ..Code::new(code, name)
        }
    }
}

/// The test controls of one runtime: counted calls, armed failures, live objects.
/// Implementations are process-wide (calls from any thread count), so one sweep runs at a time
/// per process.
pub trait Injector: Send + Sync {
    /// What is injected into, for the report ("simulated CUDA driver and NCCL").
    fn describe(&self) -> String;
    /// Starts (from zero) or stops counting calls.
    fn count_calls(&self, on: bool);
    /// The calls of each fault point counted since counting started.
    fn calls(&self) -> BTreeMap<String, u64>;
    /// The `n`th call (from now, 1 = the next, any thread) of `point` fails with `code`.
    fn arm(&self, point: &str, n: u32, code: i32);
    /// Disarms every armed failure; returns how many had not fired.
    fn disarm(&self) -> usize;
    /// The codes to inject at `point` (at least one).
    fn codes(&self, point: &str) -> Vec<Code>;
    /// The runtime's objects alive now.
    fn live(&self) -> Live;
}

/// Sweep limits.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// At most this many values of `n` per point, spread over `1..=count` (first and last
    /// included); `u32::MAX` sweeps every call.
    pub max_n_per_point: u32,
    /// A trial that has not ended by then is a hang.
    pub trial_deadline: Duration,
    /// The deadline of the warm-up run before the clean run: with an empty kernel cache it
    /// compiles the kernel library for each device (NVRTC, hiprtc), minutes on a 2-core machine.
    pub warm_up_deadline: Duration,
    /// Only the points whose names contain one of these (all when empty).
    pub only: Vec<String>,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            max_n_per_point: u32::MAX,
            trial_deadline: Duration::from_secs(60),
            warm_up_deadline: Duration::from_secs(900),
            only: Vec::new(),
        }
    }
}

/// How one trial ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The workload returned this typed error, which names the injected code.
    Surfaced(String),
    /// The workload succeeded with the clean bytes (the failure was absorbed and logged).
    Absorbed,
    /// The armed call was never reached (a call count that depends on timing, such as polling).
    NotReached,
}

/// One injected failure and what came of it.
#[derive(Debug, Clone)]
pub struct Trial {
    /// The fault point.
    pub point: String,
    /// Which call of it failed.
    pub n: u32,
    /// The injected code.
    pub code: Code,
    /// How it ended.
    pub outcome: Outcome,
    /// Wall time of the trial (fresh backend, workload, drop).
    pub took: Duration,
}

/// What a sweep found.
#[derive(Debug, Clone, Default)]
pub struct SweepReport {
    /// The injector's description.
    pub target: String,
    /// Calls of each point in the clean run.
    pub calls: BTreeMap<String, u64>,
    /// Every trial.
    pub trials: Vec<Trial>,
    /// Everything that went wrong (empty when the sweep passed).
    pub problems: Vec<String>,
    /// Trials where a failed release left its object to the runtime (not a leak of the
    /// backend: the runtime refused to release it).
    pub left_to_runtime: usize,
    /// Wall time of the whole sweep.
    pub elapsed: Duration,
}

impl SweepReport {
    /// Trials whose failure surfaced as a typed error.
    pub fn surfaced(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Surfaced(_)))
    }

    /// Trials whose failure the backend absorbed with the clean result.
    pub fn absorbed(&self) -> usize {
        self.count(|o| matches!(o, Outcome::Absorbed))
    }

    /// Trials whose armed call was not reached.
    pub fn not_reached(&self) -> usize {
        self.count(|o| matches!(o, Outcome::NotReached))
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.trials.iter().filter(|t| f(&t.outcome)).count()
    }
}

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault sweep on {}: {} points, {} calls in the clean run; {} failures injected: {} surfaced as typed errors, {} absorbed with the clean result, {} not reached; {} failed releases left their object to the runtime; {} problems; {:.1} s",
            self.target,
            self.calls.len(),
            self.calls.values().sum::<u64>(),
            self.trials.len(),
            self.surfaced(),
            self.absorbed(),
            self.not_reached(),
            self.left_to_runtime,
            self.problems.len(),
            self.elapsed.as_secs_f64()
        )?;
        let mut absorbed: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &self.trials {
            if matches!(t.outcome, Outcome::Absorbed) {
                *absorbed.entry(&t.point).or_default() += 1;
            }
        }
        if !absorbed.is_empty() {
            writeln!(f, "  absorbed at: {absorbed:?}")?;
        }
        if let Some(t) = self.trials.iter().max_by_key(|t| t.took) {
            let mut took: Vec<Duration> = self.trials.iter().map(|t| t.took).collect();
            took.sort();
            writeln!(
                f,
                "  trial time: median {:.0} ms, slowest {:.0} ms ({} call {} failing with {})",
                took[took.len() / 2].as_secs_f64() * 1e3,
                t.took.as_secs_f64() * 1e3,
                t.point,
                t.n,
                t.code.name
            )?;
        }
        for p in &self.problems {
            writeln!(f, "  PROBLEM: {p}")?;
        }
        Ok(())
    }
}

/// The values of `n` to try for a point called `count` times.
fn sample(count: u64, max: u32) -> Vec<u32> {
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    if count <= max {
        return (1..=count).collect();
    }
    let mut v: Vec<u32> = (0..max)
        .map(|i| 1 + ((count - 1) as u64 * i as u64 / (max - 1).max(1) as u64) as u32)
        .collect();
    v.dedup();
    v
}

/// Runs `f` on its own thread; `None` when it did not end within `deadline` (the thread is left
/// behind: the sweep stops there).
fn with_deadline<T: Send + 'static>(
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<std::thread::Result<T>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("fault-trial".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r);
        })
        .expect("spawn a trial thread");
    rx.recv_timeout(deadline).ok()
}

/// A workload: runs on a fresh backend, returns the bytes its results hold.
pub type Workload = fn(&Arc<dyn Backend>) -> Result<Vec<u8>>;

/// Sweeps every fault point `workload` reaches (see the module docs). `make` builds a fresh
/// backend on the injector's runtime.
pub fn sweep(
    injector: Arc<dyn Injector>,
    make: fn() -> Arc<dyn Backend>,
    workload: Workload,
    opts: &SweepOptions,
) -> SweepReport {
    let start = Instant::now();
    let mut report = SweepReport {
        target: injector.describe(),
        ..SweepReport::default()
    };
    let run_within = |deadline| {
        with_deadline(deadline, move || {
            let backend = make();
            let r = workload(&backend);
            drop(backend);
            r
        })
    };
    let run = || run_within(opts.trial_deadline);
    // Warm-up: the first run compiles the kernel library on each device, or reads it from the
    // disk cache, into the process's cache. Its own deadline, and its result is not the clean
    // one: while one rank compiles (minutes with an empty disk cache), its peer's collective may
    // time out (the workload's communicator timeout is short). Only a hang fails here.
    match run_within(opts.warm_up_deadline) {
        None => {
            report.problems.push(format!(
                "the warm-up run did not end within {:?} (hang)",
                opts.warm_up_deadline
            ));
            return report;
        }
        Some(Ok(Err(_))) => {
            // Let what the failed run's communicators and streams still hold go first.
            settle(&*injector, Live::default());
        }
        Some(_) => {}
    }
    // The clean run, then the baseline.
    let expected = match run() {
        Some(Ok(Ok(bytes))) => bytes,
        other => {
            report
                .problems
                .push(format!("the clean run failed: {}", describe_end(&other)));
            return report;
        }
    };
    let mut baseline = steady(&*injector);
    injector.count_calls(true);
    let counted = run();
    report.calls = injector.calls();
    injector.count_calls(false);
    match counted {
        Some(Ok(Ok(bytes))) if bytes == expected => {}
        other => {
            report.problems.push(format!(
                "the counted clean run differs from the first: {}",
                describe_end(&other)
            ));
            return report;
        }
    }
    let live = settle(&*injector, baseline);
    if live != baseline {
        report.problems.push(format!(
            "a clean run leaked: {live:?} after, {baseline:?} before"
        ));
        return report;
    }
    let points: Vec<(String, u64)> = report
        .calls
        .iter()
        .filter(|(k, _)| opts.only.is_empty() || opts.only.iter().any(|o| k.contains(o.as_str())))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let mut k = 0usize;
    for (point, count) in points {
        let codes = injector.codes(&point);
        for n in sample(count, opts.max_n_per_point) {
            let code = codes[k % codes.len()].clone();
            k += 1;
            let before = baseline;
            injector.arm(&point, n, code.code);
            let t0 = Instant::now();
            let end = run();
            let took = t0.elapsed();
            let unfired = injector.disarm();
            let what = format!(
                "{point} call {n} failing with {} ({})",
                code.name, code.code
            );
            let outcome = match end {
                None => {
                    report.problems.push(format!(
                        "{what}: the workload did not end within {:?} (hang)",
                        opts.trial_deadline
                    ));
                    report.elapsed = start.elapsed();
                    return report;
                }
                Some(Err(_)) => {
                    report.problems.push(format!("{what}: panicked"));
                    continue;
                }
                Some(Ok(Ok(bytes))) => {
                    if bytes != expected {
                        report.problems.push(format!(
                            "{what}: succeeded with different results (a swallowed error)"
                        ));
                    }
                    if unfired > 0 {
                        Outcome::NotReached
                    } else {
                        Outcome::Absorbed
                    }
                }
                Some(Ok(Err(e))) => {
                    let text = e.to_string();
                    // A vendor error carries the code itself; another kind must name the
                    // number as a word of its message (not merely contain its digits).
                    let number = code.code.to_string();
                    let names = match &e {
                        HalError::Vendor { code: c, .. } => *c == i64::from(code.code),
                        _ => text
                            .split(|ch: char| !ch.is_ascii_digit() && ch != '-')
                            .any(|w| w == number),
                    } || match code.kind {
                        Some(Kind::OutOfMemory) => matches!(
                            e,
                            HalError::OutOfMemory { .. } | HalError::AllocatorOutOfMemory(_)
                        ),
                        Some(Kind::Timeout) => matches!(e, HalError::Timeout { .. }),
                        None => false,
                    };
                    if matches!(e, HalError::Internal(_)) {
                        report
                            .problems
                            .push(format!("{what}: an internal error: {text}"));
                    } else if unfired > 0 {
                        report.problems.push(format!(
                            "{what}: failed though the failure never fired: {text}"
                        ));
                    } else if !names {
                        report.problems.push(format!(
                            "{what}: the error does not name the injected code: {text}"
                        ));
                    }
                    Outcome::Surfaced(text)
                }
            };
            let released = is_release(&point) && unfired == 0;
            let live = if released {
                steady(&*injector)
            } else {
                settle(&*injector, before)
            };
            if live != before && !live.exceeds(&before) {
                // Fewer objects than before: something an earlier trial left (a release retried
                // at a later call) is gone now. Counted from here.
                baseline = live;
            } else if live != before {
                if released {
                    // The runtime refused to release the object: it stays the runtime's (as with
                    // a real library), the backend logged it. Counted from now on.
                    report.left_to_runtime += 1;
                    baseline = steady(&*injector);
                } else {
                    report.problems.push(format!(
                        "{what}: leaked: {live:?} after the handles dropped, {before:?} before"
                    ));
                    baseline = steady(&*injector);
                }
            }
            report.trials.push(Trial {
                point: point.clone(),
                n,
                code,
                outcome,
                took,
            });
        }
    }
    let live = settle(&*injector, baseline);
    if live != baseline {
        report.problems.push(format!(
            "after the sweep: {live:?} alive, {baseline:?} before it"
        ));
    }
    // The devices keep working after every failure.
    match run() {
        Some(Ok(Ok(bytes))) if bytes == expected => {}
        other => report.problems.push(format!(
            "the clean run after the sweep failed: {}",
            describe_end(&other)
        )),
    }
    report.elapsed = start.elapsed();
    report
}

/// A release entry point (destroy, free, release, unload): when it fails, the runtime keeps
/// the object, so the object is not the backend's leak.
fn is_release(point: &str) -> bool {
    let p = point.to_ascii_lowercase();
    ["destroy", "free", "release", "unload", "finalize"]
        .iter()
        .any(|w| p.contains(w))
}

/// The live objects once back at `baseline`, or after [`SETTLE`]: threads that release objects
/// (stream workers, watchdogs) end asynchronously after their handles drop, and what a stream
/// queued behind a collective is released once the communicator's timeout failed it.
fn settle(injector: &dyn Injector, baseline: Live) -> Live {
    let until = Instant::now() + SETTLE;
    loop {
        let live = injector.live();
        if live == baseline || Instant::now() >= until {
            return live;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How long [`settle`] waits: the workload's communicator timeout (3 s) and a margin.
pub const SETTLE: Duration = Duration::from_secs(5);

/// The live objects once two readings 50 ms apart agree (at most 2 s).
fn steady(injector: &dyn Injector) -> Live {
    let until = Instant::now() + Duration::from_secs(2);
    let mut last = injector.live();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let now = injector.live();
        if now == last || Instant::now() >= until {
            return now;
        }
        last = now;
    }
}

fn describe_end(end: &Option<std::thread::Result<Result<Vec<u8>>>>) -> String {
    match end {
        None => "did not end (hang)".into(),
        Some(Err(_)) => "panicked".into(),
        Some(Ok(Err(e))) => e.to_string(),
        Some(Ok(Ok(_))) => "different bytes".into(),
    }
}
