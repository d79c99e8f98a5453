//! Conversions of the simulated NCCL: `ncclResult_t` codes and strings, `ncclDataType_t` and
//! `ncclRedOp_t` values (from NCCL's `nccl.h`; 2.30's numbering, which has `ncclTimeout = 8`),
//! and the codes of simulator errors.
//!
//! `UNIHAL_SIM_NCCL_FLAVOR=rccl` makes the library answer as RCCL (read once): `ncclGetVersion`
//! gives RCCL 2.22.3's code and no result beyond `ncclInProgress = 7` is returned (RCCL has no
//! `ncclTimeout`; a timeout is `ncclSystemError`, as a failed wait is there).

use std::ffi::CStr;
use unihal_hal::{DType, ReduceOp};
use unihal_sim::ccl::CommError;
use unihal_sim::SimError;

/// `ncclGetVersion`: the simulator follows NCCL 2.30.7's API.
pub const NCCL_VERSION_CODE: i32 = 23007;
/// `ncclGetVersion` when answering as RCCL (2.22.3, as ROCm 6.3 ships).
pub const RCCL_VERSION_CODE: i32 = 22203;

/// Which library the simulated NCCL API answers as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    Nccl,
    Rccl,
}

/// The flavor `UNIHAL_SIM_NCCL_FLAVOR` chooses (`nccl`, the default, or `rccl`; read once).
pub fn flavor() -> Flavor {
    static F: std::sync::OnceLock<Flavor> = std::sync::OnceLock::new();
    *F.get_or_init(|| {
        match std::env::var("UNIHAL_SIM_NCCL_FLAVOR")
            .as_deref()
            .map(str::trim)
        {
            Ok("rccl") => Flavor::Rccl,
            Ok("nccl") | Err(_) => Flavor::Nccl,
            Ok(other) => {
                eprintln!("unihal-sim: UNIHAL_SIM_NCCL_FLAVOR={other} is not nccl or rccl; nccl");
                Flavor::Nccl
            }
        }
    })
}

/// `ncclGetVersion`'s answer in the current flavor.
pub fn version_code() -> i32 {
    match flavor() {
        Flavor::Nccl => NCCL_VERSION_CODE,
        Flavor::Rccl => RCCL_VERSION_CODE,
    }
}

/// The code of a timeout in the current flavor (RCCL has no `ncclTimeout`).
pub fn timeout_code() -> i32 {
    match flavor() {
        Flavor::Nccl => NCCL_TIMEOUT,
        Flavor::Rccl => NCCL_SYSTEM_ERROR,
    }
}

pub const NCCL_SUCCESS: i32 = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: i32 = 1;
pub const NCCL_SYSTEM_ERROR: i32 = 2;
pub const NCCL_INTERNAL_ERROR: i32 = 3;
pub const NCCL_INVALID_ARGUMENT: i32 = 4;
pub const NCCL_INVALID_USAGE: i32 = 5;
pub const NCCL_REMOTE_ERROR: i32 = 6;
pub const NCCL_IN_PROGRESS: i32 = 7;
pub const NCCL_TIMEOUT: i32 = 8;
/// `NCCL_SPLIT_NOCOLOR`: the rank joins no communicator of the split.
pub const NCCL_SPLIT_NOCOLOR: i32 = -1;

/// `ncclGetErrorString` of a code.
pub fn error_string(code: i32) -> &'static CStr {
    match code {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        NCCL_TIMEOUT if flavor() == Flavor::Nccl => c"operation timed out",
        _ => c"unknown result code",
    }
}

/// The `ncclResult_t` of a simulator error.
pub fn code(e: &SimError) -> i32 {
    match e {
        SimError::InvalidValue(_) | SimError::InvalidHandle(_) | SimError::NotFound(_) => {
            NCCL_INVALID_ARGUMENT
        }
        SimError::InvalidUsage(_) => NCCL_INVALID_USAGE,
        SimError::Timeout(_) => timeout_code(),
        SimError::OutOfMemory { .. } => NCCL_SYSTEM_ERROR,
        // A poisoned device, or a capture rule broken: the CUDA call NCCL makes fails.
        SimError::IllegalAddress { .. } | SimError::LaunchFailed(_) | SimError::Capture(..) => {
            NCCL_UNHANDLED_CUDA_ERROR
        }
        _ => NCCL_INTERNAL_ERROR,
    }
}

/// The asynchronous error a communicator reports.
pub fn async_code(e: &CommError) -> i32 {
    match e {
        CommError::Aborted => NCCL_INVALID_USAGE,
        CommError::PeerAborted(_) | CommError::PeerExited { .. } => NCCL_REMOTE_ERROR,
        CommError::Failed(SimError::Timeout(_)) => timeout_code(),
        CommError::Failed(SimError::LaunchFailed(_)) => NCCL_INVALID_USAGE,
        CommError::Failed(e) => code(e),
    }
}

/// The dtype of an `ncclDataType_t` (None: unknown, or FP8, which unihal has no type for).
pub fn dtype(v: i32) -> Option<DType> {
    Some(match v {
        0 => DType::I8,
        1 => DType::U8,
        2 => DType::I32,
        3 => DType::U32,
        4 => DType::I64,
        5 => DType::U64,
        6 => DType::F16,
        7 => DType::F32,
        8 => DType::F64,
        9 => DType::Bf16,
        _ => return None,
    })
}

/// The reduction of an `ncclRedOp_t` (None: unknown or a user-defined op).
pub fn reduce_op(v: i32) -> Option<ReduceOp> {
    Some(match v {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        4 => ReduceOp::Avg,
        _ => return None,
    })
}
