//! Events of a GPU runtime: timing unless disabled, record and wait through streams, query,
//! synchronize and elapsed time.

use crate::device::GpuDevice;
use crate::graph::CaptureRec;
use crate::runtime::{Raw, Runtime};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use unihal_hal::{DeviceId, Event, EventFlags, HalError, Invalid, NativeHandle, Result};

/// A runtime event. Thread-safe (the runtimes' events are). Destroyed when dropped (the runtime
/// lets pending records complete first).
pub struct GpuEvent<R: Runtime> {
    pub(crate) dev: Arc<GpuDevice<R>>,
    pub(crate) raw: Raw,
    timing: bool,
    pub(crate) recorded: AtomicBool,
    /// The capture the last record was made in (a point of that graph, not of any stream's
    /// work), if any.
    pub(crate) capture: Mutex<Option<Arc<CaptureRec>>>,
}

impl<R: Runtime> GpuEvent<R> {
    pub(crate) fn new(dev: Arc<GpuDevice<R>>, flags: EventFlags) -> Result<Arc<GpuEvent<R>>> {
        let rt = dev.rt();
        let raw = dev.call("event create", || rt.event_create(!flags.disable_timing))?;
        Ok(Arc::new(GpuEvent {
            dev,
            raw,
            timing: !flags.disable_timing,
            recorded: AtomicBool::new(false),
            capture: Mutex::new(None),
        }))
    }

    /// The runtime event behind a HAL event of this backend.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] naming `arg` for another backend's event.
    pub fn of<'a>(e: &'a dyn Event, arg: &'static str) -> Result<&'a GpuEvent<R>> {
        e.as_any().downcast_ref::<GpuEvent<R>>().ok_or_else(|| {
            HalError::invalid(
                arg,
                Invalid::ForeignHandle {
                    expected: format!("{} event", R::VENDOR),
                    found: format!("event of {}", e.device_id()),
                },
            )
        })
    }

    /// The runtime's handle.
    pub fn raw(&self) -> Raw {
        self.raw
    }

    /// The capture the last record was made in, while it is active.
    pub(crate) fn recorded_in(&self) -> Option<Arc<CaptureRec>> {
        self.capture.lock().clone().filter(|c| c.active())
    }

    /// The capture the runtime's capture error of a call on this event concerns: the one the
    /// event was recorded in, else one active on its device.
    fn capture_error(&self, e: HalError) -> HalError {
        let last = self.capture.lock().as_ref().map(|c| c.id);
        self.dev
            .rt()
            .capture_error(e, "event", &|| last.or_else(|| self.dev.active_capture()))
    }

    fn not_timing(&self, arg: &'static str, why: &str) -> HalError {
        HalError::invalid(arg, Invalid::Other(why.into()))
    }
}

impl<R: Runtime> Event for GpuEvent<R> {
    fn device_id(&self) -> DeviceId {
        self.dev.core.id
    }

    fn query(&self) -> Result<bool> {
        // An event recorded in a capture: the runtime refuses the query (and invalidates an
        // active capture); its error names the capture.
        self.dev
            .call("event query", || self.dev.rt().event_query(self.raw))
            .map_err(|e| self.capture_error(e))
    }

    fn synchronize(&self) -> Result<()> {
        let r = self
            .dev
            .call("event synchronize", || {
                self.dev.rt().event_synchronize(self.raw)
            })
            .map_err(|e| self.capture_error(e));
        // Releases host callbacks deferred (see `deferred`) are due once their work is done.
        crate::deferred::flush();
        r
    }

    fn elapsed_ms(&self, end: &dyn Event) -> Result<f32> {
        let end = GpuEvent::<R>::of(end, "end")?;
        for (e, arg) in [(self, "start"), (end, "end")] {
            if !e.timing {
                return Err(e.not_timing(arg, "event created with timing disabled"));
            }
            if !e.recorded.load(Ordering::Acquire) {
                return Err(e.not_timing(arg, "event never recorded"));
            }
            if !e.query()? {
                return Err(
                    e.not_timing(arg, "event not completed yet (query or synchronize first)")
                );
            }
        }
        self.dev.call("event elapsed time", || {
            self.dev.rt().event_elapsed(self.raw, end.raw)
        })
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::Ptr(self.raw.0)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<R: Runtime> Drop for GpuEvent<R> {
    fn drop(&mut self) {
        let (dev, raw) = (self.dev.clone(), self.raw);
        crate::deferred::release(move || {
            let rt = dev.rt();
            dev.core.release("event destroy", move || {
                // SAFETY: created in `new`, destroyed once (a retried release runs only when
                // the earlier attempt did not); the runtime defers the release until pending
                // records complete.
                unsafe { rt.event_destroy(raw) }
            });
        });
    }
}
