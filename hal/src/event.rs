//! Events: points in a stream's work, for cross-stream waits, host waits and timing.

use crate::device::{DeviceId, NativeHandle};
use crate::error::Result;
use std::any::Any;

/// Options for `Device::create_event`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventFlags {
    /// Do not record timestamps (CUDA's `CU_EVENT_DISABLE_TIMING`); makes record and wait cheaper.
    pub disable_timing: bool,
}

/// An event. Semantics follow CUDA: `Stream::record_event` captures the work enqueued so far on that
/// stream; waits and queries refer to the most recent record at the time they are made; an event never
/// recorded counts as complete.
///
/// Ownership: `Arc<dyn Event>`; a queued record or wait keeps it alive. Thread safety: any thread.
pub trait Event: Send + Sync {
    /// The device that created the event.
    fn device_id(&self) -> DeviceId;

    /// True when the work captured by the last record has completed.
    ///
    /// # Errors
    /// The recording stream's sticky error when that work failed; [`crate::Invalid::Capture`]
    /// when the last record was made inside a stream capture (see [`crate::graph`]: it marks a
    /// point in the graph, not in any stream's work; an active capture is invalidated).
    fn query(&self) -> Result<bool>;

    /// Blocks the calling thread until the captured work has completed.
    ///
    /// # Errors
    /// As [`Event::query`].
    fn synchronize(&self) -> Result<()>;

    /// Milliseconds between this event's completion and `end`'s.
    ///
    /// # Errors
    /// [`crate::HalError::InvalidArgument`] when either event disables timing, was never recorded,
    /// or is from another backend; [`crate::HalError::Unsupported`] when the device cannot time;
    /// a not-yet-complete event gives [`crate::HalError::InvalidArgument`] too (query or synchronize
    /// first).
    fn elapsed_ms(&self, end: &dyn Event) -> Result<f32>;

    /// The vendor event handle.
    fn native_handle(&self) -> NativeHandle;

    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}
