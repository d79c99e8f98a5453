//! Conversions between unihal and MPI: dtypes, reductions and error codes.

use super::ffi;
use unihal_hal::{DType, HalError, ReduceOp};

/// The MPI datatype a dtype reduces in; `None` where MPI has none (f16, bf16, bool).
pub fn datatype(d: DType) -> Option<ffi::MPI_Datatype> {
    // SAFETY: the RSMPI_* statics are constant handles set up by the MPI library.
    unsafe {
        Some(match d {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I8 => ffi::RSMPI_INT8_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
            DType::I16 => ffi::RSMPI_INT16_T,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::U32 => ffi::RSMPI_UINT32_T,
            DType::U64 => ffi::RSMPI_UINT64_T,
            DType::F16 | DType::Bf16 | DType::Bool => return None,
        })
    }
}

/// Bytes, for operations that only move data (every dtype moves as bytes).
pub fn bytes() -> ffi::MPI_Datatype {
    // SAFETY: a constant handle set up by the MPI library.
    unsafe { ffi::RSMPI_UINT8_T }
}

/// The MPI reduction that computes `op` (avg runs as sum, then unihal divides).
pub fn op(op: ReduceOp) -> ffi::MPI_Op {
    // SAFETY: constant handles set up by the MPI library.
    unsafe {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => ffi::RSMPI_SUM,
            ReduceOp::Prod => ffi::RSMPI_PROD,
            ReduceOp::Min => ffi::RSMPI_MIN,
            ReduceOp::Max => ffi::RSMPI_MAX,
        }
    }
}

/// The library's message for an error code.
pub fn error_string(code: i32) -> String {
    let mut buf = vec![0u8; 512];
    let mut len = 0;
    // SAFETY: MPI_Error_string writes at most MPI_MAX_ERROR_STRING (256 in Open MPI) bytes.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return format!("MPI error {code}");
    }
    buf.truncate(len.clamp(0, 512) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

/// `Ok` for MPI_SUCCESS, else a `Vendor` error naming the call.
pub fn check(rc: i32, call: &str) -> unihal_hal::Result<()> {
    if rc == 0 {
        return Ok(());
    }
    Err(HalError::Vendor {
        library: "libmpi".into(),
        call: call.into(),
        code: rc as i64,
        name: format!("MPI error class {rc}"),
        message: error_string(rc),
    })
}

/// An element count as MPI's `int`.
pub fn count(n: u64, what: &str) -> unihal_hal::Result<i32> {
    i32::try_from(n).map_err(|_| {
        HalError::unsupported(format!(
            "{what} of {n} elements through MPI (its counts are C ints, at most {})",
            i32::MAX
        ))
    })
}
