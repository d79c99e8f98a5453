//! Conversions of the simulated CUDA driver: simulator errors to `CUresult` codes (the values of
//! CUDA's `cuda.h`), their names and strings, and the device attributes it reports.

use std::ffi::CStr;
use unihal_sim::gpu::ops::Fail;
use unihal_sim::{Limits, SimError};

pub const CUDA_SUCCESS: i32 = 0;
pub const CUDA_ERROR_INVALID_VALUE: i32 = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: i32 = 3;
pub const CUDA_ERROR_INVALID_DEVICE: i32 = 101;
pub const CUDA_ERROR_INVALID_IMAGE: i32 = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: i32 = 201;
pub const CUDA_ERROR_INVALID_HANDLE: i32 = 400;
pub const CUDA_ERROR_ILLEGAL_STATE: i32 = 401;
pub const CUDA_ERROR_NOT_FOUND: i32 = 500;
pub const CUDA_ERROR_NOT_READY: i32 = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: i32 = 700;
pub const CUDA_ERROR_LAUNCH_TIMEOUT: i32 = 702;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
pub const CUDA_ERROR_PEER_ACCESS_NOT_ENABLED: i32 = 705;
pub const CUDA_ERROR_LAUNCH_FAILED: i32 = 719;
pub const CUDA_ERROR_NOT_PERMITTED: i32 = 800;
pub const CUDA_ERROR_NOT_SUPPORTED: i32 = 801;
pub const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
pub const CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: i32 = 901;
pub const CUDA_ERROR_STREAM_CAPTURE_MERGE: i32 = 902;
pub const CUDA_ERROR_STREAM_CAPTURE_UNMATCHED: i32 = 903;
pub const CUDA_ERROR_STREAM_CAPTURE_UNJOINED: i32 = 904;
pub const CUDA_ERROR_STREAM_CAPTURE_ISOLATION: i32 = 905;
pub const CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: i32 = 906;
pub const CUDA_ERROR_CAPTURED_EVENT: i32 = 907;
pub const CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: i32 = 908;
pub const CUDA_ERROR_UNKNOWN: i32 = 999;

/// The `CUresult` of a broken stream-capture rule.
pub fn capture_code(k: unihal_sim::CaptureFault) -> i32 {
    use unihal_sim::CaptureFault as F;
    match k {
        F::Unsupported => CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        F::Invalidated => CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        F::Merge => CUDA_ERROR_STREAM_CAPTURE_MERGE,
        F::Unmatched => CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        F::Unjoined => CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
        F::Isolation => CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        F::Implicit => CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
        F::CapturedEvent => CUDA_ERROR_CAPTURED_EVENT,
        F::WrongThread => CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        F::IllegalState => CUDA_ERROR_ILLEGAL_STATE,
    }
}

/// The `CUresult` of a simulator error.
pub fn code(e: &SimError) -> i32 {
    match e {
        SimError::InvalidValue(_) | SimError::DoubleFree(_) | SimError::FreeInFlight(_) => {
            CUDA_ERROR_INVALID_VALUE
        }
        SimError::OutOfMemory { .. } => CUDA_ERROR_OUT_OF_MEMORY,
        SimError::InvalidHandle(_) => CUDA_ERROR_INVALID_HANDLE,
        SimError::IllegalAddress { .. } => CUDA_ERROR_ILLEGAL_ADDRESS,
        SimError::LaunchFailed(_) => CUDA_ERROR_LAUNCH_FAILED,
        SimError::NotReady => CUDA_ERROR_NOT_READY,
        SimError::WaitCycle => CUDA_ERROR_UNKNOWN,
        SimError::InvalidImage(_) => CUDA_ERROR_INVALID_IMAGE,
        SimError::NotFound(_) => CUDA_ERROR_NOT_FOUND,
        SimError::Unsupported(_) => CUDA_ERROR_NOT_SUPPORTED,
        SimError::Timeout(_) => CUDA_ERROR_LAUNCH_TIMEOUT,
        SimError::InvalidUsage(_) => CUDA_ERROR_INVALID_VALUE,
        SimError::Capture(k, _) => capture_code(*k),
    }
}

/// The `CUresult` of a shared call's failure.
pub fn fail_code(f: Fail) -> i32 {
    match f {
        Fail::Value => CUDA_ERROR_INVALID_VALUE,
        Fail::Handle => CUDA_ERROR_INVALID_HANDLE,
        Fail::Context => CUDA_ERROR_INVALID_CONTEXT,
        Fail::Device => CUDA_ERROR_INVALID_DEVICE,
        Fail::NotFound => CUDA_ERROR_NOT_FOUND,
        Fail::NotSupported => CUDA_ERROR_NOT_SUPPORTED,
        Fail::OutOfMemory => CUDA_ERROR_OUT_OF_MEMORY,
        Fail::PeerAlreadyEnabled => CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        Fail::PeerNotEnabled => CUDA_ERROR_PEER_ACCESS_NOT_ENABLED,
        Fail::Sim(e) => code(&e),
    }
}

/// `cuGetErrorName` and `cuGetErrorString` texts of a code (None for unknown codes).
pub fn names(code: i32) -> Option<(&'static CStr, &'static CStr)> {
    Some(match code {
        CUDA_SUCCESS => (c"CUDA_SUCCESS", c"no error"),
        CUDA_ERROR_INVALID_VALUE => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        CUDA_ERROR_OUT_OF_MEMORY => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        CUDA_ERROR_NOT_INITIALIZED => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        CUDA_ERROR_INVALID_DEVICE => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        CUDA_ERROR_INVALID_IMAGE => (
            c"CUDA_ERROR_INVALID_IMAGE",
            c"device kernel image is invalid",
        ),
        CUDA_ERROR_INVALID_CONTEXT => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        CUDA_ERROR_INVALID_HANDLE => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        CUDA_ERROR_NOT_FOUND => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        CUDA_ERROR_NOT_READY => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        CUDA_ERROR_ILLEGAL_ADDRESS => (
            c"CUDA_ERROR_ILLEGAL_ADDRESS",
            c"an illegal memory access was encountered",
        ),
        CUDA_ERROR_LAUNCH_TIMEOUT => (
            c"CUDA_ERROR_LAUNCH_TIMEOUT",
            c"the launch timed out and was terminated",
        ),
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => (
            c"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
            c"peer access is already enabled",
        ),
        CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => (
            c"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
            c"peer access has not been enabled",
        ),
        CUDA_ERROR_LAUNCH_FAILED => (c"CUDA_ERROR_LAUNCH_FAILED", c"unspecified launch failure"),
        CUDA_ERROR_NOT_PERMITTED => (c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
        CUDA_ERROR_NOT_SUPPORTED => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        CUDA_ERROR_ILLEGAL_STATE => (
            c"CUDA_ERROR_ILLEGAL_STATE",
            c"the operation cannot be performed in the present state",
        ),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            c"operation not permitted while the stream is capturing",
        ),
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => (
            c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            c"the capture was invalidated by an earlier error",
        ),
        CUDA_ERROR_STREAM_CAPTURE_MERGE => (
            c"CUDA_ERROR_STREAM_CAPTURE_MERGE",
            c"the operation would merge two separate captures",
        ),
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
            c"the capture did not begin on this stream",
        ),
        CUDA_ERROR_STREAM_CAPTURE_UNJOINED => (
            c"CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
            c"a stream forked from the capture was not joined back",
        ),
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION => (
            c"CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
            c"a dependency on work outside the capture",
        ),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => (
            c"CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
            c"the legacy stream would depend on a capturing blocking stream",
        ),
        CUDA_ERROR_CAPTURED_EVENT => (
            c"CUDA_ERROR_CAPTURED_EVENT",
            c"operation not permitted on an event last recorded in a capture",
        ),
        CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => (
            c"CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
            c"the capture was begun by another thread",
        ),
        CUDA_ERROR_UNKNOWN => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

/// Compute capability the simulated device reports (an sm_80-class part, the PTX it loads).
pub const COMPUTE_CAPABILITY: (i32, i32) = (8, 0);
/// Multiprocessors reported.
pub const MULTIPROCESSORS: i32 = 4;

/// The value of a `CUdevice_attribute` (None: not simulated, an invalid value).
pub fn attribute(attr: i32, ordinal: i32, limits: &Limits) -> Option<i32> {
    Some(match attr {
        1 => limits.max_threads_per_block as i32,
        2..=4 => limits.max_block[(attr - 2) as usize] as i32,
        5..=7 => limits.max_grid[(attr - 5) as usize] as i32,
        8 => limits.max_shared_bytes as i32,
        10 => 32,        // warp size
        13 => 1_000_000, // clock rate, kHz
        16 => MULTIPROCESSORS,
        18 => 0,       // not integrated
        19 => 1,       // can map host memory
        33 => ordinal, // PCI bus id: one per device
        41 => 1,       // unified addressing
        75 => COMPUTE_CAPABILITY.0,
        76 => COMPUTE_CAPABILITY.1,
        97 => limits.max_shared_bytes as i32,
        115 => 1, // memory pools (cuMemAllocAsync)
        _ => return None,
    })
}
