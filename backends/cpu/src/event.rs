//! CPU events: a record generation counter with completion timestamps.

use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;
use unihal_hal::{DeviceId, Event, EventFlags, HalError, Invalid, NativeHandle, Result};

#[derive(Default)]
struct State {
    /// Generation of the most recent record enqueued (0 = never recorded).
    recorded: u64,
    /// Highest generation whose work has completed.
    completed: u64,
    /// When `completed` was reached.
    time: Option<Instant>,
    /// Sticky error of the recording stream, when the captured work failed.
    error: Option<HalError>,
}

/// An event of the CPU backend. Records from any stream of any CPU device; waits from any.
pub struct CpuEvent {
    device: DeviceId,
    flags: EventFlags,
    state: Mutex<State>,
    cv: Condvar,
}

impl CpuEvent {
    pub(crate) fn new(device: DeviceId, flags: EventFlags) -> Arc<CpuEvent> {
        Arc::new(CpuEvent {
            device,
            flags,
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        })
    }

    /// Starts a record: returns the generation the stream operation must complete.
    pub(crate) fn begin_record(&self) -> u64 {
        let mut s = self.state.lock();
        s.recorded += 1;
        s.recorded
    }

    /// Marks generation `gen` complete (called by the stream worker, in stream order).
    pub(crate) fn complete(&self, gen: u64, error: Option<&HalError>) {
        let mut s = self.state.lock();
        if gen > s.completed {
            s.completed = gen;
            s.time = Some(Instant::now());
            s.error = error.cloned();
        }
        drop(s);
        self.cv.notify_all();
    }

    /// The generation a wait enqueued now must wait for.
    pub(crate) fn wait_target(&self) -> u64 {
        self.state.lock().recorded
    }

    /// Blocks until generation `gen` is complete; returns the recording stream's error, if any.
    pub(crate) fn wait_gen(&self, gen: u64) -> Result<()> {
        let mut s = self.state.lock();
        while s.completed < gen {
            self.cv.wait(&mut s);
        }
        match &s.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Downcasts a HAL event to a CPU event.
    pub(crate) fn from_dyn<'a>(arg: &'static str, e: &'a Arc<dyn Event>) -> Result<&'a CpuEvent> {
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
        let s = self.state.lock();
        if s.recorded == 0 {
            return Err(HalError::invalid(which, Invalid::Other("event was never recorded".into())));
        }
        if s.completed < s.recorded {
            return Err(HalError::invalid(
                which,
                Invalid::Other("event has not completed yet; synchronize it first".into()),
            ));
        }
        s.time.ok_or_else(|| HalError::Internal("completed event without a timestamp".into()))
    }
}

impl Event for CpuEvent {
    fn device_id(&self) -> DeviceId {
        self.device
    }

    fn query(&self) -> Result<bool> {
        let s = self.state.lock();
        if let Some(e) = &s.error {
            return Err(e.clone());
        }
        Ok(s.completed >= s.recorded)
    }

    fn synchronize(&self) -> Result<()> {
        let target = self.wait_target();
        self.wait_gen(target)
    }

    fn elapsed_ms(&self, end: &dyn Event) -> Result<f32> {
        let end = end.as_any().downcast_ref::<CpuEvent>().ok_or_else(|| {
            HalError::invalid(
                "end",
                Invalid::ForeignHandle {
                    expected: "CPU event".into(),
                    found: format!("event of {}", end.device_id()),
                },
            )
        })?;
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
