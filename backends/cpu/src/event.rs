//! CPU events: a reference to a position in the recording stream's queue.
//!
//! An event's completion *is* the recording stream's completion counter reaching the recorded
//! position, so "the event is complete" and "the stream has run past it" can never disagree (after
//! synchronizing either, the other is complete too).

use crate::graph::CapturedMark;
use crate::worker::WorkerShared;
use parking_lot::Mutex;
use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use unihal_hal::{DeviceId, Event, EventFlags, HalError, Invalid, NativeHandle, Result};

/// The most recent record of an event.
#[derive(Clone)]
pub(crate) struct Record {
    pub(crate) worker: Arc<WorkerShared>,
    /// Stream position that completes the record (0 = already complete).
    pub(crate) pos: u64,
    /// When the record ran on the stream, or the sticky error that stopped the captured work (set
    /// by the stream worker before the stream's position advances past the record).
    pub(crate) time: Arc<OnceLock<Result<Instant>>>,
}

impl Record {
    /// The captured work's outcome once complete: `Ok(None)` when the record carries no timestamp
    /// (only possible under the early-completion test fault).
    pub(crate) fn outcome(&self) -> Result<Option<Instant>> {
        match self.time.get() {
            Some(Ok(t)) => Ok(Some(*t)),
            Some(Err(e)) => Err(e.clone()),
            None => Ok(None),
        }
    }
}

/// An event of the CPU backend. Recorded on streams of its own device; waited on from any device.
pub struct CpuEvent {
    device: DeviceId,
    flags: EventFlags,
    last: Mutex<Last>,
}

/// An event's most recent record.
#[derive(Clone)]
enum Last {
    Never,
    Eager(Record),
    /// Recorded inside a stream capture: a point in the graph, not in any stream's work.
    Captured(CapturedMark),
}

impl Drop for CpuEvent {
    fn drop(&mut self) {
        crate::fault::track(crate::fault::Counter::Events, -1);
    }
}

impl CpuEvent {
    pub(crate) fn new(device: DeviceId, flags: EventFlags) -> Arc<CpuEvent> {
        crate::fault::track(crate::fault::Counter::Events, 1);
        Arc::new(CpuEvent {
            device,
            flags,
            last: Mutex::new(Last::Never),
        })
    }

    /// Makes `record` the most recent record.
    pub(crate) fn set_record(&self, record: Record) {
        *self.last.lock() = Last::Eager(record);
    }

    /// Makes a record inside a capture the most recent record.
    pub(crate) fn set_captured(&self, mark: CapturedMark) {
        *self.last.lock() = Last::Captured(mark);
    }

    /// The most recent record: `Ok(None)` when never recorded, `Err(mark)` when made inside a
    /// capture.
    pub(crate) fn record(&self) -> std::result::Result<Option<Record>, CapturedMark> {
        match &*self.last.lock() {
            Last::Never => Ok(None),
            Last::Eager(r) => Ok(Some(r.clone())),
            Last::Captured(m) => Err(m.clone()),
        }
    }

    /// The most recent eager record, or the error of a host wait (`call`) on a captured one.
    fn eager_record(&self, call: &str) -> Result<Option<Record>> {
        self.record().map_err(|m| m.host_wait_error(call))
    }

    /// Downcasts a HAL event to a CPU event.
    pub(crate) fn from_dyn<'a>(arg: &'static str, e: &'a dyn Event) -> Result<&'a CpuEvent> {
        e.as_any().downcast_ref::<CpuEvent>().ok_or_else(|| {
            HalError::invalid(
                arg,
                Invalid::ForeignHandle {
                    expected: "CPU event".into(),
                    found: format!("event of {}", e.device_id()),
                },
            )
        })
    }

    fn timestamp(&self, which: &'static str) -> Result<Instant> {
        if self.flags.disable_timing {
            return Err(HalError::invalid(
                which,
                Invalid::Other("event was created with timing disabled".into()),
            ));
        }
        let Some(r) = self.eager_record("Event::elapsed_ms")? else {
            return Err(HalError::invalid(
                which,
                Invalid::Other("event was never recorded".into()),
            ));
        };
        let not_yet = || {
            HalError::invalid(
                which,
                Invalid::Other("event has not completed yet; synchronize it first".into()),
            )
        };
        if !r.worker.reached(r.pos) {
            return Err(not_yet());
        }
        r.outcome()?.ok_or_else(not_yet)
    }
}

impl Event for CpuEvent {
    fn device_id(&self) -> DeviceId {
        self.device
    }

    fn query(&self) -> Result<bool> {
        let Some(r) = self.eager_record("Event::query")? else {
            return Ok(true);
        };
        if !r.worker.reached(r.pos) {
            return Ok(false);
        }
        r.outcome().map(|_| true)
    }

    fn synchronize(&self) -> Result<()> {
        let Some(r) = self.eager_record("Event::synchronize")? else {
            return Ok(());
        };
        r.worker.wait_for(r.pos)?;
        r.outcome().map(drop)
    }

    fn elapsed_ms(&self, end: &dyn Event) -> Result<f32> {
        let end = CpuEvent::from_dyn("end", end)?;
        let t0 = self.timestamp("start")?;
        let t1 = end.timestamp("end")?;
        let ms = if t1 >= t0 {
            (t1 - t0).as_secs_f64() * 1e3
        } else {
            -((t0 - t1).as_secs_f64() * 1e3)
        };
        Ok(ms as f32)
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
