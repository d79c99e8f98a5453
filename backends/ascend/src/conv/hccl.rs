//! HCCL's values: `HcclDataType` and `HcclReduceOp` from the HAL's dtypes and reductions (HCCL
//! has no average: unihal emulates it), and `HcclResult` codes as [`HalError`]s labelled
//! `HCCL` (facts sheet §2). Codes are kept raw: newer headers added codes past `E_NETWORK = 19`
//! (and gave 20, once the implicit `HCCL_E_RESERVED`, to `E_AGAIN`).

use crate::ffi::hccl::Hccl;
use unihal_hal::{DType, HalError, ReduceOp};

/// The library name of HCCL's [`HalError::Vendor`]s.
pub const LIBRARY: &str = "HCCL";

/// `HCCL_SUCCESS`.
pub const SUCCESS: i32 = 0;
/// `HCCL_E_NOT_SUPPORT`.
pub const E_NOT_SUPPORT: i32 = 5;
/// `HCCL_E_TIMEOUT`.
pub const E_TIMEOUT: i32 = 9;
/// `HCCL_E_REMOTE`: the remote side failed (an error completion on the link).
pub const E_REMOTE: i32 = 21;

/// The `HcclDataType` of a dtype (None: HCCL has no such type).
pub fn dtype(d: DType) -> Option<i32> {
    Some(match d {
        DType::I8 => 0,
        DType::I16 => 1,
        DType::I32 => 2,
        DType::F16 => 3,
        DType::F32 => 4,
        DType::I64 => 5,
        DType::U64 => 6,
        DType::U8 => 7,
        DType::U32 => 9,
        DType::F64 => 10,
        DType::Bf16 => 11,
        DType::Bool => return None,
    })
}

/// The dtypes HCCL moves (broadcast, all-gather, all-to-all, send and receive): every HAL dtype
/// with an `HcclDataType`.
pub const MOVED: [DType; 11] = [
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U32,
    DType::U64,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::Bf16,
];

/// The dtypes HCCL reduces (all-reduce, reduce, reduce-scatter): the facts sheet's list for
/// every chip (int8, int16, int32, fp16, fp32, bf16; newer chips take more, not claimed).
pub const REDUCED: [DType; 6] = [
    DType::I8,
    DType::I16,
    DType::I32,
    DType::F16,
    DType::F32,
    DType::Bf16,
];

/// The `HcclReduceOp` a reduction runs as: `avg` is `SUM` then a division by the number of
/// ranks on the stream (the second value is true then).
pub fn reduce_op(r: ReduceOp) -> (i32, bool) {
    match r {
        ReduceOp::Sum => (0, false),
        ReduceOp::Prod => (1, false),
        ReduceOp::Max => (2, false),
        ReduceOp::Min => (3, false),
        ReduceOp::Avg => (0, true),
    }
}

/// The symbolic name of an `HcclResult`.
pub fn name(code: i32) -> String {
    const NAMES: [&str; 25] = [
        "HCCL_SUCCESS",
        "HCCL_E_PARA",
        "HCCL_E_PTR",
        "HCCL_E_MEMORY",
        "HCCL_E_INTERNAL",
        "HCCL_E_NOT_SUPPORT",
        "HCCL_E_NOT_FOUND",
        "HCCL_E_UNAVAIL",
        "HCCL_E_SYSCALL",
        "HCCL_E_TIMEOUT",
        "HCCL_E_OPEN_FILE_FAILURE",
        "HCCL_E_TCP_CONNECT",
        "HCCL_E_ROCE_CONNECT",
        "HCCL_E_TCP_TRANSFER",
        "HCCL_E_ROCE_TRANSFER",
        "HCCL_E_RUNTIME",
        "HCCL_E_DRV",
        "HCCL_E_PROFILING",
        "HCCL_E_CCE",
        "HCCL_E_NETWORK",
        "HCCL_E_AGAIN",
        "HCCL_E_REMOTE",
        "HCCL_E_SUSPENDING",
        "HCCL_E_OPRETRY_FAIL",
        "HCCL_E_OOM",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or_else(|| format!("HcclResult {code}"), |n| n.to_string())
}

/// A failed HCCL call as a vendor error: `HcclGetErrorString`'s text, then the runtime's most
/// recent message on this thread (`aclGetRecentErrMsg`) when it has one.
pub fn vendor(lib: &Hccl, call: &str, code: i32) -> HalError {
    let mut message = match lib.get_error_string {
        // SAFETY: HcclGetErrorString returns a static NUL-terminated string (or NULL) for any
        // code.
        Some(f) => unsafe { unihal_dynlib::c_str(f(code)) },
        None => String::new(),
    };
    if let Some(recent) = crate::loader::cann().ok().and_then(|c| c.recent_message()) {
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&recent);
    }
    HalError::Vendor {
        library: LIBRARY.into(),
        call: call.into(),
        code: code as i64,
        name: name(code),
        message,
    }
}

/// The error of a communicator whose `HcclGetCommAsyncError` reports `code` (non-zero): HCCL's
/// timeout is a [`HalError::Timeout`], a failed remote side an [`HalError::Aborted`], anything
/// else the vendor error.
pub fn async_error(lib: &Hccl, code: i32) -> HalError {
    match code {
        E_TIMEOUT => HalError::Timeout {
            what: "HCCL reported a timeout of the communicator's operations \
                   (HcclGetCommAsyncError: HCCL_E_TIMEOUT)"
                .into(),
            millis: 0,
        },
        E_REMOTE => HalError::Aborted {
            what: "a peer rank of the HCCL communicator failed \
                   (HcclGetCommAsyncError: HCCL_E_REMOTE)"
                .into(),
        },
        _ => vendor(lib, "HcclGetCommAsyncError", code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_follow_hccl_types_h() {
        assert_eq!(dtype(DType::F16), Some(3));
        assert_eq!(dtype(DType::Bf16), Some(11));
        assert_eq!(dtype(DType::U8), Some(7));
        assert_eq!(dtype(DType::Bool), None);
        assert!(MOVED.iter().all(|&d| dtype(d).is_some()));
        assert!(REDUCED.iter().all(|d| MOVED.contains(d)));
    }

    #[test]
    fn no_average_in_hccl() {
        assert_eq!(reduce_op(ReduceOp::Avg), (0, true));
        assert_eq!(reduce_op(ReduceOp::Min), (3, false));
    }

    #[test]
    fn result_names_and_unknown_codes() {
        assert_eq!(name(9), "HCCL_E_TIMEOUT");
        assert_eq!(name(21), "HCCL_E_REMOTE");
        assert_eq!(name(24), "HCCL_E_OOM");
        assert_eq!(name(99), "HcclResult 99");
        assert_eq!(name(-1), "HcclResult -1");
    }
}
