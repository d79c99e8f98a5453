//! The transformer-block ops as aclnn operators: attention through `aclnnFlashAttentionScore`
//! and its `Grad`, rotary embeddings through `aclnnRotaryPositionEmbedding` and its `Grad`,
//! residual add + norm through `aclnnAddLayerNorm` / `aclnnAddRmsNorm` (or `Add` then
//! `LayerNorm` where the fused operator is missing: the Atlas training series).
//!
//! Attention, HAL to aclnn:
//! * layout `"BNSD"`, `headNum = Hq`; GQA passes as it is (the operator takes `Nq / Nkv` groups).
//! * causal (top-left) is `sparseMode` 2 (leftUpCausal) with the compressed 2048 × 2048 mask the
//!   docs prescribe (1 above the diagonal = masked), uploaded per call.
//! * the additive bias: the operator computes `scale * (q kᵀ + pse)`, so the bias goes in as
//!   `pseShift = bias / scale`, materialised at `(B, Hq, S, Sk)` (the documented pse shapes do not
//!   cover every broadcast). `-inf` entries stay `-inf`. A scale of 0 has no such pse: refused
//!   (Unsupported). With f16/bf16 and a scale that is not a power of two, `bias / scale` would
//!   be rounded to the dtype, so the whole call runs in f32 (inputs cast, outputs cast back once).
//!   With a bias, `innerPrecise` 2 (the docs' "invalid row" computation: a bias may mask a whole
//!   row).
//! * statistics: the operator saves the softmax max and sum (`[B, N, S, 8]`, FLOAT), not a
//!   log-sum-exp: `lse = max + ln(sum)` after the forward; for the backward, `max = lse`
//!   (broadcast over the 8) and `sum = 1`, which give the same probabilities
//!   `exp(s - max) / sum`.
//! * dropout: `dropMask` is an input bit mask, so the HAL's mask is generated here, on the host,
//!   from the documented Philox counter scheme (`hal/src/op/transformer.rs`) and uploaded:
//!   `keepProb = 1 - p`, bit `i % 8` of byte `i / 8` for element `i = ((b * Hq + h) * S + i) * Sk
//!   + j` (least significant first: assumed, the layout is not documented, as for
//!   `aclnnDropoutDoMask`), `ceil(n / 128) * 16` bytes. The same mask in forward and backward.
//! * `Sk == 0`: the operator takes `S` from 1, so out is 0, lse `-inf` and dq 0 without it.

use super::desc::Descs;
use super::Exec;
use crate::ops::soc::{classify, Class};
use unihal_hal::op::transformer::attention_keeps;
use unihal_hal::{
    op::contiguous_strides, DType, HalError, OpCall, OpId, Result, Scalar, Stream, TensorView,
};

type D = crate::ffi::nnopbase::Desc;

fn f(v: f64) -> Scalar {
    Scalar::F64(v)
}

/// A view of `t` broadcast to `shape` (its dims right-aligned; 0 strides where it has 1 or no dim).
fn broadcast_to(t: &TensorView, shape: &[u64]) -> TensorView {
    let (n, r) = (shape.len(), t.shape.len());
    let mut strides = vec![0i64; n];
    for k in 0..r.min(n) {
        let (td, ts) = (t.shape[r - 1 - k], t.strides[r - 1 - k]);
        if td == shape[n - 1 - k] && td != 1 {
            strides[n - 1 - k] = ts;
        }
    }
    TensorView {
        shape: shape.to_vec(),
        strides,
        ..t.clone()
    }
}

/// Whether `v` is ± a power of two (dividing by it is exact).
fn power_of_two(v: f64) -> bool {
    v.is_normal() && v.to_bits() & ((1u64 << 52) - 1) == 0
}

/// What the forward and backward attention calls share.
struct Fa {
    /// The dtype the operator runs in: q's, or f32 (see the module's notes).
    work: DType,
    pse: Option<TensorView>,
    mask: Option<TensorView>,
    drop: Option<TensorView>,
    keep: f64,
    sparse: i64,
    inner: i64,
    b: u64,
    hq: u64,
    s: u64,
}

impl Exec<'_> {
    /// A device tensor holding `bytes`, uploaded in this stream's order. In a probe (phase 1
    /// only, nothing runs), a view of `shape` with zero strides over one element.
    fn upload(&mut self, bytes: &[u8], dtype: DType, shape: &[u64]) -> Result<TensorView> {
        if self.probe.is_some() {
            let t = self.temp(dtype, &[1])?;
            return Ok(TensorView {
                shape: shape.to_vec(),
                strides: vec![0; shape.len()],
                ..t
            });
        }
        let t = self.temp(dtype, shape)?;
        self.stream.copy_h2d_staged(bytes, &t.buffer, t.offset)?;
        Ok(t)
    }

    fn in_dtype(&mut self, t: &TensorView, d: DType) -> Result<TensorView> {
        if t.dtype == d {
            return Ok(t.clone());
        }
        let tmp = self.temp(d, &t.shape)?;
        self.cast(t, &tmp)?;
        Ok(tmp)
    }

    fn fa_setup(&mut self, call: &OpCall) -> Result<Fa> {
        let t = &call.tensors;
        let (o, has_bias) = call.attention_options()?;
        let (q, k) = (&t[0], &t[1]);
        let (b, hq, s) = (q.shape[0], q.shape[1], q.shape[2]);
        let sk = k.shape[2];
        let half = matches!(q.dtype, DType::F16 | DType::Bf16);
        let work = if has_bias && half && !power_of_two(o.scale) {
            DType::F32
        } else {
            q.dtype
        };
        let pse = if has_bias {
            if o.scale == 0.0 {
                return Err(HalError::unsupported(
                    "attention with a bias and scale 0 on Ascend: aclnnFlashAttentionScore adds \
                     pseShift before scaling (scale * (q kT + pse)), so no pse gives the bias",
                ));
            }
            let full = [b, hq, s, sk];
            let bias = broadcast_to(&t[3], &full);
            let bias = if bias.dtype == work {
                bias
            } else {
                let tmp = self.temp(work, &full)?;
                self.cast(&bias, &tmp)?;
                tmp
            };
            let pse = self.temp(work, &full)?;
            self.scalar_op(OpId::DivScalar, &bias, f(o.scale), &pse)?;
            Some(pse)
        } else {
            None
        };
        let (mask, sparse) = if o.causal {
            const M: usize = 2048;
            let mut bytes = vec![0u8; M * M];
            if self.probe.is_none() {
                for (i, row) in bytes.chunks_mut(M).enumerate() {
                    row[i + 1..].fill(1);
                }
            }
            (
                Some(self.upload(&bytes, DType::U8, &[M as u64, M as u64])?),
                2,
            )
        } else {
            (None, 0)
        };
        let (drop, keep) = if o.dropout_p > 0.0 {
            let rng = o.rng.ok_or_else(|| {
                HalError::Internal("attention dropout without an rng state".into())
            })?;
            let n = b * hq * s * sk;
            let mut bytes = vec![0u8; (n.div_ceil(128) * 16) as usize];
            if self.probe.is_none() {
                for c in 0..n {
                    if attention_keeps(rng, c, o.dropout_p) {
                        bytes[(c / 8) as usize] |= 1 << (c % 8);
                    }
                }
            }
            let len = bytes.len() as u64;
            (
                Some(self.upload(&bytes, DType::U8, &[len])?),
                1.0 - o.dropout_p,
            )
        } else {
            (None, 1.0)
        };
        Ok(Fa {
            work,
            pse,
            mask,
            drop,
            keep,
            sparse,
            inner: if has_bias { 2 } else { 0 },
            b,
            hq,
            s,
        })
    }

    /// `Attention` through `aclnnFlashAttentionScore`.
    pub(super) fn attention(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let (q, k, v, out, lse) = (&t[0], &t[1], &t[2], &t[4], &t[5]);
        let (o, _) = call.attention_options()?;
        if k.shape[2] == 0 {
            self.fill(out, f(0.0))?;
            return self.fill(lse, f(f64::NEG_INFINITY));
        }
        let fa = self.fa_setup(call)?;
        let w = fa.work;
        let (qw, kw, vw) = (
            self.in_dtype(q, w)?,
            self.in_dtype(k, w)?,
            self.in_dtype(v, w)?,
        );
        let ow = if w == out.dtype {
            out.clone()
        } else {
            self.temp(w, &out.shape)?
        };
        let stats = [fa.b, fa.hq, fa.s, 8];
        let (mx, sm) = (
            self.temp(DType::F32, &stats)?,
            self.temp(DType::F32, &stats)?,
        );
        let none = self.temp(w, &[0])?;
        {
            let mut d = Descs::new(self.cann);
            let (qd, kd, vd) = (d.tensor(&qw), d.tensor(&kw), d.tensor(&vw));
            let null: D = std::ptr::null_mut();
            let pd = fa.pse.as_ref().map_or(null, |p| d.tensor(p));
            let dd = fa.drop.as_ref().map_or(null, |p| d.tensor(p));
            let md = fa.mask.as_ref().map_or(null, |p| d.tensor(p));
            let (xd, sd, nd, od) = (d.tensor(&mx), d.tensor(&sm), d.tensor(&none), d.tensor(&ow));
            let lay = d.string("BNSD");
            let (scale, keep, sparse, inner) = (o.scale, fa.keep, fa.sparse, fa.inner);
            let heads = fa.hq as i64;
            let op = self.cann.aclnn.flash_attention_score;
            // SAFETY: live descriptors of `d` (NULL for the absent optionals, prefix and
            // paddingMask), the layout string kept by `d`, the out-pointers of `call`.
            self.call(op, "FlashAttentionScore", d, |fun, ws, e| unsafe {
                fun(
                    qd,
                    kd,
                    vd,
                    pd,
                    dd,
                    null,
                    md,
                    null,
                    scale,
                    keep,
                    i32::MAX as i64,
                    i32::MAX as i64,
                    heads,
                    lay,
                    inner,
                    sparse,
                    xd,
                    sd,
                    nd,
                    od,
                    ws,
                    e,
                )
            })?;
        }
        if w != out.dtype {
            self.cast(&ow, out)?;
        }
        // lse = max + ln(sum), from the first of each row's 8 copies.
        let (hq, s) = (fa.hq as i64, fa.s as i64);
        let col = |t: &TensorView| TensorView {
            shape: vec![fa.b, fa.hq, fa.s],
            strides: vec![hq * s * 8, s * 8, 8],
            ..t.clone()
        };
        let ln = self.temp(DType::F32, &[fa.b, fa.hq, fa.s])?;
        self.unary(OpId::Log, &col(&sm), &ln)?;
        self.add(&col(&mx), &ln, 1.0, lse, false)
    }

    /// `AttentionBackward` through `aclnnFlashAttentionScoreGrad`.
    pub(super) fn attention_backward(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let (q, k, v, out, dout, lse) = (&t[0], &t[1], &t[2], &t[4], &t[5], &t[6]);
        let (dq, dk, dv) = (&t[7], &t[8], &t[9]);
        let (o, _) = call.attention_options()?;
        if k.shape[2] == 0 {
            return self.fill(dq, f(0.0)); // dk and dv have no element
        }
        let fa = self.fa_setup(call)?;
        let w = fa.work;
        // max = lse over the 8 copies, sum = 1: exp(s - max) / sum is the same probability.
        let stats = [fa.b, fa.hq, fa.s, 8];
        let (mx, sm) = (
            self.temp(DType::F32, &stats)?,
            self.temp(DType::F32, &stats)?,
        );
        let mut l8 = broadcast_to(lse, &stats);
        l8.strides[..3].copy_from_slice(&lse.strides);
        self.copy(&l8, &mx)?;
        self.fill(&sm, f(1.0))?;
        let ins: Vec<TensorView> = [q, k, v, out, dout]
            .into_iter()
            .map(|x| self.in_dtype(x, w))
            .collect::<Result<_>>()?;
        let outs: Vec<TensorView> = [dq, dk, dv]
            .into_iter()
            .map(|x| {
                if x.dtype == w {
                    Ok(x.clone())
                } else {
                    self.temp(w, &x.shape)
                }
            })
            .collect::<Result<_>>()?;
        let none = self.temp(w, &[0])?;
        {
            let mut d = Descs::new(self.cann);
            let (qd, kd, vd, od, gd) = (
                d.tensor(&ins[0]),
                d.tensor(&ins[1]),
                d.tensor(&ins[2]),
                d.tensor(&ins[3]),
                d.tensor(&ins[4]),
            );
            let null: D = std::ptr::null_mut();
            let pd = fa.pse.as_ref().map_or(null, |p| d.tensor(p));
            let dd = fa.drop.as_ref().map_or(null, |p| d.tensor(p));
            let md = fa.mask.as_ref().map_or(null, |p| d.tensor(p));
            let (xd, sd) = (d.tensor(&mx), d.tensor(&sm));
            let (dqd, dkd, dvd, nd) = (
                d.tensor(&outs[0]),
                d.tensor(&outs[1]),
                d.tensor(&outs[2]),
                d.tensor(&none),
            );
            let lay = d.string("BNSD");
            let (scale, keep, sparse, inner) = (o.scale, fa.keep, fa.sparse, fa.inner);
            let heads = fa.hq as i64;
            let op = self.cann.aclnn.flash_attention_score_grad;
            // SAFETY: as in `attention` (softmaxIn, paddingMask and prefix NULL).
            self.call(op, "FlashAttentionScoreGrad", d, |fun, ws, e| unsafe {
                fun(
                    qd,
                    kd,
                    vd,
                    gd,
                    pd,
                    dd,
                    null,
                    md,
                    xd,
                    sd,
                    null,
                    od,
                    null,
                    scale,
                    keep,
                    i32::MAX as i64,
                    i32::MAX as i64,
                    heads,
                    lay,
                    inner,
                    sparse,
                    dqd,
                    dkd,
                    dvd,
                    nd,
                    ws,
                    e,
                )
            })?;
        }
        for (tmp, dst) in outs.iter().zip([dq, dk, dv]) {
            if tmp.dtype != dst.dtype {
                self.cast(tmp, dst)?;
            }
        }
        Ok(())
    }

    /// `Rope` and `RopeBackward` through `aclnnRotaryPositionEmbedding(Grad)`: x as 4-D, cos
    /// and sin broadcast with 0 strides to a pattern the docs list (half mode: x's shape;
    /// interleave: one varying dim besides D); when no view fits (more than 4 dims, or an
    /// interleaved cos varying along two dims) everything goes through dense `(1, 1, M, D)`
    /// copies. The output is contiguous (the docs: no non-contiguous out), written back.
    pub(super) fn rope(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let backward = call.op == OpId::RopeBackward;
        let inter = call.rope_interleaved()?;
        let (x, cos, sin, y) = (&t[0], &t[1], &t[2], &t[3]);
        let r = x.shape.len();
        let dl = x.shape[r - 1];
        if dl >= 896 {
            return Err(HalError::unsupported(format!(
                "rope with a last dim of {dl} on Ascend: aclnnRotaryPositionEmbedding takes D below 896"
            )));
        }
        // 4-D x: leading 1s.
        let pad = |v: &TensorView| -> (Vec<u64>, Vec<i64>) {
            let n = v.shape.len();
            let mut shape = vec![1u64; 4 - n.min(4)];
            let mut strides = vec![0i64; 4 - n.min(4)];
            shape.extend(&v.shape);
            strides.extend(&v.strides);
            (shape, strides)
        };
        let cos_varying = cos.shape[..cos.shape.len() - 1]
            .iter()
            .filter(|&&c| c != 1)
            .count();
        let direct = r <= 4 && (!inter || cos_varying <= 1);
        let (xv, cv, sv, x4, c4) = if direct {
            let (x4, xs) = pad(x);
            // cos right-aligned to x, then to 4-D.
            let want: Vec<u64> = if inter {
                // One varying dim besides D: cos's own, else the last leading dim of x above 1.
                let mut w = broadcast_to(cos, &x.shape).shape;
                let varying: Vec<usize> = (0..r - 1)
                    .filter(|&k| {
                        let off = r - cos.shape.len();
                        k >= off && cos.shape[k - off] != 1
                    })
                    .collect();
                let keep = varying
                    .first()
                    .copied()
                    .or_else(|| (0..r - 1).rev().find(|&k| x.shape[k] > 1));
                for (k, wk) in w.iter_mut().enumerate().take(r - 1) {
                    if Some(k) != keep {
                        *wk = 1;
                    }
                }
                w
            } else {
                x.shape.clone()
            };
            let cb = broadcast_to(cos, &want);
            let sb = broadcast_to(sin, &want);
            let (c4, _) = pad(&cb);
            let xv = TensorView {
                shape: x4.clone(),
                strides: xs,
                ..x.clone()
            };
            let four = |v: TensorView| {
                let (shape, strides) = pad(&v);
                TensorView {
                    shape,
                    strides,
                    ..v
                }
            };
            (xv, four(cb), four(sb), x4, c4)
        } else {
            let m = x.numel() / dl.max(1);
            let shape4 = vec![1, 1, m, dl];
            let dense = |ex: &mut Self, v: &TensorView| -> Result<TensorView> {
                let tmp = ex.temp(v.dtype, &x.shape)?;
                ex.copy(&broadcast_to(v, &x.shape), &tmp)?;
                Ok(TensorView {
                    shape: shape4.clone(),
                    strides: contiguous_strides(&shape4),
                    ..tmp
                })
            };
            let (xv, cv, sv) = (dense(self, x)?, dense(self, cos)?, dense(self, sin)?);
            (xv, cv, sv, shape4.clone(), shape4)
        };
        let tmp = self.temp(y.dtype, &y.shape)?;
        let out4 = TensorView {
            shape: x4.clone(),
            strides: contiguous_strides(&x4),
            ..tmp.clone()
        };
        let mode = inter as i64;
        if backward {
            let (dc, ds) = (self.temp(y.dtype, &c4)?, self.temp(y.dtype, &c4)?);
            let mut d = Descs::new(self.cann);
            let (gd, cd, sd, od) = (d.tensor(&xv), d.tensor(&cv), d.tensor(&sv), d.tensor(&out4));
            let (dcd, dsd) = (d.tensor(&dc), d.tensor(&ds));
            let null: D = std::ptr::null_mut();
            let op = self.cann.aclnn.rotary_position_embedding_grad;
            // SAFETY: live descriptors of `d` (xOptional NULL: no dcos/dsin wanted), the
            // out-pointers of `call`.
            self.call(op, "RotaryPositionEmbeddingGrad", d, |fun, ws, e| unsafe {
                fun(gd, cd, sd, null, mode, od, dcd, dsd, ws, e)
            })?;
        } else {
            let mut d = Descs::new(self.cann);
            let (xd, cd, sd, od) = (d.tensor(&xv), d.tensor(&cv), d.tensor(&sv), d.tensor(&out4));
            let op = self.cann.aclnn.rotary_position_embedding;
            // SAFETY: live descriptors of `d`, the out-pointers of `call`.
            self.call(op, "RotaryPositionEmbedding", d, |fun, ws, e| unsafe {
                fun(xd, cd, sd, mode, od, ws, e)
            })?;
        }
        self.copy(&tmp, y)
    }

    /// `AddLayerNorm` and `AddRmsNorm`: the fused operators on the A2/A3, `Add` then
    /// `LayerNorm` elsewhere (the Atlas training series has no fused add + norm; its tables
    /// leave `AddRmsNorm` out, having no RMS norm).
    pub(super) fn add_norm(&mut self, call: &OpCall) -> Result<()> {
        let t = &call.tensors;
        let eps = call.norm_eps()?;
        let fused = matches!(classify(&self.cann.soc), Class::A2 | Class::A3);
        let keep = |v: &TensorView| {
            let mut v = v.clone();
            v.shape.push(1);
            v.strides.push(1);
            v
        };
        if call.op == OpId::AddRmsNorm {
            let (x, r, w, h, y, rstd) = (&t[0], &t[1], &t[2], &t[3], &t[4], &t[5]);
            let mut d = Descs::new(self.cann);
            let (xd, rd, wd, hd, yd, sd) = (
                d.tensor(x),
                d.tensor(r),
                d.tensor(w),
                d.tensor(h),
                d.tensor(y),
                d.tensor(&keep(rstd)),
            );
            let op = self.cann.aclnn.add_rms_norm;
            // SAFETY: live descriptors of `d`, the out-pointers of `call`.
            return self.call(op, "AddRmsNorm", d, |fun, ws, e| unsafe {
                fun(xd, rd, wd, eps, yd, sd, hd, ws, e)
            });
        }
        let (x, r, w, bi, h, y, mean, rstd) =
            (&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7]);
        if !fused {
            self.add(x, r, 1.0, h, false)?;
            let ln = OpCall::layer_norm(
                h.clone(),
                w.clone(),
                bi.clone(),
                y.clone(),
                mean.clone(),
                rstd.clone(),
                eps,
            );
            return super::map::run(self, &ln, &y.shape);
        }
        let mut d = Descs::new(self.cann);
        let (xd, rd, wd, bd, hd, yd) = (
            d.tensor(x),
            d.tensor(r),
            d.tensor(w),
            d.tensor(bi),
            d.tensor(h),
            d.tensor(y),
        );
        let (md, sd) = (d.tensor(&keep(mean)), d.tensor(&keep(rstd)));
        let null: D = std::ptr::null_mut();
        let op = self.cann.aclnn.add_layer_norm;
        // SAFETY: live descriptors of `d` (biasOptional NULL), the out-pointers of `call`.
        self.call(op, "AddLayerNorm", d, |fun, ws, e| unsafe {
            fun(xd, rd, wd, bd, null, eps, true, yd, md, sd, hd, ws, e)
        })
    }
}
