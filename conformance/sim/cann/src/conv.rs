//! Conversions of the simulated CANN stack: ACL's and aclnn's result codes (the values of
//! Huawei's `acl_base.h`, `rt_error_codes.h` and the aclnn return-code table), HCCL's, and the
//! data types of the three APIs to unihal's.

use unihal_hal::{DType, ReduceOp};
use unihal_sim::gpu::ops::Fail;
use unihal_sim::SimError;

// `aclError` (acl_base.h).
pub const ACL_SUCCESS: i32 = 0;
pub const ACL_ERROR_INVALID_PARAM: i32 = 100_000;
pub const ACL_ERROR_UNINITIALIZE: i32 = 100_001;
pub const ACL_ERROR_REPEAT_INITIALIZE: i32 = 100_002;
pub const ACL_ERROR_REPEAT_FINALIZE: i32 = 100_037;
pub const ACL_ERROR_BAD_ALLOC: i32 = 200_000;
pub const ACL_ERROR_INVALID_DEVICE: i32 = 200_002;
pub const ACL_ERROR_FEATURE_UNSUPPORTED: i32 = 200_006;
pub const ACL_ERROR_FAILURE: i32 = 500_001;
// Runtime codes (rt_error_codes.h), passed through ACL unchanged.
pub const ACL_ERROR_RT_PARAM_INVALID: i32 = 107_000;
pub const ACL_ERROR_RT_INVALID_DEVICEID: i32 = 107_001;
pub const ACL_ERROR_RT_CONTEXT_NULL: i32 = 107_002;
pub const ACL_ERROR_RT_STREAM_CONTEXT: i32 = 107_003;
pub const ACL_ERROR_RT_STREAM_SUBSCRIBE: i32 = 107_011;
pub const ACL_ERROR_RT_THREAD_SUBSCRIBE: i32 = 107_012;
pub const ACL_ERROR_RT_STREAM_NO_CB_REG: i32 = 107_015;
pub const ACL_ERROR_RT_INVALID_HANDLE: i32 = 107_017;
pub const ACL_ERROR_RT_FEATURE_NOT_SUPPORT: i32 = 207_000;
pub const ACL_ERROR_RT_MEMORY_ALLOCATION: i32 = 207_001;
pub const ACL_ERROR_RT_MEMORY_FREE: i32 = 207_002;
pub const ACL_ERROR_RT_INTERNAL_ERROR: i32 = 507_000;
pub const ACL_ERROR_RT_STREAM_NOT_COMPLETE: i32 = 507_004;
pub const ACL_ERROR_RT_EVENT_NOT_COMPLETE: i32 = 507_006;
pub const ACL_ERROR_RT_REPORT_TIMEOUT: i32 = 507_012;
pub const ACL_ERROR_RT_AICORE_EXCEPTION: i32 = 507_015;
pub const ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: i32 = 507_046;
pub const ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: i32 = 507_047;

// `aclnnStatus` (ops-nn docs/zh/context/aclnn_return_code.md).
pub const ACLNN_SUCCESS: i32 = 0;
pub const ACLNN_ERR_PARAM_NULLPTR: i32 = 161_001;
pub const ACLNN_ERR_PARAM_INVALID: i32 = 161_002;
pub const ACLNN_ERR_RUNTIME_ERROR: i32 = 361_001;
pub const ACLNN_ERR_INNER: i32 = 561_000;
pub const ACLNN_ERR_INNER_CREATE_EXECUTOR: i32 = 561_101;
pub const ACLNN_ERR_INNER_NULLPTR: i32 = 561_103;

// `HcclResult` (hccl_types.h).
pub const HCCL_SUCCESS: i32 = 0;
pub const HCCL_E_PARA: i32 = 1;
pub const HCCL_E_PTR: i32 = 2;
pub const HCCL_E_MEMORY: i32 = 3;
pub const HCCL_E_INTERNAL: i32 = 4;
pub const HCCL_E_NOT_SUPPORT: i32 = 5;
pub const HCCL_E_NOT_FOUND: i32 = 6;
pub const HCCL_E_UNAVAIL: i32 = 7;
pub const HCCL_E_TIMEOUT: i32 = 9;
pub const HCCL_E_RUNTIME: i32 = 15;
pub const HCCL_E_REMOTE: i32 = 21;

/// A failed call: its code and the message `aclGetRecentErrMsg` (or `HcclGetErrorString`'s
/// companion log) gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Err {
    pub code: i32,
    pub msg: String,
}

impl Err {
    /// A failure with `code` and `msg`.
    pub fn new(code: i32, msg: impl Into<String>) -> Err {
        Err {
            code,
            msg: msg.into(),
        }
    }

    /// `ACL_ERROR_INVALID_PARAM` with `msg`.
    pub fn param(msg: impl Into<String>) -> Err {
        Err::new(ACL_ERROR_INVALID_PARAM, msg)
    }
}

/// The `aclError` of a simulator error.
pub fn acl_code(e: &SimError) -> i32 {
    match e {
        SimError::InvalidValue(_) | SimError::InvalidUsage(_) | SimError::Capture(..) => {
            ACL_ERROR_RT_PARAM_INVALID
        }
        SimError::DoubleFree(_) | SimError::FreeInFlight(_) => ACL_ERROR_RT_MEMORY_FREE,
        SimError::OutOfMemory { .. } => ACL_ERROR_RT_MEMORY_ALLOCATION,
        SimError::InvalidHandle(_) => ACL_ERROR_RT_INVALID_HANDLE,
        SimError::IllegalAddress { .. } | SimError::LaunchFailed(_) => {
            ACL_ERROR_RT_AICORE_EXCEPTION
        }
        SimError::NotReady => ACL_ERROR_RT_STREAM_NOT_COMPLETE,
        SimError::WaitCycle | SimError::InvalidImage(_) | SimError::NotFound(_) => {
            ACL_ERROR_RT_INTERNAL_ERROR
        }
        SimError::Unsupported(_) => ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
        SimError::Timeout(_) => ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
    }
}

impl From<SimError> for Err {
    fn from(e: SimError) -> Err {
        Err::new(acl_code(&e), e.to_string())
    }
}

impl From<Fail> for Err {
    fn from(f: Fail) -> Err {
        match f {
            Fail::Value => Err::param("invalid argument"),
            Fail::Handle => Err::new(ACL_ERROR_RT_INVALID_HANDLE, "invalid handle"),
            Fail::Context => Err::new(ACL_ERROR_RT_CONTEXT_NULL, "no current context"),
            Fail::Device => Err::new(ACL_ERROR_RT_INVALID_DEVICEID, "invalid device id"),
            Fail::NotFound => Err::new(ACL_ERROR_RT_INTERNAL_ERROR, "not found"),
            Fail::NotSupported => Err::new(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "not supported"),
            Fail::OutOfMemory => Err::new(ACL_ERROR_BAD_ALLOC, "host memory exhausted"),
            Fail::PeerAlreadyEnabled => Err::param("peer access is already enabled"),
            Fail::PeerNotEnabled => Err::param("peer access is not enabled"),
            Fail::Sim(e) => e.into(),
        }
    }
}

/// The unihal dtype of an `aclDataType` (None: a type the simulator does not compute in).
pub fn dtype_of_acl(t: i32) -> Option<DType> {
    Some(match t {
        0 => DType::F32,
        1 => DType::F16,
        2 => DType::I8,
        3 => DType::I32,
        4 => DType::U8,
        6 => DType::I16,
        8 => DType::U32,
        9 => DType::I64,
        10 => DType::U64,
        11 => DType::F64,
        12 => DType::Bool,
        27 => DType::Bf16,
        _ => return None,
    })
}

/// The `aclDataType` of a unihal dtype.
pub fn acl_of_dtype(d: DType) -> i32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::I8 => 2,
        DType::I32 => 3,
        DType::U8 => 4,
        DType::I16 => 6,
        DType::U32 => 8,
        DType::I64 => 9,
        DType::U64 => 10,
        DType::F64 => 11,
        DType::Bool => 12,
        DType::Bf16 => 27,
    }
}

/// The unihal dtype of an `HcclDataType` (None: not simulated, e.g. INT128 or the FP8 kinds).
pub fn dtype_of_hccl(t: i32) -> Option<DType> {
    Some(match t {
        0 => DType::I8,
        1 => DType::I16,
        2 => DType::I32,
        3 => DType::F16,
        4 => DType::F32,
        5 => DType::I64,
        6 => DType::U64,
        7 => DType::U8,
        9 => DType::U32,
        10 => DType::F64,
        11 => DType::Bf16,
        _ => return None,
    })
}

/// The reduction of an `HcclReduceOp` (HCCL has no average: 4 is not a reduction).
pub fn reduce_of_hccl(op: i32) -> Option<ReduceOp> {
    Some(match op {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        _ => return None,
    })
}

/// `HcclGetErrorString`'s text of a code.
pub fn hccl_string(code: i32) -> &'static std::ffi::CStr {
    match code {
        0 => c"HCCL_SUCCESS: success",
        1 => c"HCCL_E_PARA: parameter error",
        2 => c"HCCL_E_PTR: empty pointer",
        3 => c"HCCL_E_MEMORY: memory error",
        4 => c"HCCL_E_INTERNAL: internal error",
        5 => c"HCCL_E_NOT_SUPPORT: not support feature",
        6 => c"HCCL_E_NOT_FOUND: not found specific resource",
        7 => c"HCCL_E_UNAVAIL: resource unavailable",
        8 => c"HCCL_E_SYSCALL: call system interface error",
        9 => c"HCCL_E_TIMEOUT: timeout",
        15 => c"HCCL_E_RUNTIME: call runtime api fail",
        21 => c"HCCL_E_REMOTE: error cqe",
        _ => c"HCCL: unknown error code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_round_trip_through_acl_numbers() {
        for d in DType::ALL {
            assert_eq!(dtype_of_acl(acl_of_dtype(d)), Some(d), "{d:?}");
        }
        assert_eq!(dtype_of_acl(5), None, "5 is unused in aclDataType");
        assert_eq!(dtype_of_hccl(11), Some(DType::Bf16));
        assert_eq!(reduce_of_hccl(4), None, "HCCL has no average");
    }
}
