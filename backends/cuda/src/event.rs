//! CUDA events: `cuEventCreate` (timing unless disabled), record/wait through streams, query,
//! synchronize and elapsed time.

use crate::conv::{not_ready, vendor};
use crate::device::CudaDevice;
use crate::drv::result;
use cudarc::driver::sys;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use unihal_hal::{DeviceId, Event, EventFlags, HalError, Invalid, NativeHandle, Result};

/// A CUDA event. Thread-safe (the driver's events are).
pub struct CudaEvent {
    pub(crate) dev: Arc<CudaDevice>,
    pub(crate) raw: sys::CUevent,
    timing: bool,
    pub(crate) recorded: AtomicBool,
}

// SAFETY: CUevent handles may be used from any thread.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    pub(crate) fn new(dev: Arc<CudaDevice>, flags: EventFlags) -> Result<Arc<CudaEvent>> {
        let f = if flags.disable_timing {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        } else {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        };
        let raw = dev.call("cuEventCreate", || {
            result::event::create(f).map_err(|e| vendor("cuEventCreate", e))
        })?;
        Ok(Arc::new(CudaEvent {
            dev,
            raw,
            timing: !flags.disable_timing,
            recorded: AtomicBool::new(false),
        }))
    }

    /// The CUDA event behind a HAL event of this backend.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] for another backend's event.
    pub(crate) fn of<'a>(e: &'a dyn Event, arg: &'static str) -> Result<&'a CudaEvent> {
        e.as_any().downcast_ref::<CudaEvent>().ok_or_else(|| {
            HalError::invalid(
                arg,
                Invalid::ForeignHandle {
                    expected: "CUDA event".into(),
                    found: format!("event of {}", e.device_id()),
                },
            )
        })
    }

    fn not_timing(&self, arg: &'static str, why: &str) -> HalError {
        HalError::invalid(arg, Invalid::Other(why.into()))
    }
}

impl Event for CudaEvent {
    fn device_id(&self) -> DeviceId {
        self.dev.ctx.id
    }

    fn query(&self) -> Result<bool> {
        self.dev.call("cuEventQuery", || {
            // SAFETY: a live event of this context.
            match unsafe { result::event::query(self.raw) } {
                Ok(()) => Ok(true),
                Err(e) if not_ready(&e) => Ok(false),
                Err(e) => Err(vendor("cuEventQuery", e)),
            }
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.dev.call("cuEventSynchronize", || {
            // SAFETY: a live event of this context.
            unsafe { result::event::synchronize(self.raw) }
                .map_err(|e| vendor("cuEventSynchronize", e))
        })
    }

    fn elapsed_ms(&self, end: &dyn Event) -> Result<f32> {
        let end = CudaEvent::of(end, "end")?;
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
        self.dev.call("cuEventElapsedTime", || {
            // SAFETY: two live, completed, timing events.
            unsafe { result::event::elapsed(self.raw, end.raw) }
                .map_err(|e| vendor("cuEventElapsedTime", e))
        })
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::Ptr(self.raw as *mut std::ffi::c_void)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        let (dev, raw) = (self.dev.clone(), self.raw as usize);
        crate::deferred::release(move || {
            let _ = dev.call("cuEventDestroy", || {
                // SAFETY: created in `new`, destroyed once; the driver defers the release until
                // pending records complete.
                unsafe { result::event::destroy(raw as sys::CUevent) }
                    .map_err(|e| vendor("cuEventDestroy", e))
            });
        });
    }
}
