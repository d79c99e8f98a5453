//! The HIP backend against direct HIP runtime and rocBLAS calls on the same GPU, side by side in
//! one run: the shared benchmark of `unihal_gpu::vs_direct` (the same measures and targets as
//! `cuda_vs_direct`) with the runtime's own calls and rocBLAS's SGEMM as the direct side.
//!
//! Prints a markdown table of medians. `--small` shrinks every size (a smoke run, e.g. on the
//! simulated runtime, whose figures mean nothing). Device 0 of the `hip` backend.
//!
//! Run: `cargo run --release -p unihal-hip --example hip_vs_direct [-- --small] [--rounds R]`

use unihal_gpu::vs_direct::{self, DirectSgemm, Options};
use unihal_hal::{Backend, HalError, Result};
use unihal_hip::{ffi, loader, Hip, HipBackend};

fn main() -> Result<()> {
    let (small, rounds) = vs_direct::args();
    let backend = HipBackend::new();
    let dev = backend.open(0)?;
    let test_kernels = backend
        .test_kernels(dev.as_ref())
        .ok_or_else(|| HalError::unsupported("no test kernels: is hiprtc installed?"))?;
    let sgemm: Option<(&'static str, DirectSgemm)> = loader::rocblas().ok().map(|(api, _)| {
        let mut handle: ffi::Handle = std::ptr::null_mut();
        let f: DirectSgemm = Box::new(move |raw, a, b, c, n| {
            if handle.is_null() {
                // SAFETY: an out-pointer to a local; the device is current.
                unsafe { (api.create_handle)(&mut handle) };
            }
            // SAFETY: a live handle and stream of this device.
            unsafe { (api.set_stream)(handle, raw.0) };
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: three live n x n f32 matrices; row-major C = A·B computed as column-major
            // Cᵀ = Bᵀ·Aᵀ; D is C.
            let st = unsafe {
                (api.gemm_strided_batched_ex)(
                    handle,
                    ffi::ROCBLAS_OP_N,
                    ffi::ROCBLAS_OP_N,
                    n,
                    n,
                    n,
                    &alpha as *const f32 as *const _,
                    b as *const _,
                    ffi::ROCBLAS_F32,
                    n,
                    0,
                    a as *const _,
                    ffi::ROCBLAS_F32,
                    n,
                    0,
                    &beta as *const f32 as *const _,
                    c as *const _,
                    ffi::ROCBLAS_F32,
                    n,
                    0,
                    c as *mut _,
                    ffi::ROCBLAS_F32,
                    n,
                    0,
                    1,
                    ffi::ROCBLAS_F32,
                    ffi::ROCBLAS_GEMM_ALGO_STANDARD,
                    0,
                    0,
                )
            };
            if st != 0 {
                return Err(HalError::Internal(format!(
                    "rocblas_gemm_strided_batched_ex: {st}"
                )));
            }
            Ok(())
        });
        ("rocBLAS", f)
    });
    let opt = Options {
        small,
        rounds,
        test_kernels,
        sgemm,
    };
    let table = vs_direct::run::<Hip>(&dev, opt)?;
    let version = backend.info().libraries[0]
        .version
        .clone()
        .unwrap_or_default();
    vs_direct::print(dev.as_ref(), &version, rounds, small, &table);
    Ok(())
}
