//! Library operations as plain data: an [`OpId`] plus a call description ([`OpCall`]: tensor views,
//! scalars, random state), so that every backend, a future C-ABI plugin, or Ascend's aclnn mapping
//! can implement them. Ops enqueue on a stream like everything else (`Stream::run_op`); which op runs
//! in which dtype is a capability (`Capabilities::supports`).
//!
//! ## Rules every backend follows (checked by [`OpCall::validate`])
//!
//! * **Arbitrary strides.** Every tensor is a [`TensorView`]: a buffer, a byte offset, a dtype, a
//!   shape and strides in elements (negative allowed; 0 = broadcast). Inputs broadcast to the output
//!   shape by numpy's rules (missing leading dims, size-1 dims, or explicit 0 strides).
//! * **Aliasing.** An output may alias an input exactly (same address, dtype, shape and strides after
//!   broadcasting); any other overlap of the memory spans of an output and another operand is
//!   [`Invalid::Overlap`]. An output may not overlap itself (no 0 strides on dims of size > 1).
//! * **NaN.** `maximum`/`minimum` propagate NaN; so do all float unary ops.
//! * **Integers** wrap on overflow; float→integer casts truncate toward zero and saturate, NaN → 0
//!   (as Rust's `as`). Float→f16/bf16 rounds to nearest even, once, from any source type.

pub mod args;
pub mod nn;
pub mod transformer;

use crate::buffer::Buffer;
use crate::dtype::DType;
use crate::error::{HalError, Invalid, Result};
use serde::Serialize;
use std::fmt;

/// Most dimensions a tensor view may have.
pub const MAX_DIMS: usize = 8;

/// Stable operation ids. The snake_case name ([`OpId::name`]) appears in capabilities, reports and
/// conformance case ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OpId {
    /// `[out]`, scalars `[value]`.
    Fill,
    /// `[src, dst]`, same dtype; `src` broadcasts to `dst` (slice, concat, transpose, expand).
    Copy,
    /// `[src, dst]`, any two of the float types, i32 and i64.
    Cast,
    // Unary, `[x, y]`.
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    GeluTanh,
    GeluErf,
    Silu,
    // Unary backward, `[x, dy, dx]`: dx = dy * f'(x).
    ReluBackward,
    GeluTanhBackward,
    GeluErfBackward,
    SiluBackward,
    // Binary, `[a, b, out]` with broadcasting.
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
    // Binary with a scalar right operand, `[a, out]`, scalars `[b]`.
    AddScalar,
    SubScalar,
    MulScalar,
    DivScalar,
    MaximumScalar,
    MinimumScalar,
    PowScalar,
    /// `[x, y]`, scalars `[alpha]`: y = alpha * x + y.
    Axpy,
    /// `[cond (bool or u8), a, b, out]`: out = cond != 0 ? a : b.
    Where,
    /// `[out]`, scalars `[low, high]`, rng: uniform in [low, high).
    RandomUniform,
    /// `[out]`, scalars `[mean, std]`, rng: normal (Box-Muller on Philox with `bitwise_rng`).
    RandomNormal,
    /// `[x, out, mask (bool or u8)]`, scalars `[p]`, rng: keep with probability 1-p, scale 1/(1-p).
    DropoutForward,
    /// `[dy, mask, dx]`, scalars `[p]`: dx = mask ? dy / (1-p) : 0.
    DropoutBackward,
    // Reductions along one axis, `[x, out]`, scalars `[axis]` (negative counts from the end); `out`
    // has x's shape with the axis of size 1. See [`nn`] for the exact semantics.
    ReduceSum,
    ReduceMean,
    ReduceMax,
    ReduceMin,
    /// As the reductions, with an `i64` output: index of the first maximum (NaN counts as largest).
    Argmax,
    /// As the reductions, with an `i64` output: index of the first minimum (NaN counts as smallest).
    Argmin,
    // Softmax along the last axis, `[x, y]`.
    Softmax,
    LogSoftmax,
    // Softmax of `x + mask` along the last axis, `[x, mask, y]`; `mask` broadcasts to `x`.
    SoftmaxMasked,
    LogSoftmaxMasked,
    // Gradients, `[y, dy, dx]` where `y` is the forward output.
    SoftmaxBackward,
    LogSoftmaxBackward,
    /// `[logits (N, C), target (N; i32 or i64), loss (f32)]`, scalars `[reduction, ignore_index,
    /// label_smoothing]`: PyTorch's `cross_entropy`. `loss` is `[]` for mean/sum, `[N]` for none.
    CrossEntropy,
    /// `[logits, target, dloss (f32, the loss's shape), dlogits]`, scalars as the forward.
    CrossEntropyBackward,
    /// `[x, weight, bias, y, mean, rstd]`, scalars `[eps]`: over the last axis.
    LayerNorm,
    /// `[x, dy, weight, mean, rstd, dx, dweight, dbias]`.
    LayerNormBackward,
    /// `[x, weight, y, rstd]`, scalars `[eps]`: over the last axis.
    RmsNorm,
    /// `[x, dy, weight, rstd, dx, dweight]`.
    RmsNormBackward,
    /// `[a (..., M, K), b (..., K, N), c (..., M, N)]`, scalars `[alpha, beta]`:
    /// `c = alpha * a @ b + beta * c`; batch dims broadcast; transposes are strides.
    Matmul,
    /// `[table (V, ...), index (N; i32 or i64), out (N, ...)]`: `out[i] = table[index[i]]`.
    IndexSelect,
    /// `[src (N, ...), index (N; i32 or i64), out (V, ...)]`: `out[index[i]] += src[i]`, the
    /// gradient of `index_select` (scatter-add of rows).
    IndexAdd,
    /// Multi-tensor SGD with momentum; see [`nn`].
    SgdMomentum,
    /// Multi-tensor AdamW; see [`nn`].
    AdamW,
    /// `[found_inf (1, f32), inv_scale (1, f32), grads...]`: grads *= inv_scale in place;
    /// found_inf = 1 if any grad is not finite.
    AmpUnscale,
    /// `[scale (1, f32), growth_tracker (1, i32), found_inf (1, f32)]`, scalars `[growth_factor,
    /// backoff_factor, growth_interval]`: the dynamic loss-scale update.
    AmpUpdateScale,
    /// `[total_norm (1, f32), grads...]`, scalars `[max_norm]`: global L2 norm clipping.
    ClipGradNorm,
    /// Fused scaled-dot-product attention (FlashAttention-2 style, O(S) extra memory):
    /// `[q (B, Hq, S, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, D), bias, out (B, Hq, S, D),
    /// lse (B, Hq, S)]`, scalars `[scale, causal, dropout_p, has_bias]`, rng when dropout_p > 0.
    /// See [`transformer`].
    Attention,
    /// `[q, k, v, bias, out, dout, lse, dq, dk, dv]`, scalars and rng as the forward.
    AttentionBackward,
    /// Rotary position embedding, `[x (..., D), cos, sin, y]`, scalars `[interleaved]`.
    Rope,
    /// `[dy, cos, sin, dx]`, scalars `[interleaved]`: the transposed rotation.
    RopeBackward,
    /// Residual add + layer norm: `[x, residual, weight, bias, h, y, mean, rstd]`, scalars
    /// `[eps]`: `h = x + residual`, `y = layer_norm(h)`.
    AddLayerNorm,
    /// Residual add + RMS norm: `[x, residual, weight, h, y, rstd]`, scalars `[eps]`.
    AddRmsNorm,
}

impl OpId {
    /// Every op, in declaration order.
    pub const ALL: [OpId; 71] = [
        OpId::Fill,
        OpId::Copy,
        OpId::Cast,
        OpId::Neg,
        OpId::Abs,
        OpId::Exp,
        OpId::Log,
        OpId::Sqrt,
        OpId::Rsqrt,
        OpId::Tanh,
        OpId::Sigmoid,
        OpId::Relu,
        OpId::GeluTanh,
        OpId::GeluErf,
        OpId::Silu,
        OpId::ReluBackward,
        OpId::GeluTanhBackward,
        OpId::GeluErfBackward,
        OpId::SiluBackward,
        OpId::Add,
        OpId::Sub,
        OpId::Mul,
        OpId::Div,
        OpId::Maximum,
        OpId::Minimum,
        OpId::Pow,
        OpId::AddScalar,
        OpId::SubScalar,
        OpId::MulScalar,
        OpId::DivScalar,
        OpId::MaximumScalar,
        OpId::MinimumScalar,
        OpId::PowScalar,
        OpId::Axpy,
        OpId::Where,
        OpId::RandomUniform,
        OpId::RandomNormal,
        OpId::DropoutForward,
        OpId::DropoutBackward,
        OpId::ReduceSum,
        OpId::ReduceMean,
        OpId::ReduceMax,
        OpId::ReduceMin,
        OpId::Argmax,
        OpId::Argmin,
        OpId::Softmax,
        OpId::LogSoftmax,
        OpId::SoftmaxMasked,
        OpId::LogSoftmaxMasked,
        OpId::SoftmaxBackward,
        OpId::LogSoftmaxBackward,
        OpId::CrossEntropy,
        OpId::CrossEntropyBackward,
        OpId::LayerNorm,
        OpId::LayerNormBackward,
        OpId::RmsNorm,
        OpId::RmsNormBackward,
        OpId::Matmul,
        OpId::IndexSelect,
        OpId::IndexAdd,
        OpId::SgdMomentum,
        OpId::AdamW,
        OpId::AmpUnscale,
        OpId::AmpUpdateScale,
        OpId::ClipGradNorm,
        OpId::Attention,
        OpId::AttentionBackward,
        OpId::Rope,
        OpId::RopeBackward,
        OpId::AddLayerNorm,
        OpId::AddRmsNorm,
    ];

    /// The stable snake_case name.
    pub fn name(self) -> &'static str {
        use OpId::*;
        match self {
            Fill => "fill",
            Copy => "copy",
            Cast => "cast",
            Neg => "neg",
            Abs => "abs",
            Exp => "exp",
            Log => "log",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Relu => "relu",
            GeluTanh => "gelu_tanh",
            GeluErf => "gelu_erf",
            Silu => "silu",
            ReluBackward => "relu_backward",
            GeluTanhBackward => "gelu_tanh_backward",
            GeluErfBackward => "gelu_erf_backward",
            SiluBackward => "silu_backward",
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Maximum => "maximum",
            Minimum => "minimum",
            Pow => "pow",
            AddScalar => "add_scalar",
            SubScalar => "sub_scalar",
            MulScalar => "mul_scalar",
            DivScalar => "div_scalar",
            MaximumScalar => "maximum_scalar",
            MinimumScalar => "minimum_scalar",
            PowScalar => "pow_scalar",
            Axpy => "axpy",
            Where => "where",
            RandomUniform => "random_uniform",
            RandomNormal => "random_normal",
            DropoutForward => "dropout_forward",
            DropoutBackward => "dropout_backward",
            ReduceSum => "reduce_sum",
            ReduceMean => "reduce_mean",
            ReduceMax => "reduce_max",
            ReduceMin => "reduce_min",
            Argmax => "argmax",
            Argmin => "argmin",
            Softmax => "softmax",
            LogSoftmax => "log_softmax",
            SoftmaxMasked => "softmax_masked",
            LogSoftmaxMasked => "log_softmax_masked",
            SoftmaxBackward => "softmax_backward",
            LogSoftmaxBackward => "log_softmax_backward",
            CrossEntropy => "cross_entropy",
            CrossEntropyBackward => "cross_entropy_backward",
            LayerNorm => "layer_norm",
            LayerNormBackward => "layer_norm_backward",
            RmsNorm => "rms_norm",
            RmsNormBackward => "rms_norm_backward",
            Matmul => "matmul",
            IndexSelect => "index_select",
            IndexAdd => "index_add",
            SgdMomentum => "sgd_momentum",
            AdamW => "adamw",
            AmpUnscale => "amp_unscale",
            AmpUpdateScale => "amp_update_scale",
            ClipGradNorm => "clip_grad_norm",
            Attention => "attention",
            AttentionBackward => "attention_backward",
            Rope => "rope",
            RopeBackward => "rope_backward",
            AddLayerNorm => "add_layer_norm",
            AddRmsNorm => "add_rms_norm",
        }
    }

    /// The class of the op, which fixes its operands.
    pub fn class(self) -> OpClass {
        use OpId::*;
        match self {
            Fill => OpClass::Fill,
            Copy => OpClass::Copy,
            Cast => OpClass::Cast,
            Neg | Abs | Exp | Log | Sqrt | Rsqrt | Tanh | Sigmoid | Relu | GeluTanh | GeluErf
            | Silu => OpClass::Unary,
            ReluBackward | GeluTanhBackward | GeluErfBackward | SiluBackward => {
                OpClass::UnaryBackward
            }
            Add | Sub | Mul | Div | Maximum | Minimum | Pow => OpClass::Binary,
            AddScalar | SubScalar | MulScalar | DivScalar | MaximumScalar | MinimumScalar
            | PowScalar => OpClass::BinaryScalar,
            Axpy => OpClass::Axpy,
            Where => OpClass::Where,
            RandomUniform | RandomNormal => OpClass::Random,
            DropoutForward => OpClass::DropoutForward,
            DropoutBackward => OpClass::DropoutBackward,
            ReduceSum | ReduceMean | ReduceMax | ReduceMin | Argmax | Argmin => OpClass::Reduce,
            Softmax | LogSoftmax => OpClass::Softmax,
            SoftmaxMasked | LogSoftmaxMasked => OpClass::SoftmaxMasked,
            SoftmaxBackward | LogSoftmaxBackward => OpClass::SoftmaxBackward,
            CrossEntropy => OpClass::CrossEntropy,
            CrossEntropyBackward => OpClass::CrossEntropyBackward,
            LayerNorm => OpClass::LayerNorm,
            LayerNormBackward => OpClass::LayerNormBackward,
            RmsNorm => OpClass::RmsNorm,
            RmsNormBackward => OpClass::RmsNormBackward,
            Matmul => OpClass::Matmul,
            IndexSelect => OpClass::IndexSelect,
            IndexAdd => OpClass::IndexAdd,
            SgdMomentum | AdamW => OpClass::Optimizer,
            AmpUnscale => OpClass::AmpUnscale,
            AmpUpdateScale => OpClass::AmpUpdateScale,
            ClipGradNorm => OpClass::ClipGradNorm,
            Attention => OpClass::Attention,
            AttentionBackward => OpClass::AttentionBackward,
            Rope | RopeBackward => OpClass::Rope,
            AddLayerNorm => OpClass::AddLayerNorm,
            AddRmsNorm => OpClass::AddRmsNorm,
        }
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Op classes: ops of one class share operand lists and validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpClass {
    Fill,
    Copy,
    Cast,
    Unary,
    UnaryBackward,
    Binary,
    BinaryScalar,
    Axpy,
    Where,
    Random,
    DropoutForward,
    DropoutBackward,
    Reduce,
    Softmax,
    SoftmaxMasked,
    SoftmaxBackward,
    CrossEntropy,
    CrossEntropyBackward,
    LayerNorm,
    LayerNormBackward,
    RmsNorm,
    RmsNormBackward,
    Matmul,
    IndexSelect,
    IndexAdd,
    /// Multi-tensor optimizer steps: tensors are groups of a fixed width.
    Optimizer,
    AmpUnscale,
    AmpUpdateScale,
    ClipGradNorm,
    Attention,
    AttentionBackward,
    Rope,
    AddLayerNorm,
    AddRmsNorm,
}

impl OpClass {
    /// True for the elementwise classes (one output shape, numpy broadcasting of the inputs).
    pub const fn is_elementwise(self) -> bool {
        (self as u8) <= (OpClass::DropoutBackward as u8)
    }

    /// (number of tensors, number of scalars, takes rng, index of the first output); `usize::MAX`
    /// tensors for the multi-tensor classes, whose tensor lists have any length. The elementwise
    /// classes that take an rng require it; attention takes one only with dropout.
    pub const fn arity(self) -> (usize, usize, bool, usize) {
        const ANY: usize = usize::MAX;
        match self {
            OpClass::Fill => (1, 1, false, 0),
            OpClass::Copy | OpClass::Cast | OpClass::Unary => (2, 0, false, 1),
            OpClass::UnaryBackward => (3, 0, false, 2),
            OpClass::Binary => (3, 0, false, 2),
            OpClass::BinaryScalar => (2, 1, false, 1),
            OpClass::Axpy => (2, 1, false, 1),
            OpClass::Where => (4, 0, false, 3),
            OpClass::Random => (1, 2, true, 0),
            OpClass::DropoutForward => (3, 1, true, 1),
            OpClass::DropoutBackward => (3, 1, false, 2),
            OpClass::Reduce => (2, 1, false, 1),
            OpClass::Softmax => (2, 0, false, 1),
            OpClass::SoftmaxMasked | OpClass::SoftmaxBackward => (3, 0, false, 2),
            OpClass::CrossEntropy => (3, 3, false, 2),
            OpClass::CrossEntropyBackward => (4, 3, false, 3),
            OpClass::LayerNorm => (6, 1, false, 3),
            OpClass::LayerNormBackward => (8, 0, false, 5),
            OpClass::RmsNorm => (4, 1, false, 2),
            OpClass::RmsNormBackward => (6, 0, false, 4),
            OpClass::Matmul => (3, 2, false, 2),
            OpClass::IndexSelect | OpClass::IndexAdd => (3, 0, false, 2),
            OpClass::Optimizer => (ANY, ANY, false, 0),
            OpClass::AmpUnscale => (ANY, 0, false, 0),
            OpClass::AmpUpdateScale => (3, 3, false, 0),
            OpClass::ClipGradNorm => (ANY, 1, false, 0),
            OpClass::Attention => (6, 4, true, 4),
            OpClass::AttentionBackward => (10, 4, true, 7),
            OpClass::Rope => (4, 1, false, 3),
            OpClass::AddLayerNorm => (8, 1, false, 4),
            OpClass::AddRmsNorm => (6, 1, false, 3),
        }
    }
}

/// A scalar operand.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Scalar {
    F64(f64),
    I64(i64),
}

impl Scalar {
    /// As f64 (i64 values convert with rounding).
    pub fn as_f64(self) -> f64 {
        match self {
            Scalar::F64(v) => v,
            Scalar::I64(v) => v as f64,
        }
    }
    /// As i64 (f64 values truncate and saturate, NaN → 0).
    pub fn as_i64(self) -> i64 {
        match self {
            Scalar::F64(v) => v as i64,
            Scalar::I64(v) => v,
        }
    }

    /// The bit pattern of this value as one element of `dtype`, as `fill` writes it (float →
    /// f16/bf16 rounds to nearest even; into a narrower integer the value truncates toward zero
    /// and saturates; u64 takes the value as Rust's `as` does).
    pub fn bits(self, dtype: DType) -> u64 {
        let f = self.as_f64();
        let i = self.as_i64();
        let int = |lo: i64, hi: i64| i.clamp(lo, hi);
        match dtype {
            DType::F64 => f.to_bits(),
            DType::F32 => (f as f32).to_bits() as u64,
            DType::F16 => half::f16::from_f64(f).to_bits() as u64,
            DType::Bf16 => half::bf16::from_f64(f).to_bits() as u64,
            DType::Bool => {
                (if matches!(self, Scalar::F64(_)) {
                    f != 0.0
                } else {
                    i != 0
                }) as u64
            }
            DType::I8 => int(i8::MIN as i64, i8::MAX as i64) as u8 as u64,
            DType::U8 => int(0, u8::MAX as i64) as u8 as u64,
            DType::I16 => int(i16::MIN as i64, i16::MAX as i64) as u16 as u64,
            DType::I32 => int(i32::MIN as i64, i32::MAX as i64) as u32 as u64,
            DType::U32 => int(0, u32::MAX as i64) as u32 as u64,
            DType::I64 => i as u64,
            DType::U64 => match self {
                Scalar::F64(v) => v as u64,
                Scalar::I64(v) => v as u64,
            },
        }
    }
}

/// State of the random ops' generator. On devices with `OptionalCaps::bitwise_rng`, element `i` of
/// a call uses Philox4x32-10 counter block `offset + i`, key `seed`, so the same `(seed, offset)`
/// gives the same bits on every such backend; elsewhere the device's own generator gives the same
/// bits for the same `(seed, offset)` on the same device, and other bits for another seed or offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RngState {
    pub seed: u64,
    pub offset: u64,
}

/// A strided view of device memory as a tensor.
#[derive(Debug, Clone)]
pub struct TensorView {
    pub buffer: Buffer,
    /// Byte offset of element `[0, 0, ...]` within `buffer`.
    pub offset: u64,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Strides in elements, one per dim.
    pub strides: Vec<i64>,
}

/// Row-major strides (in elements) of a contiguous tensor of `shape`, saturating for shapes too
/// large to address (such a view never passes validation).
pub fn contiguous_strides(shape: &[u64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut s = 1i64;
    for (i, &d) in shape.iter().enumerate().rev() {
        strides[i] = s;
        s = s.saturating_mul(i64::try_from(d.max(1)).unwrap_or(i64::MAX));
    }
    strides
}

impl TensorView {
    /// A row-major contiguous view of the start of `buffer`.
    pub fn contiguous(buffer: &Buffer, dtype: DType, shape: &[u64]) -> TensorView {
        TensorView {
            buffer: buffer.clone(),
            offset: 0,
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
        }
    }

    /// The same view with other strides (in elements) and byte offset.
    pub fn strided(mut self, offset: u64, strides: &[i64]) -> TensorView {
        self.offset = offset;
        self.strides = strides.to_vec();
        self
    }

    /// Number of elements: 0 when any dim is 0, saturating at `u64::MAX` (a shape that large
    /// never passes validation, but asking is never a panic).
    pub fn numel(&self) -> u64 {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Element offsets `(lowest, highest)` reached by the view (`None` when empty).
    fn element_span(&self) -> Option<(i128, i128)> {
        if self.numel() == 0 {
            return None;
        }
        // Each reach is below 2^127 in size; the sums saturate (and then fail the range check).
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&d, &s) in self.shape.iter().zip(&self.strides) {
            let reach = (d as i128 - 1).saturating_mul(s as i128);
            if reach < 0 {
                lo = lo.saturating_add(reach)
            } else {
                hi = hi.saturating_add(reach)
            }
        }
        Some((lo, hi))
    }

    /// Byte range `[start, end)` of the buffer's device addresses spanned, after checking that the
    /// view's shape and strides agree and that every element lies inside the buffer.
    ///
    /// # Errors
    /// [`Invalid::Value`] for mismatched shape/strides or too many dims; [`Invalid::OutOfRange`]
    /// when an element falls outside the buffer.
    pub fn byte_span(&self, arg: &'static str) -> Result<Option<(u64, u64)>> {
        if self.shape.len() != self.strides.len() || self.shape.len() > MAX_DIMS {
            return Err(HalError::invalid(
                arg,
                Invalid::Value {
                    value: format!("shape {:?} with strides {:?}", self.shape, self.strides),
                    accepted: format!("as many strides as dims, at most {MAX_DIMS} dims"),
                },
            ));
        }
        let Some((lo, hi)) = self.element_span() else {
            return Ok(None);
        };
        let esz = self.dtype.size() as i128;
        let start = (self.offset as i128).saturating_add(lo.saturating_mul(esz));
        let end = (self.offset as i128).saturating_add(hi.saturating_add(1).saturating_mul(esz));
        if start < 0 || end > self.buffer.len() as i128 {
            let clamp = |v: i128| v.clamp(0, u64::MAX as i128) as u64;
            return Err(HalError::out_of_range(
                arg,
                clamp(start),
                clamp(end.saturating_sub(start)),
                self.buffer.len(),
            ));
        }
        let base = self.buffer.device_addr();
        Ok(Some((base + start as u64, base + end as u64)))
    }

    /// Strides of this view broadcast to `shape` (numpy rules), or `None` if it does not broadcast.
    pub fn broadcast_strides(&self, shape: &[u64]) -> Option<Vec<i64>> {
        if self.shape.len() > shape.len() {
            return None;
        }
        let lead = shape.len() - self.shape.len();
        let mut out = vec![0i64; shape.len()];
        for (i, (&d, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            let target = shape[lead + i];
            out[lead + i] = if d == target {
                if d == 1 {
                    0
                } else {
                    s
                }
            } else if d == 1 {
                0
            } else {
                return None;
            };
        }
        Some(out)
    }
}

/// One library operation: an op id plus its operands.
#[derive(Debug, Clone)]
pub struct OpCall {
    pub op: OpId,
    /// Inputs then outputs, as documented per [`OpId`].
    pub tensors: Vec<TensorView>,
    pub scalars: Vec<Scalar>,
    pub rng: Option<RngState>,
}

impl OpCall {
    fn new(
        op: OpId,
        tensors: Vec<TensorView>,
        scalars: Vec<Scalar>,
        rng: Option<RngState>,
    ) -> OpCall {
        OpCall {
            op,
            tensors,
            scalars,
            rng,
        }
    }
    /// `out = value`.
    pub fn fill(out: TensorView, value: Scalar) -> OpCall {
        Self::new(OpId::Fill, vec![out], vec![value], None)
    }
    /// `dst = src` (same dtype, `src` broadcasts).
    pub fn copy(src: TensorView, dst: TensorView) -> OpCall {
        Self::new(OpId::Copy, vec![src, dst], vec![], None)
    }
    /// `dst = src as dst.dtype`.
    pub fn cast(src: TensorView, dst: TensorView) -> OpCall {
        Self::new(OpId::Cast, vec![src, dst], vec![], None)
    }
    /// `y = op(x)` for a unary op.
    pub fn unary(op: OpId, x: TensorView, y: TensorView) -> OpCall {
        Self::new(op, vec![x, y], vec![], None)
    }
    /// `dx = dy * op'(x)` for a unary backward op.
    pub fn unary_backward(op: OpId, x: TensorView, dy: TensorView, dx: TensorView) -> OpCall {
        Self::new(op, vec![x, dy, dx], vec![], None)
    }
    /// `out = op(a, b)` with broadcasting.
    pub fn binary(op: OpId, a: TensorView, b: TensorView, out: TensorView) -> OpCall {
        Self::new(op, vec![a, b, out], vec![], None)
    }
    /// `out = op(a, b)` for a `*_scalar` op.
    pub fn binary_scalar(op: OpId, a: TensorView, b: Scalar, out: TensorView) -> OpCall {
        Self::new(op, vec![a, out], vec![b], None)
    }
    /// `y = alpha * x + y`.
    pub fn axpy(alpha: Scalar, x: TensorView, y: TensorView) -> OpCall {
        Self::new(OpId::Axpy, vec![x, y], vec![alpha], None)
    }
    /// `out = cond ? a : b`.
    pub fn where_(cond: TensorView, a: TensorView, b: TensorView, out: TensorView) -> OpCall {
        Self::new(OpId::Where, vec![cond, a, b, out], vec![], None)
    }
    /// Uniform random numbers in `[low, high)`.
    pub fn uniform(out: TensorView, low: f64, high: f64, rng: RngState) -> OpCall {
        Self::new(
            OpId::RandomUniform,
            vec![out],
            vec![Scalar::F64(low), Scalar::F64(high)],
            Some(rng),
        )
    }
    /// Normal random numbers.
    pub fn normal(out: TensorView, mean: f64, std: f64, rng: RngState) -> OpCall {
        Self::new(
            OpId::RandomNormal,
            vec![out],
            vec![Scalar::F64(mean), Scalar::F64(std)],
            Some(rng),
        )
    }
    /// Dropout forward: `out = keep ? x / (1-p) : 0`, `mask = keep`.
    pub fn dropout(
        x: TensorView,
        out: TensorView,
        mask: TensorView,
        p: f64,
        rng: RngState,
    ) -> OpCall {
        Self::new(
            OpId::DropoutForward,
            vec![x, out, mask],
            vec![Scalar::F64(p)],
            Some(rng),
        )
    }
    /// Dropout backward: `dx = mask ? dy / (1-p) : 0`.
    pub fn dropout_backward(dy: TensorView, mask: TensorView, dx: TensorView, p: f64) -> OpCall {
        Self::new(
            OpId::DropoutBackward,
            vec![dy, mask, dx],
            vec![Scalar::F64(p)],
            None,
        )
    }

    /// The dtype support is keyed on: the first output's dtype for elementwise ops; the main
    /// input's (x, logits, a, table, the gradients) for the others.
    pub fn key_dtype(&self) -> Option<DType> {
        let class = self.op.class();
        let k = if class.is_elementwise() {
            class.arity().3
        } else {
            nn::key_operand(class)
        };
        self.tensors.get(k).map(|t| t.dtype)
    }

    /// The tensors the op writes, as indices into `tensors`: the outputs (from the class's first
    /// output on), and for the in-place multi-tensor classes every tensor they update (optimizer
    /// steps and `amp_unscale`/`clip_grad_norm` write every tensor; `amp_update_scale` its scale and
    /// growth tracker). The others are only read. The one statement of this rule: validation
    /// ([`OpCall::validate`]) and a validation layer's access tracking both use it.
    pub fn outputs(&self) -> std::ops::Range<usize> {
        let n = self.tensors.len();
        match self.op.class() {
            OpClass::Optimizer | OpClass::AmpUnscale | OpClass::ClipGradNorm => 0..n,
            OpClass::AmpUpdateScale => 0..n.min(2),
            class => class.arity().3.min(n)..n,
        }
    }

    /// Checks the call against the rules in the module docs and returns the output shape.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for a wrong number of operands, mismatched dtypes or shapes,
    /// views outside their buffers, out-of-range scalars, or partial overlap between an output and
    /// another operand.
    pub fn validate(&self) -> Result<Vec<u64>> {
        let class = self.op.class();
        if !class.is_elementwise() {
            return nn::validate(self);
        }
        let (nt, ns, needs_rng, first_out) = class.arity();
        if self.tensors.len() != nt || self.scalars.len() != ns || self.rng.is_some() != needs_rng {
            return Err(HalError::invalid(
                "call",
                Invalid::Value {
                    value: format!(
                        "{} with {} tensors, {} scalars, rng {}",
                        self.op,
                        self.tensors.len(),
                        self.scalars.len(),
                        self.rng.is_some()
                    ),
                    accepted: format!("{nt} tensors, {ns} scalars, rng {needs_rng}"),
                },
            ));
        }
        let out_shape = self.tensors[first_out].shape.clone();
        // Dtypes.
        let dt: Vec<DType> = self.tensors.iter().map(|t| t.dtype).collect();
        let mask_ok = |d: DType| matches!(d, DType::Bool | DType::U8);
        let same = |idx: &[usize]| idx.iter().all(|&i| dt[i] == dt[first_out]);
        let dtypes_ok = match class {
            OpClass::Fill | OpClass::Random => true,
            OpClass::Cast => true,
            OpClass::Copy
            | OpClass::Unary
            | OpClass::Binary
            | OpClass::BinaryScalar
            | OpClass::Axpy
            | OpClass::UnaryBackward => same(&(0..nt).collect::<Vec<_>>()),
            OpClass::Where => mask_ok(dt[0]) && same(&[1, 2]),
            OpClass::DropoutForward => dt[0] == dt[1] && mask_ok(dt[2]),
            OpClass::DropoutBackward => dt[0] == dt[2] && mask_ok(dt[1]),
            _ => unreachable!("non-elementwise classes are validated in nn.rs"),
        };
        if !dtypes_ok {
            return Err(HalError::invalid(
                "tensors",
                Invalid::Value {
                    value: format!(
                        "{} with dtypes {:?}",
                        self.op,
                        dt.iter().map(|d| d.name()).collect::<Vec<_>>()
                    ),
                    accepted: "matching dtypes (masks and conditions: bool or u8)".into(),
                },
            ));
        }
        // Spans (bounds) and broadcasting.
        let mut spans = Vec::with_capacity(nt);
        for (i, t) in self.tensors.iter().enumerate() {
            let arg = if i >= first_out { "output" } else { "input" };
            spans.push(t.byte_span(arg)?);
            let bcast = if i >= first_out {
                t.shape == out_shape
            } else {
                t.broadcast_strides(&out_shape).is_some()
            };
            if !bcast {
                return Err(HalError::invalid(
                    arg,
                    Invalid::Value {
                        value: format!("shape {:?} (operand {i} of {})", t.shape, self.op),
                        accepted: format!(
                            "a shape that broadcasts to the output shape {out_shape:?}"
                        ),
                    },
                ));
            }
        }
        // Outputs: no self-overlap.
        for t in &self.tensors[first_out..] {
            if !non_overlapping(&t.shape, &t.strides) {
                return Err(HalError::invalid(
                    "output",
                    Invalid::Value {
                        value: format!("shape {:?} with strides {:?}", t.shape, t.strides),
                        accepted: "an output whose elements do not overlap each other".into(),
                    },
                ));
            }
        }
        // Outputs vs everything else: exact alias or disjoint.
        for o in first_out..nt {
            for i in (0..nt).filter(|&i| i != o) {
                let (Some((os, oe)), Some((is, ie))) = (spans[o], spans[i]) else {
                    continue;
                };
                let allowed =
                    i < first_out && exact_alias(&self.tensors[o], &self.tensors[i], &out_shape);
                if os < ie && is < oe && !allowed {
                    return Err(HalError::invalid(
                        "output",
                        Invalid::Overlap {
                            src: is,
                            dst: os,
                            len: (oe.min(ie) - os.max(is)),
                        },
                    ));
                }
            }
        }
        // Scalars.
        if matches!(class, OpClass::DropoutForward | OpClass::DropoutBackward) {
            let p = self.scalars[0].as_f64();
            if !(0.0..1.0).contains(&p) {
                return Err(HalError::invalid(
                    "p",
                    Invalid::Value {
                        value: p.to_string(),
                        accepted: "[0, 1)".into(),
                    },
                ));
            }
        }
        Ok(out_shape)
    }
}

/// True when no two elements of a view with this shape and these strides share memory.
fn non_overlapping(shape: &[u64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true; // no elements
    }
    let mut dims: Vec<(u64, u64)> = shape
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| (d, s.unsigned_abs()))
        .collect();
    dims.sort_by_key(|&(_, s)| s);
    let mut extent = 1u64; // elements spanned by the dims so far
    for (d, s) in dims {
        if s < extent {
            return false;
        }
        extent = s.saturating_mul(d - 1).saturating_add(extent);
    }
    true
}

/// True when `a` and `b` provably share no element although their byte spans may interleave: two
/// views with the same dtype size, shape and positive strides (e.g. q, k and v of one fused QKV
/// buffer) whose elements fall in disjoint windows modulo some stride `r` that every outer stride
/// is a multiple of. Within a window of `r` elements each view touches `[offset, offset + extent)`
/// (modulo `r`), where `extent` spans its dims with strides below `r`. `false` means "not
/// proven", never "overlapping".
pub(crate) fn views_disjoint(a: &TensorView, b: &TensorView) -> bool {
    let esz = a.dtype.size() as i128;
    if esz != b.dtype.size() as i128 || a.shape != b.shape || a.strides != b.strides {
        return false;
    }
    let (pa, pb) = (
        (a.buffer.device_addr() + a.offset) as i128,
        (b.buffer.device_addr() + b.offset) as i128,
    );
    if (pb - pa) % esz != 0 {
        return false;
    }
    let delta = (pb - pa) / esz;
    let dims: Vec<(i128, i128)> = a
        .shape
        .iter()
        .zip(&a.strides)
        .filter(|(&d, _)| d > 1)
        .map(|(&d, &s)| (d as i128, s as i128))
        .collect();
    if dims.iter().any(|&(_, s)| s <= 0) {
        return false;
    }
    dims.iter().any(|&(_, r)| {
        let mut extent = 1i128;
        for &(d, s) in &dims {
            if s < r {
                extent += (d - 1) * s;
            } else if s % r != 0 {
                return false;
            }
        }
        let gap = delta.rem_euclid(r);
        extent <= r && gap >= extent && r - gap >= extent
    })
}

/// True when `a` (an output) and `b` address exactly the same elements in the same order.
fn exact_alias(a: &TensorView, b: &TensorView, shape: &[u64]) -> bool {
    // Both sides broadcast to the output shape: a size-1 dim's stride is irrelevant (0 on both),
    // so an in-place op on a tensor with size-1 dims is an exact alias too.
    a.buffer.device_addr() + a.offset == b.buffer.device_addr() + b.offset
        && a.dtype.size() == b.dtype.size()
        && b.broadcast_strides(shape).is_some()
        && b.broadcast_strides(shape) == a.broadcast_strides(shape)
}

/// A zero-length allocation for the HAL's unit tests: views of it exercise constructors,
/// accessors and the checks that come before any memory check; no byte is ever accessed.
#[cfg(test)]
pub(crate) fn no_memory() -> Buffer {
    struct NoMemory;
    // SAFETY: a zero-length allocation: no byte is ever accessed (only addresses compared).
    unsafe impl crate::DeviceAllocation for NoMemory {
        fn device(&self) -> crate::DeviceId {
            crate::DeviceId {
                backend: "test",
                ordinal: 0,
            }
        }
        fn addr(&self) -> u64 {
            4096
        }
        fn len(&self) -> u64 {
            0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }
    Buffer::from_allocation(NoMemory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_snake_case() {
        let mut names: Vec<_> = OpId::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), OpId::ALL.len());
    }

    #[test]
    fn overlap_detection() {
        assert!(non_overlapping(&[2, 3], &[3, 1]));
        assert!(non_overlapping(&[2, 3], &[1, 2]));
        assert!(non_overlapping(&[2, 3], &[-3, -1]));
        assert!(!non_overlapping(&[2, 3], &[0, 1]));
        assert!(!non_overlapping(&[4, 4], &[2, 1]));
        assert!(non_overlapping(&[4, 1], &[1, 0]));
        assert!(non_overlapping(&[1 << 40, 0, 1], &[0, 0, 0]));
    }

    /// q, k and v of one fused `(B, S, 3, H, D)` buffer share no element; shifted views do.
    #[test]
    fn fused_qkv_views_are_disjoint() {
        let buf = no_memory();
        let (s, h, d) = (5i64, 2i64, 8i64);
        let part = |elems: u64| {
            let mut v = TensorView::contiguous(&buf, DType::F32, &[2, 2, 5, 8]);
            v.offset = elems * 4;
            v.strides = vec![s * 3 * h * d, d, 3 * h * d, 1];
            v
        };
        let (q, k, v) = (part(0), part((h * d) as u64), part(2 * (h * d) as u64));
        assert!(views_disjoint(&q, &k) && views_disjoint(&k, &v) && views_disjoint(&q, &v));
        assert!(
            !views_disjoint(&q, &part(1)),
            "shifted by one element: overlapping"
        );
        assert!(!views_disjoint(&q, &q));
        let mut wider = part((h * d) as u64);
        wider.shape[3] = 9;
        assert!(
            !views_disjoint(&q, &wider),
            "different shapes are not proven"
        );
    }

    /// Huge shapes are never a panic: numel saturates, spans fail the range check.
    #[test]
    fn huge_shapes_are_errors_not_panics() {
        let b = no_memory();
        let huge = [1u64 << 40, 1 << 40, 1 << 40];
        let v = TensorView::contiguous(&b, DType::F32, &huge);
        assert_eq!(v.numel(), u64::MAX);
        let v0 = TensorView::contiguous(&b, DType::F32, &[1 << 40, 0, 1 << 40]);
        assert_eq!(v0.numel(), 0);
        assert_eq!(v0.byte_span("x").unwrap(), None);
        let extreme = v.clone().strided(u64::MAX, &[i64::MAX, i64::MIN, i64::MAX]);
        assert!(matches!(
            extreme.byte_span("x"),
            Err(HalError::InvalidArgument { .. })
        ));
        let wide = TensorView::contiguous(&b, DType::F64, &[u64::MAX; MAX_DIMS])
            .strided(0, &[i64::MAX; MAX_DIMS]);
        assert!(wide.byte_span("x").is_err());
    }
}
