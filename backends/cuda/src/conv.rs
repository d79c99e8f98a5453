//! Conversions of the CUDA backend: driver errors to [`HalError`] (the CUDA name and number are
//! kept), and the device attributes it reads.

use crate::ffi::{codes, error_text, DriverError};
use cudarc::cublas::sys::{cublasOperation_t, cublasStatus_t};
use cudarc::driver::sys::CUdevice_attribute;
use unihal_gpu::gemm::Op;
use unihal_hal::{HalError, Result};

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
