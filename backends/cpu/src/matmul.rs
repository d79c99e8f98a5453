//! `matmul` on the CPU backend through faer's GEMM, which picks its micro-kernels at run time (up
//! to AVX-512); a product large enough is cut into panels of `c` (rows, or columns when `c` is
//! wide) that the device's compute pool runs, the calling stream worker among them. f32 and f64 run in place on the
//! operands' strides; f16 and bf16 are widened to dense f32 panels, multiplied with f32
//! accumulation and rounded once into `c`. (`UNIHAL_CPU_MATMUL=dialect` runs the portable tiled
//! GEMM kernel instead, through the ordinary op path.)

use crate::compute::ComputePool;
use unihal_hal::{DType, OpCall, Result, TensorView};
use unihal_kernels::plan_nn::lead_strides;

/// A validated matmul, reduced to addresses and element strides.
pub(crate) struct MatmulJob {
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    /// The batch shape (c's leading dims) and each operand's element strides over it.
    batch: Vec<u64>,
    batch_strides: [Vec<i64>; 3],
    base: [usize; 3],
    /// (row, column) strides of a, b, c in elements.
    strides: [[isize; 2]; 3],
    alpha: f64,
    beta: f64,
}

/// Calls `f` with the element offsets of a, b and c for every index of `shape` under each
/// operand's strides (row-major order), computed as it goes: nothing is allocated in proportion
/// to a caller-given dimension. Only called for a non-empty `c`, whose batches all exist in its
/// buffer, so the offsets fit (validation checked every element is inside its buffer).
fn for_each_batch(shape: &[u64], strides: &[Vec<i64>; 3], mut f: impl FnMut([i64; 3])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0u64; shape.len()];
    loop {
        let mut o = [0i64; 3];
        for (d, &i) in idx.iter().enumerate() {
            for (k, s) in strides.iter().enumerate() {
                o[k] += i as i64 * s[d];
            }
        }
        f(o);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl MatmulJob {
    /// Prepares `call` (validated here); `None` when `c` is empty (nothing to do, whatever the
    /// other dims say).
    pub(crate) fn new(call: &OpCall) -> Result<Option<MatmulJob>> {
        call.validate()?;
        let (alpha, beta) = call.matmul_scales()?;
        if call.tensors[2].numel() == 0 {
            return Ok(None);
        }
        let (a, b, c) = (&call.tensors[0], &call.tensors[1], &call.tensors[2]);
        let (na, nb, nc) = (a.shape.len(), b.shape.len(), c.shape.len());
        let batch = &c.shape[..nc - 2];
        let strides = [
            lead_strides(a, 2, batch),
            lead_strides(b, 2, batch),
            c.strides[..nc - 2].to_vec(),
        ];
        let pair =
            |t: &TensorView, n: usize| [t.strides[n - 2] as isize, t.strides[n - 1] as isize];
        let addr = |t: &TensorView| (t.buffer.device_addr() + t.offset) as usize;
        Ok(Some(MatmulJob {
            dtype: a.dtype,
            m: c.shape[nc - 2] as usize,
            n: c.shape[nc - 1] as usize,
            k: a.shape[na - 1] as usize,
            batch: batch.to_vec(),
            batch_strides: strides,
            base: [addr(a), addr(b), addr(c)],
            strides: [pair(a, na), pair(b, nb), pair(c, nc)],
            alpha,
            beta,
        }))
    }

    /// Runs every batch, each product cut into panels over `pool` when it is worth it.
    ///
    /// # Safety
    /// The views' memory must be live and not accessed by anyone else for the duration (the
    /// stream holds the buffers and orders the work; validation checked every element is inside
    /// its buffer and that `c` overlaps neither input).
    pub(crate) unsafe fn run(&self, pool: Option<&ComputePool>) {
        let [sa, sb, sc] = self.strides;
        let (m, n, k) = (self.m, self.n, self.k);
        let esz = self.dtype.size() as isize;
        for_each_batch(&self.batch, &self.batch_strides, |o| {
            let at = |i: usize| (self.base[i] as isize + o[i] as isize * esz) as usize;
            let (pa, pb, pc) = (at(0), at(1), at(2));
            match self.dtype {
                // SAFETY: the caller's contract; sizes and strides are the validated views'.
                DType::F32 => unsafe {
                    panels::<f32>(
                        pool,
                        [pc, pa, pb],
                        [sc, sa, sb],
                        (m, n, k),
                        self.alpha,
                        self.beta,
                    )
                },
                // SAFETY: as for f32.
                DType::F64 => unsafe {
                    panels::<f64>(
                        pool,
                        [pc, pa, pb],
                        [sc, sa, sb],
                        (m, n, k),
                        self.alpha,
                        self.beta,
                    )
                },
                // SAFETY: as for f32; the widened panels are dense and owned here.
                DType::F16 | DType::Bf16 => unsafe {
                    let wa = widen(self.dtype, pa, m, k, sa);
                    let wb = widen(self.dtype, pb, k, n, sb);
                    let mut wc = if self.beta != 0.0 {
                        widen(self.dtype, pc, m, n, sc)
                    } else {
                        vec![0.0; m * n]
                    };
                    let dense = |c: usize| [c as isize, 1];
                    panels::<f32>(
                        pool,
                        [
                            wc.as_mut_ptr() as usize,
                            wa.as_ptr() as usize,
                            wb.as_ptr() as usize,
                        ],
                        [dense(n), dense(k), dense(n)],
                        (m, n, k),
                        self.alpha,
                        self.beta,
                    );
                    narrow(self.dtype, &wc, pc, m, n, sc);
                },
                _ => unreachable!("validated: float dtypes only"),
            }
        });
    }
}

/// A real type faer multiplies.
trait Real: faer::traits::ComplexField + Copy + std::ops::Mul<Output = Self> {
    fn of(v: f64) -> Self;
}
impl Real for f32 {
    fn of(v: f64) -> f32 {
        v as f32
    }
}
impl Real for f64 {
    fn of(v: f64) -> f64 {
        v
    }
}

/// Products smaller than this many multiply-adds run on the caller alone: cutting them costs
/// more than it saves.
const PANEL_MIN_MACS: usize = 64 * 64 * 64;
/// Panels are cut at multiples of this many rows or columns (a multiple of faer's register tiles).
const PANEL_ALIGN: usize = 16;

/// `c = alpha * a @ b + beta * c` for one (m, n, k) product at element addresses `[c, a, b]` with
/// (row, column) strides `[sc, sa, sb]`, cut into panels of `c` over `pool`: row panels (each
/// with its rows of `a`), or column panels (each with its columns of `b`) when `c` is wider than
/// tall. Panels write disjoint parts of `c`.
///
/// # Safety
/// As for [`product`].
unsafe fn panels<T: Real>(
    pool: Option<&ComputePool>,
    [c, a, b]: [usize; 3],
    [sc, sa, sb]: [[isize; 2]; 3],
    (m, n, k): (usize, usize, usize),
    alpha: f64,
    beta: f64,
) {
    let threads = pool.map_or(1, ComputePool::threads);
    let rows = m >= n;
    let long = if rows { m } else { n };
    let parts = if threads > 1 && m * n * k >= PANEL_MIN_MACS {
        let per = long.div_ceil(threads).next_multiple_of(PANEL_ALIGN);
        long.div_ceil(per)
    } else {
        1
    };
    if parts <= 1 {
        // SAFETY: the caller's contract.
        unsafe { product::<T>(c, sc, a, sa, b, sb, (m, n, k), alpha, beta) };
        return;
    }
    let per = long.div_ceil(parts);
    let esz = std::mem::size_of::<T>() as isize;
    let panel = |p: u64| {
        let start = p as usize * per;
        let len = per.min(long - start);
        let at =
            |base: usize, stride: isize| (base as isize + start as isize * stride * esz) as usize;
        // SAFETY: a panel is a sub-matrix of the caller's (its rows of c and a, or its columns
        // of c and b), so the caller's contract covers it; panels write disjoint parts of c.
        unsafe {
            if rows {
                product::<T>(
                    at(c, sc[0]),
                    sc,
                    at(a, sa[0]),
                    sa,
                    b,
                    sb,
                    (len, n, k),
                    alpha,
                    beta,
                )
            } else {
                product::<T>(
                    at(c, sc[1]),
                    sc,
                    a,
                    sa,
                    at(b, sb[1]),
                    sb,
                    (m, len, k),
                    alpha,
                    beta,
                )
            }
        }
    };
    pool.expect("parts > 1 needs a pool")
        .for_each(parts as u64, &panel);
}

/// `c = alpha * a @ b + beta * c` for one (m, n, k) product at element addresses with
/// (row, column) strides, on the calling thread.
///
/// # Safety
/// Every element of the three strided matrices must be valid for the access (c written, a and b
/// read), and c must not overlap a or b.
#[allow(clippy::too_many_arguments)]
unsafe fn product<T: Real>(
    c: usize,
    sc: [isize; 2],
    a: usize,
    sa: [isize; 2],
    b: usize,
    sb: [isize; 2],
    (m, n, k): (usize, usize, usize),
    alpha: f64,
    beta: f64,
) {
    let c = c as *mut T;
    if beta != 0.0 && beta != 1.0 {
        for i in 0..m as isize {
            for j in 0..n as isize {
                // SAFETY: inside c (the caller's contract).
                unsafe {
                    let p = c.offset(i * sc[0] + j * sc[1]);
                    *p = *p * T::of(beta);
                }
            }
        }
    }
    // SAFETY: the caller's contract.
    let (dst, lhs, rhs) = unsafe {
        (
            faer::MatMut::<T>::from_raw_parts_mut(c, m, n, sc[0], sc[1]),
            faer::MatRef::<T>::from_raw_parts(a as *const T, m, k, sa[0], sa[1]),
            faer::MatRef::<T>::from_raw_parts(b as *const T, k, n, sb[0], sb[1]),
        )
    };
    let accum = if beta == 0.0 {
        faer::Accum::Replace
    } else {
        faer::Accum::Add
    };
    faer::linalg::matmul::matmul(dst, accum, lhs, rhs, T::of(alpha), faer::Par::Seq);
}

/// A dense row-major f32 copy of an f16/bf16 matrix.
///
/// # Safety
/// Every element `p + (i * rs + j * cs) * 2` for i < rows, j < cols must be readable.
unsafe fn widen(d: DType, p: usize, rows: usize, cols: usize, [rs, cs]: [isize; 2]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            let at = (p as isize + (i as isize * rs + j as isize * cs) * 2) as *const u16;
            // SAFETY: the caller's contract.
            let bits = unsafe { at.read_unaligned() };
            out.push(match d {
                DType::F16 => half::f16::from_bits(bits).to_f32(),
                _ => half::bf16::from_bits(bits).to_f32(),
            });
        }
    }
    out
}

/// Rounds a dense f32 matrix into an f16/bf16 strided one (round to nearest even).
///
/// # Safety
/// Every element of the strided destination must be writable and not otherwise accessed.
unsafe fn narrow(d: DType, src: &[f32], p: usize, rows: usize, cols: usize, [rs, cs]: [isize; 2]) {
    for i in 0..rows {
        for j in 0..cols {
            let v = src[i * cols + j];
            let bits = match d {
                DType::F16 => half::f16::from_f32(v).to_bits(),
                _ => half::bf16::from_f32(v).to_bits(),
            };
            let at = (p as isize + (i as isize * rs + j as isize * cs) * 2) as *mut u16;
            // SAFETY: the caller's contract.
            unsafe { at.write_unaligned(bits) };
        }
    }
}
