//! Row-major matmul as one column-major strided-batched GEMM (cuBLAS's, hipBLAS's and rocBLAS's
//! `*GemmStridedBatchedEx`).
//!
//! Row-major `C = A·B` is column-major `Cᵀ = Bᵀ·Aᵀ`: a row-major matrix with unit column stride
//! is its transpose in column-major order, one with unit row stride is itself with `op = T`. So
//! the BLAS call's first operand comes from `b`, its second from `a`. Layouts the call cannot
//! express (non-unit inner strides, batches that do not collapse to one stride, a transposed
//! output, `k == 0`, sizes beyond `i32`) give `None`: the backend runs the portable GEMM.

use std::collections::BTreeMap;

use unihal_hal::{DType, OpId, TensorView};

/// The element types the vendor BLAS libraries' `*GemmStridedBatchedEx` take (f16 and bf16 with
/// f32 accumulation), for cuBLAS, hipBLAS and rocBLAS alike.
pub const BLAS_DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];

/// A device's library ops: the kernel library's `kernel_ops` (empty without a runtime compiler)
/// plus matmul in [`BLAS_DTYPES`] when a BLAS library is loaded, so that a machine with the BLAS
/// library but no runtime compiler keeps BLAS matmul. Layouts BLAS cannot express then fail with
/// `Unsupported` (see `GpuStream::run_op`).
pub fn ops_with_blas(
    mut kernel_ops: BTreeMap<OpId, Vec<DType>>,
    blas_loaded: bool,
) -> BTreeMap<OpId, Vec<DType>> {
    if blas_loaded {
        let dtypes = kernel_ops.entry(OpId::Matmul).or_default();
        for d in BLAS_DTYPES {
            if !dtypes.contains(&d) {
                dtypes.push(d);
            }
        }
    }
    kernel_ops
}

/// A BLAS operand operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// As stored (`*_OP_N`).
    N,
    /// Transposed (`*_OP_T`).
    T,
}

/// One operand in column-major terms: its operation and leading dimension.
struct ColMajor {
    op: Op,
    ld: i64,
}

/// The column-major form of the transpose of a row-major `rows x cols` matrix with element
/// strides `(rs, cs)`: `N` when the columns are unit-stride (the memory is that transpose),
/// `T` when the rows are (the memory is the matrix itself). None otherwise.
fn transposed(rows: u64, cols: u64, rs: i64, cs: i64) -> Option<ColMajor> {
    let (rows, cols) = (rows as i64, cols as i64);
    if cs == 1 || cols == 1 {
        // Memory: cols x rows column-major, leading dimension rs (>= cols).
        let ld = if rows == 1 { cols.max(1) } else { rs };
        (ld >= cols.max(1)).then_some(ColMajor { op: Op::N, ld })
    } else if rs == 1 || rows == 1 {
        // Memory: rows x cols column-major, leading dimension cs (>= rows).
        let ld = if cols == 1 { rows.max(1) } else { cs };
        (ld >= rows.max(1)).then_some(ColMajor { op: Op::T, ld })
    } else {
        None
    }
}

/// The single batch stride of `lead` strides over `batch` (None when the batch dims do not
/// collapse to one stride).
fn batch_stride(batch: &[u64], lead: &[i64]) -> Option<i64> {
    let dims: Vec<(u64, i64)> = batch
        .iter()
        .zip(lead)
        .filter(|(&n, _)| n > 1)
        .map(|(&n, &s)| (n, s))
        .collect();
    match dims.as_slice() {
        [] => Some(0),
        [(_, s)] => Some(*s),
        _ => {
            // Row-major collapse: each stride equals the next one times the next size.
            let ok = dims.windows(2).all(|w| w[0].1 == w[1].1 * w[1].0 as i64);
            ok.then(|| dims.last().map_or(0, |d| d.1))
        }
    }
}

/// The arguments of one strided-batched GEMM call (before addresses and scalars): the
/// column-major problem `C' (m x n) = op_a(A') · op_b(B')` with `A'` from `b` and `B'` from `a`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub op_a: Op,
    pub op_b: Op,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub lda: i32,
    pub ldb: i32,
    pub ldc: i32,
    /// Batch strides in elements of the first operand (from `b`), the second (from `a`), `c`.
    pub stride_a: i64,
    pub stride_b: i64,
    pub stride_c: i64,
    /// Batch count; 0 for an empty problem (nothing to call).
    pub count: i32,
}

/// The BLAS form of row-major `c = a · b` over views (validated by the caller), or None when the
/// call cannot express the layout (or `k == 0`). An empty problem gives `count == 0`.
pub fn gemm_of(a: &TensorView, b: &TensorView, c: &TensorView) -> Option<Gemm> {
    let nd = c.shape.len();
    if a.shape.len() < 2 || b.shape.len() < 2 || nd < 2 {
        return None;
    }
    let dims = |t: &TensorView| {
        let n = t.shape.len();
        (
            t.shape[n - 2],
            t.shape[n - 1],
            t.strides[n - 2],
            t.strides[n - 1],
        )
    };
    let ((m, k, ars, acs), (_, n, brs, bcs), (_, _, crs, ccs)) = (dims(a), dims(b), dims(c));
    let batch = &c.shape[..nd - 2];
    let count: u64 = batch.iter().product();
    let fits = |v: i64| i32::try_from(v).is_ok();
    if m == 0 || n == 0 || count == 0 {
        return Some(Gemm {
            op_a: Op::N,
            op_b: Op::N,
            m: 0,
            n: 0,
            k: 0,
            lda: 1,
            ldb: 1,
            ldc: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            count: 0,
        });
    }
    if k == 0 {
        return None;
    }
    // Cᵀ (n x m) = op(Bᵀ) (n x k) · op(Aᵀ) (k x m); C itself must be the N form.
    let (bt, at, ct) = (
        transposed(k, n, brs, bcs)?,
        transposed(m, k, ars, acs)?,
        transposed(m, n, crs, ccs)?,
    );
    if ct.op != Op::N {
        return None;
    }
    let lead = |t: &TensorView| unihal_kernels::plan_nn::lead_strides(t, 2, batch);
    let (sa, sb, sc) = (
        batch_stride(batch, &lead(a))?,
        batch_stride(batch, &lead(b))?,
        batch_stride(batch, &lead(c))?,
    );
    if [sa, sb, sc].iter().any(|&s| s < 0) || (count > 1 && sc == 0) {
        return None;
    }
    if ![
        m as i64,
        n as i64,
        k as i64,
        at.ld,
        bt.ld,
        ct.ld,
        count as i64,
    ]
    .into_iter()
    .all(fits)
    {
        return None;
    }
    Some(Gemm {
        op_a: bt.op,
        op_b: at.op,
        m: n as i32,
        n: m as i32,
        k: k as i32,
        lda: bt.ld as i32,
        ldb: at.ld as i32,
        ldc: ct.ld as i32,
        stride_a: sb,
        stride_b: sa,
        stride_c: sc,
        count: count as i32,
    })
}

/// A matmul call ready for a BLAS library: the mapping, the device addresses of the first
/// elements (`pa` of `a`, `pb` of `b`, `pc` of `c`, in the HAL's operand names) and the scalars
/// in the compute precision (f64 for f64 data, f32 otherwise, as the BLAS libraries take them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlasCall {
    pub gemm: Gemm,
    pub dtype: unihal_hal::DType,
    pub pa: u64,
    pub pb: u64,
    pub pc: u64,
    alpha: f64,
    beta: f64,
    alpha32: f32,
    beta32: f32,
}

impl BlasCall {
    /// Validates a matmul call and maps it for a BLAS library whose element types are `dtypes`;
    /// `None` when the library does not take it (another dtype, a layout it cannot express: the
    /// caller runs the portable GEMM), `Some(Err)` for an invalid call. `addr(view, arg, len)` is
    /// the backend's checked device address of a view's first element.
    pub fn of(
        call: &unihal_hal::OpCall,
        dtypes: &[unihal_hal::DType],
        addr: impl Fn(&TensorView, &'static str, u64) -> unihal_hal::Result<u64>,
    ) -> Option<unihal_hal::Result<BlasCall>> {
        if let Err(e) = call.validate() {
            return Some(Err(e));
        }
        let [a, b, c] = [&call.tensors[0], &call.tensors[1], &call.tensors[2]];
        let dtype = c.dtype;
        if !dtypes.contains(&dtype) {
            return None;
        }
        let gemm = gemm_of(a, b, c)?;
        let esz = dtype.size() as u64;
        let addrs = (addr(a, "a", esz), addr(b, "b", esz), addr(c, "c", esz));
        let (pa, pb, pc) = match addrs {
            (Ok(x), Ok(y), Ok(z)) => (x, y, z),
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return Some(Err(e)),
        };
        let (alpha, beta) = (call.scalars[0].as_f64(), call.scalars[1].as_f64());
        Some(Ok(BlasCall {
            gemm,
            dtype,
            pa,
            pb,
            pc,
            alpha,
            beta,
            alpha32: alpha as f32,
            beta32: beta as f32,
        }))
    }

    /// Host pointers to alpha and beta in the compute precision, valid while `self` lives.
    pub fn scalars(&self) -> (*const std::ffi::c_void, *const std::ffi::c_void) {
        if self.dtype == unihal_hal::DType::F64 {
            (
                &self.alpha as *const f64 as *const _,
                &self.beta as *const f64 as *const _,
            )
        } else {
            (
                &self.alpha32 as *const f32 as *const _,
                &self.beta32 as *const f32 as *const _,
            )
        }
    }
}

/// Runs a matmul call through a BLAS library on `stream`: validated and mapped ([`BlasCall::of`],
/// with the library's element types `dtypes`), nothing enqueued for an empty problem, else
/// `gemm(handle, call)` under the stream's BLAS handle with the operands kept until the work
/// ran. `None` when the library does not take the call (the portable GEMM runs it then).
pub fn run_blas<R: crate::runtime::Runtime>(
    stream: &crate::stream::GpuStream<R>,
    call: &unihal_hal::OpCall,
    dtypes: &[DType],
    gemm: impl FnOnce(&R::Blas, &BlasCall) -> unihal_hal::Result<()>,
) -> Option<unihal_hal::Result<()>> {
    let device = stream.gpu_device().core().id;
    let addr = |t: &TensorView, arg, len| {
        crate::stream::device_addr::<R>(&t.buffer, arg, device, t.offset, len)
    };
    let bc = match BlasCall::of(call, dtypes, addr)? {
        Ok(bc) => bc,
        Err(e) => return Some(Err(e)),
    };
    if bc.gemm.count == 0 {
        return Some(Ok(()));
    }
    Some(stream.blas(|h, keep| {
        keep.extend(
            call.tensors
                .iter()
                .map(|t| t.buffer.use_on(unihal_hal::Stream::stream_id(stream))),
        );
        gemm(h, &bc)
    }))
}

#[cfg(test)]
mod tests {
    //! The layout mapping, checked on the host: a column-major GEMM that reads its operands the
    //! way the BLAS libraries document must reproduce the row-major product for every layout
    //! `gemm_of` accepts.
    use super::*;
    use unihal_hal::{Buffer, DType};

    /// What `*GemmStridedBatchedEx` computes (alpha = 1, beta = 0), on host arrays.
    fn emulate(g: &Gemm, a: &[f64], b: &[f64], c: &mut [f64], offs: (usize, usize, usize)) {
        let n_op = Op::N;
        for p in 0..g.count as i64 {
            for i in 0..g.m as i64 {
                for j in 0..g.n as i64 {
                    let mut acc = 0.0;
                    for l in 0..g.k as i64 {
                        let ai = if g.op_a == n_op {
                            i + l * g.lda as i64
                        } else {
                            l + i * g.lda as i64
                        };
                        let bi = if g.op_b == n_op {
                            l + j * g.ldb as i64
                        } else {
                            j + l * g.ldb as i64
                        };
                        acc += a[offs.0 + (p * g.stride_a + ai) as usize]
                            * b[offs.1 + (p * g.stride_b + bi) as usize];
                    }
                    c[offs.2 + (p * g.stride_c + i + j * g.ldc as i64) as usize] = acc;
                }
            }
        }
    }

    fn view(buf: &Buffer, shape: &[u64], strides: &[i64]) -> TensorView {
        TensorView {
            buffer: buf.clone(),
            offset: 0,
            dtype: DType::F64,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        }
    }

    #[test]
    fn the_column_major_form_reproduces_the_row_major_product() {
        let dev = unihal_cpu::CpuBackend::with_config(
            unihal_cpu::CpuConfig::from_values(Some("1"), Some("64M"), Some("1")).unwrap(),
        );
        let buf = unihal_hal::Backend::open(&dev, 0)
            .unwrap()
            .alloc(8)
            .unwrap();
        let (bat, m, k, n) = (2u64, 3u64, 4u64, 5u64);
        // a: [2, 3, 4] row-major or with its last two dims transposed in memory; b likewise.
        let layouts_a: [(Vec<i64>, usize); 2] = [(vec![12, 4, 1], 24), (vec![12, 1, 3], 24)];
        let layouts_b: [(Vec<i64>, usize); 3] = [
            (vec![20, 5, 1], 40),
            (vec![20, 1, 4], 40),
            (vec![0, 5, 1], 20),
        ];
        for (sa, la) in &layouts_a {
            for (sb, lb) in &layouts_b {
                let av: Vec<f64> = (0..*la).map(|i| (i as f64 * 0.37).sin()).collect();
                let bv: Vec<f64> = (0..*lb).map(|i| (i as f64 * 0.91).cos()).collect();
                let a = view(&buf, &[bat, m, k], sa);
                let b = view(&buf, &[bat, k, n], sb);
                let c = view(&buf, &[bat, m, n], &[15, 5, 1]);
                let g = gemm_of(&a, &b, &c).unwrap_or_else(|| panic!("{sa:?} x {sb:?}"));
                let mut got = vec![0.0; 30];
                // The BLAS call's first operand comes from b, its second from a.
                emulate(&g, &bv, &av, &mut got, (0, 0, 0));
                for p in 0..bat as i64 {
                    for i in 0..m as i64 {
                        for j in 0..n as i64 {
                            let want: f64 = (0..k as i64)
                                .map(|l| {
                                    av[(p * sa[0] + i * sa[1] + l * sa[2]) as usize]
                                        * bv[(p * sb[0] + l * sb[1] + j * sb[2]) as usize]
                                })
                                .sum();
                            let at = (p * 15 + i * 5 + j) as usize;
                            assert!((got[at] - want).abs() < 1e-12, "{sa:?} x {sb:?} at {at}");
                        }
                    }
                }
            }
        }
        // Inexpressible layouts fall back: non-unit inner strides, a transposed output.
        let a = view(&buf, &[m, k], &[8, 2]);
        let b = view(&buf, &[k, n], &[5, 1]);
        assert!(gemm_of(&a, &b, &view(&buf, &[m, n], &[5, 1])).is_none());
        let a = view(&buf, &[m, k], &[4, 1]);
        assert!(gemm_of(&a, &b, &view(&buf, &[m, n], &[1, 3])).is_none());
    }
}
