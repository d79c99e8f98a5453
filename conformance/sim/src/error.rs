//! The simulator's errors: vendor-neutral kinds that each face maps to its API's codes (a CUDA
//! face to `CUresult`, a HIP face to `hipError_t`, an ACL face to `aclError`).

use std::fmt;

/// What went wrong, in terms every vendor API has a code for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimError {
    /// A malformed argument (a null or zero-length where not allowed, a range outside its
    /// allocation at enqueue time).
    InvalidValue(String),
    /// The device's capacity would be exceeded.
    OutOfMemory { requested: u64, free: u64 },
    /// A stream, event or allocation handle that does not exist (or no longer exists).
    InvalidHandle(String),
    /// Freeing an address that was already freed.
    DoubleFree(u64),
    /// Freeing an allocation that queued work still uses.
    FreeInFlight(u64),
    /// Queued work touched memory outside every live allocation (sticky).
    IllegalAddress { addr: u64, len: u64 },
    /// A kernel failed (sticky).
    LaunchFailed(String),
    /// Work not finished (a query in deferred mode before a synchronisation point).
    NotReady,
    /// Streams waiting on each other's events in a cycle: they would never finish.
    WaitCycle,
    /// A module image the simulator cannot load (a cubin, a fatbin, not PTX).
    InvalidImage(String),
    /// A name (kernel entry) that the module does not have.
    NotFound(String),
    /// Something the simulator does not run (a kernel without a host function): never faked.
    Unsupported(String),
    /// A call that is well-formed but not allowed now (two ranks of a communicator on one device,
    /// a rank joining twice, communicator sizes that disagree).
    InvalidUsage(String),
    /// Device work waited longer than the watchdog allows (a collective whose peers never came):
    /// sticky, as a kernel killed by a watchdog is.
    Timeout(String),
    /// A stream-capture rule was broken (see [`CaptureFault`]); never sticky.
    Capture(CaptureFault, String),
}

/// Which stream-capture rule a call broke, as CUDA and HIP number them (`*_STREAM_CAPTURE_*`
/// 900-906, captured event 907, wrong thread 908; illegal state 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureFault {
    /// Not permitted while the stream (or a capture it conflicts with) is capturing (900).
    Unsupported,
    /// The capture was invalidated by an earlier illegal call (901).
    Invalidated,
    /// Would merge two independent captures (902).
    Merge,
    /// Ended on a stream that did not begin the capture (903).
    Unmatched,
    /// A stream that joined the capture was not joined back into the origin (904).
    Unjoined,
    /// A dependency on work outside the capture (905).
    Isolation,
    /// An implicit dependency of the legacy default stream on a capturing stream (906).
    Implicit,
    /// An event last recorded in a capture used outside it (907).
    CapturedEvent,
    /// A non-relaxed capture ended from another thread (908).
    WrongThread,
    /// Begin on a capturing stream, end on a stream that is not capturing (401).
    IllegalState,
}
impl SimError {
    /// True for the errors that poison the context, as a fault in device work does on hardware.
    pub fn is_sticky(&self) -> bool {
        matches!(
            self,
            SimError::IllegalAddress { .. } | SimError::LaunchFailed(_) | SimError::Timeout(_)
        )
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::InvalidValue(m) => write!(f, "invalid value: {m}"),
            SimError::OutOfMemory { requested, free } => {
                write!(f, "out of memory: {requested} bytes requested, {free} free")
            }
            SimError::InvalidHandle(m) => write!(f, "invalid handle: {m}"),
            SimError::DoubleFree(a) => write!(f, "double free of {a:#x}"),
            SimError::FreeInFlight(a) => write!(f, "free of {a:#x} while queued work uses it"),
            SimError::IllegalAddress { addr, len } => {
                write!(
                    f,
                    "illegal address: {len} bytes at {addr:#x} outside every allocation"
                )
            }
            SimError::LaunchFailed(m) => write!(f, "launch failed: {m}"),
            SimError::NotReady => write!(f, "not ready"),
            SimError::WaitCycle => write!(f, "streams wait on each other in a cycle"),
            SimError::InvalidImage(m) => write!(f, "invalid image: {m}"),
            SimError::NotFound(m) => write!(f, "not found: {m}"),
            SimError::Unsupported(m) => write!(f, "unsupported by the simulator: {m}"),
            SimError::Timeout(m) => write!(f, "timed out: {m}"),
            SimError::InvalidUsage(m) => write!(f, "invalid usage: {m}"),
            SimError::Capture(k, m) => write!(f, "stream capture ({k:?}): {m}"),
        }
    }
}

impl std::error::Error for SimError {}

/// Results of the simulator.
pub type SimResult<T> = Result<T, SimError>;
