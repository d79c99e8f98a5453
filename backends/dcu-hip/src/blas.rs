//! Matmul through rocBLAS, opened at run time (`UNIHAL_ROCBLAS_LIB`, else `librocblas.so.4`
//! (ROCm 6), `.so.0` (ROCm 5), `.so`, under `ROCM_PATH` and Hygon DTK's root too): one handle per
//! stream, `rocblas_gemm_strided_batched_ex` for every layout it expresses, f32 accumulation for
//! f16/bf16 as in the portable GEMM. The layout mapping is the shared one of `unihal_gpu::gemm`
//! (the same as cuBLAS's); layouts it cannot express, and machines without rocBLAS, take the
//! portable tiled GEMM.

use crate::ffi::{self, Handle as RawHandle, RocblasApi};
use std::sync::OnceLock;
use unihal_dynlib::{Candidates, Library};
use unihal_gpu::gemm::{BlasCall, Op};
use unihal_gpu::runtime::Raw;
use unihal_hal::{DType, HalError, Result};

/// Where rocBLAS is looked for.
pub fn candidates() -> Candidates {
    const NAMES: [&str; 3] = ["librocblas.so.4", "librocblas.so.0", "librocblas.so"];
    Candidates::new("rocBLAS", "UNIHAL_ROCBLAS_LIB", &NAMES)
        .under_root(&["ROCM_PATH"], Some("/opt/rocm"), "lib", &NAMES)
        .under_root(&["DTKROOT"], Some("/opt/dtk"), "lib", &NAMES)
        .under_root(&["DTKROOT"], Some("/opt/dtk"), "rocblas/lib", &NAMES)
}

/// rocBLAS, opened once per process.
///
/// # Errors
/// [`HalError::Unavailable`] with the names tried (the first outcome is kept).
pub fn rocblas() -> Result<&'static (RocblasApi, String)> {
    static ROCBLAS: OnceLock<Result<(RocblasApi, String)>> = OnceLock::new();
    ROCBLAS
        .get_or_init(|| {
            let lib = Library::open(&candidates())?;
            Ok((RocblasApi::new(&lib)?, lib.path().to_string()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// rocBLAS's version string (`rocblas_get_version_string`), when it has one.
pub fn version(api: &RocblasApi) -> Option<String> {
    let f = api.get_version_string?;
    let mut buf = [0 as std::ffi::c_char; 128];
    // SAFETY: a buffer of the length passed.
    if unsafe { f(buf.as_mut_ptr(), buf.len()) } != 0 {
        return None;
    }
    buf[127] = 0;
    // SAFETY: NUL-terminated within the buffer (the last byte was forced to NUL).
    Some(unsafe { unihal_dynlib::c_str(buf.as_ptr()) })
}

/// A rocBLAS handle of one device, pooled per device by the shared GPU layer (a stream takes
/// one for its first matmul and gives it back once its work ran; never destroyed).
pub struct Handle(RawHandle);

// SAFETY: a rocBLAS handle may be used from any thread, by one at a time (the stream that holds
// it serialises its use under its lock).
unsafe impl Send for Handle {}

fn status(call: &str, st: ffi::rocblas_status) -> Result<()> {
    if st == 0 {
        return Ok(());
    }
    let name = rocblas()
        .ok()
        .and_then(|(api, _)| api.status_to_string)
        // SAFETY: returns a static string for any status.
        .map(|f| unsafe { unihal_dynlib::c_str(f(st)) })
        .unwrap_or_else(|| format!("rocblas_status {st}"));
    Err(HalError::Vendor {
        library: "rocBLAS".into(),
        call: call.into(),
        code: st as i64,
        name,
        message: String::new(),
    })
}

impl Handle {
    /// A handle of the current device.
    pub(crate) fn new() -> Result<Handle> {
        let (api, _) = rocblas()?;
        let mut h = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the device is current.
        status("rocblas_create_handle", unsafe {
            (api.create_handle)(&mut h)
        })?;
        Ok(Handle(h))
    }

    /// Makes later calls with this handle run on `stream`.
    pub(crate) fn bind(&self, stream: Raw) -> Result<()> {
        let (api, _) = rocblas()?;
        // SAFETY: a live handle and stream of its device.
        status("rocblas_set_stream", unsafe {
            (api.set_stream)(self.0, stream.0)
        })
    }
}

fn op(o: Op) -> i32 {
    match o {
        Op::N => ffi::ROCBLAS_OP_N,
        Op::T => ffi::ROCBLAS_OP_T,
    }
}

/// Queues one strided-batched GEMM through rocBLAS on the handle's stream.
///
/// # Safety
/// `Runtime::blas_gemm`'s contract: `bc` was validated against its buffers, which are kept
/// until the work ran.
pub(crate) unsafe fn gemm(h: &Handle, bc: &BlasCall) -> Result<()> {
    let (api, _) = rocblas()?;
    let (data, compute) = match bc.dtype {
        DType::F64 => (ffi::ROCBLAS_F64, ffi::ROCBLAS_F64),
        DType::F16 => (ffi::ROCBLAS_F16, ffi::ROCBLAS_F32),
        DType::Bf16 => (ffi::ROCBLAS_BF16, ffi::ROCBLAS_F32),
        _ => (ffi::ROCBLAS_F32, ffi::ROCBLAS_F32),
    };
    let (g, (alpha, beta)) = (bc.gemm, bc.scalars());
    // SAFETY: the caller's contract covers the operands; alpha/beta are host values read during
    // the call (the default pointer mode), beta = 0 makes rocBLAS not read C, and D is C
    // (rocBLAS allows them to alias with equal layouts).
    let st = unsafe {
        (api.gemm_strided_batched_ex)(
            h.0,
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
            bc.pc as *const _,
            data,
            g.ldc,
            g.stride_c,
            bc.pc as *mut _,
            data,
            g.ldc,
            g.stride_c,
            g.count,
            compute,
            ffi::ROCBLAS_GEMM_ALGO_STANDARD,
            0,
            0,
        )
    };
    status("rocblas_gemm_strided_batched_ex", st)
}
