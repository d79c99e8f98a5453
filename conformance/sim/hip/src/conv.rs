//! Conversions of the simulated HIP runtime: simulator errors to `hipError_t` (the values of
//! AMD's `hip_runtime_api.h`, the same from ROCm 5.0 to 6.x), their names and strings, and the
//! device attributes it reports in either numbering.

use std::ffi::CStr;
use unihal_sim::gpu::ops::Fail;
use unihal_sim::{Limits, SimError};

pub const HIP_SUCCESS: i32 = 0;
pub const HIP_ERROR_INVALID_VALUE: i32 = 1;
pub const HIP_ERROR_OUT_OF_MEMORY: i32 = 2;
pub const HIP_ERROR_NOT_INITIALIZED: i32 = 3;
pub const HIP_ERROR_NO_DEVICE: i32 = 100;
pub const HIP_ERROR_INVALID_DEVICE: i32 = 101;
pub const HIP_ERROR_INVALID_IMAGE: i32 = 200;
pub const HIP_ERROR_INVALID_CONTEXT: i32 = 201;
pub const HIP_ERROR_NO_BINARY_FOR_GPU: i32 = 209;
pub const HIP_ERROR_INVALID_HANDLE: i32 = 400;
pub const HIP_ERROR_ILLEGAL_STATE: i32 = 401;
pub const HIP_ERROR_NOT_FOUND: i32 = 500;
pub const HIP_ERROR_NOT_READY: i32 = 600;
pub const HIP_ERROR_ILLEGAL_ADDRESS: i32 = 700;
pub const HIP_ERROR_LAUNCH_TIMEOUT: i32 = 702;
pub const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
pub const HIP_ERROR_PEER_ACCESS_NOT_ENABLED: i32 = 705;
pub const HIP_ERROR_LAUNCH_FAILURE: i32 = 719;
pub const HIP_ERROR_NOT_SUPPORTED: i32 = 801;
pub const HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
pub const HIP_ERROR_STREAM_CAPTURE_INVALIDATED: i32 = 901;
pub const HIP_ERROR_STREAM_CAPTURE_MERGE: i32 = 902;
pub const HIP_ERROR_STREAM_CAPTURE_UNMATCHED: i32 = 903;
pub const HIP_ERROR_STREAM_CAPTURE_UNJOINED: i32 = 904;
pub const HIP_ERROR_STREAM_CAPTURE_ISOLATION: i32 = 905;
pub const HIP_ERROR_STREAM_CAPTURE_IMPLICIT: i32 = 906;
pub const HIP_ERROR_CAPTURED_EVENT: i32 = 907;
pub const HIP_ERROR_STREAM_CAPTURE_WRONG_THREAD: i32 = 908;
pub const HIP_ERROR_UNKNOWN: i32 = 999;

/// The `hipError_t` of a broken stream-capture rule.
pub fn capture_code(k: unihal_sim::CaptureFault) -> i32 {
    use unihal_sim::CaptureFault as F;
    match k {
        F::Unsupported => HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        F::Invalidated => HIP_ERROR_STREAM_CAPTURE_INVALIDATED,
        F::Merge => HIP_ERROR_STREAM_CAPTURE_MERGE,
        F::Unmatched => HIP_ERROR_STREAM_CAPTURE_UNMATCHED,
        F::Unjoined => HIP_ERROR_STREAM_CAPTURE_UNJOINED,
        F::Isolation => HIP_ERROR_STREAM_CAPTURE_ISOLATION,
        F::Implicit => HIP_ERROR_STREAM_CAPTURE_IMPLICIT,
        F::CapturedEvent => HIP_ERROR_CAPTURED_EVENT,
        F::WrongThread => HIP_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        F::IllegalState => HIP_ERROR_ILLEGAL_STATE,
    }
}

/// The `hipError_t` of a simulator error.
pub fn code(e: &SimError) -> i32 {
    match e {
        SimError::InvalidValue(_) | SimError::DoubleFree(_) | SimError::FreeInFlight(_) => {
            HIP_ERROR_INVALID_VALUE
        }
        SimError::OutOfMemory { .. } => HIP_ERROR_OUT_OF_MEMORY,
        SimError::InvalidHandle(_) => HIP_ERROR_INVALID_HANDLE,
        SimError::IllegalAddress { .. } => HIP_ERROR_ILLEGAL_ADDRESS,
        SimError::LaunchFailed(_) => HIP_ERROR_LAUNCH_FAILURE,
        SimError::NotReady => HIP_ERROR_NOT_READY,
        SimError::WaitCycle => HIP_ERROR_UNKNOWN,
        SimError::InvalidImage(_) => HIP_ERROR_INVALID_IMAGE,
        SimError::NotFound(_) => HIP_ERROR_NOT_FOUND,
        SimError::Unsupported(_) => HIP_ERROR_NOT_SUPPORTED,
        SimError::Timeout(_) => HIP_ERROR_LAUNCH_TIMEOUT,
        SimError::InvalidUsage(_) => HIP_ERROR_INVALID_VALUE,
        SimError::Capture(k, _) => capture_code(*k),
    }
}

/// The `hipError_t` of a shared call's failure. HIP has no context to be invalid: a missing
/// current device is an invalid device.
pub fn fail_code(f: Fail) -> i32 {
    match f {
        Fail::Value => HIP_ERROR_INVALID_VALUE,
        Fail::Handle => HIP_ERROR_INVALID_HANDLE,
        Fail::Context | Fail::Device => HIP_ERROR_INVALID_DEVICE,
        Fail::NotFound => HIP_ERROR_NOT_FOUND,
        Fail::NotSupported => HIP_ERROR_NOT_SUPPORTED,
        Fail::OutOfMemory => HIP_ERROR_OUT_OF_MEMORY,
        Fail::PeerAlreadyEnabled => HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        Fail::PeerNotEnabled => HIP_ERROR_PEER_ACCESS_NOT_ENABLED,
        Fail::Sim(e) => code(&e),
    }
}

/// `hipGetErrorName` and `hipGetErrorString` texts of a code (None for unknown codes).
pub fn names(code: i32) -> Option<(&'static CStr, &'static CStr)> {
    Some(match code {
        HIP_SUCCESS => (c"hipSuccess", c"no error"),
        HIP_ERROR_INVALID_VALUE => (c"hipErrorInvalidValue", c"invalid argument"),
        HIP_ERROR_OUT_OF_MEMORY => (c"hipErrorOutOfMemory", c"out of memory"),
        HIP_ERROR_NOT_INITIALIZED => (c"hipErrorNotInitialized", c"initialization error"),
        HIP_ERROR_NO_DEVICE => (c"hipErrorNoDevice", c"no ROCm-capable device is detected"),
        HIP_ERROR_INVALID_DEVICE => (c"hipErrorInvalidDevice", c"invalid device ordinal"),
        HIP_ERROR_INVALID_IMAGE => (c"hipErrorInvalidImage", c"device kernel image is invalid"),
        HIP_ERROR_INVALID_CONTEXT => (c"hipErrorInvalidContext", c"invalid device context"),
        HIP_ERROR_NO_BINARY_FOR_GPU => (
            c"hipErrorNoBinaryForGpu",
            c"no kernel image is available for execution on the device",
        ),
        HIP_ERROR_INVALID_HANDLE => (c"hipErrorInvalidHandle", c"invalid resource handle"),
        HIP_ERROR_NOT_FOUND => (c"hipErrorNotFound", c"named symbol not found"),
        HIP_ERROR_NOT_READY => (c"hipErrorNotReady", c"device not ready"),
        HIP_ERROR_ILLEGAL_ADDRESS => (
            c"hipErrorIllegalAddress",
            c"an illegal memory access was encountered",
        ),
        HIP_ERROR_LAUNCH_TIMEOUT => (
            c"hipErrorLaunchTimeOut",
            c"the launch timed out and was terminated",
        ),
        HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED => (
            c"hipErrorPeerAccessAlreadyEnabled",
            c"peer access is already enabled",
        ),
        HIP_ERROR_PEER_ACCESS_NOT_ENABLED => (
            c"hipErrorPeerAccessNotEnabled",
            c"peer access has not been enabled",
        ),
        HIP_ERROR_LAUNCH_FAILURE => (c"hipErrorLaunchFailure", c"unspecified launch failure"),
        HIP_ERROR_NOT_SUPPORTED => (c"hipErrorNotSupported", c"operation not supported"),
        HIP_ERROR_ILLEGAL_STATE => (
            c"hipErrorIllegalState",
            c"the operation cannot be performed in the present state",
        ),
        HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED => (
            c"hipErrorStreamCaptureUnsupported",
            c"operation not permitted while the stream is capturing",
        ),
        HIP_ERROR_STREAM_CAPTURE_INVALIDATED => (
            c"hipErrorStreamCaptureInvalidated",
            c"the capture was invalidated by an earlier error",
        ),
        HIP_ERROR_STREAM_CAPTURE_MERGE => (
            c"hipErrorStreamCaptureMerge",
            c"the operation would merge two separate captures",
        ),
        HIP_ERROR_STREAM_CAPTURE_UNMATCHED => (
            c"hipErrorStreamCaptureUnmatched",
            c"the capture did not begin on this stream",
        ),
        HIP_ERROR_STREAM_CAPTURE_UNJOINED => (
            c"hipErrorStreamCaptureUnjoined",
            c"a stream forked from the capture was not joined back",
        ),
        HIP_ERROR_STREAM_CAPTURE_ISOLATION => (
            c"hipErrorStreamCaptureIsolation",
            c"a dependency on work outside the capture",
        ),
        HIP_ERROR_STREAM_CAPTURE_IMPLICIT => (
            c"hipErrorStreamCaptureImplicit",
            c"the legacy stream would depend on a capturing blocking stream",
        ),
        HIP_ERROR_CAPTURED_EVENT => (
            c"hipErrorCapturedEvent",
            c"operation not permitted on an event last recorded in a capture",
        ),
        HIP_ERROR_STREAM_CAPTURE_WRONG_THREAD => (
            c"hipErrorStreamCaptureWrongThread",
            c"the capture was begun by another thread",
        ),
        HIP_ERROR_UNKNOWN => (c"hipErrorUnknown", c"unknown error"),
        _ => return None,
    })
}

/// Which `hipDeviceAttribute_t` numbering the simulated runtime speaks
/// (`UNIHAL_SIM_HIP_NUMBERING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbering {
    /// ROCm 5.0 to 6.2 (`rocm5`, the default), reporting HIP 6.2.
    Rocm5,
    /// ROCm up to 4.5, as Hygon DTK keeps it while reporting HIP 6.3 (`legacy`).
    Legacy,
}

/// Compute units reported.
pub const COMPUTE_UNITS: i32 = 4;
/// The wavefront width of every simulated architecture (gfx906, gfx90a).
pub const WAVEFRONT: i32 = 64;

/// The value of an attribute in `numbering` (None: not simulated, an invalid value).
pub fn attribute(numbering: Numbering, attr: i32, ordinal: i32, limits: &Limits) -> Option<i32> {
    let block = |i: usize| limits.max_block[i] as i32;
    let grid = |i: usize| limits.max_grid[i] as i32;
    Some(match numbering {
        // hip_runtime_api.h, rocm-5.0.0 .. rocm-6.2.0.
        Numbering::Rocm5 => match attr {
            5 => 1_700_000, // clock rate, kHz
            16 => 0,        // not integrated
            23 => 9,        // compute capability major (gfx9)
            26..=28 => block((attr - 26) as usize),
            29..=31 => grid((attr - 29) as usize),
            56 => limits.max_threads_per_block as i32,
            61 => 0, // compute capability minor
            63 => COMPUTE_UNITS,
            67 => ordinal, // PCI bus id: one per device
            74 => limits.max_shared_bytes as i32,
            85 => 1, // unified addressing
            87 => WAVEFRONT,
            88 => 1, // memory pools (hipMallocAsync)
            _ => return None,
        },
        // hip_runtime_api.h, rocm-4.5.2 (its enum ends before 53).
        Numbering::Legacy => match attr {
            0 => limits.max_threads_per_block as i32,
            1..=3 => block((attr - 1) as usize),
            4..=6 => grid((attr - 4) as usize),
            7 => limits.max_shared_bytes as i32,
            9 => WAVEFRONT,
            11 => 1_700_000,
            14 => COMPUTE_UNITS,
            18 => 9,
            19 => 0,
            21 => ordinal,
            _ => return None,
        },
    })
}
