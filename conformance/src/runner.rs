//! Running cases: planning (needs, manifest, filters), the per-case watchdog, process isolation and
//! per-device exclusivity.

use crate::case::{Case, Ctx, Need};
use crate::manifest::{EntryKind, Manifest};
use crate::progress::Progress;
use crate::report::{CaseReport, Outcome, Report, TargetReport, UnavailableBackend};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use unihal_hal::{Backend, Device, DeviceId, Registry};

/// Environment variable through which a parent hands one case to an isolated child process:
/// `<backend>\t<ordinal>\t<case id>\t<timeout ms>`.
pub const CHILD_ENV: &str = "UNIHAL_CONFORMANCE_CHILD";
/// Prefix of the line on which the child prints its outcome as JSON.
pub const CHILD_MARKER: &str = "UNIHAL-CONFORMANCE-OUTCOME ";

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Only cases whose id contains this text.
    pub filter: Option<String>,
    /// Only one share of the cases the filter selects (`--partition K/N`).
    pub partition: Option<Partition>,
    /// Treat an unexpected pass of an `xfail` case as a failure.
    pub verify: bool,
    /// Run each case in its own process.
    pub isolate: bool,
    /// Watchdog limit for cases that do not set their own.
    pub timeout: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            filter: None,
            partition: None,
            verify: false,
            isolate: false,
            timeout: Duration::from_secs(60),
        }
    }
}

/// A device under test, with its backend and manifest.
#[derive(Clone)]
pub struct Target {
    pub backend: Arc<dyn Backend>,
    pub device: Arc<dyn Device>,
    pub manifest: Manifest,
    /// In an SPMD run (one process per rank, e.g. under `mpirun`), this process's rank of the
    /// world communicator: collective cases then run one rank per process instead of one rank
    /// per device.
    pub world: Option<Arc<dyn unihal_hal::Communicator>>,
}

/// Every device of every backend `registry` selects (by `spec`, or `UNIHAL_BACKENDS` when `None`).
/// Unavailable backends are returned with their reasons, never silently dropped.
///
/// # Errors
/// A message when `spec` names an unregistered backend, or when a backend's conformance
/// manifest does not parse.
pub fn discover(
    registry: &Registry,
    spec: Option<&str>,
) -> Result<(Vec<Target>, Vec<UnavailableBackend>), String> {
    let backends = match spec {
        Some(s) => registry.select(Some(s)),
        None => registry.select_from_env(),
    }
    .map_err(|e| e.to_string())?;
    let mut targets = Vec::new();
    let mut unavailable = Vec::new();
    for b in backends {
        let n = match b.probe() {
            Ok(n) => n,
            Err(e) => {
                unavailable.push(UnavailableBackend {
                    backend: b.name().into(),
                    reason: e.to_string(),
                });
                continue;
            }
        };
        let manifest = Manifest::of(&*b)?;
        for i in 0..n {
            match b.open(i) {
                Ok(device) => targets.push(Target {
                    backend: b.clone(),
                    device,
                    manifest: manifest.clone(),
                    world: None,
                }),
                Err(e) => unavailable.push(UnavailableBackend {
                    backend: format!("{}:{i}", b.name()),
                    reason: e.to_string(),
                }),
            }
        }
    }
    Ok((targets, unavailable))
}

/// What will happen to a case on a target.
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Run { xfail: Option<String> },
    Skip(String),
}

/// Decides whether `case` runs on `target`: manifest `unsupported` and missing needs skip it.
pub fn plan(case: &Case, target: &Target) -> Plan {
    let entry = target.manifest.verdict(&case.id);
    if let Some(e) = entry.filter(|e| e.kind == EntryKind::Unsupported) {
        return Plan::Skip(format!(
            "unsupported by the {} manifest: {}",
            target.backend.name(),
            e.reason
        ));
    }
    let count = target.backend.probe().unwrap_or(1);
    let ranks = target.world.as_ref().map_or(count, |w| w.size());
    for need in &case.needs {
        if let Err(reason) = need.check(
            &*target.backend,
            &*target.device,
            count,
            ranks,
            target.world.is_some(),
        ) {
            return Plan::Skip(reason);
        }
    }
    Plan::Run {
        xfail: entry
            .filter(|e| e.kind == EntryKind::Xfail)
            .map(|e| e.reason.clone()),
    }
}

/// The lock that serialises cases on one device (concurrent cases share it).
fn device_lock(id: DeviceId) -> Arc<RwLock<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<DeviceId, Arc<RwLock<()>>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Default::default)
        .lock()
        .entry(id)
        .or_default()
        .clone()
}

/// Devices whose last in-process case hung: its abandoned thread may still hold their streams, so
/// later cases there would not be independent. Maps each to the case that hung.
/// Keyed by the device object (two backend instances may both have a `cpu:0`).
fn poisoned() -> &'static Mutex<HashMap<usize, String>> {
    static POISONED: OnceLock<Mutex<HashMap<usize, String>>> = OnceLock::new();
    POISONED.get_or_init(Default::default)
}

fn device_key(target: &Target) -> usize {
    Arc::as_ptr(&target.device) as *const () as usize
}

/// The devices a case uses: its own, or every device of the backend for multi-device cases (in
/// ordinal order, so locks are always taken in the same order).
fn devices_used(case: &Case, target: &Target) -> Vec<DeviceId> {
    let me = target.device.id();
    let multi = case.needs.iter().any(|n| {
        matches!(
            n,
            Need::Devices(_) | Need::Ranks(_) | Need::PeerDevice | Need::Collective(..)
        )
    });
    if !multi {
        return vec![me];
    }
    let n = target.backend.probe().unwrap_or(1);
    (0..n as u32)
        .map(|ordinal| DeviceId {
            backend: me.backend,
            ordinal,
        })
        .collect()
}

/// Runs the body on its own thread and gives up after `timeout`, so a hang becomes a failure.
pub fn run_with_watchdog(case: &Case, target: &Target, timeout: Duration) -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel();
    let (run, backend, device, world) = (
        case.run.clone(),
        target.backend.clone(),
        target.device.clone(),
        target.world.clone(),
    );
    let spawned = std::thread::Builder::new()
        .name(format!("case {}", case.id))
        .spawn(move || {
            // The context (the case's devices, streams and buffers) is dropped inside the guard
            // and the watchdog's time: a release that hangs or panics is the case's failure, and
            // once the result is sent the thread has nothing left to do but exit.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut ctx = Ctx::new(backend, device);
                ctx.world = world;
                run(&ctx)
            }));
            let _ = tx.send(r);
        });
    let thread = match spawned {
        Ok(t) => t,
        Err(e) => {
            return Outcome::Failed {
                message: format!("cannot start the case thread: {e}"),
            }
        }
    };
    let result = rx.recv_timeout(timeout);
    if result.is_ok() {
        // It sent its result, its last act: joined, so no case thread is still exiting when the
        // process exits (LeakSanitizer's exit-time check races an exiting thread,
        // google/sanitizers#1836). An abandoned (timed-out) thread is left running.
        let _ = thread.join();
    }
    match result {
        Ok(Ok(Ok(()))) => Outcome::Passed,
        Ok(Ok(Err(f))) => Outcome::Failed { message: f.message },
        Ok(Err(p)) => {
            let msg = unihal_hal::panic_message(&*p).unwrap_or_else(|| "non-string panic".into());
            Outcome::Failed {
                message: format!("panicked: {msg}"),
            }
        }
        Err(_) => Outcome::Failed {
            message: format!(
                "watchdog: the case did not finish within {:.1}s; its thread was abandoned \
                 (use isolation to contain hangs)",
                timeout.as_secs_f64()
            ),
        },
    }
}

/// Runs one case in a child process of the current executable, which must call
/// [`run_child_if_requested`] first thing in `main`. The child is killed if it outlives the timeout
/// by more than a grace period.
pub fn run_isolated(case: &Case, target: &Target, timeout: Duration) -> Outcome {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return Outcome::Failed {
                message: format!("cannot find the current executable: {e}"),
            }
        }
    };
    let spec = format!(
        "{}\t{}\t{}\t{}",
        target.backend.name(),
        target.device.id().ordinal,
        case.id,
        timeout.as_millis()
    );
    let child = Command::new(exe)
        .env(CHILD_ENV, spec)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            return Outcome::Failed {
                message: format!("cannot start an isolated process: {e}"),
            }
        }
    };
    // Drain the pipes on threads so a chatty child never blocks on a full pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            let _ = tx.send(s);
        });
        rx
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now()
        .checked_add(timeout.saturating_add(Duration::from_secs(5)))
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 86400));
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // A grandchild may hold the pipes open: never wait long for them once the child is gone.
    let stdout = out.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
    let stderr = err.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
    let Some(status) = status else {
        return Outcome::Failed {
            message: format!(
                "watchdog: the isolated process did not finish within {:.1}s and was killed",
                timeout.as_secs_f64()
            ),
        };
    };
    match stdout.lines().find_map(|l| l.strip_prefix(CHILD_MARKER)) {
        Some(json) => serde_json::from_str(json).unwrap_or_else(|e| Outcome::Failed {
            message: format!("unreadable result from the isolated process: {e}"),
        }),
        None => {
            let tail: String = stderr
                .chars()
                .rev()
                .take(600)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            Outcome::Failed {
                message: format!(
                    "the isolated process ended ({status}) without a result; stderr: {tail}"
                ),
            }
        }
    }
}

/// In a child started by [`run_isolated`], runs the requested case, prints its outcome and exits.
/// Returns (doing nothing) in any other process. The child opens the backend through `registry`, so
/// it sees the registry's configuration (environment), not a backend object built in the parent.
pub fn run_child_if_requested(registry: &Registry) {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let outcome = child_outcome(registry, &spec);
    println!(
        "{CHILD_MARKER}{}",
        serde_json::to_string(&outcome).expect("outcomes serialise")
    );
    std::process::exit(0);
}

fn child_outcome(registry: &Registry, spec: &str) -> Outcome {
    let parts: Vec<&str> = spec.split('\t').collect();
    let [backend, ordinal, id, timeout_ms] = parts[..] else {
        return Outcome::Failed {
            message: format!("malformed {CHILD_ENV}: {spec:?}"),
        };
    };
    let (Ok(ordinal), Ok(timeout_ms)) = (ordinal.parse::<usize>(), timeout_ms.parse::<u64>())
    else {
        return Outcome::Failed {
            message: format!("malformed {CHILD_ENV}: {spec:?}"),
        };
    };
    let Some(case) = crate::cases::all().into_iter().find(|c| c.id == id) else {
        return Outcome::Failed {
            message: format!("no case {id:?} in this build"),
        };
    };
    let target = match registry
        .get(backend)
        .and_then(|b| Ok((b.clone(), b.open(ordinal)?)))
        .map_err(|e| e.to_string())
        .and_then(|(b, d)| Ok((Manifest::of(&*b)?, b, d)))
    {
        Ok((manifest, backend, device)) => Target {
            manifest,
            backend,
            device,
            world: None,
        },
        Err(e) => {
            return Outcome::Failed {
                message: format!("isolated process cannot open {backend}:{ordinal}: {e}"),
            }
        }
    };
    run_with_watchdog(&case, &target, Duration::from_millis(timeout_ms))
}

/// Runs, in this process, every case that is neither a library op nor a collective nor a fault
/// case on `target` (what a backend's own tests run on a simulated runtime: ops need the
/// runtime compiler and run through the CLI in CI, fault cases need isolation). Returns how many
/// passed.
///
/// # Errors
/// The first case that failed, or skipped for a reason `allowed_skip` does not accept, as
/// `"<case id>: <outcome>"`.
pub fn run_non_op_cases(
    target: &Target,
    allowed_skip: impl Fn(&str) -> bool,
) -> std::result::Result<usize, String> {
    let mut passed = 0;
    for c in crate::cases::all()
        .into_iter()
        .filter(|c| !c.id.starts_with("ops.") && !c.id.starts_with("ccl.") && !c.faults)
    {
        let r = run_case(&c, target, &RunOptions::default());
        match &r.outcome {
            Outcome::Passed => passed += 1,
            Outcome::Skipped { reason } if allowed_skip(reason) => {}
            other => return Err(format!("{}: {other:?}", c.id)),
        }
    }
    Ok(passed)
}

/// Runs one case on one target: plan, device lock, watchdog or isolation, manifest verdict.
pub fn run_case(case: &Case, target: &Target, opts: &RunOptions) -> CaseReport {
    let start = Instant::now();
    let outcome = match plan(case, target) {
        Plan::Skip(reason) => Outcome::Skipped { reason },
        Plan::Run { xfail } => {
            let timeout = case.timeout.unwrap_or(opts.timeout);
            let locks: Vec<_> = devices_used(case, target)
                .into_iter()
                .map(device_lock)
                .collect();
            let raw = {
                let (_shared, _exclusive): (Vec<_>, Vec<_>) = if case.concurrent {
                    (locks.iter().map(|l| l.read()).collect(), Vec::new())
                } else {
                    (Vec::new(), locks.iter().map(|l| l.write()).collect())
                };
                let hung = poisoned().lock().get(&device_key(target)).cloned();
                match hung {
                    Some(other) if !opts.isolate => Outcome::Failed {
                        message: format!(
                            "not run: case {other} hung on this device and its thread may still hold \
                             the device's streams; rerun with isolation"
                        ),
                    },
                    _ => {
                        let o = execute(case, target, opts, timeout);
                        if !opts.isolate && matches!(&o, Outcome::Failed { message } if message.starts_with("watchdog")) {
                            poisoned().lock().insert(device_key(target), case.id.to_string());
                        }
                        o
                    }
                }
            };
            match (xfail, raw) {
                (None, o) => o,
                (Some(reason), Outcome::Failed { message }) => Outcome::Xfailed { reason, message },
                (Some(reason), Outcome::Passed) if opts.verify => Outcome::Failed {
                    message: format!("unexpected pass: the manifest expects a failure ({reason}); update the manifest"),
                },
                (Some(reason), Outcome::Passed) => Outcome::Xpassed { reason },
                (Some(_), o) => o,
            }
        }
    };
    CaseReport {
        id: case.id.clone(),
        outcome: with_validation_findings(target, outcome),
        duration_ms: start.elapsed().as_secs_f64() * 1e3,
    }
}

/// Under the validation layer (`UNIHAL_VALIDATE`), a case that ran and made findings fails with
/// them: the suite must be silent under it (cases run one at a time, so what the layer found
/// since the last case is this case's).
fn with_validation_findings(target: &Target, outcome: Outcome) -> Outcome {
    let Some(v) = validation_layer(target) else {
        return outcome;
    };
    let found = v.take_findings();
    if found.is_empty() || matches!(outcome, Outcome::Skipped { .. }) {
        return outcome;
    }
    let list: Vec<String> = found.iter().map(|f| f.to_string()).collect();
    let findings = format!(
        "validation layer: {} finding(s): {}",
        found.len(),
        list.join("; ")
    );
    match outcome {
        Outcome::Failed { message } => Outcome::Failed {
            message: format!("{message}; {findings}"),
        },
        _ => Outcome::Failed { message: findings },
    }
}

/// The validation layer `target`'s backend runs under, if any.
pub fn validation_layer(target: &Target) -> Option<&unihal_layer::LayerBackend> {
    target
        .backend
        .as_any()
        .downcast_ref::<unihal_layer::LayerBackend>()
        .filter(|v| v.mode().is_some())
}

fn execute(case: &Case, target: &Target, opts: &RunOptions, timeout: Duration) -> Outcome {
    // A deliberate fault would poison the context for every later case: contain it.
    let contain = case.faults && target.device.capabilities().optional.fault_poisons_device;
    if opts.isolate || contain {
        run_isolated(case, target, timeout)
    } else {
        run_with_watchdog(case, target, timeout)
    }
}

/// The `index`th of `count` shares of a run's cases (`K/N`, 1 ≤ K ≤ N): the cases the filter
/// selects, in the suite's order, dealt out in turn (case i goes to share i mod N + 1), so each
/// share takes some of every group and the N shares together run every case once. CI splits a
/// long suite across runs this way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Which share, from 1.
    pub index: usize,
    /// How many shares.
    pub count: usize,
}

impl Partition {
    /// True when the `position`th selected case (from 0) is in this share.
    pub fn takes(&self, position: usize) -> bool {
        position % self.count == self.index - 1
    }
}

impl std::fmt::Display for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Partition {
    type Err = String;

    /// `K/N` with 1 ≤ K ≤ N.
    fn from_str(s: &str) -> Result<Partition, String> {
        let bad = || format!("{s:?} is not a share K/N of the cases (1 <= K <= N, e.g. 1/2)");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            k.trim().parse::<usize>().map_err(|_| bad())?,
            n.trim().parse::<usize>().map_err(|_| bad())?,
        );
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(Partition { index, count })
    }
}

/// True when `id` passes the run's filter.
pub fn selected(id: &str, opts: &RunOptions) -> bool {
    opts.filter.as_deref().is_none_or(|f| id.contains(f))
}

/// Runs `cases` (filtered) on every target, one case at a time, and builds the report. Shows
/// each device's progress on stderr ([`crate::progress`]: `UNIHAL_PROGRESS=0` turns it off;
/// plain lines in an SPMD run, whose ranks may share a terminal).
pub fn run(
    targets: &[Target],
    unavailable: Vec<UnavailableBackend>,
    cases: &[Case],
    opts: &RunOptions,
) -> Report {
    let spmd = targets.iter().any(|t| t.world.is_some());
    run_with_progress(
        targets,
        unavailable,
        cases,
        opts,
        &Arc::new(Progress::stderr(spmd)),
    )
}

/// As [`run`], showing progress through `progress` (which it closes at the end).
pub fn run_with_progress(
    targets: &[Target],
    unavailable: Vec<UnavailableBackend>,
    cases: &[Case],
    opts: &RunOptions,
    progress: &Arc<Progress>,
) -> Report {
    let started = Instant::now();
    let started_unix_s = unix_now_s();
    let ticker = progress.ticker(Duration::from_millis(500));
    let targets = targets
        .iter()
        .map(|t| {
            let chosen: Vec<&Case> = cases
                .iter()
                .filter(|c| selected(&c.id, opts))
                .enumerate()
                .filter(|(i, _)| opts.partition.is_none_or(|p| p.takes(*i)))
                .map(|(_, c)| c)
                .collect();
            let label = match &t.world {
                Some(w) => format!("{} rank {}/{}", t.device.id(), w.rank(), w.size()),
                None => t.device.id().to_string(),
            };
            let slot = progress.device(label, chosen.len());
            let results: Vec<CaseReport> = chosen
                .into_iter()
                .map(|c| {
                    let r = run_case(c, t, opts);
                    progress.case_done(slot, &r.outcome);
                    r
                })
                .collect();
            progress.finish(slot);
            TargetReport::of(t, results)
        })
        .collect();
    drop(ticker);
    progress.close();
    Report {
        schema_version: crate::report::SCHEMA_VERSION,
        unihal_version: unihal_hal::VERSION.to_string(),
        started_unix_s,
        hostname: unihal_hal::ccl::process_tag().host.clone(),
        duration_s: started.elapsed().as_secs_f64(),
        verify: opts.verify,
        isolate: opts.isolate,
        filter: opts.filter.clone(),
        partition: opts.partition.map(|p| p.to_string()),
        unavailable,
        targets,
    }
}

pub(crate) use unihal_hal::clock::unix_now_s;
