//! Conversions of the CUDA backend: driver errors to [`HalError`] (the CUDA name and number are
//! kept), and the device attributes it reads.

use crate::ffi::{codes, error_text, DriverError};
use cudarc::cublas::sys::{cublasOperation_t, cublasStatus_t};
use cudarc::driver::sys::CUdevice_attribute;
use std::ffi::c_int;
use unihal_gpu::gemm::Op;
use unihal_gpu::runtime::RawCaptureStatus;
use unihal_hal::{CaptureId, CaptureMode, HalError, Result};

/// A failed driver call as a vendor error: `CUDA driver: <call> failed with CUDA_ERROR_X (n): text`.
/// The code is kept as the driver returned it, listed in `cuda.h` or not.
pub(crate) fn vendor(call: &str, e: DriverError) -> HalError {
    let code = e.0;
    // The names come from the driver itself (cuGetErrorName/String); a code the driver does not
    // name (or a driver without them) still gives the number.
    let text = |name| {
        std::panic::catch_unwind(|| error_text(code, name))
            .ok()
            .flatten()
    };
    HalError::Vendor {
        library: "CUDA driver".into(),
        call: call.into(),
        code: code as i64,
        name: text(true).unwrap_or_else(|| format!("CUresult {code}")),
        message: text(false).unwrap_or_default(),
    }
}

/// True for `CUDA_ERROR_NOT_READY` (work still running: not an error for queries).
pub(crate) fn not_ready(e: &DriverError) -> bool {
    e.0 == codes::NOT_READY
}

/// True for `CUDA_ERROR_OUT_OF_MEMORY`.
pub(crate) fn out_of_memory(e: &DriverError) -> bool {
    e.0 == codes::OUT_OF_MEMORY
}

/// The attributes the backend reads into its capabilities.
pub(crate) mod attr {
    use super::CUdevice_attribute as A;
    pub const MAX_THREADS_PER_BLOCK: A = A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
    pub const MAX_BLOCK: [A; 3] = [
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
    ];
    pub const MAX_GRID: [A; 3] = [
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
    ];
    pub const SHARED_PER_BLOCK: A = A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK;
    pub const WARP_SIZE: A = A::CU_DEVICE_ATTRIBUTE_WARP_SIZE;
    pub const SM_COUNT: A = A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
    pub const CC_MAJOR: A = A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
    pub const CC_MINOR: A = A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
    /// `cuMemAllocAsync` / `cuMemFreeAsync` and the device's default pool.
    pub const MEMORY_POOLS: A = A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED;
}

/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`: enabling twice is not a failure.
pub(crate) fn already_enabled(e: &DriverError) -> bool {
    e.0 == codes::PEER_ACCESS_ALREADY_ENABLED
}

/// A cuBLAS status as a [`HalError::Vendor`] naming `call` (success is `Ok`).
pub(crate) fn blas_status(call: &str, st: cublasStatus_t) -> Result<()> {
    if st == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    Err(HalError::Vendor {
        library: "cuBLAS".into(),
        call: call.into(),
        code: st as i64,
        name: format!("{st:?}"),
        message: String::new(),
    })
}

/// cuBLAS's value of a BLAS operation.
pub(crate) fn blas_op(o: Op) -> cublasOperation_t {
    match o {
        Op::N => cublasOperation_t::CUBLAS_OP_N,
        Op::T => cublasOperation_t::CUBLAS_OP_T,
    }
}

/// `CUstreamCaptureMode` of a HAL capture mode (`CU_STREAM_CAPTURE_MODE_GLOBAL` = 0,
/// `THREAD_LOCAL` = 1, `RELAXED` = 2).
pub(crate) fn capture_mode(m: CaptureMode) -> c_int {
    match m {
        CaptureMode::Global => 0,
        CaptureMode::ThreadLocal => 1,
        CaptureMode::Relaxed => 2,
    }
}

/// The HAL capture mode of a `CUstreamCaptureMode` (None for a value the driver does not
/// document).
pub(crate) fn capture_mode_of(v: c_int) -> Option<CaptureMode> {
    CaptureMode::ALL.into_iter().find(|m| capture_mode(*m) == v)
}

/// `CUstreamCaptureStatus`: `CU_STREAM_CAPTURE_STATUS_NONE` = 0, `ACTIVE` = 1,
/// `INVALIDATED` = 2, with the capture's id (read only when not none).
pub(crate) fn capture_status(status: c_int, id: u64) -> Result<RawCaptureStatus> {
    match status {
        0 => Ok(RawCaptureStatus::None),
        1 => Ok(RawCaptureStatus::Active(id)),
        2 => Ok(RawCaptureStatus::Invalidated(id)),
        other => Err(HalError::Internal(format!(
            "the CUDA driver reports an undocumented CUstreamCaptureStatus {other}"
        ))),
    }
}

/// A driver error with one of the capture codes (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` 900
/// to `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` 908) as [`unihal_hal::Invalid::Capture`] naming
/// `capture()`; other errors unchanged.
pub(crate) fn capture_error(
    e: HalError,
    arg: &'static str,
    capture: &dyn Fn() -> Option<CaptureId>,
) -> HalError {
    unihal_gpu::graph::vendor_capture_error("CUDA driver", e, arg, capture)
}
