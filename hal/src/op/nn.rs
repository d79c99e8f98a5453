//! The training ops beyond elementwise: reductions, softmax, cross-entropy, norms, matmul, row
//! gather/scatter, multi-tensor optimizers and mixed-precision helpers. Their calls are plain data
//! like every op ([`OpCall`]); this file gives their constructors and their validation.
//!
//! ## Semantics (PyTorch's unless stated)
//!
//! * **Accumulation.** f16 and bf16 compute and accumulate in f32; f64 in f64; f32 in f32.
//! * **Reductions** keep the reduced axis with size 1. `max`/`min` propagate NaN; `argmax`/`argmin`
//!   return the first index of the extreme value, NaN counting as the extreme. A reduction over an
//!   empty axis: sum 0, mean NaN; max, min, argmax and argmin are [`Invalid::Value`].
//! * **Softmax** runs along the last axis. The masked forms add `mask` (same dtype as `x`,
//!   broadcast to `x`'s shape, typically 0 or -inf) before the softmax. A row that is all `-inf`
//!   gives NaN, as in PyTorch.
//! * **Cross-entropy** over logits `(N, C)` and class indices `(N)`: `reduction` is [`CeReduction`];
//!   targets equal to `ignore_index` contribute 0 and are not counted by `mean`; label smoothing
//!   `s` mixes the one-hot target with the uniform distribution (`(1-s) * onehot + s / C`). A target
//!   outside `[0, C)` that is not `ignore_index` is a kernel fault on the stream (an error, never a
//!   wild read). The loss is f32 (the accumulation type) whatever the logits' dtype.
//! * **Layer norm / RMS norm** normalise over the last axis with a `weight` (and for layer norm a
//!   `bias`) of that length; `mean` and `rstd` (saved for the backward) have the leading dims'
//!   shape and the accumulation dtype (f64 for f64 input, else f32). Variance is biased (divides
//!   by D), as in PyTorch.
//! * **Matmul**: `c = alpha * a @ b + beta * c` over the last two dims; leading (batch) dims of `a`
//!   and `b` broadcast to `c`'s. A transposed operand is a view with swapped strides. With
//!   `beta == 0`, `c` is not read (NaN in `c` does not propagate), as in BLAS.
//! * **Index select / index add** move rows along axis 0. `index_add` adds rows in index order, one
//!   output column per thread, so results are deterministic and do not depend on the backend's
//!   thread count; for f16/bf16 outputs each addition rounds to the output type. An index outside
//!   the table is a kernel fault on the stream, and no write happens through it.
//! * **Optimizers** update lists of tensors in one launch per up to [`MT_MAX_GROUPS`] groups. Every
//!   tensor is dense. Parameters and optimizer state are f32 ("master weights"); gradients are f32,
//!   f16 or bf16; with `copy`, the updated parameter is also written rounded to f16/bf16 for the
//!   next forward pass. See [`SgdOptions`] and [`AdamWOptions`] for the update rules.
//! * **AMP**: `amp_unscale` is `_amp_foreach_non_finite_check_and_unscale_` (found_inf is set, never
//!   cleared); `amp_update_scale` is `_amp_update_scale_`; `clip_grad_norm` computes the global L2
//!   norm of all gradients (written to `total_norm`) and multiplies them by
//!   `min(1, max_norm / (total_norm + 1e-6))`, as `torch.nn.utils.clip_grad_norm_`.
//!
//! ## Layout
//!
//! Leading dims take any strides. The normalised axis of softmax, cross-entropy and the norms must
//! be dense (stride 1; a softmax mask may also broadcast along it), as must the `[D]` weight and
//! bias vectors; `index_select`/`index_add` tables and rows and every optimizer/AMP tensor are dense
//! row-major. Reductions and matmul take any strides (a transposed matmul operand is a view with
//! swapped strides). Anything else is [`Invalid::Value`] naming the operand.
//!
//! ## Aliasing
//!
//! Outputs of these ops never alias inputs (any overlap is [`Invalid::Overlap`]). The optimizer and
//! AMP ops update their tensors in place; all their tensors must be pairwise disjoint.

use super::{OpCall, OpClass, OpId, Scalar, TensorView};
use crate::dtype::DType;
use crate::error::{HalError, Invalid, Result};

/// Most tensor groups of a multi-tensor op handled by one kernel launch (longer lists take several).
pub const MT_MAX_GROUPS: usize = 24;

/// How cross-entropy reduces the per-row losses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeReduction {
    /// Sum over counted rows divided by their number (rows whose target is `ignore_index` are not
    /// counted). The loss has shape `[]`.
    Mean = 0,
    /// Sum over rows; shape `[]`.
    Sum = 1,
    /// One loss per row; shape `[N]`.
    None = 2,
}

/// Options of [`OpCall::cross_entropy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CeOptions {
    pub reduction: CeReduction,
    /// Target value whose rows contribute nothing (PyTorch's default is -100).
    pub ignore_index: i64,
    /// In `[0, 1]`.
    pub label_smoothing: f64,
}

impl Default for CeOptions {
    fn default() -> Self {
        CeOptions {
            reduction: CeReduction::Mean,
            ignore_index: -100,
            label_smoothing: 0.0,
        }
    }
}

/// SGD with momentum, as `torch.optim.SGD`: `g = grad + weight_decay * p`; on the first step
/// `buf = g`, later `buf = momentum * buf + (1 - dampening) * g`; `d = nesterov ? g + momentum * buf
/// : buf`; `p -= lr * d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdOptions {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
    /// True on the first step (the momentum buffer is initialised from the gradient).
    pub first_step: bool,
}

/// AdamW, as `torch.optim.AdamW`: `p *= 1 - lr * weight_decay`; `m = beta1 * m + (1 - beta1) * g`;
/// `v = beta2 * v + (1 - beta2) * g^2`; `p -= lr / (1 - beta1^step) * m / (sqrt(v / (1 -
/// beta2^step)) + eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWOptions {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Step number, from 1 (bias correction).
    pub step: u64,
}

/// One parameter's tensors for a multi-tensor optimizer step.
#[derive(Debug, Clone)]
pub struct ParamGroup {
    /// f32 master weights, updated in place.
    pub param: TensorView,
    /// f32, f16 or bf16 gradient (read only).
    pub grad: TensorView,
    /// f32 optimizer state: `[momentum_buffer]` for SGD, `[exp_avg, exp_avg_sq]` for AdamW.
    pub state: Vec<TensorView>,
    /// Optional f16/bf16 copy of the updated parameter.
    pub copy: Option<TensorView>,
}

fn f(v: f64) -> Scalar {
    Scalar::F64(v)
}
fn i(v: i64) -> Scalar {
    Scalar::I64(v)
}

impl OpCall {
    /// A reduction (`ReduceSum`, `ReduceMean`, `ReduceMax`, `ReduceMin`, `Argmax`, `Argmin`) of `x`
    /// along `axis` into `out` (x's shape with that axis of size 1).
    pub fn reduce(op: OpId, x: TensorView, out: TensorView, axis: i64) -> OpCall {
        Self::new(op, vec![x, out], vec![i(axis)], None)
    }
    /// `Softmax` or `LogSoftmax` of `x` along the last axis into `y`.
    pub fn softmax(op: OpId, x: TensorView, y: TensorView) -> OpCall {
        Self::new(op, vec![x, y], vec![], None)
    }
    /// `SoftmaxMasked` or `LogSoftmaxMasked`: softmax of `x + mask`.
    pub fn softmax_masked(op: OpId, x: TensorView, mask: TensorView, y: TensorView) -> OpCall {
        Self::new(op, vec![x, mask, y], vec![], None)
    }
    /// `SoftmaxBackward` or `LogSoftmaxBackward` from the forward output `y` and its gradient.
    pub fn softmax_backward(op: OpId, y: TensorView, dy: TensorView, dx: TensorView) -> OpCall {
        Self::new(op, vec![y, dy, dx], vec![], None)
    }
    fn ce_scalars(o: CeOptions) -> Vec<Scalar> {
        vec![
            i(o.reduction as i64),
            i(o.ignore_index),
            f(o.label_smoothing),
        ]
    }
    /// Cross-entropy loss of `logits (N, C)` against `target (N)`.
    pub fn cross_entropy(
        logits: TensorView,
        target: TensorView,
        loss: TensorView,
        o: CeOptions,
    ) -> OpCall {
        Self::new(
            OpId::CrossEntropy,
            vec![logits, target, loss],
            Self::ce_scalars(o),
            None,
        )
    }
    /// Gradient of cross-entropy with respect to the logits.
    pub fn cross_entropy_backward(
        logits: TensorView,
        target: TensorView,
        dloss: TensorView,
        dlogits: TensorView,
        o: CeOptions,
    ) -> OpCall {
        Self::new(
            OpId::CrossEntropyBackward,
            vec![logits, target, dloss, dlogits],
            Self::ce_scalars(o),
            None,
        )
    }
    /// Layer norm over the last axis.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        x: TensorView,
        weight: TensorView,
        bias: TensorView,
        y: TensorView,
        mean: TensorView,
        rstd: TensorView,
        eps: f64,
    ) -> OpCall {
        Self::new(
            OpId::LayerNorm,
            vec![x, weight, bias, y, mean, rstd],
            vec![f(eps)],
            None,
        )
    }
    /// Layer norm backward: `dx`, `dweight`, `dbias`.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_backward(
        x: TensorView,
        dy: TensorView,
        weight: TensorView,
        mean: TensorView,
        rstd: TensorView,
        dx: TensorView,
        dweight: TensorView,
        dbias: TensorView,
    ) -> OpCall {
        Self::new(
            OpId::LayerNormBackward,
            vec![x, dy, weight, mean, rstd, dx, dweight, dbias],
            vec![],
            None,
        )
    }
    /// RMS norm over the last axis: `y = x * rstd * weight`, `rstd = 1 / sqrt(mean(x^2) + eps)`.
    pub fn rms_norm(
        x: TensorView,
        weight: TensorView,
        y: TensorView,
        rstd: TensorView,
        eps: f64,
    ) -> OpCall {
        Self::new(OpId::RmsNorm, vec![x, weight, y, rstd], vec![f(eps)], None)
    }
    /// RMS norm backward: `dx`, `dweight`.
    pub fn rms_norm_backward(
        x: TensorView,
        dy: TensorView,
        weight: TensorView,
        rstd: TensorView,
        dx: TensorView,
        dweight: TensorView,
    ) -> OpCall {
        Self::new(
            OpId::RmsNormBackward,
            vec![x, dy, weight, rstd, dx, dweight],
            vec![],
            None,
        )
    }
    /// Residual add + layer norm: `h = x + residual` (rounded to the dtype, as the unfused add
    /// stores it), then `y = layer_norm(h)` with its `mean` and `rstd`. The backward pass is
    /// [`OpCall::layer_norm_backward`] of `h`, plus the residual stream's own gradient.
    #[allow(clippy::too_many_arguments)]
    pub fn add_layer_norm(
        x: TensorView,
        residual: TensorView,
        weight: TensorView,
        bias: TensorView,
        h: TensorView,
        y: TensorView,
        mean: TensorView,
        rstd: TensorView,
        eps: f64,
    ) -> OpCall {
        Self::new(
            OpId::AddLayerNorm,
            vec![x, residual, weight, bias, h, y, mean, rstd],
            vec![f(eps)],
            None,
        )
    }
    /// Residual add + RMS norm: `h = x + residual`, `y = rms_norm(h)` with its `rstd`.
    pub fn add_rms_norm(
        x: TensorView,
        residual: TensorView,
        weight: TensorView,
        h: TensorView,
        y: TensorView,
        rstd: TensorView,
        eps: f64,
    ) -> OpCall {
        Self::new(
            OpId::AddRmsNorm,
            vec![x, residual, weight, h, y, rstd],
            vec![f(eps)],
            None,
        )
    }
    /// `c = alpha * a @ b + beta * c`.
    pub fn matmul(a: TensorView, b: TensorView, c: TensorView, alpha: f64, beta: f64) -> OpCall {
        Self::new(OpId::Matmul, vec![a, b, c], vec![f(alpha), f(beta)], None)
    }
    /// `out[i] = table[index[i]]` (rows along axis 0).
    pub fn index_select(table: TensorView, index: TensorView, out: TensorView) -> OpCall {
        Self::new(OpId::IndexSelect, vec![table, index, out], vec![], None)
    }
    /// `out[index[i]] += src[i]` (rows along axis 0, in index order).
    pub fn index_add(src: TensorView, index: TensorView, out: TensorView) -> OpCall {
        Self::new(OpId::IndexAdd, vec![src, index, out], vec![], None)
    }
    fn groups(groups: &[ParamGroup]) -> (Vec<TensorView>, bool) {
        let copy = groups.first().is_some_and(|g| g.copy.is_some());
        let mut t = Vec::new();
        for g in groups {
            t.push(g.param.clone());
            t.push(g.grad.clone());
            t.extend(g.state.iter().cloned());
            // A group whose copy presence differs from the first one's breaks the group width,
            // which validation reports.
            t.extend(g.copy.iter().cloned());
        }
        (t, copy)
    }
    /// One SGD-with-momentum step over `groups` (state: `[momentum_buffer]`).
    pub fn sgd_momentum(groups: &[ParamGroup], o: SgdOptions) -> OpCall {
        let (t, copy) = Self::groups(groups);
        let s = vec![
            f(o.lr),
            f(o.momentum),
            f(o.dampening),
            f(o.weight_decay),
            i(o.nesterov as i64),
            i(o.first_step as i64),
            i(copy as i64),
        ];
        Self::new(OpId::SgdMomentum, t, s, None)
    }
    /// One AdamW step over `groups` (state: `[exp_avg, exp_avg_sq]`).
    pub fn adamw(groups: &[ParamGroup], o: AdamWOptions) -> OpCall {
        let (t, copy) = Self::groups(groups);
        let s = vec![
            f(o.lr),
            f(o.beta1),
            f(o.beta2),
            f(o.eps),
            f(o.weight_decay),
            i(o.step.min(i64::MAX as u64) as i64),
            i(copy as i64),
        ];
        Self::new(OpId::AdamW, t, s, None)
    }
    /// `grads *= inv_scale`; `found_inf = 1` when any gradient element is not finite.
    pub fn amp_unscale(
        found_inf: TensorView,
        inv_scale: TensorView,
        grads: &[TensorView],
    ) -> OpCall {
        let mut t = vec![found_inf, inv_scale];
        t.extend(grads.iter().cloned());
        Self::new(OpId::AmpUnscale, t, vec![], None)
    }
    /// The dynamic loss-scale update: on `found_inf`, `scale *= backoff_factor` and the tracker
    /// resets; otherwise the tracker counts up and after `growth_interval` clean steps `scale *=
    /// growth_factor` (if the result is finite) and the tracker resets.
    pub fn amp_update_scale(
        scale: TensorView,
        growth_tracker: TensorView,
        found_inf: TensorView,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: i64,
    ) -> OpCall {
        Self::new(
            OpId::AmpUpdateScale,
            vec![scale, growth_tracker, found_inf],
            vec![f(growth_factor), f(backoff_factor), i(growth_interval)],
            None,
        )
    }
    /// Global-norm gradient clipping; `total_norm` receives the norm before clipping.
    pub fn clip_grad_norm(total_norm: TensorView, grads: &[TensorView], max_norm: f64) -> OpCall {
        let mut t = vec![total_norm];
        t.extend(grads.iter().cloned());
        Self::new(OpId::ClipGradNorm, t, vec![f(max_norm)], None)
    }
}

/// The operand that keys dtype support for a non-elementwise op.
pub(super) fn key_operand(class: OpClass) -> usize {
    match class {
        OpClass::Optimizer => 1,
        OpClass::AmpUnscale => 2,
        OpClass::ClipGradNorm => 1,
        _ => 0,
    }
}

/// The accumulation dtype of `d` (f64 for f64, else f32).
pub fn acc_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

pub(super) fn value(arg: &'static str, value: String, accepted: impl Into<String>) -> HalError {
    HalError::invalid(
        arg,
        Invalid::Value {
            value,
            accepted: accepted.into(),
        },
    )
}

pub(super) fn want_dtype(call: &OpCall, k: usize, ok: &[DType], what: &'static str) -> Result<()> {
    let d = call.tensors[k].dtype;
    if ok.contains(&d) {
        return Ok(());
    }
    Err(value(
        what,
        format!("{} operand {k} in {}", call.op, d.name()),
        format!(
            "one of {:?}",
            ok.iter().map(|d| d.name()).collect::<Vec<_>>()
        ),
    ))
}

pub(super) fn want_shape(call: &OpCall, k: usize, shape: &[u64], what: &'static str) -> Result<()> {
    let t = &call.tensors[k];
    if t.shape == shape {
        return Ok(());
    }
    Err(value(
        what,
        format!("shape {:?} (operand {k} of {})", t.shape, call.op),
        format!("{shape:?}"),
    ))
}

fn want_one(call: &OpCall, k: usize, d: DType, what: &'static str) -> Result<()> {
    want_dtype(call, k, &[d], what)?;
    if call.tensors[k].numel() != 1 {
        return Err(value(
            what,
            format!(
                "shape {:?} (operand {k} of {})",
                call.tensors[k].shape, call.op
            ),
            "exactly one element",
        ));
    }
    Ok(())
}

fn want_dense(call: &OpCall, k: usize) -> Result<()> {
    let t = &call.tensors[k];
    let dense = TensorView::contiguous(&t.buffer, t.dtype, &t.shape).strides;
    if t.shape
        .iter()
        .zip(&t.strides)
        .zip(&dense)
        .all(|((&d, &s), &w)| d <= 1 || s == w)
    {
        return Ok(());
    }
    Err(value(
        "tensors",
        format!("operand {k} of {} with strides {:?}", call.op, t.strides),
        "a dense row-major tensor",
    ))
}

/// Operand `k` must be dense along its last dim (stride 1, or at most one element there).
pub(super) fn want_row_dense(call: &OpCall, k: usize) -> Result<()> {
    let t = &call.tensors[k];
    match (t.shape.last(), t.strides.last()) {
        (Some(&d), Some(&s)) if d > 1 && s != 1 => Err(value(
            "tensors",
            format!("operand {k} of {} with strides {:?}", call.op, t.strides),
            "stride 1 along the last (normalised) axis",
        )),
        _ => Ok(()),
    }
}

pub(super) fn scalar_in(
    call: &OpCall,
    k: usize,
    name: &'static str,
    ok: impl Fn(f64) -> bool,
    accepted: &str,
) -> Result<f64> {
    let v = call.scalars[k].as_f64();
    if ok(v) {
        Ok(v)
    } else {
        Err(value(name, format!("{v}"), accepted))
    }
}

/// The shape of `x` without its last dim (the rows of a last-axis op).
pub fn rows_shape(x: &TensorView) -> Vec<u64> {
    x.shape[..x.shape.len().saturating_sub(1)].to_vec()
}

/// Normalises a reduction axis for `ndim` dims.
///
/// # Errors
/// [`Invalid::Value`] when out of `[-ndim, ndim)`.
pub fn axis_of(axis: i64, ndim: usize) -> Result<usize> {
    let n = ndim as i64;
    if ndim == 0 || axis < -n || axis >= n {
        return Err(value(
            "axis",
            axis.to_string(),
            format!("an axis in [-{n}, {n}) of a tensor with at least one dim"),
        ));
    }
    Ok(if axis < 0 {
        (axis + n) as usize
    } else {
        axis as usize
    })
}

/// The broadcast batch shape of matmul operands, given their leading dims.
pub(super) fn broadcast(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let n = a.len().max(b.len());
    let get = |s: &[u64], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| {
            let (x, y) = (get(a, i), get(b, i));
            if x == y || y == 1 {
                Some(x)
            } else if x == 1 {
                Some(y)
            } else {
                None
            }
        })
        .collect()
}

/// Bounds of every operand; outputs (`outs`) must not overlap themselves or any other operand;
/// with `in_place`, every tensor must be disjoint from every other.
pub(super) fn check_memory(
    call: &OpCall,
    outs: std::ops::Range<usize>,
    in_place: bool,
) -> Result<()> {
    let mut spans = Vec::with_capacity(call.tensors.len());
    for (k, t) in call.tensors.iter().enumerate() {
        let arg = if outs.contains(&k) || in_place {
            "output"
        } else {
            "input"
        };
        spans.push((t.byte_span(arg)?, k));
        if (outs.contains(&k) || in_place) && !super::non_overlapping(&t.shape, &t.strides) {
            return Err(value(
                "output",
                format!("shape {:?} with strides {:?}", t.shape, t.strides),
                "an output whose elements do not overlap each other",
            ));
        }
    }
    let mut written: Vec<(u64, u64, usize)> = spans
        .iter()
        .filter_map(|&(s, k)| s.map(|(a, b)| (a, b, k)))
        .collect();
    written.sort_unstable();
    // Sweep: every pair of overlapping spans where at least one is written is an error.
    let mut active: Vec<(u64, u64, usize)> = Vec::new();
    for (s, e, k) in written {
        active.retain(|&(_, ae, _)| ae > s);
        for &(as_, ae, ak) in &active {
            let written = in_place || outs.contains(&k) || outs.contains(&ak);
            if written && !super::views_disjoint(&call.tensors[k], &call.tensors[ak]) {
                return Err(HalError::invalid(
                    "output",
                    Invalid::Overlap {
                        src: as_.min(s),
                        dst: as_.max(s),
                        len: ae.min(e) - as_.max(s),
                    },
                ));
            }
        }
        active.push((s, e, k));
    }
    Ok(())
}

/// The float dtypes the training ops take.
pub(super) const FLOATS: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::Bf16];
/// The dtypes of mixed-precision state (no f64).
const HALVES: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

/// What each class's checks read of a validated-arity call.
struct Ctx<'a> {
    call: &'a OpCall,
    class: OpClass,
    t: &'a [TensorView],
    n: usize,
    /// The first tensor's dtype.
    d0: DType,
}

impl Ctx<'_> {
    /// Tensors `ks` have the first tensor's dtype.
    fn same(&self, ks: &[usize]) -> Result<()> {
        for &k in ks {
            want_dtype(self.call, k, &[self.d0], "tensors")?;
        }
        Ok(())
    }
}

/// Validation of the non-elementwise classes; returns the shape of the first output.
pub(super) fn validate(call: &OpCall) -> Result<Vec<u64>> {
    let class = call.op.class();
    let (nt, ns, takes_rng, first_out) = class.arity();
    let n = call.tensors.len();
    let variable = nt == usize::MAX;
    let bad_count = if variable {
        n == 0 || (ns != usize::MAX && call.scalars.len() != ns)
    } else {
        n != nt || call.scalars.len() != ns
    };
    if bad_count || (call.rng.is_some() && !takes_rng) {
        return Err(value(
            "call",
            format!(
                "{} with {} tensors, {} scalars, rng {}",
                call.op,
                n,
                call.scalars.len(),
                call.rng.is_some()
            ),
            if variable {
                "see the op's documentation".to_string()
            } else {
                format!(
                    "{nt} tensors, {ns} scalars, {}",
                    if takes_rng {
                        "an rng with dropout"
                    } else {
                        "no rng"
                    }
                )
            },
        ));
    }
    let t = &call.tensors;
    let cx = Ctx {
        call,
        class,
        t,
        n,
        d0: t[0].dtype,
    };
    let early = match class {
        OpClass::Reduce => check_reduce(&cx)?,
        OpClass::Softmax | OpClass::SoftmaxMasked | OpClass::SoftmaxBackward => check_softmax(&cx)?,
        OpClass::CrossEntropy | OpClass::CrossEntropyBackward => check_cross_entropy(&cx)?,
        OpClass::LayerNorm
        | OpClass::RmsNorm
        | OpClass::LayerNormBackward
        | OpClass::RmsNormBackward
        | OpClass::AddLayerNorm
        | OpClass::AddRmsNorm => check_layer_norm(&cx)?,
        OpClass::Attention | OpClass::AttentionBackward => {
            super::transformer::check_attention(call)?
        }
        OpClass::Rope => super::transformer::check_rope(call)?,
        OpClass::Matmul => check_matmul(&cx)?,
        OpClass::IndexSelect | OpClass::IndexAdd => check_index_select(&cx)?,
        OpClass::Optimizer => check_optimizer(&cx)?,
        OpClass::AmpUnscale | OpClass::ClipGradNorm => check_amp_unscale(&cx)?,
        OpClass::AmpUpdateScale => check_amp_update_scale(&cx)?,
        _ => unreachable!("elementwise classes are validated in mod.rs"),
    };
    if let Some(shape) = early {
        return Ok(shape);
    }
    check_memory(call, call.outputs(), false)?;
    Ok(t[first_out].shape.clone())
}

/// The checks of Reduce; `Some(shape)` ends validation with that output shape.
fn check_reduce(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    use DType::*;
    let (call, t, d0) = (cx.call, cx.t, cx.d0);
    want_dtype(call, 0, FLOATS, "x")?;
    let arg = matches!(call.op, OpId::Argmax | OpId::Argmin);
    want_dtype(call, 1, &[if arg { I64 } else { d0 }], "out")?;
    let ax = axis_of(call.reduce_axis()?, t[0].shape.len())?;
    let mut shape = t[0].shape.clone();
    if shape[ax] == 0 && !matches!(call.op, OpId::ReduceSum | OpId::ReduceMean) {
        return Err(value(
            "x",
            format!("{} over an empty axis {ax} of {:?}", call.op, t[0].shape),
            "a non-empty axis",
        ));
    }
    shape[ax] = 1;
    want_shape(call, 1, &shape, "out")?;
    Ok(None)
}

/// The checks of Softmax, SoftmaxMasked, SoftmaxBackward; `Some(shape)` ends validation with that output shape.
fn check_softmax(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    let (call, class, t, n) = (cx.call, cx.class, cx.t, cx.n);
    want_dtype(call, 0, FLOATS, "x")?;
    if t[0].shape.is_empty() {
        return Err(value("x", "a 0-d tensor".into(), "at least one dim"));
    }
    cx.same(&(1..n).collect::<Vec<_>>())?;
    want_shape(call, n - 1, &t[0].shape, "y")?;
    for k in 0..n {
        if !(class == OpClass::SoftmaxMasked && k == 1) {
            want_row_dense(call, k)?;
        }
    }
    if class == OpClass::SoftmaxMasked {
        let last = t[1]
            .broadcast_strides(&t[0].shape)
            .map(|s| s.last().copied());
        if !matches!(last, Some(Some(0 | 1))) {
            return Err(value(
                "mask",
                format!("shape {:?}", t[1].shape),
                format!(
                    "a shape that broadcasts to {:?}, dense or broadcast along the last axis",
                    t[0].shape
                ),
            ));
        }
    } else {
        want_shape(call, 1, &t[0].shape, "tensors")?;
    }
    Ok(None)
}

/// The checks of CrossEntropy, CrossEntropyBackward; `Some(shape)` ends validation with that output shape.
fn check_cross_entropy(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    use DType::*;
    let (call, class, t, d0) = (cx.call, cx.class, cx.t, cx.d0);
    want_dtype(call, 0, HALVES, "logits")?;
    if t[0].shape.len() != 2 {
        return Err(value("logits", format!("shape {:?}", t[0].shape), "(N, C)"));
    }
    let (rows, classes) = (t[0].shape[0], t[0].shape[1]);
    if classes == 0 {
        return Err(value("logits", "0 classes".into(), "at least one class"));
    }
    want_row_dense(call, 0)?;
    want_dtype(call, 1, &[I32, I64], "target")?;
    want_shape(call, 1, &[rows], "target")?;
    let red = call.scalars[0].as_i64();
    let loss_shape: Vec<u64> = match red {
        0 | 1 => vec![],
        2 => vec![rows],
        _ => {
            return Err(value(
                "reduction",
                red.to_string(),
                "0 (mean), 1 (sum) or 2 (none)",
            ))
        }
    };
    scalar_in(
        call,
        2,
        "label_smoothing",
        |s| (0.0..=1.0).contains(&s),
        "[0, 1]",
    )?;
    want_dtype(call, 2, &[F32], "loss")?;
    want_shape(call, 2, &loss_shape, "loss")?;
    if class == OpClass::CrossEntropyBackward {
        want_dtype(call, 3, &[d0], "dlogits")?;
        want_shape(call, 3, &t[0].shape, "dlogits")?;
        want_row_dense(call, 3)?;
    }
    Ok(None)
}

/// The checks of LayerNorm, RmsNorm, LayerNormBackward, RmsNormBackward; `Some(shape)` ends validation with that output shape.
fn check_layer_norm(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    let (call, class, t, d0) = (cx.call, cx.class, cx.t, cx.d0);
    want_dtype(call, 0, FLOATS, "x")?;
    if t[0].shape.is_empty() {
        return Err(value("x", "a 0-d tensor".into(), "at least one dim"));
    }
    let d = *t[0].shape.last().expect("not 0-d");
    let rows = rows_shape(&t[0]);
    let acc = acc_dtype(d0);
    // (tensors like x, tensors of shape [D], row statistics).
    let (like_x, vecs, stats): (&[usize], &[usize], &[usize]) = match class {
        OpClass::LayerNorm => (&[3], &[1, 2], &[4, 5]),
        OpClass::RmsNorm => (&[2], &[1], &[3]),
        OpClass::AddLayerNorm => (&[1, 4, 5], &[2, 3], &[6, 7]),
        OpClass::AddRmsNorm => (&[1, 3, 4], &[2], &[5]),
        OpClass::LayerNormBackward => (&[1, 5], &[2, 6, 7], &[3, 4]),
        _ => (&[1, 4], &[2, 5], &[3]),
    };
    want_row_dense(call, 0)?;
    for &k in like_x {
        want_dtype(call, k, &[d0], "tensors")?;
        want_shape(call, k, &t[0].shape, "tensors")?;
        want_row_dense(call, k)?;
    }
    for &k in vecs {
        want_dtype(call, k, &[d0], "weight")?;
        want_shape(call, k, &[d], "weight")?;
        want_row_dense(call, k)?;
    }
    for &k in stats {
        want_dtype(call, k, &[acc], "statistics")?;
        want_shape(call, k, &rows, "statistics")?;
    }
    if matches!(
        class,
        OpClass::LayerNorm | OpClass::RmsNorm | OpClass::AddLayerNorm | OpClass::AddRmsNorm
    ) {
        scalar_in(
            call,
            0,
            "eps",
            |e| e.is_finite() && e >= 0.0,
            "a finite eps >= 0",
        )?;
    }
    Ok(None)
}

/// The checks of Matmul; `Some(shape)` ends validation with that output shape.
fn check_matmul(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    let (call, t) = (cx.call, cx.t);
    want_dtype(call, 0, FLOATS, "a")?;
    cx.same(&[1, 2])?;
    let (a, b, c) = (&t[0].shape, &t[1].shape, &t[2].shape);
    let ok = a.len() >= 2 && b.len() >= 2 && c.len() >= 2 && {
        let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
        let (k2, nn) = (b[b.len() - 2], b[b.len() - 1]);
        let batch = broadcast(&a[..a.len() - 2], &b[..b.len() - 2]);
        k == k2 && c[c.len() - 2..] == [m, nn] && batch.as_deref() == Some(&c[..c.len() - 2])
    };
    if !ok {
        return Err(value(
            "tensors",
            format!("matmul of {a:?} by {b:?} into {c:?}"),
            "a (..., M, K), b (..., K, N), c (batch..., M, N) with broadcastable batches",
        ));
    }
    Ok(None)
}

/// The checks of IndexSelect, IndexAdd; `Some(shape)` ends validation with that output shape.
fn check_index_select(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    use DType::*;
    let (call, class, t, d0) = (cx.call, cx.class, cx.t, cx.d0);
    want_dtype(call, 0, FLOATS, "tensors")?;
    want_dtype(call, 2, &[d0], "out")?;
    want_dtype(call, 1, &[I32, I64], "index")?;
    let (src, idx, out) = (&t[0].shape, &t[1].shape, &t[2].shape);
    let gather = class == OpClass::IndexSelect;
    let (table, rows) = if gather { (src, out) } else { (out, src) };
    let ok = idx.len() == 1
        && !table.is_empty()
        && rows.len() == table.len()
        && rows[0] == idx[0]
        && rows[1..] == table[1..];
    if !ok {
        return Err(value(
            "tensors",
            format!("{} of {src:?} by index {idx:?} into {out:?}", call.op),
            "table (V, ...), index (N), rows (N, ...)",
        ));
    }
    want_dense(call, 0)?;
    want_dense(call, 2)?;
    Ok(None)
}

/// The checks of Optimizer; `Some(shape)` ends validation with that output shape.
fn check_optimizer(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    use DType::*;
    let (call, t, n) = (cx.call, cx.t, cx.n);
    let adam = call.op == OpId::AdamW;
    if call.scalars.len() != 7 {
        return Err(value("scalars", call.scalars.len().to_string(), "7"));
    }
    let copy = call.scalars[6].as_i64() != 0;
    let width = if adam { 4 } else { 3 } + copy as usize;
    if n % width != 0 {
        return Err(value(
            "tensors",
            format!("{n} tensors"),
            format!("groups of {width} (param, grad, state..., copy if any)"),
        ));
    }
    let gd = t[1].dtype;
    for g in 0..n / width {
        let base = g * width;
        let numel = t[base].numel();
        for (role, tk) in t[base..base + width].iter().enumerate() {
            let k = base + role;
            let ok: &[DType] = if role == 1 {
                &[gd]
            } else if copy && role == width - 1 {
                &[F16, Bf16]
            } else {
                &[F32]
            };
            want_dtype(call, k, ok, "tensors")?;
            want_dense(call, k)?;
            if tk.numel() != numel {
                return Err(value(
                    "tensors",
                    format!("group {g}: {} elements against {numel}", tk.numel()),
                    "the same element count for a parameter, its gradient, state and copy",
                ));
            }
        }
        if copy {
            want_dtype(call, base + width - 1, &[t[width - 1].dtype], "copy")?;
        }
    }
    want_dtype(call, 1, HALVES, "grad")?;
    scalar_in(
        call,
        0,
        "lr",
        |v| v.is_finite() && v >= 0.0,
        "a finite lr >= 0",
    )?;
    if adam {
        for (k, name) in [(1, "beta1"), (2, "beta2")] {
            scalar_in(call, k, name, |b| (0.0..1.0).contains(&b), "[0, 1)")?;
        }
        scalar_in(
            call,
            3,
            "eps",
            |e| e.is_finite() && e > 0.0,
            "a finite eps > 0",
        )?;
        if call.scalars[5].as_i64() < 1 {
            return Err(value(
                "step",
                call.scalars[5].as_i64().to_string(),
                "at least 1",
            ));
        }
    } else {
        scalar_in(call, 1, "momentum", |m| (0.0..=1.0).contains(&m), "[0, 1]")?;
        scalar_in(call, 2, "dampening", |m| (0.0..=1.0).contains(&m), "[0, 1]")?;
    }
    let wd = if adam { 4 } else { 3 };
    scalar_in(
        call,
        wd,
        "weight_decay",
        |w| w.is_finite() && w >= 0.0,
        "a finite value >= 0",
    )?;
    check_memory(call, call.outputs(), true)?;
    Ok(Some(t[0].shape.clone()))
}

/// The checks of AmpUnscale, ClipGradNorm; `Some(shape)` ends validation with that output shape.
fn check_amp_unscale(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    use DType::*;
    let (call, class, t, n) = (cx.call, cx.class, cx.t, cx.n);
    let first_grad = if class == OpClass::AmpUnscale { 2 } else { 1 };
    if class == OpClass::AmpUnscale {
        want_one(call, 0, F32, "found_inf")?;
        want_one(call, 1, F32, "inv_scale")?;
    } else {
        want_one(call, 0, F32, "total_norm")?;
        scalar_in(
            call,
            0,
            "max_norm",
            |m| m.is_finite() && m > 0.0,
            "a finite max_norm > 0",
        )?;
    }
    if n <= first_grad {
        return Err(value(
            "tensors",
            format!("{n} tensors"),
            "at least one gradient",
        ));
    }
    want_dtype(call, first_grad, HALVES, "grads")?;
    let gd = t[first_grad].dtype;
    for k in first_grad..n {
        want_dtype(call, k, &[gd], "grads")?;
        want_dense(call, k)?;
    }
    check_memory(call, call.outputs(), true)?;
    Ok(Some(t[0].shape.clone()))
}

/// The checks of AmpUpdateScale; `Some(shape)` ends validation with that output shape.
fn check_amp_update_scale(cx: &Ctx) -> Result<Option<Vec<u64>>> {
    use DType::*;
    let (call, t) = (cx.call, cx.t);
    want_one(call, 0, F32, "scale")?;
    want_one(call, 1, I32, "growth_tracker")?;
    want_one(call, 2, F32, "found_inf")?;
    scalar_in(
        call,
        0,
        "growth_factor",
        |g| g.is_finite() && g > 0.0,
        "a finite value > 0",
    )?;
    scalar_in(
        call,
        1,
        "backoff_factor",
        |g| g.is_finite() && g > 0.0,
        "a finite value > 0",
    )?;
    if call.scalars[2].as_i64() < 1 {
        return Err(value(
            "growth_interval",
            call.scalars[2].as_i64().to_string(),
            "at least 1",
        ));
    }
    check_memory(call, call.outputs(), false)?;
    Ok(Some(t[0].shape.clone()))
}
