//! Test-only faults, all behind the `fault-injection` feature (without it the checks compile
//! away):
//!
//! * ordering faults ([`Fault`]): a backend built with one deliberate ordering bug, so a test can
//!   prove that the conformance suite notices it;
//! * injected failures ([`injection`]): the `n`th call of a fault point fails, and live objects
//!   are counted, for the fault sweeps of `unihal_conformance::faults`.

/// One deliberate ordering bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Execute every operation synchronously on the enqueuing thread, instead of asynchronously on
    /// the stream worker.
    InlineExecution,
    /// Treat `Stream::wait_event` as a no-op.
    IgnoreEventWaits,
    /// The worker takes the newest queued operation first instead of the oldest.
    ReorderQueue,
    /// An event counts as complete as soon as its record is enqueued.
    EarlyEventCompletion,
}

impl Fault {
    /// Every fault, for tests that iterate over them.
    pub const ALL: [Fault; 4] = [
        Fault::InlineExecution,
        Fault::IgnoreEventWaits,
        Fault::ReorderQueue,
        Fault::EarlyEventCompletion,
    ];
}

/// The fault a backend instance was built with (always `None` without `fault-injection`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FaultSwitch(#[allow(dead_code)] Option<Fault>);

impl FaultSwitch {
    #[cfg(feature = "fault-injection")]
    pub(crate) fn new(f: Option<Fault>) -> Self {
        FaultSwitch(f)
    }

    /// True when `f` is injected.
    #[inline(always)]
    pub(crate) fn is(self, f: Fault) -> bool {
        #[cfg(feature = "fault-injection")]
        {
            self.0 == Some(f)
        }
        #[cfg(not(feature = "fault-injection"))]
        {
            let _ = f;
            false
        }
    }
}

/// Injected failures in the CPU backend's own code, for fault sweeps (feature
/// `fault-injection`): the `n`th call of a fault point (a kind of call: `alloc`, `copy`,
/// `launch`, ...) returns an error instead of running, and the objects the backend holds are
/// counted process-wide so that a sweep can prove nothing leaked. Without the feature every
/// point is a no-op that compiles away.
#[cfg(feature = "fault-injection")]
pub mod injection {
    use parking_lot::Mutex;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
    use unihal_hal::{HalError, Result};

    static COUNTING: AtomicBool = AtomicBool::new(false);
    static CALLS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
    /// Armed failures: point, calls still to let through, code.
    static ARMED: Mutex<Vec<(String, u32, i32)>> = Mutex::new(Vec::new());

    /// Code 1: the call fails as [`HalError::OutOfMemory`].
    pub const OUT_OF_MEMORY: i32 = 1;
    /// Code 2: the call fails as [`HalError::DeviceLost`].
    pub const DEVICE_LOST: i32 = 2;
    // Any other code: a `HalError::Vendor` from library "unihal-cpu" with that code.

    /// Starts (from zero) or stops counting calls of every fault point.
    pub fn count_calls(on: bool) {
        CALLS.lock().clear();
        COUNTING.store(on, Ordering::SeqCst);
    }

    /// Calls of each fault point since counting started.
    pub fn calls() -> BTreeMap<String, u64> {
        CALLS
            .lock()
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }

    /// The `n`th call (from now, 1 = the next, any thread) of `point` fails with `code`.
    pub fn arm(point: &str, n: u32, code: i32) {
        ARMED
            .lock()
            .push((point.to_string(), n.saturating_sub(1), code));
    }

    /// Disarms every failure; returns how many had not fired.
    pub fn disarm() -> usize {
        std::mem::take(&mut *ARMED.lock()).len()
    }

    pub(crate) fn fire(point: &'static str) -> Result<()> {
        if COUNTING.load(Ordering::Relaxed) {
            *CALLS.lock().entry(point).or_insert(0) += 1;
        }
        let mut armed = ARMED.lock();
        let Some(i) = armed.iter().position(|a| a.0 == point) else {
            return Ok(());
        };
        if armed[i].1 > 0 {
            armed[i].1 -= 1;
            return Ok(());
        }
        let (_, _, code) = armed.remove(i);
        Err(match code {
            OUT_OF_MEMORY => HalError::OutOfMemory {
                requested: 0,
                free: 0,
            },
            DEVICE_LOST => HalError::DeviceLost {
                what: format!("{point}: injected fault {code}"),
            },
            _ => HalError::Vendor {
                library: "unihal-cpu".into(),
                call: point.into(),
                code: code.into(),
                name: "INJECTED".into(),
                message: "a failure injected by a fault sweep".into(),
            },
        })
    }

    pub(crate) static ALLOCATIONS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static BYTES: AtomicI64 = AtomicI64::new(0);
    pub(crate) static STREAMS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static EVENTS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static MODULES: AtomicI64 = AtomicI64::new(0);

    /// Objects of the CPU backend alive in this process: (allocations, bytes, stream workers,
    /// events, modules).
    pub fn live() -> [i64; 5] {
        [&ALLOCATIONS, &BYTES, &STREAMS, &EVENTS, &MODULES].map(|c| c.load(Ordering::SeqCst))
    }
}

/// A fault point: `Err` when a failure injected at `point` fires now (never without the
/// `fault-injection` feature).
#[inline(always)]
pub(crate) fn point(point: &'static str) -> unihal_hal::Result<()> {
    #[cfg(feature = "fault-injection")]
    {
        injection::fire(point)
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = point;
        Ok(())
    }
}

/// Which live-object counter [`track`] moves.
#[derive(Clone, Copy)]
pub(crate) enum Counter {
    Allocations,
    Bytes,
    Streams,
    Events,
    Modules,
}

/// Moves a live-object counter by `delta` (a no-op without the `fault-injection` feature).
#[inline(always)]
pub(crate) fn track(counter: Counter, delta: i64) {
    #[cfg(feature = "fault-injection")]
    {
        use injection::*;
        let c = match counter {
            Counter::Allocations => &ALLOCATIONS,
            Counter::Bytes => &BYTES,
            Counter::Streams => &STREAMS,
            Counter::Events => &EVENTS,
            Counter::Modules => &MODULES,
        };
        c.fetch_add(delta, std::sync::atomic::Ordering::SeqCst);
    }
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = (counter, delta);
    }
}
