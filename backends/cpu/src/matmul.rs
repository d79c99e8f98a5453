//! `matmul` on the CPU backend through the `gemm` crate, which picks its micro-kernels at run time
//! up to AVX-512 and parallelises over the device's compute pool. f32 and f64 run in place on the
//! operands' strides; f16 and bf16 are widened to dense f32 panels, multiplied with f32
//! accumulation and rounded once into `c`. (`UNIHAL_CPU_MATMUL=dialect` runs the portable tiled
//! GEMM kernel instead, through the ordinary op path.)

use unihal_hal::{DType, OpCall, Result, TensorView};

/// A validated matmul, reduced to addresses and element strides.
pub(crate) struct MatmulJob {
    dtype: DType,
    m: usize,
    n: usize,
    k: usize,
    /// Element offsets of each batch's a, b, c from the views' first elements.
    batches: Vec<[i64; 3]>,
    base: [usize; 3],
    /// (row, column) strides of a, b, c in elements.
    strides: [[isize; 2]; 3],
    alpha: f64,
    beta: f64,
}

/// Element offsets of every index of `shape` under each operand's strides (row-major order).
fn offsets(shape: &[u64], strides: &[Vec<i64>; 3]) -> Vec<[i64; 3]> {
    let total: u64 = shape.iter().product();
    let mut out = Vec::with_capacity(total as usize);
    let mut idx = vec![0u64; shape.len()];
    for _ in 0..total {
        let mut o = [0i64; 3];
        for (d, &i) in idx.iter().enumerate() {
            for (k, s) in strides.iter().enumerate() {
                o[k] += i as i64 * s[d];
            }
        }
        out.push(o);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn lead(t: &TensorView, batch: &[u64]) -> Vec<i64> {
    let nd = t.shape.len() - 2;
    TensorView {
        shape: t.shape[..nd].to_vec(),
        strides: t.strides[..nd].to_vec(),
        ..t.clone()
    }
    .broadcast_strides(batch)
    .expect("validated")
}

impl MatmulJob {
    /// Prepares `call` (already validated by `OpCall::validate`).
    pub(crate) fn new(call: &OpCall) -> Result<MatmulJob> {
        call.validate()?;
        let (a, b, c) = (&call.tensors[0], &call.tensors[1], &call.tensors[2]);
        let (na, nb, nc) = (a.shape.len(), b.shape.len(), c.shape.len());
        let batch = &c.shape[..nc - 2];
        let strides = [lead(a, batch), lead(b, batch), c.strides[..nc - 2].to_vec()];
        let pair =
            |t: &TensorView, n: usize| [t.strides[n - 2] as isize, t.strides[n - 1] as isize];
        let addr = |t: &TensorView| (t.buffer.device_addr() + t.offset) as usize;
        Ok(MatmulJob {
            dtype: a.dtype,
            m: c.shape[nc - 2] as usize,
            n: c.shape[nc - 1] as usize,
            k: a.shape[na - 1] as usize,
            batches: offsets(batch, &strides),
            base: [addr(a), addr(b), addr(c)],
            strides: [pair(a, na), pair(b, nb), pair(c, nc)],
            alpha: call.scalars[0].as_f64(),
            beta: call.scalars[1].as_f64(),
        })
    }

    /// Runs every batch. `threads` > 1 parallelises inside the calling rayon pool.
    ///
    /// # Safety
    /// The views' memory must be live and not accessed by anyone else for the duration (the
    /// stream holds the buffers and orders the work; validation checked every element is inside
    /// its buffer and that `c` overlaps neither input).
    pub(crate) unsafe fn run(&self, threads: usize) {
        let par = if threads > 1 {
            gemm::Parallelism::Rayon(threads)
        } else {
            gemm::Parallelism::None
        };
        let [[ars, acs], [brs, bcs], [crs, ccs]] = self.strides;
        let (m, n, k) = (self.m, self.n, self.k);
        for o in &self.batches {
            let esz = self.dtype.size() as isize;
            let at = |i: usize| (self.base[i] as isize + o[i] as isize * esz) as usize;
            let (pa, pb, pc) = (at(0), at(1), at(2));
            match self.dtype {
                // SAFETY (both arms): the caller's contract; the strides and sizes are the
                // validated views'. gemm computes dst = beta_g * a @ b + alpha_g * dst.
                DType::F32 => unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        pc as *mut f32,
                        ccs,
                        crs,
                        self.beta != 0.0,
                        pa as *const f32,
                        acs,
                        ars,
                        pb as *const f32,
                        bcs,
                        brs,
                        self.beta as f32,
                        self.alpha as f32,
                        false,
                        false,
                        false,
                        par,
                    )
                },
                DType::F64 => unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        pc as *mut f64,
                        ccs,
                        crs,
                        self.beta != 0.0,
                        pa as *const f64,
                        acs,
                        ars,
                        pb as *const f64,
                        bcs,
                        brs,
                        self.beta,
                        self.alpha,
                        false,
                        false,
                        false,
                        par,
                    )
                },
                DType::F16 | DType::Bf16 => {
                    // SAFETY: as above; the panels are dense copies.
                    let wa = unsafe { widen(self.dtype, pa, m, k, ars, acs) };
                    let wb = unsafe { widen(self.dtype, pb, k, n, brs, bcs) };
                    let mut wc = if self.beta != 0.0 {
                        unsafe { widen(self.dtype, pc, m, n, crs, ccs) }
                    } else {
                        vec![0.0; m * n]
                    };
                    unsafe {
                        gemm::gemm(
                            m,
                            n,
                            k,
                            wc.as_mut_ptr(),
                            1,
                            n as isize,
                            self.beta != 0.0,
                            wa.as_ptr(),
                            1,
                            k as isize,
                            wb.as_ptr(),
                            1,
                            n as isize,
                            self.beta as f32,
                            self.alpha as f32,
                            false,
                            false,
                            false,
                            par,
                        );
                        narrow(self.dtype, &wc, pc, m, n, crs, ccs);
                    }
                }
                _ => unreachable!("validated: float dtypes only"),
            }
        }
    }
}

/// A dense row-major f32 copy of an f16/bf16 matrix.
///
/// # Safety
/// Every element `p + (i * rs + j * cs) * 2` for i < rows, j < cols must be readable.
unsafe fn widen(d: DType, p: usize, rows: usize, cols: usize, rs: isize, cs: isize) -> Vec<f32> {
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
unsafe fn narrow(d: DType, src: &[f32], p: usize, rows: usize, cols: usize, rs: isize, cs: isize) {
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
