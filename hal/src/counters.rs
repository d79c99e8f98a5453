//! Counter samples for a timeline: how a layer above the backends (the caching allocator) tells
//! a trace recorder (`UNIHAL_TRACE`, in unihal-layer) of a quantity that changed, such as the
//! bytes allocated and reserved on a device.
//!
//! With no recorder installed, [`sample`] costs one relaxed atomic load and a branch; callers
//! that build their sample check [`recording`] first.

use crate::DeviceId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Receives counter samples. Installed once per process with [`install`].
///
/// Thread safety: called from any thread, possibly with the caller's locks held: an
/// implementation only appends and must not call back into the HAL.
pub trait CounterSink: Send + Sync {
    /// `series` (name, value) of the counter `name` on `device`, as of now.
    fn sample(&self, device: DeviceId, name: &'static str, series: &[(&'static str, i64)]);
}

static SINK: OnceLock<Arc<dyn CounterSink>> = OnceLock::new();
static RECORDING: AtomicBool = AtomicBool::new(false);

/// Installs the process's counter sink.
///
/// # Errors
/// `Err(sink)` when one is installed already (the first stays).
pub fn install(sink: Arc<dyn CounterSink>) -> Result<(), Arc<dyn CounterSink>> {
    SINK.set(sink)?;
    RECORDING.store(true, Ordering::Release);
    Ok(())
}

/// True when a sink is installed.
#[inline]
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Passes a sample to the sink, if one is installed.
#[inline]
pub fn sample(device: DeviceId, name: &'static str, series: &[(&'static str, i64)]) {
    if recording() {
        if let Some(s) = SINK.get() {
            s.sample(device, name, series);
        }
    }
}
