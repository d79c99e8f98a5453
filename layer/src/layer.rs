//! The state one layered backend shares with all its wrappers: the validation model and its
//! findings, and the trace it records into.

use crate::trace::timeline::{FlowEnd, Timeline};
use crate::trace::{Detail, Trace};
use crate::validate::finding::{Finding, Site};
use crate::validate::tracker::{Touch, Tracker};
use crate::Mode;
use parking_lot::Mutex;
use std::sync::Arc;
use unihal_hal::{HalError, HostBuffer, Invalid, MapObserver, Result, Stream};

/// Ownership: one per [`crate::LayerBackend`], shared (`Arc`) by its devices, streams,
/// events and communicators. Thread safety: `Sync`; its locks are held for bookkeeping only.
pub(crate) struct Layer {
    /// Validation's mode; `None`: not validating (the model still follows order, unread).
    pub mode: Option<Mode>,
    pub tracker: Mutex<Tracker>,
    findings: Mutex<Vec<Finding>>,
    /// The trace recorded into, if any.
    pub trace: Option<Arc<Trace>>,
}

/// What a traced enqueue needs: its stream's timeline and process, the backend's stream.
pub(crate) struct Traced<'a> {
    pub pid: u32,
    pub timeline: &'a Mutex<Timeline>,
    pub inner: &'a dyn Stream,
}

impl Layer {
    pub fn new(mode: Option<Mode>, trace: Option<Arc<Trace>>) -> Layer {
        Layer {
            mode,
            tracker: Mutex::new(Tracker::default()),
            findings: Mutex::new(Vec::new()),
            trace,
        }
    }

    /// Logs and keeps `found` (when validating).
    pub fn report(&self, found: Vec<Finding>) {
        if found.is_empty() || self.mode.is_none() {
            return;
        }
        for f in &found {
            tracing::warn!(target: "unihal::layer", "{f}");
        }
        crate::validate::TOTAL.fetch_add(found.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.findings.lock().extend(found);
    }

    pub fn findings(&self) -> Vec<Finding> {
        self.findings.lock().clone()
    }

    pub fn take_findings(&self) -> Vec<Finding> {
        std::mem::take(&mut *self.findings.lock())
    }

    /// In [`Mode::Error`], the error that refuses a call with `found`; otherwise `None`.
    pub fn refusal(&self, found: &[Finding]) -> Option<HalError> {
        let first = found.first()?;
        (self.mode == Some(Mode::Error)).then(|| {
            HalError::invalid(
                "validation",
                Invalid::Other(format!("refused by the validation layer: {first}")),
            )
        })
    }

    /// `call`, with a host span named `what` on `pid`'s process when tracing.
    pub fn host<R>(&self, pid: Option<u32>, what: &'static str, call: impl FnOnce() -> R) -> R {
        match (&self.trace, pid) {
            (Some(t), Some(pid)) => {
                let start = t.now();
                let r = call();
                t.host_span(pid, start, what);
                r
            }
            _ => call(),
        }
    }

    /// One enqueue on `stream`: when validating, checks `touches`, refuses in error mode, and
    /// records the touches once the backend accepted `call`; when tracing, a host span and a
    /// device span described by `detail` (with `flow`'s arrow end). The caller serialises
    /// enqueues of one stream around this.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        stream: u64,
        what: &'static str,
        site: Site,
        touches: &[Touch],
        traced: Option<Traced<'_>>,
        detail: impl FnOnce() -> Detail,
        flow: Option<FlowEnd>,
        call: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let validating = self.mode.is_some();
        let (epoch, found) = {
            let mut t = self.tracker.lock();
            let epoch = t.tick(stream);
            let found = if validating {
                t.check(stream, what, site, touches)
            } else {
                Vec::new()
            };
            (epoch, found)
        };
        if let Some(e) = self.refusal(&found) {
            self.report(found);
            return Err(e);
        }
        match (&self.trace, traced) {
            (Some(t), Some(tr)) => {
                let start = t.now();
                let r = call();
                t.host_span(tr.pid, start, what);
                r?;
                tr.timeline.lock().after(t, tr.inner, start, detail(), flow);
            }
            _ => call()?,
        }
        if validating {
            self.tracker
                .lock()
                .commit(stream, epoch, what, site, touches);
        }
        self.report(found);
        Ok(())
    }
}

impl MapObserver for Layer {
    fn mapped(&self, buffer: &HostBuffer, site: Site) {
        let found =
            self.tracker
                .lock()
                .host_map(buffer.host_addr() as u64, buffer.len() as u64, site);
        self.report(found);
    }
}
