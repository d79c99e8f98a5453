//! The CUDA backend against direct driver and cuBLAS calls on the same GPU, side by side in one
//! run: the shared benchmark of `unihal_gpu::vs_direct` (its table of measures and targets) with
//! the driver's own calls and `cublasSgemm` as the direct side.
//!
//! Prints a markdown table of medians. `--small` shrinks every size (a smoke run, e.g. on the
//! simulated driver, whose figures mean nothing). Device 0 of the `cuda` backend.
//!
//! Run: `cargo run --release -p unihal-cuda --example cuda_vs_direct [-- --small] [--rounds R]`

use cudarc::cublas::sys as blas;
use unihal_cuda::{Cuda, CudaBackend};
use unihal_gpu::vs_direct::{self, DirectSgemm, Options};
use unihal_hal::{Backend, HalError, ModuleSource, Result};
use unihal_kernels::testing::PTX;

fn main() -> Result<()> {
    let (small, rounds) = vs_direct::args();
    let backend = CudaBackend::new();
    let dev = backend.open(0)?;
    let has_blas = unihal_cuda::loader::cublas_available();
    let mut handle: blas::cublasHandle_t = std::ptr::null_mut();
    let sgemm: Option<(&'static str, DirectSgemm)> = has_blas.then(|| {
        let f: DirectSgemm = Box::new(move |raw, a, b, c, n| {
            if handle.is_null() {
                // SAFETY: an out-pointer to a local; the device's context is current (the
                // benchmark runs direct calls with it bound).
                unsafe { blas::cublasCreate_v2(&mut handle) };
            }
            // SAFETY: a live handle and stream of this context.
            unsafe { blas::cublasSetStream_v2(handle, raw.0 as _) };
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: three live n x n f32 matrices; row-major C = A·B computed as column-major
            // Cᵀ = Bᵀ·Aᵀ, as the backend does.
            let st = unsafe {
                blas::cublasSgemm_v2(
                    handle,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    blas::cublasOperation_t::CUBLAS_OP_N,
                    n,
                    n,
                    n,
                    &alpha,
                    b as *const f32,
                    n,
                    a as *const f32,
                    n,
                    &beta,
                    c as *mut f32,
                    n,
                )
            };
            if st != blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(HalError::Internal(format!("cublasSgemm: {st:?}")));
            }
            Ok(())
        });
        ("cuBLAS", f)
    });
    let opt = Options {
        small,
        rounds,
        test_kernels: ModuleSource::Ptx(PTX.to_string()),
        sgemm,
    };
    let table = vs_direct::run::<Cuda>(&dev, opt)?;
    let version = backend.info().libraries[0]
        .version
        .clone()
        .unwrap_or_default();
    vs_direct::print(dev.as_ref(), &version, rounds, small, &table);
    Ok(())
}
