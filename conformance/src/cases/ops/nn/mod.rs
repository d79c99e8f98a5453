//! `ops.<training op>.*`: reductions, softmax, cross-entropy, norms, matmul, gather/scatter,
//! optimizers and AMP, against independent f64 references ([`reference`]).
//!
//! Tolerances follow the error analysis of each op rather than a fixed number of ulps: a sum of
//! `n` terms may be off by about `n * eps(acc) * sum|terms|` (so cancellation near zero never fails
//! a correct kernel), plus one rounding of the result into the output dtype. `acc` is the
//! accumulation dtype (f32 for f16/bf16).

mod attention;
mod index;
mod losses;
mod matmul;
mod misuse;
mod norms;
mod optim;
mod reductions;
pub mod reference;
mod softmax;

use super::elementwise::{place, Layout, Placed};
use super::values::{decode, encode, eps};
use crate::case::{Case, CaseResult, Ctx, Failure, Need};
use crate::ensure;
use std::sync::Arc;
use unihal_hal::{DType, OpId, Result as HalResult, Stream, TensorView};

/// The float dtypes of reductions, softmax, norms and matmul.
pub(super) const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::Bf16];
/// The dtypes of cross-entropy, gather/scatter gradients, optimizers and AMP.
pub(super) const HALVES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

/// Every training-op case.
pub fn cases() -> Vec<Case> {
    let mut v = reductions::cases();
    v.extend(softmax::cases());
    v.extend(losses::cases());
    v.extend(norms::cases());
    v.extend(matmul::cases());
    v.extend(index::cases());
    v.extend(optim::cases());
    v.extend(attention::cases());
    v.extend(misuse::cases());
    v
}

/// A tensor placed in device memory, with the values it holds (after rounding into its dtype).
pub(super) struct Tensor {
    placed: Placed,
    pub dtype: DType,
    pub vals: Vec<f64>,
}

impl Tensor {
    /// The view to pass to an op.
    pub fn view(&self) -> TensorView {
        self.placed.view.clone()
    }

    /// Reads the tensor back, failing if any byte outside its elements changed.
    pub fn read(&self, ctx: &Ctx, what: &str) -> Result<Vec<f64>, Failure> {
        let bytes = ctx.download(&self.placed.view.buffer)?;
        let esz = self.dtype.size();
        let mut expect = self.placed.image.clone();
        let mut out = Vec::with_capacity(self.placed.pos.len());
        for &p in &self.placed.pos {
            expect[p..p + esz].copy_from_slice(&bytes[p..p + esz]);
            out.push(decode(self.dtype, &bytes[p..p + esz]));
        }
        if let Some(b) = expect.iter().zip(&bytes).position(|(a, b)| a != b) {
            return Err(Failure::new(format!(
                "{what}: byte {b} outside the tensor's elements was written"
            )));
        }
        Ok(out)
    }
}

/// Places `values` (rounded into `d`) as a tensor of `shape` with `layout`.
pub(super) fn put(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    d: DType,
    shape: &[u64],
    layout: Layout,
    values: &[f64],
) -> HalResult<Tensor> {
    let placed = place(ctx, s, d, shape, layout, values)?;
    let vals = values.iter().map(|&v| decode(d, &encode(d, v))).collect();
    Ok(Tensor {
        placed,
        dtype: d,
        vals,
    })
}

/// A dense tensor.
pub(super) fn dense(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    d: DType,
    shape: &[u64],
    values: &[f64],
) -> HalResult<Tensor> {
    put(ctx, s, d, shape, Layout::Dense, values)
}

/// `n` deterministic values uniform in `[lo, hi)`.
pub(super) fn gen(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            lo + (hi - lo) * ((x >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// Unit roundoff of the accumulation dtype of `d`.
pub(super) fn acc_eps(d: DType) -> f64 {
    eps(unihal_hal::op::nn::acc_dtype(d))
}

/// The smallest positive subnormal of `d` (an absolute floor for results that underflow).
pub(super) fn tiny(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-24),
        DType::Bf16 => 2f64.powi(-133),
        DType::F32 => 2f64.powi(-149),
        _ => f64::from_bits(1),
    }
}

/// `got[i]` within `tol[i]` of `want[i]` for every i; NaN matches only NaN, infinities only
/// themselves.
pub(super) fn check(what: &str, got: &[f64], want: &[f64], tol: &[f64]) -> CaseResult {
    if got.len() != want.len() {
        return Err(Failure::new(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        )));
    }
    for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= t
        };
        if !ok {
            return Err(Failure::new(format!(
                "{what}: element {i}: got {g:e}, expected {w:e} within {t:e}"
            )));
        }
    }
    Ok(())
}

/// `got` equals `want` bit for bit in `d` (NaN matches any NaN).
pub(super) fn same_bits(what: &str, d: DType, got: &[f64], want: &[f64]) -> CaseResult {
    ensure!(
        got.len() == want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else {
            encode(d, g) == encode(d, w)
        };
        ensure!(
            ok,
            "{what}: element {i}: got {g:e}, expected {w:e} (bit for bit)"
        );
    }
    Ok(())
}

/// One case `ops.<op>.<dtype>` per op and dtype, needing the op in that dtype.
pub(super) fn per_dtype(
    ops: &[OpId],
    dtypes: &[DType],
    body: fn(&Ctx, OpId, DType) -> CaseResult,
) -> Vec<Case> {
    let mut v = Vec::new();
    for &op in ops {
        for &d in dtypes {
            v.push(
                Case::new(format!("ops.{}.{}", op.name(), d.name()), move |ctx| {
                    body(ctx, op, d)
                })
                .needs(&[Need::Op(op, d)]),
            );
        }
    }
    v
}

/// Row-major element count of a shape.
pub(super) fn numel(shape: &[u64]) -> usize {
    shape.iter().product::<u64>() as usize
}
