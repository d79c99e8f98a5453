//! The state one validated backend shares with all its wrappers: the model and the findings.

use crate::finding::{Finding, Site};
use crate::tracker::{Touch, Tracker};
use crate::Mode;
use parking_lot::Mutex;
use unihal_hal::{HalError, HostBuffer, Invalid, MapObserver, Result};

/// Ownership: one per [`crate::ValidatingBackend`], shared (`Arc`) by its devices, streams,
/// events and communicators. Thread safety: `Sync`; its locks are held for bookkeeping only.
pub(crate) struct Layer {
    pub mode: Mode,
    pub tracker: Mutex<Tracker>,
    findings: Mutex<Vec<Finding>>,
}

impl Layer {
    pub fn new(mode: Mode) -> Layer {
        Layer {
            mode,
            tracker: Mutex::new(Tracker::default()),
            findings: Mutex::new(Vec::new()),
        }
    }

    /// Logs and keeps `found`.
    pub fn report(&self, found: Vec<Finding>) {
        if found.is_empty() {
            return;
        }
        for f in &found {
            tracing::warn!(target: "unihal::validate", "{f}");
        }
        crate::TOTAL.fetch_add(found.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.findings.lock().extend(found);
    }

    pub fn findings(&self) -> Vec<Finding> {
        self.findings.lock().clone()
    }

    pub fn take_findings(&self) -> Vec<Finding> {
        std::mem::take(&mut *self.findings.lock())
    }

    /// In [`Mode::Error`], the error that refuses a call with `found`; in report mode, `None`.
    pub fn refusal(&self, found: &[Finding]) -> Option<HalError> {
        let first = found.first()?;
        (self.mode == Mode::Error).then(|| {
            HalError::invalid(
                "validation",
                Invalid::Other(format!("refused by the validation layer: {first}")),
            )
        })
    }

    /// One tracked enqueue on `stream`: checks `touches`, refuses in error mode, runs `call`
    /// (the backend's enqueue) and, if the backend accepted it, records the touches and reports
    /// the findings. The caller serialises enqueues of one stream around this.
    pub fn enqueue(
        &self,
        stream: u64,
        what: &'static str,
        site: Site,
        touches: &[Touch],
        call: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let (epoch, found) = {
            let mut t = self.tracker.lock();
            let epoch = t.tick(stream);
            (epoch, t.check(stream, what, site, touches))
        };
        if let Some(e) = self.refusal(&found) {
            self.report(found);
            return Err(e);
        }
        call()?;
        self.tracker
            .lock()
            .commit(stream, epoch, what, site, touches);
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
