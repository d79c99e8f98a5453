//! Stress: many host threads, each driving many streams of one device with fills, cross-stream
//! copies ordered by events, random extra waits and host reads, checked exactly against a host
//! model; the whole run under a deadline, so a deadlock is a failure, not a hang.
//!
//! Each thread owns its streams and one small buffer per stream. A cross-stream copy from
//! stream `a`'s buffer into stream `b`'s is ordered both ways, as a framework orders it: `b`
//! waits for an event recorded on `a` (the source's last write), copies, records an event that
//! `a` waits for before writing its buffer again. Every read the host makes (after synchronising
//! the stream) must equal the model, and so must every buffer at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{Device, Event, EventFlags, FillValue, HalError, Result, Stream};

/// How much work a stress run does.
#[derive(Debug, Clone)]
pub struct StressOptions {
    /// Host threads.
    pub threads: usize,
    /// Streams per thread.
    pub streams_per_thread: usize,
    /// Operations per thread (fills, cross-stream copies, waits, host reads).
    pub ops_per_thread: usize,
    /// Seed of the operations' choice.
    pub seed: u64,
    /// The run fails (as a deadlock) when it has not ended by then.
    pub deadline: Duration,
}

impl Default for StressOptions {
    fn default() -> Self {
        StressOptions {
            threads: 16,
            streams_per_thread: 8,
            ops_per_thread: 10_000,
            seed: 1,
            deadline: Duration::from_secs(600),
        }
    }
}

/// What a stress run did.
#[derive(Debug, Clone, Default)]
pub struct StressReport {
    /// Operations enqueued, all threads together.
    pub ops: u64,
    /// Of which cross-stream copies (each with two events and two waits).
    pub cross_copies: u64,
    /// Host reads checked against the model (the final ones included).
    pub checks: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl std::fmt::Display for StressReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} operations ({} cross-stream copies), {} exact host checks in {:.1} s ({:.0} ops/s)",
            self.ops,
            self.cross_copies,
            self.checks,
            self.elapsed.as_secs_f64(),
            self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
        )
    }
}

/// Bytes of each stream's buffer.
const LEN: u64 = 256;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs the stress workload on `device` (see the module docs).
///
/// # Errors
/// The first error a thread met; [`HalError::Timeout`] when the run did not end by the
/// deadline (the threads are left behind); [`HalError::Internal`] for a result that differs
/// from the model, naming the thread, stream and operation.
pub fn stress(device: Arc<dyn Device>, opts: &StressOptions) -> Result<StressReport> {
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..opts.threads {
        let (dev, opts, tx) = (device.clone(), opts.clone(), tx.clone());
        std::thread::Builder::new()
            .name(format!("stress-{t}"))
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    one_thread(&dev, t, &opts)
                }))
                .unwrap_or_else(|_| Err(HalError::Internal(format!("stress thread {t} panicked"))));
                let _ = tx.send(r);
            })
            .map_err(|e| HalError::Internal(format!("cannot start a stress thread: {e}")))?;
    }
    drop(tx);
    let mut total = StressReport::default();
    for _ in 0..opts.threads {
        let left = opts.deadline.saturating_sub(start.elapsed());
        let r = rx.recv_timeout(left).map_err(|_| HalError::Timeout {
            what: format!(
                "stress run: {} threads x {} streams x {} operations (deadlock?)",
                opts.threads, opts.streams_per_thread, opts.ops_per_thread
            ),
            millis: opts.deadline.as_millis() as u64,
        })??;
        total.ops += r.ops;
        total.cross_copies += r.cross_copies;
        total.checks += r.checks;
    }
    total.elapsed = start.elapsed();
    Ok(total)
}

fn one_thread(dev: &Arc<dyn Device>, t: usize, opts: &StressOptions) -> Result<StressReport> {
    let n = opts.streams_per_thread.max(2);
    let mut rng = Rng(opts.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 1));
    let streams: Vec<Arc<dyn Stream>> =
        (0..n).map(|_| dev.create_stream()).collect::<Result<_>>()?;
    let bufs: Vec<_> = (0..n)
        .map(|_| dev.alloc(LEN as usize))
        .collect::<Result<_>>()?;
    let mut model = vec![0u32; n];
    // The last event of each stream's own writes, and of other streams' reads of its buffer.
    let mut pending_reads: Vec<Vec<Arc<dyn Event>>> = vec![Vec::new(); n];
    let mut recent: Vec<Arc<dyn Event>> = Vec::new();
    let mut report = StressReport::default();
    let check = |s: &Arc<dyn Stream>, i: usize, want: u32, op: usize| -> Result<()> {
        s.synchronize()?;
        let mut out = [0u8; LEN as usize];
        s.read(&bufs[i], 0, &mut out)?;
        if let Some(bad) = out
            .chunks(4)
            .position(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")) != want)
        {
            return Err(HalError::Internal(format!(
                "stress thread {t}, stream {i}, after operation {op}: word {bad} is not {want:#x}"
            )));
        }
        Ok(())
    };
    for op in 0..opts.ops_per_thread {
        let a = rng.below(n);
        match rng.below(10) {
            // Fill a stream's own buffer, after the copies that read it.
            0..=4 => {
                for e in pending_reads[a].drain(..) {
                    streams[a].wait_event(&e)?;
                }
                let v = (t as u32) << 24 | op as u32;
                streams[a].fill(&bufs[a], 0, LEN, FillValue::U32(v))?;
                model[a] = v;
            }
            // A cross-stream copy, ordered both ways.
            5..=7 => {
                let b = (a + 1 + rng.below(n - 1)) % n;
                let written = dev.create_event(EventFlags::default())?;
                streams[a].record_event(&written)?;
                streams[b].wait_event(&written)?;
                for e in pending_reads[b].drain(..) {
                    streams[b].wait_event(&e)?;
                }
                streams[b].copy_d2d(&bufs[a], 0, &bufs[b], 0, LEN)?;
                let read = dev.create_event(EventFlags::default())?;
                streams[b].record_event(&read)?;
                pending_reads[a].push(read.clone());
                model[b] = model[a];
                report.cross_copies += 1;
                recent.push(written);
                if recent.len() > 8 {
                    recent.remove(0);
                }
            }
            // A random extra wait on a recent event (harmless, must not deadlock).
            8 => {
                if !recent.is_empty() {
                    let e = recent[rng.below(recent.len())].clone();
                    streams[a].wait_event(&e)?;
                }
            }
            // A host read, checked.
            _ => {
                check(&streams[a], a, model[a], op)?;
                report.checks += 1;
            }
        }
        report.ops += 1;
    }
    for (i, s) in streams.iter().enumerate() {
        check(s, i, model[i], opts.ops_per_thread)?;
        report.checks += 1;
    }
    Ok(report)
}
