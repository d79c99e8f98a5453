//! Dead-rank trials: in each, one rank of a two-rank communicator stops arriving after a random
//! number of all-reduce rounds (as a process that died would: it neither calls nor aborts), and
//! the survivor must end with the documented error (`Timeout`, or `Aborted` where the engine
//! turns a peer's loss into an abort) within the communicator's timeout plus a stated margin.
//! Nothing else may suffer: a buffer no collective touched keeps its bytes, a second
//! communicator over the same devices still all-reduces correctly on fresh streams, and the
//! survivor builds a new communicator that works.

use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::ccl::{CommConfig, Communicator, ReduceOp};
use unihal_hal::{Backend, Buffer, DType, Device, HalError, Result, Stream};

/// Trial settings.
#[derive(Debug, Clone)]
pub struct DeadRankOptions {
    /// Trials.
    pub trials: usize,
    /// All-reduce rounds the survivor enqueues per trial.
    pub rounds: usize,
    /// The communicator's timeout.
    pub timeout: Duration,
    /// What the survivor's error may take beyond the timeout (watchdog period, scheduling).
    pub margin: Duration,
    /// Seed of the point where the rank dies.
    pub seed: u64,
}

impl Default for DeadRankOptions {
    fn default() -> Self {
        DeadRankOptions {
            trials: 50,
            rounds: 4,
            timeout: Duration::from_millis(300),
            margin: Duration::from_millis(1500),
            seed: 7,
        }
    }
}

/// What the trials found.
#[derive(Debug, Clone, Default)]
pub struct DeadRankReport {
    /// Trials run.
    pub trials: usize,
    /// Of which the survivor's error was a `Timeout`.
    pub timeouts: usize,
    /// Of which it was an `Aborted`.
    pub aborts: usize,
    /// The longest time from the survivor's wait to its error.
    pub slowest: Duration,
    /// Wall time.
    pub elapsed: Duration,
}

impl std::fmt::Display for DeadRankReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} trials: {} timeouts, {} aborts, slowest error {:.0} ms after the survivor's wait; bystander buffers, a second communicator and a rebuilt one intact in every trial; {:.1} s",
            self.trials,
            self.timeouts,
            self.aborts,
            self.slowest.as_secs_f64() * 1e3,
            self.elapsed.as_secs_f64()
        )
    }
}

fn fail(trial: usize, what: String) -> HalError {
    HalError::Internal(format!("dead-rank trial {trial}: {what}"))
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// All-reduces `[rank + 1; 16]` over `comms` (one thread per rank, fresh streams) and checks
/// the sum.
fn all_reduce_works(comms: &[Arc<dyn Communicator>], trial: usize, what: &str) -> Result<()> {
    let n = comms.len();
    let want = f32s(&[(n * (n + 1) / 2) as f32; 16]);
    std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let want = want.clone();
                sc.spawn(move || -> Result<()> {
                    let s = c.device().create_stream()?;
                    let b = c.device().alloc(64)?;
                    s.write(&b, 0, &f32s(&[(c.rank() + 1) as f32; 16]))?;
                    c.all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &s)?;
                    let mut out = vec![0u8; 64];
                    s.read(&b, 0, &mut out)?;
                    if out != want {
                        return Err(fail(trial, format!("{what}: wrong all-reduce result")));
                    }
                    Ok(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(fail(trial, format!("{what}: a rank panicked"))))
        })
    })
}

/// Runs the trials on devices 0 and 1 of `backend`, which must have collectives.
///
/// # Errors
/// [`HalError::Unsupported`] without collectives or two devices; [`HalError::Internal`] naming
/// the trial and what went wrong (a success where the survivor must fail, another error kind, an
/// error later than timeout + margin, a bystander changed, a communicator that stopped working).
pub fn dead_rank_trials(
    backend: &Arc<dyn Backend>,
    opts: &DeadRankOptions,
) -> Result<DeadRankReport> {
    let start = Instant::now();
    let ccl = backend
        .collectives()
        .ok_or_else(|| HalError::unsupported(format!("{}: no collectives", backend.name())))?;
    let devices: [Arc<dyn Device>; 2] = [backend.open(0)?, backend.open(1)?];
    let cfg = CommConfig {
        timeout: Some(opts.timeout),
    };
    // The bystanders: a buffer per device no collective touches, and a second communicator.
    let pattern: Vec<u8> = (0..256u32).map(|i| (i * 37 + 11) as u8).collect();
    let bystanders: Vec<(Arc<dyn Stream>, Buffer)> = devices
        .iter()
        .map(|d| -> Result<_> {
            let s = d.create_stream()?;
            let b = d.alloc(pattern.len())?;
            s.write(&b, 0, &pattern)?;
            Ok((s, b))
        })
        .collect::<Result<_>>()?;
    let other = ccl.init_all(&devices, &CommConfig::default())?;
    let mut report = DeadRankReport::default();
    let mut seed = opts.seed | 1;
    for trial in 0..opts.trials {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let dies_after = (seed % opts.rounds as u64) as usize;
        let comms = ccl.init_all(&devices, &cfg)?;
        let (survivor, dead) = (comms[0].clone(), comms[1].clone());
        // The dying rank: `dies_after` rounds, then nothing (its communicator is kept, as a dead
        // process's resources are not released by it).
        let dead_stream = dead.device().create_stream()?;
        let dead_buf = dead.device().alloc(64)?;
        let dying = std::thread::spawn({
            let (dead, s, b) = (dead.clone(), dead_stream.clone(), dead_buf.clone());
            move || -> Result<()> {
                for _ in 0..dies_after {
                    dead.all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &s)?;
                }
                s.synchronize()
            }
        });
        let s = survivor.device().create_stream()?;
        let b = survivor.device().alloc(64)?;
        let mut r: Result<()> = Ok(());
        for _ in 0..opts.rounds {
            r = survivor.all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &s);
            if r.is_err() {
                break;
            }
        }
        let t0 = Instant::now();
        if r.is_ok() {
            // On its own thread, so an engine that never fails it is reported, not waited for.
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = s.clone();
            std::thread::spawn(move || {
                let _ = tx.send(waiter.synchronize());
            });
            r = rx
                .recv_timeout(opts.timeout + opts.margin + Duration::from_secs(10))
                .map_err(|_| {
                    fail(
                        trial,
                        format!("the survivor's wait never ended (it died after {dies_after} rounds): a hang"),
                    )
                })?;
        }
        let took = t0.elapsed();
        dying
            .join()
            .unwrap_or_else(|_| Err(fail(trial, "the dying rank panicked".into())))
            .map_err(|e| fail(trial, format!("the dying rank's own rounds failed: {e}")))?;
        match r {
            Err(HalError::Timeout { .. }) => report.timeouts += 1,
            Err(HalError::Aborted { .. }) => report.aborts += 1,
            Ok(()) => {
                return Err(fail(
                    trial,
                    format!("the survivor's {} rounds succeeded without its peer (it died after {dies_after})", opts.rounds),
                ))
            }
            Err(e) => return Err(fail(trial, format!("the survivor got {e}, not Timeout or Aborted"))),
        }
        if took > opts.timeout + opts.margin {
            return Err(fail(
                trial,
                format!(
                    "the survivor's error came {took:?} after its wait, over the {:?} timeout + {:?} margin",
                    opts.timeout, opts.margin
                ),
            ));
        }
        report.slowest = report.slowest.max(took);
        drop((survivor, dead, comms));
        // Nothing else suffered.
        for (i, (s, buf)) in bystanders.iter().enumerate() {
            let mut out = vec![0u8; pattern.len()];
            s.read(buf, 0, &mut out)?;
            if out != pattern {
                return Err(fail(
                    trial,
                    format!("device {i}'s bystander buffer changed"),
                ));
            }
        }
        all_reduce_works(&other, trial, "the second communicator")?;
        let rebuilt = ccl.init_all(&devices[..1], &cfg)?;
        all_reduce_works(&rebuilt, trial, "the survivor's new communicator")?;
        report.trials += 1;
    }
    report.elapsed = start.elapsed();
    Ok(report)
}
