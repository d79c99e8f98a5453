//! The rocBLAS subset unihal's HIP backend calls (`rocblas_create_handle`, `rocblas_set_stream`,
//! `rocblas_gemm_strided_batched_ex`, `rocblas_status_to_string`), written from AMD's rocBLAS
//! documentation and exported from this library, so the backend's matmul runs its rocBLAS path
//! in CI (`UNIHAL_ROCBLAS_LIB` pointing at this file).
//!
//! The GEMM is checked as rocBLAS documents (sizes and leading dimensions, pointers, the type
//! combinations it supports, `beta == 0` meaning C is not read) and computed on the host in the
//! handle's stream order, column-major: `D = alpha·op(A)·op(B) + beta·C` per batch, accumulating
//! in the compute type (f32 for f16, bf16 and f32; f64 for f64). Scalars are host values (the
//! default pointer mode).

use crate::sim;
use half::{bf16, f16};
use std::ffi::{c_char, c_int, c_void};
use unihal_sim::gpu::ops::{self, EntryCodes};
use unihal_sim::{Memory, SimResult, Work};

pub const SUCCESS: c_int = 0;
pub const INVALID_HANDLE: c_int = 1;
pub const NOT_IMPLEMENTED: c_int = 2;
pub const INVALID_POINTER: c_int = 3;
pub const INVALID_SIZE: c_int = 4;
pub const INTERNAL_ERROR: c_int = 6;
pub const INVALID_VALUE: c_int = 11;

const OP_N: c_int = 111;
const OP_T: c_int = 112;
const F16: c_int = 150;
const F32: c_int = 151;
const F64: c_int = 152;
const BF16: c_int = 168;

/// A handle: the stream its calls run on.
struct Handle {
    stream: *mut c_void,
}

fn entry(name: &str, f: impl FnOnce() -> Result<(), c_int>) -> c_int {
    let codes = EntryCodes {
        not_permitted: INTERNAL_ERROR,
        unknown: INTERNAL_ERROR,
    };
    ops::entry(name, codes, f)
}

#[no_mangle]
pub unsafe extern "C" fn rocblas_create_handle(h: *mut *mut c_void) -> c_int {
    entry("rocblas_create_handle", || {
        if h.is_null() {
            return Err(INVALID_POINTER);
        }
        sim().map_err(|_| INTERNAL_ERROR)?;
        let handle = Box::into_raw(Box::new(Handle {
            stream: std::ptr::null_mut(),
        }));
        // SAFETY: a non-null out-pointer (the caller's contract).
        unsafe { h.write(handle as *mut c_void) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rocblas_destroy_handle(h: *mut c_void) -> c_int {
    entry("rocblas_destroy_handle", || {
        if h.is_null() {
            return Err(INVALID_HANDLE);
        }
        // SAFETY: a handle of rocblas_create_handle, destroyed once (the caller's contract).
        drop(unsafe { Box::from_raw(h as *mut Handle) });
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rocblas_set_stream(h: *mut c_void, stream: *mut c_void) -> c_int {
    entry("rocblas_set_stream", || {
        if h.is_null() {
            return Err(INVALID_HANDLE);
        }
        sim()
            .map_err(|_| INTERNAL_ERROR)?
            .face
            .stream_of(stream)
            .map_err(|_| INVALID_VALUE)?;
        // SAFETY: a live handle (the caller's contract), used by one thread at a time.
        unsafe { (*(h as *mut Handle)).stream = stream };
        Ok(())
    })
}

/// The version this simulator reports, naming itself.
const VERSION: &std::ffi::CStr = c"4.2.0 (unihal simulated rocBLAS)";

#[no_mangle]
pub unsafe extern "C" fn rocblas_get_version_string(buf: *mut c_char, len: usize) -> c_int {
    entry("rocblas_get_version_string", || {
        let v = VERSION.to_bytes_with_nul();
        if buf.is_null() || len < v.len() {
            return Err(INVALID_SIZE);
        }
        // SAFETY: the caller's buffer of `len >= v.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const c_char, buf, v.len()) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn rocblas_status_to_string(st: c_int) -> *const c_char {
    match st {
        SUCCESS => c"rocblas_status_success",
        INVALID_HANDLE => c"rocblas_status_invalid_handle",
        NOT_IMPLEMENTED => c"rocblas_status_not_implemented",
        INVALID_POINTER => c"rocblas_status_invalid_pointer",
        INVALID_SIZE => c"rocblas_status_invalid_size",
        INTERNAL_ERROR => c"rocblas_status_internal_error",
        INVALID_VALUE => c"rocblas_status_invalid_value",
        _ => c"<undefined rocblas_status>",
    }
    .as_ptr()
}

/// One operand: address, leading dimension, batch stride (elements), rows and columns stored.
#[derive(Clone, Copy)]
struct Mat {
    addr: u64,
    ld: i64,
    stride: i64,
    rows: i64,
    cols: i64,
}

impl Mat {
    /// Bytes spanned by `count` batches of it.
    fn span(&self, count: i64, esz: i64) -> u64 {
        if self.rows == 0 || self.cols == 0 || count == 0 {
            return 0;
        }
        (((count - 1) * self.stride + (self.cols - 1) * self.ld + self.rows) * esz) as u64
    }
}

/// Reads element `i` of type `ty` from `bytes` as f64.
fn get(ty: c_int, bytes: &[u8], i: usize) -> f64 {
    match ty {
        F16 => f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f64(),
        BF16 => bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f64(),
        F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4")) as f64,
        _ => f64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8")),
    }
}

/// Writes `v` as element `i` of type `ty`.
fn put(ty: c_int, bytes: &mut [u8], i: usize, v: f64) {
    match ty {
        F16 => bytes[2 * i..2 * i + 2].copy_from_slice(&f16::from_f64(v).to_le_bytes()),
        BF16 => bytes[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f64(v).to_le_bytes()),
        F32 => bytes[4 * i..4 * i + 4].copy_from_slice(&(v as f32).to_le_bytes()),
        _ => bytes[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes()),
    }
}

/// The GEMM problem, checked.
struct Gemm {
    ta: bool,
    tb: bool,
    m: i64,
    n: i64,
    k: i64,
    a: Mat,
    b: Mat,
    c: Mat,
    d: Mat,
    count: i64,
    ty: c_int,
    f64_compute: bool,
    alpha: f64,
    beta: f64,
}

impl Gemm {
    /// Runs every batch on device memory.
    fn run(&self, mem: &mut Memory) -> SimResult<()> {
        let esz = if self.ty == F64 {
            8
        } else if self.ty == F32 {
            4
        } else {
            2
        };
        let read = |mem: &Memory, m: &Mat, b: i64| -> SimResult<Vec<u8>> {
            let mut v = vec![0u8; m.span(1, esz) as usize];
            mem.read(m.addr + (b * m.stride * esz) as u64, &mut v)?;
            Ok(v)
        };
        let round = |x: f64| if self.f64_compute { x } else { x as f32 as f64 };
        for batch in 0..self.count {
            // Operands decoded and packed once per batch (A by rows, B by columns), so each
            // output element is a dot product of two dense slices, accumulated in the same order
            // (p = 0..k) and rounded as the compute type at every operation.
            let (k, m, n) = (self.k as usize, self.m as usize, self.n as usize);
            let (ab, bb) = (read(mem, &self.a, batch)?, read(mem, &self.b, batch)?);
            // `outer` rows of k values; value (o, p) at element o * os + p * is of `bytes`.
            let pack = |bytes: &[u8], outer: i64, (os, is): (i64, i64)| -> Vec<f64> {
                (0..outer)
                    .flat_map(|o| (0..self.k).map(move |p| (o * os + p * is) as usize))
                    .map(|e| get(self.ty, bytes, e))
                    .collect()
            };
            // A's (i, p) and B's (p, j), by the transposes.
            let (la, lb) = (self.a.ld, self.b.ld);
            let a = pack(&ab, self.m, if self.ta { (la, 1) } else { (1, la) });
            let b = pack(&bb, self.n, if self.tb { (1, lb) } else { (lb, 1) });
            // beta == 0: C is not read (it may hold anything, NaN included).
            let c = if self.beta != 0.0 {
                Some(read(mem, &self.c, batch)?)
            } else {
                None
            };
            let mut d = read(mem, &self.d, batch)?;
            // f32 compute: f32 arithmetic is exactly the f64 operation rounded to f32 (the
            // operands are f32 values), so the two paths below agree with rounding each step.
            let (a32, b32): (Vec<f32>, Vec<f32>) = if self.f64_compute {
                (Vec::new(), Vec::new())
            } else {
                (
                    a.iter().map(|&x| x as f32).collect(),
                    b.iter().map(|&x| x as f32).collect(),
                )
            };
            for j in 0..n {
                for i in 0..m {
                    let acc = if self.f64_compute {
                        let (ar, br) = (&a[i * k..(i + 1) * k], &b[j * k..(j + 1) * k]);
                        ar.iter().zip(br).fold(0.0f64, |acc, (x, y)| acc + x * y)
                    } else {
                        let (ar, br) = (&a32[i * k..(i + 1) * k], &b32[j * k..(j + 1) * k]);
                        f64::from(ar.iter().zip(br).fold(0.0f32, |acc, (x, y)| acc + x * y))
                    };
                    let mut v = round(self.alpha * acc);
                    if let Some(c) = &c {
                        let ci = i as i64 + j as i64 * self.c.ld;
                        v = round(v + round(self.beta * get(self.ty, c, ci as usize)));
                    }
                    put(
                        self.ty,
                        &mut d,
                        (i as i64 + j as i64 * self.d.ld) as usize,
                        v,
                    );
                }
            }
            mem.write(self.d.addr + (batch * self.d.stride * esz) as u64, &d)?;
        }
        Ok(())
    }
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn rocblas_gemm_strided_batched_ex(
    handle: *mut c_void,
    trans_a: c_int,
    trans_b: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    a_type: c_int,
    lda: c_int,
    stride_a: i64,
    b: *const c_void,
    b_type: c_int,
    ldb: c_int,
    stride_b: i64,
    beta: *const c_void,
    c: *const c_void,
    c_type: c_int,
    ldc: c_int,
    stride_c: i64,
    d: *mut c_void,
    d_type: c_int,
    ldd: c_int,
    stride_d: i64,
    batch_count: c_int,
    compute_type: c_int,
    _algo: c_int,
    _solution_index: i32,
    _flags: u32,
) -> c_int {
    entry("rocblas_gemm_strided_batched_ex", || {
        if handle.is_null() {
            return Err(INVALID_HANDLE);
        }
        let op = |t: c_int| match t {
            OP_N => Ok(false),
            OP_T => Ok(true),
            _ => Err(INVALID_VALUE),
        };
        let (ta, tb) = (op(trans_a)?, op(trans_b)?);
        let (m, n, k) = (m as i64, n as i64, k as i64);
        if m < 0 || n < 0 || k < 0 || batch_count < 0 {
            return Err(INVALID_SIZE);
        }
        // Leading dimensions at least the stored rows (and 1).
        let (a_rows, a_cols) = if ta { (k, m) } else { (m, k) };
        let (b_rows, b_cols) = if tb { (n, k) } else { (k, n) };
        let short = |ld: c_int, rows: i64| (ld as i64) < rows.max(1);
        if short(lda, a_rows) || short(ldb, b_rows) || short(ldc, m) || short(ldd, m) {
            return Err(INVALID_SIZE);
        }
        if m == 0 || n == 0 || batch_count == 0 {
            return Ok(());
        }
        if alpha.is_null() || beta.is_null() || d.is_null() {
            return Err(INVALID_POINTER);
        }
        // The combinations rocBLAS documents for these types.
        let ty = a_type;
        let f64_compute = match (ty, compute_type) {
            (F64, F64) => true,
            (F32 | F16 | BF16, F32) => false,
            _ => return Err(NOT_IMPLEMENTED),
        };
        if b_type != ty || c_type != ty || d_type != ty {
            return Err(NOT_IMPLEMENTED);
        }
        // SAFETY: host scalars of the compute type (the default pointer mode).
        let (alpha, beta) = unsafe {
            if f64_compute {
                (*(alpha as *const f64), *(beta as *const f64))
            } else {
                (*(alpha as *const f32) as f64, *(beta as *const f32) as f64)
            }
        };
        if (k > 0 && alpha != 0.0 && (a.is_null() || b.is_null())) || (beta != 0.0 && c.is_null()) {
            return Err(INVALID_POINTER);
        }
        let mat = |p: *const c_void, ld: c_int, stride: i64, rows: i64, cols: i64| Mat {
            addr: p as u64,
            ld: ld as i64,
            stride,
            rows,
            cols,
        };
        let g = Gemm {
            ta,
            tb,
            m,
            n,
            k,
            a: mat(a, lda, stride_a, a_rows, a_cols),
            b: mat(b, ldb, stride_b, b_rows, b_cols),
            c: mat(c, ldc, stride_c, m, n),
            d: mat(d, ldd, stride_d, m, n),
            count: batch_count as i64,
            ty,
            f64_compute,
            alpha,
            beta,
        };
        let esz = if ty == F64 {
            8
        } else if ty == F32 {
            4
        } else {
            2
        };
        let count = g.count;
        let touches = [g.a, g.b, g.c, g.d]
            .iter()
            .filter(|x| x.addr != 0)
            .map(|x| (x.addr, x.span(count, esz)))
            .collect();
        // SAFETY: a live handle (the caller's contract).
        let stream = unsafe { (*(handle as *const Handle)).stream };
        let s = sim().map_err(|_| INTERNAL_ERROR)?;
        let (dev, id) = s.face.stream_of(stream).map_err(|_| INVALID_VALUE)?;
        let work = Work {
            touches,
            run: Box::new(move |mem| g.run(mem)),
        };
        dev.enqueue(id, work).map_err(|_| INTERNAL_ERROR)
    })
}
