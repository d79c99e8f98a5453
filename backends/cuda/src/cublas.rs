//! Matmul through cuBLAS, opened at run time (cudarc's `cublas` bindings): one handle per stream,
//! `cublasGemmStridedBatchedEx` for every layout it can express, with f32 accumulation for
//! f16/bf16 (as the portable GEMM) and no TF32 (the default math mode keeps f32 exact). Layouts it
//! cannot express (negative or non-unit inner strides, batches that do not collapse to one stride,
//! `k == 0`, sizes beyond `i32`) and machines without cuBLAS take the portable tiled GEMM instead.
//!
//! The layout mapping (row-major `C = A·B` as column-major `Cᵀ = Bᵀ·Aᵀ`) is the shared one of
//! `unihal_gpu::gemm`, which hipBLAS and rocBLAS take too.

use crate::loader::guard;
use cudarc::cublas::sys as blas;
use std::sync::OnceLock;
use unihal_gpu::gemm::{BlasCall, Op};
use unihal_hal::{DType, HalError, Result};

/// True when cuBLAS can be opened (checked once, without panicking).
pub fn available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: probes the library names with dlopen/dlclose; no symbol is called.
        std::panic::catch_unwind(|| unsafe { blas::is_culib_present() }).unwrap_or(false)
    })
}

/// A cuBLAS handle of one device. A stream takes one for its first matmul and hands it back to
/// its device's pool once the work queued on it has run, so handles are never destroyed
/// (`cublasDestroy` synchronises the whole device, which a stream's release must not do) and
/// no handle's workspace is shared by two streams' work at once.
pub struct Handle(pub(crate) usize);

impl Handle {
    /// Creates a handle in the current context.
    pub(crate) fn new() -> Result<Handle> {
        guard("cublasCreate", || {
            let mut h: blas::cublasHandle_t = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local; the device's context is current.
            let st = unsafe { blas::cublasCreate_v2(&mut h) };
            status("cublasCreate", st)?;
            Ok(Handle(h as usize))
        })
    }

    /// Makes later calls with this handle run on `stream` (of the handle's context).
    pub(crate) fn bind(&self, stream: cudarc::driver::sys::CUstream) -> Result<()> {
        guard("cublasSetStream", || {
            // SAFETY: a live handle and stream of its context.
            let st =
                unsafe { blas::cublasSetStream_v2(self.0 as blas::cublasHandle_t, stream as _) };
            status("cublasSetStream", st)
        })
    }
}

fn status(call: &str, st: blas::cublasStatus_t) -> Result<()> {
    if st == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
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
fn op(o: Op) -> blas::cublasOperation_t {
    match o {
        Op::N => blas::cublasOperation_t::CUBLAS_OP_N,
        Op::T => blas::cublasOperation_t::CUBLAS_OP_T,
    }
}

/// Queues one strided-batched GEMM through cuBLAS on the handle's stream.
///
/// # Safety
/// `Runtime::blas_gemm`'s contract: `bc` was validated against its buffers, which are kept
/// until the work ran.
pub(crate) unsafe fn gemm(h: &Handle, bc: &BlasCall) -> Result<()> {
    let (data, compute) = match bc.dtype {
        DType::F64 => (
            blas::cudaDataType::CUDA_R_64F,
            blas::cublasComputeType_t::CUBLAS_COMPUTE_64F,
        ),
        DType::F16 => (
            blas::cudaDataType::CUDA_R_16F,
            blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        DType::Bf16 => (
            blas::cudaDataType::CUDA_R_16BF,
            blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
        _ => (
            blas::cudaDataType::CUDA_R_32F,
            blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        ),
    };
    let (g, (alpha, beta)) = (bc.gemm, bc.scalars());
    guard("cublasGemmStridedBatchedEx", || {
        // SAFETY: the caller's contract covers the operands; alpha/beta are host values read
        // during the call, and beta = 0 makes cuBLAS not read C (as the HAL requires).
        let st = unsafe {
            blas::cublasGemmStridedBatchedEx(
                h.0 as blas::cublasHandle_t,
                op(g.op_a),
                op(g.op_b),
                g.m,
                g.n,
                g.k,
                alpha,
                bc.pb as *const _,
                data,
                g.lda,
                g.stride_a,
                bc.pa as *const _,
                data,
                g.ldb,
                g.stride_b,
                beta,
                bc.pc as *mut _,
                data,
                g.ldc,
                g.stride_c,
                g.count,
                compute,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        status("cublasGemmStridedBatchedEx", st)
    })
}
