//! The transformer operators of `hicann/ops-transformer`: FlashAttention forward and backward
//! and the rotary position embedding (forward and backward).
//!
//! **FlashAttentionScore / Grad** are computed on the host (in f64, each output rounded once),
//! as [`super::host`] does for the semantics the kernel library has no kernel for: the library's
//! attention takes an additive bias already scaled, a top-left causal flag and unihal's Philox
//! dropout, while the operator scales `pse` with the scores (`scale * (q kᵀ + pse)`), takes a
//! bool/uint8 `attenMask` (1 = masked) under a `sparseMode`, a dropout bit mask *input* and
//! saves the softmax max and sum (`[B, N, Sq, 8]`, the value repeated 8 times), not a
//! log-sum-exp. Simulated: layouts BSH, SBH, BSND and BNSD; sparse modes 0 (attenMask with the
//! preTokens/nextTokens band), 1 (attenMask alone), 2 (leftUpCausal) and 3 (rightDownCausal),
//! the last two with the compressed 2048 × 2048 mask the docs prescribe (its shape is checked,
//! its contents are not read: the mode defines the mask); GQA; `pse` of shape `[B,N,Sq,Skv]`,
//! `[B,N,1,Skv]` or `[1,N,Sq,Skv]`; dropout with `keepProb < 1` from `dropMask`. Refused as not
//! simulated (`ACLNN_ERR_PARAM_INVALID`): sparse modes 4 to 8, `prefixOptional`,
//! `paddingMaskOptional`, a value head size unlike the query's. Assumed (not documented):
//! `dropMask` holds bit `i % 8` of byte `i / 8` (least significant first) for element
//! `i = ((b * N + n) * Sq + s) * Skv + k`, 1 = kept (the docs: `keepProb` is "the proportion of
//! 1s in dropMask"), `ceil(n / 128) * 128 / 8` bytes as `aclnnDropoutGenMaskV2` makes; a fully
//! masked query row gives a zero output row, max `-inf` and sum 0, and no gradient
//! (`innerPrecise` 2's "invalid row" computation).
//!
//! **RotaryPositionEmbedding / Grad** run the kernel library's rope (`OpCall::rope`,
//! `OpCall::rope_backward`): modes 0 (half) and 1 (interleave), the modes the docs give the A2.

use super::host::{read, write};
use super::{invalid, Args, Build};
use crate::aclnn_op;
use crate::conv::Err;
use crate::nnopbase::{IntArray, Tensor};
use std::ffi::{c_char, CStr};
use std::sync::Arc;
use unihal_hal::{DType, OpCall, TensorView};

// --- FlashAttention ------------------------------------------------------------------------------

/// A tensor read as `(B, N, S, D)` whatever its layout: address of an element.
#[derive(Clone, Copy)]
struct V4 {
    data: u64,
    offset: i64,
    strides: [i64; 4],
    dtype: DType,
}

impl V4 {
    #[inline]
    fn at(&self, i: [usize; 4]) -> u64 {
        let e: i64 = self.offset + (0..4).map(|k| i[k] as i64 * self.strides[k]).sum::<i64>();
        self.data + e as u64 * self.dtype.size() as u64
    }
    /// # Safety
    /// `i` is inside the view (checked at phase 1), live at enqueue.
    #[inline]
    unsafe fn get(&self, i: [usize; 4]) -> f64 {
        // SAFETY: the caller's contract.
        unsafe { read(self.at(i), self.dtype) }
    }
    /// # Safety
    /// As [`V4::get`], for a write.
    #[inline]
    unsafe fn set(&self, i: [usize; 4], v: f64) {
        // SAFETY: the caller's contract.
        unsafe { write(self.at(i), self.dtype, v) }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Layout {
    Bsh,
    Sbh,
    Bsnd,
    Bnsd,
}

fn layout(p: *const c_char) -> Result<Layout, Err> {
    if p.is_null() {
        return Err(Err::new(
            crate::conv::ACLNN_ERR_PARAM_NULLPTR,
            "NULL inputLayout",
        ));
    }
    // SAFETY: a NUL-terminated string of the caller's (the docs' `char *inputLayout`).
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    match s.as_ref() {
        "BSH" => Ok(Layout::Bsh),
        "SBH" => Ok(Layout::Sbh),
        "BSND" => Ok(Layout::Bsnd),
        "BNSD" => Ok(Layout::Bnsd),
        other => Err(invalid(format!(
            "inputLayout {other:?}: one of BSH, SBH, BSND, BNSD"
        ))),
    }
}

/// `t` in `lay` as `(B, N, S, D)` dims and view; `d` is the head size for the 3-D layouts
/// (`None`: `t` is the query, whose head count is `heads`).
fn bnsd(
    t: &Tensor,
    lay: Layout,
    heads: Option<i64>,
    d: Option<i64>,
    what: &str,
) -> Result<([usize; 4], V4), Err> {
    let dt = t.dt()?;
    let (v, s) = (&t.view, &t.strides);
    let rank = if matches!(lay, Layout::Bsh | Layout::Sbh) {
        3
    } else {
        4
    };
    if v.len() != rank {
        return Err(invalid(format!(
            "{what} has {} dims, layout {lay:?} takes {rank}",
            v.len()
        )));
    }
    let (dims, strides) = match lay {
        Layout::Bnsd => ([v[0], v[1], v[2], v[3]], [s[0], s[1], s[2], s[3]]),
        Layout::Bsnd => ([v[0], v[2], v[1], v[3]], [s[0], s[2], s[1], s[3]]),
        Layout::Bsh | Layout::Sbh => {
            let (b, sq) = if lay == Layout::Bsh { (0, 1) } else { (1, 0) };
            let h = v[2];
            let dd = match (heads, d) {
                (Some(n), _) if n > 0 && h % n == 0 => h / n,
                (_, Some(dd)) if dd > 0 && h % dd == 0 => dd,
                _ => {
                    return Err(invalid(format!(
                        "{what}: H = {h} is not a whole number of heads"
                    )))
                }
            };
            let n = h / dd.max(1);
            ([v[b], n, v[sq], dd], [s[b], dd * s[2], s[sq], s[2]])
        }
    };
    let view = V4 {
        data: t.data,
        offset: t.offset,
        strides,
        dtype: dt,
    };
    Ok((dims.map(|x| x as usize), view))
}

/// The masking of one call.
#[derive(Clone)]
struct Mask {
    mode: i64,
    pre: i64,
    next: i64,
    /// The attenMask, read as `(B, N, S, Sk)` with 0 strides on broadcast dims.
    mask: Option<V4>,
}

impl Mask {
    /// Whether key `j` is masked for query `i` (`s`, `sk`: the lengths).
    ///
    /// # Safety
    /// The mask descriptor is live (checked at enqueue).
    unsafe fn masked(&self, b: usize, n: usize, i: usize, j: usize, s: usize, sk: usize) -> bool {
        let Some(m) = &self.mask else {
            return false; // no attenMask: everything is computed, the mode does not apply
        };
        let (ii, jj) = (i as i64, j as i64);
        match self.mode {
            // SAFETY: the caller's contract.
            0 => unsafe { m.get([b, n, i, j]) != 0.0 || ii - jj > self.pre || jj - ii > self.next },
            // SAFETY: the caller's contract.
            1 => unsafe { m.get([b, n, i, j]) != 0.0 },
            2 => j > i,
            _ => jj > ii + sk as i64 - s as i64,
        }
    }
}

/// What both FlashAttention operators read.
#[derive(Clone)]
struct Fa {
    q: V4,
    k: V4,
    v: V4,
    pse: Option<V4>,
    drop: Option<Tensor>,
    mask: Mask,
    scale: f64,
    keep: f64,
    /// (B, N, Nkv, S, Sk, D).
    dims: (usize, usize, usize, usize, usize, usize),
}

/// A `(B, N, S, Sk)` view of a tensor broadcast from `shape` (its dims right-aligned).
fn broadcast4(t: &Tensor, want: [usize; 4]) -> V4 {
    let r = t.view.len();
    let mut strides = [0i64; 4];
    for k in 0..r.min(4) {
        let (td, ts) = (t.view[r - 1 - k], t.strides[r - 1 - k]);
        if td as usize == want[3 - k] && td != 1 {
            strides[3 - k] = ts;
        }
    }
    V4 {
        data: t.data,
        offset: t.offset,
        strides,
        dtype: t.dt().unwrap_or(DType::U8),
    }
}

#[allow(clippy::too_many_arguments)]
fn fa_parse(
    a: &mut Args,
    query: *const Tensor,
    key: *const Tensor,
    value: *const Tensor,
    pse: *const Tensor,
    drop_mask: *const Tensor,
    padding_mask: *const Tensor,
    atten_mask: *const Tensor,
    prefix: *const IntArray,
    scale: f64,
    keep: f64,
    pre: i64,
    next: i64,
    head_num: i64,
    input_layout: *const c_char,
    inner_precise: i64,
    sparse_mode: i64,
    max_modes: i64,
) -> Result<(Fa, Tensor), Err> {
    let q = a.tensor(query, "query")?;
    let k = a.tensor(key, "key")?;
    let v = a.tensor(value, "value")?;
    let pse = a.opt_tensor(pse, "pse")?;
    let drop = a.opt_tensor(drop_mask, "dropMask")?;
    let pad = a.opt_tensor(padding_mask, "paddingMask")?;
    let mask = a.opt_tensor(atten_mask, "attenMask")?;
    a.dtype(&q)?;
    a.same_dtype(&q, &k, "query and key")?;
    a.same_dtype(&q, &v, "query and value")?;
    if pad.is_some() {
        return Err(invalid("paddingMaskOptional is reserved (not simulated)"));
    }
    if !prefix.is_null() {
        return Err(invalid(
            "prefixOptional (sparse modes 5 and 6) is not simulated",
        ));
    }
    let lay = layout(input_layout)?;
    let (qd, qv) = bnsd(&q, lay, Some(head_num), None, "query")?;
    let (kd, kv) = bnsd(&k, lay, None, Some(qd[3] as i64), "key")?;
    let (vd, vv) = bnsd(&v, lay, None, Some(qd[3] as i64), "value")?;
    let [b, n, s, d] = qd;
    let (nkv, sk) = (kd[1], kd[2]);
    if head_num != n as i64 {
        return Err(invalid(format!(
            "headNum {head_num} is not query's N = {n}"
        )));
    }
    if kd[0] != b || vd[0] != b {
        return Err(invalid("query, key and value batch sizes differ"));
    }
    if kd[3] != d {
        return Err(invalid("query and key head sizes differ"));
    }
    if vd != kd {
        return Err(invalid(
            "key and value shapes differ (a value head size below the key's is not simulated)",
        ));
    }
    if nkv == 0 || n % nkv != 0 || !(1..=256).contains(&n) {
        return Err(invalid(format!(
            "query heads {n} must be in 1..=256 and a multiple of the key heads {nkv}"
        )));
    }
    if b == 0 || s == 0 || sk == 0 || !(1..=768).contains(&d) {
        return Err(invalid(format!(
            "B {b}, S {s}, Skv {sk}, D {d}: B and S from 1, D in 1..=768"
        )));
    }
    if !scale.is_finite() {
        return Err(invalid(format!("scaleValue {scale}")));
    }
    if !(keep > 0.0 && keep <= 1.0) {
        return Err(invalid(format!("keepProb {keep} outside (0, 1]")));
    }
    if !(0..=2).contains(&inner_precise) {
        return Err(invalid(format!("innerPrecise {inner_precise}: 0, 1 or 2")));
    }
    if !(0..=max_modes).contains(&sparse_mode) {
        return Err(invalid(format!(
            "sparseMode {sparse_mode}: 0 to {max_modes}"
        )));
    }
    let full = [b, n, s, sk];
    let pse = match pse {
        None => None,
        Some(p) => {
            a.same_dtype(&q, &p, "query and pse")?;
            let ps: Vec<usize> = p.view.iter().map(|&x| x as usize).collect();
            let ok = ps == [b, n, s, sk] || ps == [b, n, 1, sk] || ps == [1, n, s, sk];
            if !ok {
                return Err(invalid(format!(
                    "pse shape {ps:?}: [B,N,S,S], [B,N,1,Skv] or [1,N,S,S] of {full:?}"
                )));
            }
            Some(broadcast4(&p, full))
        }
    };
    let drop = if keep < 1.0 {
        let m = drop.ok_or_else(|| invalid("keepProb < 1 without a dropMask"))?;
        let want = super::random::mask_bytes((b * n * s * sk) as u64);
        if m.dtype != 4 || m.view.len() != 1 || m.numel() as u64 != want {
            return Err(invalid(format!(
                "dropMask must be 1-D UINT8 of {want} bytes for {} elements",
                b * n * s * sk
            )));
        }
        Some(m)
    } else {
        None
    };
    let mask = match mask {
        None => None,
        Some(m) => {
            if !matches!(m.dtype, 12 | 4) {
                return Err(invalid("attenMask must be BOOL or UINT8"));
            }
            let ms: Vec<usize> = m.view.iter().map(|&x| x as usize).collect();
            match sparse_mode {
                0 | 1 => {
                    let ok = ms == [b, n, s, sk]
                        || ms == [b, 1, s, sk]
                        || ms == [1, 1, s, sk]
                        || ms == [s, sk];
                    if !ok {
                        return Err(invalid(format!(
                            "attenMask shape {ms:?}: [B,N,S,S], [B,1,S,S], [1,1,S,S] or [S,S] of {full:?}"
                        )));
                    }
                }
                2 | 3 => {
                    if ms != [2048, 2048] {
                        return Err(invalid(format!(
                            "sparseMode {sparse_mode} takes the compressed 2048 x 2048 attenMask, not {ms:?}"
                        )));
                    }
                }
                other => {
                    return Err(invalid(format!("sparseMode {other} is not simulated")));
                }
            }
            Some(broadcast4(&m, full))
        }
    };
    let fa = Fa {
        q: qv,
        k: kv,
        v: vv,
        pse,
        drop,
        mask: Mask {
            mode: sparse_mode,
            pre,
            next,
            mask,
        },
        scale,
        keep,
        dims: (b, n, nkv, s, sk, d),
    };
    Ok((fa, q))
}

impl Fa {
    /// The scores of query row `(b, n, i)` (`-inf` where masked) and the dropout factors.
    ///
    /// # Safety
    /// Every descriptor is live (checked at enqueue).
    unsafe fn row(&self, b: usize, n: usize, i: usize, bits: &[u8]) -> (Vec<f64>, Vec<f64>) {
        let (_, nq, nkv, s, sk, d) = self.dims;
        let hk = n / (nq / nkv);
        let mut sc = vec![f64::NEG_INFINITY; sk];
        let mut z = vec![1.0; sk];
        for (j, sj) in sc.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            if unsafe { self.mask.masked(b, n, i, j, s, sk) } {
                continue;
            }
            let mut dot = 0.0;
            for e in 0..d {
                // SAFETY: the caller's contract (indices inside the views).
                dot += unsafe { self.q.get([b, n, i, e]) * self.k.get([b, hk, j, e]) };
            }
            if let Some(p) = &self.pse {
                // SAFETY: as above.
                dot += unsafe { p.get([b, n, i, j]) };
            }
            *sj = self.scale * dot;
        }
        if self.drop.is_some() {
            for (j, zj) in z.iter_mut().enumerate() {
                let e = ((b * nq + n) * s + i) * sk + j;
                let kept = bits[e / 8] >> (e % 8) & 1 == 1;
                *zj = if kept { 1.0 / self.keep } else { 0.0 };
            }
        }
        (sc, z)
    }

    /// The dropout mask bytes (empty without dropout).
    fn bits(&self) -> Vec<u8> {
        match &self.drop {
            // SAFETY: a live UINT8 descriptor (checked at enqueue).
            Some(m) => super::host::addrs(m)
                .into_iter()
                .map(|a| unsafe { (a as *const u8).read() })
                .collect(),
            None => Vec::new(),
        }
    }
}

/// A `[B, N, S, 8]` FLOAT statistics output.
fn stat(t: &Tensor, b: usize, n: usize, s: usize, what: &str) -> Result<V4, Err> {
    if t.dt()? != DType::F32 || t.view != [b as i64, n as i64, s as i64, 8] {
        return Err(invalid(format!(
            "{what} must be FLOAT [B, N, S, 8] = [{b}, {n}, {s}, 8], not {:?}",
            t.view
        )));
    }
    Ok(V4 {
        data: t.data,
        offset: t.offset,
        strides: [t.strides[0], t.strides[1], t.strides[2], t.strides[3]],
        dtype: DType::F32,
    })
}

/// An output like `like` (same dims in the same layout, same dtype).
fn out_like(t: &Tensor, like: &Tensor, lay: Layout, d: usize, what: &str) -> Result<V4, Err> {
    if t.view != like.view || t.dtype != like.dtype {
        return Err(invalid(format!(
            "{what} must have the shape {:?} and dtype of its input",
            like.view
        )));
    }
    Ok(bnsd(t, lay, None, Some(d as i64), what)?.1)
}

// Declared from: OT `attention/flash_attention_score/docs/aclnnFlashAttentionScore.md` (xwqtju/ops-transformer); `docs/context/sparse_mode参数说明.md`
aclnn_op!(aclnnFlashAttentionScore, aclnnFlashAttentionScoreGetWorkspaceSize, "FlashAttentionScore",
(query: *const Tensor, key: *const Tensor, value: *const Tensor, real_shift: *const Tensor,
 drop_mask: *const Tensor, padding_mask: *const Tensor, atten_mask: *const Tensor, prefix: *const IntArray,
 scale_value: f64, keep_prob: f64, pre_tokens: i64, next_tokens: i64, head_num: i64,
 input_layout: *const c_char, inner_precise: i64, sparse_mode: i64, softmax_max_out: *const Tensor,
 softmax_sum_out: *const Tensor, softmax_out_out: *const Tensor, attention_out_out: *const Tensor) |a| {
    let lay = layout(input_layout)?;
    let (fa, q) = fa_parse(a, query, key, value, real_shift, drop_mask, padding_mask, atten_mask, prefix,
        scale_value, keep_prob, pre_tokens, next_tokens, head_num, input_layout, inner_precise, sparse_mode, 6)?;
    let (b, n, _, s, sk, d) = fa.dims;
    let mx = stat(&a.tensor(softmax_max_out, "softmaxMaxOut")?, b, n, s, "softmaxMaxOut")?;
    let sm = stat(&a.tensor(softmax_sum_out, "softmaxSumOut")?, b, n, s, "softmaxSumOut")?;
    // softmaxOutOut is reserved: NULL or any tensor, never written.
    let _ = a.opt_tensor(softmax_out_out, "softmaxOutOut")?;
    let out = out_like(&a.tensor(attention_out_out, "attentionOutOut")?, &q, lay, d, "attentionOutOut")?;
    Ok(Arc::new(move |bd: &mut Build| {
        let fa = fa.clone();
        bd.host(move || {
            let bits = fa.bits();
            for bi in 0..b {
                for ni in 0..n {
                    let hk = ni / (n / fa.dims.2);
                    for i in 0..s {
                        // SAFETY: live descriptors, indices inside their views (phase 1).
                        let (sc, z) = unsafe { fa.row(bi, ni, i, &bits) };
                        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let l: f64 = if m == f64::NEG_INFINITY {
                            0.0
                        } else {
                            sc.iter().map(|&x| (x - m).exp()).sum()
                        };
                        for e in 0..d {
                            let mut o = 0.0;
                            if l > 0.0 {
                                for j in 0..sk {
                                    if sc[j] > f64::NEG_INFINITY {
                                        // SAFETY: as above.
                                        o += (sc[j] - m).exp() / l * z[j] * unsafe { fa.v.get([bi, hk, j, e]) };
                                    }
                                }
                            }
                            // SAFETY: as above.
                            unsafe { out.set([bi, ni, i, e], o) };
                        }
                        for c in 0..8 {
                            // SAFETY: as above.
                            unsafe {
                                mx.set([bi, ni, i, c], m);
                                sm.set([bi, ni, i, c], l);
                            }
                        }
                    }
                }
            }
            Ok(())
        });
        Ok(())
    }))
});

// Declared from: OT `attention/flash_attention_score_grad/docs/aclnnFlashAttentionScoreGrad.md` (xwqtju/ops-transformer)
aclnn_op!(aclnnFlashAttentionScoreGrad, aclnnFlashAttentionScoreGradGetWorkspaceSize, "FlashAttentionScoreGrad",
(query: *const Tensor, key_in: *const Tensor, value: *const Tensor, dy: *const Tensor, pse_shift: *const Tensor,
 drop_mask: *const Tensor, padding_mask: *const Tensor, atten_mask: *const Tensor, softmax_max: *const Tensor,
 softmax_sum: *const Tensor, softmax_in: *const Tensor, attention_in: *const Tensor, prefix: *const IntArray,
 scale_value: f64, keep_prob: f64, pre_tokens: i64, next_tokens: i64, head_num: i64,
 input_layout: *const c_char, inner_precise: i64, sparse_mode: i64, dq_out: *const Tensor,
 dk_out: *const Tensor, dv_out: *const Tensor, dpse_out: *const Tensor) |a| {
    let lay = layout(input_layout)?;
    let (fa, q) = fa_parse(a, query, key_in, value, pse_shift, drop_mask, padding_mask, atten_mask, prefix,
        scale_value, keep_prob, pre_tokens, next_tokens, head_num, input_layout, inner_precise, sparse_mode, 8)?;
    let (b, n, nkv, s, sk, d) = fa.dims;
    let k = a.tensor(key_in, "keyIn")?;
    let dyv = out_like(&a.tensor(dy, "dy")?, &q, lay, d, "dy")?;
    let (mx, sm) = match (a.opt_tensor(softmax_max, "softmaxMax")?, a.opt_tensor(softmax_sum, "softmaxSum")?) {
        (Some(m), Some(l)) => (stat(&m, b, n, s, "softmaxMax")?, stat(&l, b, n, s, "softmaxSum")?),
        _ => return Err(invalid("without softmaxMax and softmaxSum (recomputing the forward) is not simulated")),
    };
    let _ = a.opt_tensor(softmax_in, "softmaxIn")?;
    let out = match a.opt_tensor(attention_in, "attentionIn")? {
        Some(t) => out_like(&t, &q, lay, d, "attentionIn")?,
        None => return Err(invalid("without attentionIn is not simulated")),
    };
    let dq = out_like(&a.tensor(dq_out, "dqOut")?, &q, lay, d, "dqOut")?;
    let dk = out_like(&a.tensor(dk_out, "dkOut")?, &k, lay, d, "dkOut")?;
    let dv = out_like(&a.tensor(dv_out, "dvOut")?, &k, lay, d, "dvOut")?;
    // dpseOut: "not used yet" in the docs; NULL or any tensor, never written.
    let _ = a.opt_tensor(dpse_out, "dpseOut")?;
    Ok(Arc::new(move |bd: &mut Build| {
        let fa = fa.clone();
        bd.host(move || {
            let bits = fa.bits();
            let idx = |bh: usize, r: usize, len: usize, e: usize| (bh * len + r) * d + e;
            let mut gq = vec![0.0; b * n * s * d];
            let mut gk = vec![0.0; b * nkv * sk * d];
            let mut gv = vec![0.0; b * nkv * sk * d];
            for bi in 0..b {
                for ni in 0..n {
                    let hk = ni / (n / nkv);
                    for i in 0..s {
                        // SAFETY: live descriptors, indices inside their views (phase 1).
                        let (m, l) = unsafe { (mx.get([bi, ni, i, 0]), sm.get([bi, ni, i, 0])) };
                        if m == f64::NEG_INFINITY || l <= 0.0 {
                            continue; // a fully masked row: no gradient
                        }
                        // SAFETY: as above.
                        let (sc, z) = unsafe { fa.row(bi, ni, i, &bits) };
                        let (mut g, mut dsum) = (vec![0.0; d], 0.0);
                        for (e, ge) in g.iter_mut().enumerate() {
                            // SAFETY: as above.
                            let (gy, o) = unsafe { (dyv.get([bi, ni, i, e]), out.get([bi, ni, i, e])) };
                            *ge = gy;
                            dsum += gy * o;
                        }
                        for j in 0..sk {
                            if sc[j] == f64::NEG_INFINITY {
                                continue;
                            }
                            let p = (sc[j] - m).exp() / l;
                            // SAFETY: as above.
                            let dp: f64 = (0..d).map(|e| g[e] * unsafe { fa.v.get([bi, hk, j, e]) }).sum();
                            let ds = p * (dp * z[j] - dsum);
                            for e in 0..d {
                                // SAFETY: as above.
                                let (kj, qi) = unsafe { (fa.k.get([bi, hk, j, e]), fa.q.get([bi, ni, i, e])) };
                                gq[idx(bi * n + ni, i, s, e)] += fa.scale * ds * kj;
                                gk[idx(bi * nkv + hk, j, sk, e)] += fa.scale * ds * qi;
                                gv[idx(bi * nkv + hk, j, sk, e)] += p * z[j] * g[e];
                            }
                        }
                    }
                }
            }
            for bi in 0..b {
                for ni in 0..n {
                    for i in 0..s {
                        for e in 0..d {
                            // SAFETY: as above.
                            unsafe { dq.set([bi, ni, i, e], gq[idx(bi * n + ni, i, s, e)]) };
                        }
                    }
                }
                for h in 0..nkv {
                    for j in 0..sk {
                        for e in 0..d {
                            let at = idx(bi * nkv + h, j, sk, e);
                            // SAFETY: as above.
                            unsafe {
                                dk.set([bi, h, j, e], gk[at]);
                                dv.set([bi, h, j, e], gv[at]);
                            }
                        }
                    }
                }
            }
            Ok(())
        });
        Ok(())
    }))
});

// --- Rotary position embedding -------------------------------------------------------------------

/// The checks both rope operators share: `x` 3-D or 4-D, `cos` and `sin` of its rank and one
/// shape, each dim 1 or `x`'s, the last `D` (even, below 896); the interleave mode takes
/// `cos`/`sin` varying along one dim besides `D` at most (11SD, 1S1D, S11D, T1D); `out` like `x`
/// and contiguous. Returns `mode == 1`.
fn rope_check(
    a: &Args,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    out: &Tensor,
    mode: i64,
) -> Result<bool, Err> {
    a.dtype(x)?;
    a.same_dtype(x, cos, "x and cos")?;
    a.same_dtype(x, sin, "x and sin")?;
    a.same_dtype(x, out, "x and out")?;
    let r = x.view.len();
    if !(3..=4).contains(&r) {
        return Err(invalid(format!("x has {r} dims: 3 or 4")));
    }
    if !(0..=1).contains(&mode) {
        return Err(invalid(format!(
            "mode {mode}: 0 (half) or 1 (interleave) on this chip"
        )));
    }
    let d = x.view[r - 1];
    if d % 2 != 0 || d >= 896 {
        return Err(invalid(format!("D = {d}: even and below 896")));
    }
    if cos.view != sin.view || cos.view.len() != r {
        return Err(invalid("cos and sin must have one shape, of x's rank"));
    }
    let fits = cos
        .view
        .iter()
        .zip(&x.view)
        .all(|(&c, &xv)| c == 1 || c == xv)
        && cos.view[r - 1] == d;
    if !fits {
        return Err(invalid(format!(
            "cos {:?} against x {:?}",
            cos.view, x.view
        )));
    }
    let varying = cos.view[..r - 1].iter().filter(|&&c| c != 1).count();
    if mode == 1 && varying > 1 {
        return Err(invalid(format!(
            "interleave mode takes cos/sin varying along one dim besides D (11SD, 1S1D, S11D, T1D), not {:?}",
            cos.view
        )));
    }
    if out.view != x.view {
        return Err(invalid("out must have x's shape"));
    }
    let want =
        unihal_hal::op::contiguous_strides(&out.view.iter().map(|&v| v as u64).collect::<Vec<_>>());
    if out.strides != want {
        return Err(invalid("out must be contiguous"));
    }
    Ok(mode == 1)
}

/// `cos`/`sin` as views broadcast to `x`'s shape (0 strides on their 1-dims).
fn expand(b: &Build, t: &Tensor, shape: &[u64]) -> Result<TensorView, Err> {
    let mut v = b.view(t)?;
    for (k, &s) in shape.iter().enumerate() {
        if v.shape[k] != s {
            v.shape[k] = s;
            v.strides[k] = 0;
        }
    }
    Ok(v)
}

// Declared from: OT `posembedding/rotary_position_embedding/docs/aclnnRotaryPositionEmbedding_en.md` (hicann/ops-transformer)
aclnn_op!(aclnnRotaryPositionEmbedding, aclnnRotaryPositionEmbeddingGetWorkspaceSize, "RotaryPositionEmbedding",
(x: *const Tensor, cos: *const Tensor, sin: *const Tensor, mode: i64, out: *const Tensor) |a| {
    let (x, c, s) = (a.tensor(x, "x")?, a.tensor(cos, "cos")?, a.tensor(sin, "sin")?);
    let o = a.tensor(out, "out")?;
    let inter = rope_check(a, &x, &c, &s, &o, mode)?;
    Ok(Arc::new(move |b: &mut Build| {
        let xv = b.view(&x)?;
        let (cv, sv) = (expand(b, &c, &xv.shape)?, expand(b, &s, &xv.shape)?);
        b.call(OpCall::rope(xv, cv, sv, b.view(&o)?, inter))
    }))
});

// Declared from: OT `posembedding/rotary_position_embedding_grad/docs/aclnnRotaryPositionEmbeddingGrad_en.md` (hicann/ops-transformer)
aclnn_op!(aclnnRotaryPositionEmbeddingGrad, aclnnRotaryPositionEmbeddingGradGetWorkspaceSize, "RotaryPositionEmbeddingGrad",
(dy: *const Tensor, cos: *const Tensor, sin: *const Tensor, x_optional: *const Tensor, mode: i64,
 dx_out: *const Tensor, dcos_out: *const Tensor, dsin_out: *const Tensor) |a| {
    let (g, c, s) = (a.tensor(dy, "dy")?, a.tensor(cos, "cos")?, a.tensor(sin, "sin")?);
    if a.opt_tensor(x_optional, "xOptional")?.is_some() {
        return Err(invalid("xOptional (dcos and dsin) is not simulated"));
    }
    let dx = a.tensor(dx_out, "dxOut")?;
    let (dc, ds) = (a.tensor(dcos_out, "dcosOut")?, a.tensor(dsin_out, "dsinOut")?);
    if g.view.len() != 4 {
        return Err(invalid("dy must be 4-D"));
    }
    let inter = rope_check(a, &g, &c, &s, &dx, mode)?;
    if dc.view != c.view || ds.view != c.view {
        return Err(invalid("dcosOut and dsinOut must have cos's shape"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let gv = b.view(&g)?;
        let (cv, sv) = (expand(b, &c, &gv.shape)?, expand(b, &s, &gv.shape)?);
        b.call(OpCall::rope_backward(gv, cv, sv, b.view(&dx)?, inter))
    }))
});
