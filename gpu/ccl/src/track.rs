//! The vendor-neutral parts of a collective engine that enqueues a library's calls on device
//! streams: the engine of the NCCL API here, HCCL's in the Ascend backend. Nothing here names a
//! library:
//!
//! * [`operand_addr`]: an operand's device address after the HAL's and the platform's checks,
//!   so that every engine rejects the same misuse with the same error;
//! * [`Operands`]: the checks every operation makes before it touches its library (the sticky
//!   error, the HAL's checks of the call and the stream, the platform's of the stream, each
//!   operand's address, where send and receive may coincide), once for every engine;
//! * [`InFlight`] and [`retire`]: an operation in flight (a completion event recorded behind it on
//!   its stream, and a deadline), and one watchdog pass over a list of them;
//! * [`start_watchdog`]: the watchdog thread of a communicator, holding only a weak reference
//!   to it (a dropped communicator ends its watch).

use crate::platform::Platform;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::ccl::{check_call, check_rank, check_send_recv, GroupCall, P2pParts};
use unihal_hal::{Buffer, CclCaps, CollectiveOp, DType, Device, DeviceId, Event, EventFlags};
use unihal_hal::{HalError, Invalid, ReduceOp};
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

/// The checks of one communicator's operations, shared by every engine: what the HAL requires
/// (`unihal_hal::ccl::check_call`: the sticky error, the dtype and reduction against the
/// capabilities, the stream's device) and what the platform requires (its own stream, its own
/// buffers in range). Borrowed from the communicator for one call.
pub struct Operands<'a> {
    /// The backend's side of devices and streams.
    pub platform: &'a dyn Platform,
    /// The communicator's device.
    pub device: &'a Arc<dyn Device>,
    /// The engine's capabilities.
    pub caps: &'a CclCaps,
}

impl Operands<'_> {
    /// The checks of every operation: the sticky error (`sticky`), the HAL's, the platform's
    /// stream check.
    ///
    /// # Errors
    /// The sticky error; the HAL's and the platform's `InvalidArgument` and `Unsupported`.
    pub fn check(
        &self,
        sticky: Option<HalError>,
        call: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        check_call(self.device, self.caps, sticky, call, stream)?;
        self.platform.check_stream(stream)
    }

    /// The device address of `elems` elements at the start of `buf` ([`operand_addr`]).
    ///
    /// # Errors
    /// As [`operand_addr`].
    pub fn addr(&self, buf: &Buffer, arg: &'static str, elems: u64, dtype: DType) -> Result<u64> {
        operand_addr(self.platform, self.device.id(), buf, arg, elems, dtype)
    }

    /// The checks of an operation on a send and a receive buffer, then their addresses; `None`
    /// for a count of 0 (nothing to enqueue). `in_place` is where the two may coincide, in
    /// elements (`unihal_hal::ccl::check_send_recv`); `None` when this rank uses only one of
    /// them (broadcast and reduce off the root).
    ///
    /// # Errors
    /// As [`Operands::check`] and [`Operands::addr`]; an overlap the operation does not allow.
    #[allow(clippy::too_many_arguments)]
    pub fn two_buffers(
        &self,
        sticky: Option<HalError>,
        call: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &Arc<dyn Stream>,
        (send, send_elems): (&Buffer, u64),
        (recv, recv_elems): (&Buffer, u64),
        count: u64,
        in_place: Option<(u64, u64)>,
    ) -> Result<Option<(u64, u64)>> {
        let (_, dtype, _) = call;
        self.check(sticky, call, stream)?;
        let sa = self.addr(send, "send", send_elems, dtype)?;
        let ra = self.addr(recv, "recv", recv_elems, dtype)?;
        if let Some((so, ro)) = in_place {
            // Both sizes fit 64 bits (checked just above); the offsets lie inside them.
            let esz = dtype.size() as u64;
            let (sl, rl) = (send_elems * esz, recv_elems * esz);
            check_send_recv(send, sl, recv, rl, (so * esz, ro * esz))?;
        }
        Ok((count != 0).then_some((sa, ra)))
    }
}

impl Operands<'_> {
    /// The checks of a group of sends and receives among `size` ranks (each call as
    /// [`Operands::check`] with `sticky()`, its peer, its buffer), then each call with its
    /// device address, in order.
    ///
    /// # Errors
    /// As [`Operands::check`]; `InvalidArgument` naming `peer` or the buffer.
    pub fn group<'c>(
        &self,
        sticky: impl Fn() -> Option<HalError>,
        size: usize,
        calls: &'c [GroupCall],
        stream: &Arc<dyn Stream>,
    ) -> Result<Vec<(P2pParts<'c>, u64)>> {
        calls
            .iter()
            .map(|c| {
                let p = c.parts();
                self.check(sticky(), (CollectiveOp::SendRecv, p.dtype, None), stream)?;
                check_rank("peer", p.peer, size)?;
                let arg = if p.recv { "recv" } else { "send" };
                let a = self.addr(p.buf, arg, p.count, p.dtype)?;
                Ok((p, a))
            })
            .collect()
    }
}

/// What an operation is, for messages and timeouts: "NCCL all_reduce of 4 f32 sum".
pub fn describe(
    label: &str,
    op: CollectiveOp,
    count: u64,
    dtype: DType,
    red: Option<ReduceOp>,
) -> String {
    format!(
        "{label} {} of {count} {dtype}{}",
        op.name(),
        red.map(|r| format!(" {r}")).unwrap_or_default()
    )
}

/// The stream identity under which an operation enqueued now on `stream` keeps its buffers:
/// the capture's ([`unihal_hal::CaptureId::stream_id`]) while the stream is capturing (the
/// graph keeps them while it lives), else the stream's.
pub fn use_key(stream: &Arc<dyn Stream>) -> unihal_hal::StreamId {
    match stream.capture_status().capture() {
        Some(c) => c.stream_id(),
        None => stream.stream_id(),
    }
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
