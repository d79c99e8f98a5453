//! The one error type of the HAL.
//!
//! Every fallible HAL call returns [`HalError`]. The variants separate "this cannot run here"
//! ([`HalError::Unavailable`], [`HalError::Unsupported`]), which a framework falls back on and the
//! conformance suite skips on, from real failures. Misuse of the safe API is always
//! [`HalError::InvalidArgument`] carrying the offending values in a typed [`Invalid`].

use crate::device::DeviceId;
use crate::graph::CaptureId;

/// Result alias used throughout unihal.
pub type Result<T, E = HalError> = std::result::Result<T, E>;

/// Every error a HAL call can return.
///
/// `Clone` because asynchronous errors are sticky: a stream or communicator keeps the first one and
/// hands out copies of it to every later call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum HalError {
    /// A backend, library or device is not present on this machine. `reason` lists what was tried.
    #[error("{what} is unavailable: {reason}")]
    Unavailable { what: String, reason: String },
    /// The backend or device exists but does not implement this operation or variant.
    #[error("unsupported: {what}")]
    Unsupported { what: String },
    /// The caller passed something wrong; `arg` names the argument, `reason` the offending values.
    #[error("invalid argument `{arg}`: {reason}")]
    InvalidArgument { arg: &'static str, reason: Invalid },
    /// An allocation could not be satisfied.
    #[error("out of memory: requested {requested} bytes, {free} bytes free")]
    OutOfMemory { requested: u64, free: u64 },
    /// A caching allocator could not satisfy a request, even after releasing its cached memory
    /// and retrying. The report says where the memory is.
    #[error("{0}")]
    AllocatorOutOfMemory(Box<OomReport>),
    /// An operation did not complete within its time limit.
    #[error("timed out after {millis} ms: {what}")]
    Timeout { what: String, millis: u64 },
    /// An operation was cancelled by an abort (of a communicator, stream or device).
    #[error("aborted: {what}")]
    Aborted { what: String },
    /// The device faulted or disappeared; its context can no longer be used.
    #[error("device lost: {what}")]
    DeviceLost { what: String },
    /// A plugin or library speaks another version of an interface than the one expected.
    #[error("ABI mismatch: {what}")]
    AbiMismatch { what: String },
    /// A vendor library call failed. `code` is the vendor's numeric code, `name` its symbolic name.
    #[error("{library}: {call} failed with {name} ({code}): {message}")]
    Vendor {
        library: String,
        call: String,
        code: i64,
        name: String,
        message: String,
    },
    /// A bug in unihal or a backend: an invariant did not hold.
    #[error("internal error: {0}")]
    Internal(String),
}

/// Where a device's memory was when a caching allocator ran out of it (PyTorch's message, as data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomReport {
    /// The device, as `backend:ordinal`.
    pub device: String,
    /// The bytes asked for (before rounding).
    pub requested: u64,
    /// Bytes in blocks handed out to callers.
    pub allocated: u64,
    /// Bytes the allocator holds from the device (its segments).
    pub reserved: u64,
    /// Bytes the device reported free after the allocator released its cache.
    pub free: u64,
    /// The device's total memory.
    pub total: u64,
    /// The largest free block in the allocator's cache.
    pub largest_free_block: u64,
    /// The allocator's limit (memory fraction) in bytes, when one is set.
    pub limit: Option<u64>,
}

impl std::fmt::Display for OomReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "out of memory on {}: tried to allocate {} bytes; {} bytes allocated, {} reserved by \
             the caching allocator ({} cached, largest free block {}), {} of {} bytes free on \
             the device",
            self.device,
            self.requested,
            self.allocated,
            self.reserved,
            self.reserved.saturating_sub(self.allocated),
            self.largest_free_block,
            self.free,
            self.total
        )?;
        if let Some(l) = self.limit {
            write!(f, "; the allocator's limit is {l} bytes")?;
        }
        Ok(())
    }
}

/// The offending values of an [`HalError::InvalidArgument`], typed so that callers and tests can
/// inspect them without parsing messages.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    /// `offset + len` runs past the end of an object of `size` bytes.
    #[error("range [{offset}, {offset}+{len}) is outside an object of {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// The object belongs to another device than the one the call runs on.
    #[error("object belongs to {found}, call runs on {expected}")]
    WrongDevice { expected: DeviceId, found: DeviceId },
    /// The buffer's stream-ordered free has already been enqueued; it may not be used again.
    #[error("the free of the buffer at {addr:#x} ({len} bytes) is already enqueued")]
    FreeEnqueued { addr: u64, len: u64 },
    /// The handle was made by another backend (or another implementation) than this one.
    #[error("handle of type {found} is not a {expected}")]
    ForeignHandle { expected: String, found: String },
    /// Source and destination ranges of a copy overlap (addresses are device addresses).
    #[error("destination [{dst:#x}, +{len}) overlaps source [{src:#x}, +{len})")]
    Overlap { src: u64, dst: u64, len: u64 },
    /// A host buffer is borrowed by the host or in use by queued work.
    #[error("host buffer is busy: {0}")]
    Busy(String),
    /// A value is outside what the device or operation accepts.
    #[error("{value} is not accepted: expected {accepted}")]
    Value { value: String, accepted: String },
    /// A call the stream-capture rules refuse (see [`crate::graph`]): `call` names it, `capture`
    /// the capture concerned (none when the stream was not capturing, e.g. `end_capture` on a
    /// stream that never began one), `detail` what the rule is and, for an illegal call during a
    /// capture, that the capture is now invalidated.
    #[error("{call} refused{}: {detail}", capture.map(|c| format!(" ({c})")).unwrap_or_default())]
    Capture {
        capture: Option<CaptureId>,
        call: String,
        detail: String,
    },
    /// Anything else, described in words.
    #[error("{0}")]
    Other(String),
}

impl HalError {
    /// Of the errors several ranks (or threads) of one operation returned, the one to report:
    /// the first that is a rank's own failure, before the timeouts and aborts that failure
    /// caused on the others; the first of all when every one is such a consequence. `None` for
    /// no errors.
    pub fn root_cause<'a>(errors: impl IntoIterator<Item = &'a HalError>) -> Option<&'a HalError> {
        let mut first = None;
        for e in errors {
            if !matches!(e, HalError::Timeout { .. } | HalError::Aborted { .. }) {
                return Some(e);
            }
            first.get_or_insert(e);
        }
        first
    }

    /// The [`HalError::InvalidArgument`] of a null address with a non-zero length, for
    /// `Device::import_memory` implementations.
    pub fn null_import(len: u64) -> Self {
        Self::invalid(
            "addr",
            Invalid::Value {
                value: format!("a null address for {len} bytes"),
                accepted: "a non-null address, or a length of 0".into(),
            },
        )
    }

    /// Shorthand for an [`HalError::InvalidArgument`].
    pub fn invalid(arg: &'static str, reason: Invalid) -> Self {
        HalError::InvalidArgument { arg, reason }
    }

    /// The [`Invalid::Capture`] of `call`, made illegal by the active capture `capture`, which the
    /// call invalidated (as the vendors do).
    pub fn illegal_in_capture(arg: &'static str, call: &str, capture: CaptureId) -> Self {
        Self::invalid(
            arg,
            Invalid::Capture {
                capture: Some(capture),
                call: call.into(),
                detail: "not allowed while the stream capture is active (it would wait for or \
                         observe captured work that has not run); the capture is now invalidated \
                         and its end_capture fails"
                    .into(),
            },
        )
    }

    /// Shorthand for an out-of-range [`HalError::InvalidArgument`].
    pub fn out_of_range(arg: &'static str, offset: u64, len: u64, size: u64) -> Self {
        Self::invalid(arg, Invalid::OutOfRange { offset, len, size })
    }

    /// Shorthand for an [`HalError::Unsupported`].
    pub fn unsupported(what: impl Into<String>) -> Self {
        HalError::Unsupported { what: what.into() }
    }

    /// True for both out-of-memory variants (a device's and a caching allocator's).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            HalError::OutOfMemory { .. } | HalError::AllocatorOutOfMemory(_)
        )
    }

    /// True for the two "cannot run here" variants, on which callers fall back and the conformance
    /// suite skips.
    pub fn is_not_available(&self) -> bool {
        matches!(
            self,
            HalError::Unavailable { .. } | HalError::Unsupported { .. }
        )
    }
}

/// Checks that `[offset, offset+len)` lies inside an object of `size` bytes, without overflow.
///
/// # Errors
/// [`HalError::InvalidArgument`] with [`Invalid::OutOfRange`] naming `arg`.
pub fn check_range(arg: &'static str, offset: u64, len: u64, size: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(HalError::out_of_range(arg, offset, len, size)),
    }
}

/// The message of a panic's payload (`catch_unwind`'s `Err`, a joined thread's panic): the
/// `String` or `&str` that `panic!` carries; `None` for any other payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_cause_is_a_ranks_own_failure_before_the_timeouts_it_caused() {
        let timeout = HalError::Timeout {
            what: "init".into(),
            millis: 3000,
        };
        let own = HalError::unsupported("x");
        let aborted = HalError::Aborted { what: "y".into() };
        assert_eq!(HalError::root_cause([&timeout, &aborted, &own]), Some(&own));
        assert_eq!(HalError::root_cause([&aborted, &timeout]), Some(&aborted));
        assert_eq!(HalError::root_cause(std::iter::empty()), None);
    }

    #[test]
    fn range_check_rejects_overflow_and_accepts_edges() {
        assert!(check_range("x", 0, 0, 0).is_ok());
        assert!(check_range("x", 4, 4, 8).is_ok());
        assert!(check_range("x", 8, 0, 8).is_ok());
        assert_eq!(
            check_range("x", 5, 4, 8),
            Err(HalError::out_of_range("x", 5, 4, 8))
        );
        assert!(check_range("x", u64::MAX, 2, 8).is_err());
    }

    #[test]
    fn messages_carry_values() {
        let e = HalError::OutOfMemory {
            requested: 10,
            free: 3,
        };
        assert_eq!(
            e.to_string(),
            "out of memory: requested 10 bytes, 3 bytes free"
        );
        let e = HalError::out_of_range("dst", 5, 4, 8);
        assert!(e.to_string().contains("[5, 5+4)") && e.to_string().contains("8 bytes"));
    }
}
