//! The fused ops of a transformer block: scaled-dot-product attention (forward and backward) and
//! rotary position embeddings. Their calls are plain data like every op ([`OpCall`]); this file
//! gives their constructors and their validation. The fused residual add + norm ops sit with the
//! norms ([`super::nn`]).
//!
//! ## Attention
//!
//! `out = softmax(scale * q @ kᵀ + bias + causal mask) @ v` per batch and query head, computed
//! FlashAttention-2 style: key blocks stream past an online softmax, so no `(S, Sk)` score matrix
//! is ever stored; the forward pass saves the log-sum-exp of each query row (`lse`, natural log,
//! in the accumulation dtype, of the scaled and biased scores) for the backward pass, which
//! recomputes the probabilities from it.
//!
//! * **Shapes**: `q (B, Hq, S, D)`, `k` and `v (B, Hkv, Sk, D)`, `out` like `q`, `lse (B, Hq, S)`.
//!   Grouped-query attention: `Hq` is a multiple of `Hkv`, query head `h` reads key/value head
//!   `h / (Hq / Hkv)`. Head size `D` in `1..=256` ([`ATTENTION_MAX_HEAD`]).
//! * **Layout**: any strides, except that the head dim of `q`, `k`, `v`, `out` (and the
//!   gradients) is dense (stride 1), so `q`, `k` and `v` may be views of one fused QKV buffer.
//! * **Bias**: an additive tensor of `q`'s dtype that broadcasts to `(B, Hq, S, Sk)`, e.g. ALiBi
//!   slopes or a padding mask of 0 and `-inf` shaped `(B, 1, 1, Sk)` (PyTorch's boolean masks
//!   are this bias with `-inf` where the mask is false). Without a bias the operand slot holds any
//!   view (it is not read).
//! * **Causal**: key `j` is masked for query `i` when `j > i` (top-left aligned, as PyTorch's
//!   `is_causal`); masked key blocks are skipped, not computed.
//! * **Fully masked rows** (every score `-inf`, or `Sk == 0`): `out` is 0 and `lse` is `-inf`; the
//!   backward pass gives them zero gradients. (The unfused `softmax_masked` gives NaN there, as
//!   PyTorch's math path did before 2.5; fused kernels give 0, as `scaled_dot_product_attention`
//!   does now.)
//! * **Dropout** on the probabilities with probability `dropout_p` from the Philox generator
//!   ([`RngState`]): element `(b, h, i, j)` is kept when the uniform of counter `offset +
//!   ((b * Hq + h) * S + i) * Sk + j` is `>= dropout_p` and scaled by `1 / (1 - dropout_p)`. The
//!   backward pass regenerates the same mask from the same state. `lse` is that of the undropped
//!   probabilities.
//! * **Precision**: f16 and bf16 load, accumulate in f32 and round the output once; f64 in f64.
//! * **Determinism**: the backward pass uses no floating-point atomics. `dq` is summed over key
//!   positions in order; `dk` and `dv` over query heads of the group in order, then query
//!   positions in order; the results do not depend on the device's thread count.
//!
//! The backward pass takes `out` and `dout` (for `Dᵢ = rowsum(dout ∘ out)`), `lse`, and writes
//! `dq`, `dk`, `dv` (shaped like `q`, `k`, `v`; the bias gets no gradient).
//!
//! ## Rotary position embedding
//!
//! `y = x * cos + rotate(x) * sin` over the last dim `D` (even), where `cos` and `sin` have `x`'s
//! dtype, last dim `D` (dense) and broadcast to `x` (typically `(S, D)` against `(B, S, H, D)` or
//! `(S, 1, D)`), as Hugging Face's `apply_rotary_pos_emb` and Ascend's
//! `aclnnRotaryPositionEmbedding` take them. `rotate` pairs element `i` of the first half with
//! element `i` of the second half (`[-x₂, x₁]`, GPT-NeoX/LLaMA), or with `interleaved`, element
//! `2i` with `2i + 1` (`[-x₂ᵢ₊₁, x₂ᵢ]`, GPT-J). `RopeBackward` applies the transposed map:
//! `dx = dy * cos + rotateᵀ(dy * sin)`. No output may overlap an input.

use super::nn::{
    acc_dtype, broadcast, check_memory, scalar_in, value, want_dtype, want_row_dense, want_shape,
    FLOATS,
};
use super::{OpCall, OpClass, OpId, RngState, Scalar, TensorView};
use crate::error::Result;

/// Largest head size the attention ops take.
pub const ATTENTION_MAX_HEAD: u64 = 256;

/// The options of [`OpCall::attention`] and [`OpCall::attention_backward`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionOptions {
    /// Multiplies `q @ kᵀ` (usually `1 / sqrt(D)`); finite.
    pub scale: f64,
    /// Mask key `j > i` for query `i`.
    pub causal: bool,
    /// Dropout probability on the attention weights, in `[0, 1)`.
    pub dropout_p: f64,
    /// The generator state; required when `dropout_p > 0`.
    pub rng: Option<RngState>,
}

impl AttentionOptions {
    /// No causal mask, no dropout, scale `1 / sqrt(head_dim)`.
    pub fn new(head_dim: u64) -> AttentionOptions {
        AttentionOptions {
            scale: 1.0 / (head_dim.max(1) as f64).sqrt(),
            causal: false,
            dropout_p: 0.0,
            rng: None,
        }
    }
    fn scalars(&self, has_bias: bool) -> Vec<Scalar> {
        vec![
            Scalar::F64(self.scale),
            Scalar::I64(self.causal as i64),
            Scalar::F64(self.dropout_p),
            Scalar::I64(has_bias as i64),
        ]
    }
}

impl OpCall {
    /// Fused attention forward: `out` and the row log-sum-exp `lse`. Without `bias`, `q` fills
    /// the bias slot (not read).
    pub fn attention(
        q: TensorView,
        k: TensorView,
        v: TensorView,
        bias: Option<TensorView>,
        out: TensorView,
        lse: TensorView,
        o: AttentionOptions,
    ) -> OpCall {
        let s = o.scalars(bias.is_some());
        let bias = bias.unwrap_or_else(|| q.clone());
        Self::new(OpId::Attention, vec![q, k, v, bias, out, lse], s, o.rng)
    }

    /// Fused attention backward: `dq`, `dk`, `dv` from the forward's inputs, `out`, `lse` and the
    /// output gradient `dout`; `o` must be the forward's options (the same rng state regenerates
    /// the same dropout mask).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward(
        q: TensorView,
        k: TensorView,
        v: TensorView,
        bias: Option<TensorView>,
        out: TensorView,
        dout: TensorView,
        lse: TensorView,
        dq: TensorView,
        dk: TensorView,
        dv: TensorView,
        o: AttentionOptions,
    ) -> OpCall {
        let s = o.scalars(bias.is_some());
        let bias = bias.unwrap_or_else(|| q.clone());
        Self::new(
            OpId::AttentionBackward,
            vec![q, k, v, bias, out, dout, lse, dq, dk, dv],
            s,
            o.rng,
        )
    }

    /// Rotary embedding `y = x * cos + rotate(x) * sin` (`interleaved`: GPT-J pairs, else halves).
    pub fn rope(
        x: TensorView,
        cos: TensorView,
        sin: TensorView,
        y: TensorView,
        interleaved: bool,
    ) -> OpCall {
        Self::new(
            OpId::Rope,
            vec![x, cos, sin, y],
            vec![Scalar::I64(interleaved as i64)],
            None,
        )
    }

    /// The gradient of [`OpCall::rope`]: `dx = dy * cos + rotateᵀ(dy * sin)`.
    pub fn rope_backward(
        dy: TensorView,
        cos: TensorView,
        sin: TensorView,
        dx: TensorView,
        interleaved: bool,
    ) -> OpCall {
        Self::new(
            OpId::RopeBackward,
            vec![dy, cos, sin, dx],
            vec![Scalar::I64(interleaved as i64)],
            None,
        )
    }
}

/// The checks of Attention and AttentionBackward; the output shape is `q`'s.
pub(super) fn check_attention(call: &OpCall) -> Result<Option<Vec<u64>>> {
    let t = &call.tensors;
    let backward = call.op.class() == OpClass::AttentionBackward;
    want_dtype(call, 0, FLOATS, "q")?;
    let d0 = t[0].dtype;
    let has_bias = call.scalars[3].as_i64() != 0;
    // (index, name) of every tensor of q's dtype and of the gradients.
    let mut same: Vec<(usize, &'static str)> = vec![(1, "k"), (2, "v"), (4, "out")];
    if backward {
        same.extend([(5, "dout"), (7, "dq"), (8, "dk"), (9, "dv")]);
    }
    if has_bias {
        same.push((3, "bias"));
    }
    for &(k, name) in &same {
        want_dtype(call, k, &[d0], name)?;
    }
    let lse_k = if backward { 6 } else { 5 };
    want_dtype(call, lse_k, &[acc_dtype(d0)], "lse")?;
    let (q, k, v) = (&t[0].shape, &t[1].shape, &t[2].shape);
    let ok = q.len() == 4
        && k.len() == 4
        && k == v
        && k[0] == q[0]
        && k[3] == q[3]
        && (k[1] == 0 && q[1] == 0 || k[1] > 0 && q[1] % k[1] == 0);
    if !ok {
        return Err(value(
            "tensors",
            format!("attention of q {q:?} over k {k:?} and v {v:?}"),
            "q (B, Hq, S, D), k and v (B, Hkv, Sk, D) with Hq a multiple of Hkv",
        ));
    }
    let (b, hq, s, d) = (q[0], q[1], q[2], q[3]);
    let sk = k[2];
    if !(1..=ATTENTION_MAX_HEAD).contains(&d) {
        return Err(value(
            "q",
            format!("head size {d}"),
            format!("a head size in 1..={ATTENTION_MAX_HEAD}"),
        ));
    }
    want_shape(call, 4, q, "out")?;
    want_shape(call, lse_k, &[b, hq, s], "lse")?;
    let mut dense = vec![0, 1, 2, 4];
    if backward {
        want_shape(call, 5, q, "dout")?;
        want_shape(call, 7, q, "dq")?;
        want_shape(call, 8, k, "dk")?;
        want_shape(call, 9, k, "dv")?;
        dense.extend([5, 7, 8, 9]);
    }
    for k in dense {
        want_row_dense(call, k)?;
    }
    if has_bias {
        let full = [b, hq, s, sk];
        if broadcast(&t[3].shape, &full).as_deref() != Some(&full[..]) {
            return Err(value(
                "bias",
                format!("shape {:?}", t[3].shape),
                format!("a shape that broadcasts to (B, Hq, S, Sk) = {full:?}"),
            ));
        }
    }
    scalar_in(call, 0, "scale", f64::is_finite, "a finite scale")?;
    let causal = call.scalars[1].as_i64();
    if !(0..=1).contains(&causal) {
        return Err(value("causal", causal.to_string(), "0 or 1"));
    }
    let p = scalar_in(call, 2, "dropout_p", |p| (0.0..1.0).contains(&p), "[0, 1)")?;
    if p > 0.0 && call.rng.is_none() {
        return Err(value(
            "rng",
            format!("dropout_p {p} without a generator state"),
            "an rng state whenever dropout_p > 0",
        ));
    }
    let flag = call.scalars[3].as_i64();
    if !(0..=1).contains(&flag) {
        return Err(value("has_bias", flag.to_string(), "0 or 1"));
    }
    check_memory(call, call.outputs(), false)?;
    Ok(Some(q.clone()))
}

/// The checks of Rope and RopeBackward; the output shape is `x`'s.
pub(super) fn check_rope(call: &OpCall) -> Result<Option<Vec<u64>>> {
    let t = &call.tensors;
    want_dtype(call, 0, FLOATS, "x")?;
    let d0 = t[0].dtype;
    for (k, name) in [(1, "cos"), (2, "sin"), (3, "y")] {
        want_dtype(call, k, &[d0], name)?;
    }
    let x = &t[0].shape;
    let Some(&d) = x.last() else {
        return Err(value("x", "a 0-d tensor".into(), "at least one dim"));
    };
    if d % 2 != 0 {
        return Err(value(
            "x",
            format!("last dim {d}"),
            "an even last dim (pairs rotate together)",
        ));
    }
    want_shape(call, 3, x, "y")?;
    for k in [0, 1, 2, 3] {
        want_row_dense(call, k)?;
    }
    for (k, name) in [(1, "cos"), (2, "sin")] {
        let c = &t[k].shape;
        if c.last() != Some(&d) || broadcast(c, x).as_deref() != Some(&x[..]) {
            return Err(value(
                name,
                format!("shape {c:?} against x {x:?}"),
                format!("last dim {d} and a shape that broadcasts to x's"),
            ));
        }
    }
    let flag = call.scalars[0].as_i64();
    if !(0..=1).contains(&flag) {
        return Err(value("interleaved", flag.to_string(), "0 or 1"));
    }
    check_memory(call, call.outputs(), false)?;
    Ok(Some(x.clone()))
}

/// Philox4x32-10 on a 128-bit counter and a 64-bit key: the generator of the random ops, for a
/// backend that must reproduce a mask on the host (a vendor operator that takes the dropout mask as
/// an input, such as Ascend's `aclnnFlashAttentionScore`).
pub fn philox(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for r in 0..10 {
        if r > 0 {
            k[0] = k[0].wrapping_add(0x9E37_79B9);
            k[1] = k[1].wrapping_add(0xBB67_AE85);
        }
        let p0 = 0xD251_1F53u64 * c[0] as u64;
        let p1 = 0xCD9E_8D57u64 * c[2] as u64;
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// Whether attention dropout with probability `p` keeps element `c` (the linear index
/// `((b * Hq + h) * S + i) * Sk + j`) under `rng`: the top 24 bits of the first word of Philox
/// block `rng.offset + c` (key `rng.seed`) as a float in `[0, 1)`, compared `>= p` in f32 — the
/// rule every backend's mask follows.
pub fn attention_keeps(rng: RngState, c: u64, p: f64) -> bool {
    let ctr = rng.offset.wrapping_add(c);
    let r = philox(
        [ctr as u32, (ctr >> 32) as u32, 0, 0],
        [rng.seed as u32, (rng.seed >> 32) as u32],
    );
    (r[0] >> 8) as f32 * 2f32.powi(-24) >= p as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::Buffer;
    use crate::dtype::DType;
    use crate::error::{HalError, Invalid};

    fn view(buf: &Buffer, d: DType, shape: &[u64]) -> TensorView {
        TensorView::contiguous(buf, d, shape)
    }

    fn err_arg(r: Result<Vec<u64>>) -> String {
        match r {
            Err(HalError::InvalidArgument { arg, reason, .. }) => {
                assert!(matches!(reason, Invalid::Value { .. }), "{reason:?}");
                arg.to_string()
            }
            other => panic!("expected an invalid argument, got {other:?}"),
        }
    }

    #[test]
    fn philox_matches_the_random123_known_answer() {
        assert_eq!(
            philox([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        let rng = RngState { seed: 0, offset: 0 };
        assert!(attention_keeps(rng, 0, 0.0) && !attention_keeps(rng, 0, 1.0));
    }

    #[test]
    fn attention_shapes_heads_and_dropout_are_checked() {
        let buf = crate::op::no_memory();
        let q = || view(&buf, DType::F32, &[2, 4, 8, 16]);
        let kv = |h: u64| view(&buf, DType::F32, &[2, h, 8, 16]);
        let lse = view(&buf, DType::F32, &[2, 4, 8]);
        let o = AttentionOptions::new(16);
        // Outputs overlap the inputs here: the shape checks come first.
        let call = |k, v, o| OpCall::attention(q(), k, v, None, q(), lse.clone(), o);
        assert_eq!(err_arg(call(kv(3), kv(3), o).validate()), "tensors");
        let big = view(&buf, DType::F32, &[1, 1, 1, 512]);
        let c = OpCall::attention(
            big.clone(),
            big.clone(),
            big.clone(),
            None,
            big,
            lse.clone(),
            o,
        );
        assert_eq!(err_arg(c.validate()), "q");
        let drop = AttentionOptions {
            dropout_p: 0.1,
            ..o
        };
        assert_eq!(err_arg(call(kv(2), kv(2), drop).validate()), "rng");
        let bad_p = AttentionOptions {
            dropout_p: 1.0,
            ..o
        };
        assert_eq!(err_arg(call(kv(2), kv(2), bad_p).validate()), "dropout_p");
        let x = view(&buf, DType::F32, &[2, 5]);
        let cs = view(&buf, DType::F32, &[5]);
        let r = OpCall::rope(x.clone(), cs.clone(), cs, x.clone(), false);
        assert_eq!(err_arg(r.validate()), "x");
        let x = view(&buf, DType::F32, &[2, 3, 4]);
        let cs = view(&buf, DType::F32, &[2, 1, 4]);
        let short = view(&buf, DType::F32, &[3, 2]);
        let r = OpCall::rope(x.clone(), cs, short, x, true);
        assert_eq!(err_arg(r.validate()), "sin");
    }
}
