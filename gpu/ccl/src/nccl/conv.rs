//! Conversions of the engine: dtypes and reductions to the NCCL API's values, and result codes
//! to [`HalError`] (codes kept raw: NCCL 2.30 inserted `ncclTimeout = 8`, RCCL and older NCCL stop
//! at 7), labelled with the flavor's name.

use super::ffi::Nccl;
use unihal_hal::{DType, HalError, ReduceOp};

/// `ncclInProgress`.
pub const IN_PROGRESS: i32 = 7;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: i32 = 6;

/// The `ncclDataType_t` of a dtype (None: NCCL has no such type).
pub fn dtype(d: DType) -> Option<i32> {
    Some(match d {
        DType::I8 => 0,
        DType::U8 => 1,
        DType::I32 => 2,
        DType::U32 => 3,
        DType::I64 => 4,
        DType::U64 => 5,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::Bf16 => 9,
        DType::Bool | DType::I16 => return None,
    })
}

/// The dtypes NCCL moves and reduces.
pub const DTYPES: [DType; 10] = [
    DType::I8,
    DType::U8,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::Bf16,
];

/// The `ncclRedOp_t` of a reduction.
pub fn reduce_op(r: ReduceOp) -> i32 {
    match r {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
    }
}

/// Symbolic name of a result code.
pub fn name(code: i32) -> String {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        8 => "ncclTimeout",
        _ => return format!("ncclResult {code}"),
    }
    .to_string()
}

/// A failed call as a vendor error of the library's flavor, with its own text (and last-error
/// message).
pub fn vendor(lib: &Nccl, call: &str, code: i32) -> HalError {
    // SAFETY: ncclGetErrorString returns a static string for any code; ncclGetLastError a
    // thread-local one valid until the next call on this thread.
    let text = unsafe {
        let mut t = unihal_dynlib::c_str((lib.get_error_string)(code));
        if let Some(last) = lib.get_last_error {
            let l = unihal_dynlib::c_str(last(std::ptr::null_mut()));
            if !l.is_empty() {
                t = format!("{t}: {l}");
            }
        }
        t
    };
    HalError::Vendor {
        library: lib.label.into(),
        call: call.into(),
        code: code as i64,
        name: name(code),
        message: text,
    }
}
