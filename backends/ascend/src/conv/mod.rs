//! Conversions of the Ascend backend: `aclError` and `aclnnStatus` codes to [`HalError`] (the
//! vendor's name and number kept, with `aclGetRecentErrMsg`'s text), and HAL dtypes to
//! `aclDataType`; HCCL's values in [`hccl`].

pub mod hccl;

use unihal_hal::{DType, HalError};

/// `aclError` values the backend names or tests for (`acl_base.h`, `rt_error_codes.h`).
pub mod codes {
    pub const INVALID_PARAM: i32 = 100000;
    pub const UNINITIALIZE: i32 = 100001;
    pub const REPEAT_INITIALIZE: i32 = 100002;
    pub const REPEAT_FINALIZE: i32 = 100037;
    pub const BAD_ALLOC: i32 = 200000;
    pub const API_NOT_SUPPORT: i32 = 200001;
    pub const INVALID_DEVICE: i32 = 200002;
    pub const MEMORY_ADDRESS_UNALIGNED: i32 = 200003;
    pub const INVALID_RESOURCE_HANDLE: i32 = 200005;
    pub const FEATURE_UNSUPPORTED: i32 = 200006;
    pub const STORAGE_OVER_LIMIT: i32 = 300000;
    pub const INTERNAL_ERROR: i32 = 500000;
    pub const FAILURE: i32 = 500001;
    pub const RT_FAILURE: i32 = 500003;
    pub const DRV_FAILURE: i32 = 500004;
    pub const RT_PARAM_INVALID: i32 = 107000;
    pub const RT_INVALID_DEVICEID: i32 = 107001;
    pub const RT_CONTEXT_NULL: i32 = 107002;
    pub const RT_STREAM_CONTEXT: i32 = 107003;
    pub const RT_WAIT_TIMEOUT: i32 = 107019;
    pub const RT_TASK_TIMEOUT: i32 = 107020;
    pub const RT_FEATURE_NOT_SUPPORT: i32 = 207000;
    pub const RT_MEMORY_ALLOCATION: i32 = 207001;
    pub const RT_NO_DEVICE: i32 = 207004;
    pub const RT_NO_PERMISSION: i32 = 207006;
    pub const RT_DEVICE_OOM: i32 = 207018;
    pub const RT_INTERNAL_ERROR: i32 = 507000;
    pub const RT_STREAM_NOT_COMPLETE: i32 = 507004;
    pub const RT_EVENT_NOT_COMPLETE: i32 = 507006;
    pub const RT_AICORE_EXCEPTION: i32 = 507015;
    pub const RT_VECTOR_CORE_EXCEPTION: i32 = 507035;
    pub const RT_STREAM_SYNC_TIMEOUT: i32 = 507046;
    pub const RT_EVENT_SYNC_TIMEOUT: i32 = 507047;
    pub const RT_DEVICE_MEM_ERROR: i32 = 507053;
    pub const RT_COMM_OP_RETRY_FAIL: i32 = 507904;
    /// `aclrtProcessReport` found no callback in its time.
    pub const RT_REPORT_TIMEOUT: i32 = 507012;
    /// `aclrtProcessReport` from a thread subscribed to no stream.
    pub const RT_THREAD_SUBSCRIBE: i32 = 107012;
}

/// `aclnnStatus` values (ops-nn `docs/zh/context/aclnn_return_code.md`).
pub mod aclnn {
    pub const PARAM_NULLPTR: i32 = 161001;
    pub const PARAM_INVALID: i32 = 161002;
    pub const RUNTIME_ERROR: i32 = 361001;
    pub const INNER: i32 = 561000;
    pub const INNER_INFERSHAPE: i32 = 561001;
    pub const INNER_TILING: i32 = 561002;
    pub const INNER_FIND_KERNEL: i32 = 561003;
    pub const INNER_CREATE_EXECUTOR: i32 = 561101;
    pub const INNER_NULLPTR: i32 = 561103;
    pub const INNER_OPP_PATH: i32 = 561107;
    pub const INNER_LOAD_KERNEL: i32 = 561112;
}

/// The library label of the runtime's vendor errors.
pub const LIBRARY: &str = "ACL runtime";
/// The library label of the operator library's vendor errors.
pub const ACLNN: &str = "aclnn";

/// The name of an `aclError` or `aclnnStatus` code (`aclError <n>` for one not known here).
pub fn error_name(code: i32) -> String {
    use codes::*;
    let name = match code {
        0 => "ACL_SUCCESS",
        INVALID_PARAM => "ACL_ERROR_INVALID_PARAM",
        UNINITIALIZE => "ACL_ERROR_UNINITIALIZE",
        REPEAT_INITIALIZE => "ACL_ERROR_REPEAT_INITIALIZE",
        REPEAT_FINALIZE => "ACL_ERROR_REPEAT_FINALIZE",
        BAD_ALLOC => "ACL_ERROR_BAD_ALLOC",
        API_NOT_SUPPORT => "ACL_ERROR_API_NOT_SUPPORT",
        INVALID_DEVICE => "ACL_ERROR_INVALID_DEVICE",
        MEMORY_ADDRESS_UNALIGNED => "ACL_ERROR_MEMORY_ADDRESS_UNALIGNED",
        INVALID_RESOURCE_HANDLE => "ACL_ERROR_INVALID_RESOURCE_HANDLE",
        FEATURE_UNSUPPORTED => "ACL_ERROR_FEATURE_UNSUPPORTED",
        STORAGE_OVER_LIMIT => "ACL_ERROR_STORAGE_OVER_LIMIT",
        INTERNAL_ERROR => "ACL_ERROR_INTERNAL_ERROR",
        FAILURE => "ACL_ERROR_FAILURE",
        RT_FAILURE => "ACL_ERROR_RT_FAILURE",
        DRV_FAILURE => "ACL_ERROR_DRV_FAILURE",
        RT_PARAM_INVALID => "ACL_ERROR_RT_PARAM_INVALID",
        RT_INVALID_DEVICEID => "ACL_ERROR_RT_INVALID_DEVICEID",
        RT_CONTEXT_NULL => "ACL_ERROR_RT_CONTEXT_NULL",
        RT_STREAM_CONTEXT => "ACL_ERROR_RT_STREAM_CONTEXT",
        RT_THREAD_SUBSCRIBE => "ACL_ERROR_RT_THREAD_SUBSCRIBE",
        RT_WAIT_TIMEOUT => "ACL_ERROR_RT_WAIT_TIMEOUT",
        RT_TASK_TIMEOUT => "ACL_ERROR_RT_TASK_TIMEOUT",
        RT_FEATURE_NOT_SUPPORT => "ACL_ERROR_RT_FEATURE_NOT_SUPPORT",
        RT_MEMORY_ALLOCATION => "ACL_ERROR_RT_MEMORY_ALLOCATION",
        RT_NO_DEVICE => "ACL_ERROR_RT_NO_DEVICE",
        RT_NO_PERMISSION => "ACL_ERROR_RT_NO_PERMISSION",
        RT_DEVICE_OOM => "ACL_ERROR_RT_DEVICE_OOM",
        RT_INTERNAL_ERROR => "ACL_ERROR_RT_INTERNAL_ERROR",
        RT_STREAM_NOT_COMPLETE => "ACL_ERROR_RT_STREAM_NOT_COMPLETE",
        RT_EVENT_NOT_COMPLETE => "ACL_ERROR_RT_EVENT_NOT_COMPLETE",
        RT_REPORT_TIMEOUT => "ACL_ERROR_RT_REPORT_TIMEOUT",
        RT_AICORE_EXCEPTION => "ACL_ERROR_RT_AICORE_EXCEPTION",
        RT_VECTOR_CORE_EXCEPTION => "ACL_ERROR_RT_VECTOR_CORE_EXCEPTION",
        RT_STREAM_SYNC_TIMEOUT => "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
        RT_EVENT_SYNC_TIMEOUT => "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT",
        RT_DEVICE_MEM_ERROR => "ACL_ERROR_RT_DEVICE_MEM_ERROR",
        RT_COMM_OP_RETRY_FAIL => "ACL_ERROR_RT_COMM_OP_RETRY_FAIL",
        aclnn::PARAM_NULLPTR => "ACLNN_ERR_PARAM_NULLPTR",
        aclnn::PARAM_INVALID => "ACLNN_ERR_PARAM_INVALID",
        aclnn::RUNTIME_ERROR => "ACLNN_ERR_RUNTIME_ERROR",
        aclnn::INNER => "ACLNN_ERR_INNER",
        aclnn::INNER_INFERSHAPE => "ACLNN_ERR_INNER_INFERSHAPE",
        aclnn::INNER_TILING => "ACLNN_ERR_INNER_TILING",
        aclnn::INNER_FIND_KERNEL => "ACLNN_ERR_INNER_FIND_KERNEL",
        aclnn::INNER_CREATE_EXECUTOR => "ACLNN_ERR_INNER_CREATE_EXECUTOR",
        aclnn::INNER_NULLPTR => "ACLNN_ERR_INNER_NULLPTR",
        aclnn::INNER_OPP_PATH => "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND",
        aclnn::INNER_LOAD_KERNEL => "ACLNN_ERR_INNER_LOAD_JSON_FAILED",
        _ => return format!("aclError {code}"),
    };
    name.into()
}

/// True for errors after which the device is unusable (a core exception, a memory error).
pub fn poisons(code: i64) -> bool {
    matches!(
        code as i32,
        codes::RT_AICORE_EXCEPTION | codes::RT_VECTOR_CORE_EXCEPTION | codes::RT_DEVICE_MEM_ERROR
    )
}

/// A failed call as a vendor error of `library` (`ACL runtime`, `aclnn`), with the runtime's
/// most recent message (`aclGetRecentErrMsg`, read on the failing thread) when it has one.
pub fn vendor_of(library: &str, call: &str, code: i32, recent: Option<String>) -> HalError {
    HalError::Vendor {
        library: library.into(),
        call: call.into(),
        code: code as i64,
        name: error_name(code),
        message: recent.unwrap_or_default(),
    }
}

/// `aclDataType` values (acl_base.h).
pub mod dt {
    pub const FLOAT: i32 = 0;
    pub const FLOAT16: i32 = 1;
    pub const INT8: i32 = 2;
    pub const INT32: i32 = 3;
    pub const UINT8: i32 = 4;
    pub const INT16: i32 = 6;
    pub const UINT16: i32 = 7;
    pub const UINT32: i32 = 8;
    pub const INT64: i32 = 9;
    pub const UINT64: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const BOOL: i32 = 12;
    pub const BF16: i32 = 27;
}

/// `aclFormat::ACL_FORMAT_ND`: plain row-major tensors.
pub const FORMAT_ND: i32 = 2;

/// The `aclDataType` of a HAL dtype (every HAL dtype has one).
pub fn acl_dtype(d: DType) -> i32 {
    match d {
        DType::F32 => dt::FLOAT,
        DType::F16 => dt::FLOAT16,
        DType::Bf16 => dt::BF16,
        DType::F64 => dt::DOUBLE,
        DType::I8 => dt::INT8,
        DType::I16 => dt::INT16,
        DType::I32 => dt::INT32,
        DType::I64 => dt::INT64,
        DType::U8 => dt::UINT8,
        DType::U32 => dt::UINT32,
        DType::U64 => dt::UINT64,
        DType::Bool => dt::BOOL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_vendors_and_unknown_codes_keep_their_number() {
        assert_eq!(error_name(107002), "ACL_ERROR_RT_CONTEXT_NULL");
        assert_eq!(error_name(161002), "ACLNN_ERR_PARAM_INVALID");
        assert_eq!(error_name(4242), "aclError 4242");
        assert!(poisons(507015) && !poisons(207001));
    }

    #[test]
    fn dtypes_follow_acl_base_h() {
        assert_eq!(acl_dtype(DType::Bf16), 27);
        assert_eq!(acl_dtype(DType::Bool), 12);
        assert_eq!(acl_dtype(DType::F64), 11);
    }
}
