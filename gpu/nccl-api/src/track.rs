//! The vendor-neutral parts of a collective engine that enqueues a library's calls on device
//! streams: the engine of the NCCL API here, HCCL's in the Ascend backend. Nothing here names a
//! library:
//!
//! * [`operand_addr`]: an operand's device address after the HAL's and the platform's checks,
//!   so that every engine rejects the same misuse with the same error;
//! * [`InFlight`] and [`retire`]: an operation in flight (a completion event recorded behind it on
//!   its stream, and a deadline), and one watchdog pass over a list of them;
//! * [`start_watchdog`]: the watchdog thread of a communicator, holding only a weak reference
//!   to it (a dropped communicator ends its watch).

use crate::platform::Platform;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{Buffer, DType, Device, DeviceId, Event, EventFlags, HalError, Invalid};
use unihal_hal::{Result, Stream};

/// The device address of `elems` elements of `dtype` at the start of `buf` (the argument
/// `arg`), after the platform's checks (its own allocation, on `device`, in range, not freed).
///
/// # Errors
/// [`Invalid::Value`] when the size does not fit 64 bits; the platform's
/// [`HalError::InvalidArgument`]s.
pub fn operand_addr(
    platform: &dyn Platform,
    device: DeviceId,
    buf: &Buffer,
    arg: &'static str,
    elems: u64,
    dtype: DType,
) -> Result<u64> {
    let len = elems.checked_mul(dtype.size() as u64).ok_or_else(|| {
        HalError::invalid(
            arg,
            Invalid::Value {
                value: format!("{elems} elements"),
                accepted: "a size that fits 64 bits".into(),
            },
        )
    })?;
    platform.buffer_addr(buf, arg, device, len)
}

/// An operation in flight: a completion event recorded on its stream right behind it, the
/// stream, its deadline and what it is (for a timeout's message).
pub struct InFlight {
    pub done: Arc<dyn Event>,
    pub stream: Arc<dyn Stream>,
    pub deadline: Instant,
    pub what: String,
}

impl InFlight {
    /// Records the completion event of the work enqueued on `stream` so far.
    ///
    /// # Errors
    /// The event's creation or record.
    pub fn record(
        device: &Arc<dyn Device>,
        stream: &Arc<dyn Stream>,
        what: String,
        deadline: Instant,
    ) -> Result<InFlight> {
        let done = device.create_event(EventFlags {
            disable_timing: true,
        })?;
        stream.record_event(&done)?;
        Ok(InFlight {
            done,
            stream: stream.clone(),
            deadline,
            what,
        })
    }

    /// True once the operation completed, or failed (its stream then holds the error).
    pub fn finished(&self) -> bool {
        !matches!(self.done.query(), Ok(false))
    }
}

/// One watchdog pass over `ops`: drops the finished ones and returns what the first operation
/// still pending past its deadline is (None when none is).
pub fn retire(ops: &mut Vec<InFlight>, now: Instant) -> Option<String> {
    let mut expired = None;
    ops.retain(|op| match op.done.query() {
        Ok(true) => false,
        Ok(false) if now >= op.deadline => {
            expired.get_or_insert(op.what.clone());
            true
        }
        Ok(false) => true,
        Err(_) => false, // the stream holds the error
    });
    expired
}

/// Starts the watchdog of `shared` unless `running(shared)` says it runs: a thread named `name`
/// that holds only a weak reference and calls `pass` every millisecond while it returns true
/// (work left to watch). After a false pass it stops, unless `resume` says work queued meanwhile
/// needs watching (then it goes on). A dropped `shared` ends it.
pub fn start_watchdog<T: Send + Sync + 'static>(
    shared: &Arc<T>,
    running: fn(&T) -> &AtomicBool,
    name: String,
    pass: fn(&T) -> bool,
    resume: fn(&T) -> bool,
) {
    if running(shared).swap(true, Ordering::AcqRel) {
        return;
    }
    let weak = Arc::downgrade(shared);
    let spawned = std::thread::Builder::new().name(name).spawn(move || loop {
        let Some(shared) = weak.upgrade() else { return };
        if !pass(&shared) {
            running(&shared).store(false, Ordering::Release);
            // An operation queued meanwhile restarts the watch (unless its own start did).
            if !resume(&shared) || running(&shared).swap(true, Ordering::AcqRel) {
                return;
            }
        }
        drop(shared);
        std::thread::sleep(Duration::from_millis(1));
    });
    if spawned.is_err() {
        running(shared).store(false, Ordering::Release);
    }
}
