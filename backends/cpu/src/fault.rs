//! Test-only ordering faults.
//!
//! With the `fault-injection` feature, a backend can be built with one deliberate ordering bug, so a
//! test can prove that the conformance suite notices it. Without the feature the switch does not
//! exist and the checks compile away.

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
