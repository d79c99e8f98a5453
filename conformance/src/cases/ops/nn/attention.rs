//! `ops.{attention,attention_backward,rope,rope_backward,add_layer_norm,add_rms_norm}.<dtype>`:
//! the transformer-block ops against f64 references written from their definitions (no online
//! softmax, no tiling: the whole score row at once).
//!
//! Attention families: grouped-query heads with a causal mask; keys spanning several key blocks
//! with an additive bias; a padding mask with a fully masked query row (out 0, lse -inf, no
//! gradient); the largest head size; q, k and v as strided views of one fused QKV buffer; no keys
//! at all; and dropout, whose mask the reference regenerates from the documented Philox counter.
//! Tolerances scale with the magnitude of the terms each result sums (the same computation on
//! absolute values), the number of terms and the largest score.

use super::reference::norm;
use super::{acc_eps, check, dense, gen, numel, put, tiny, Tensor, FLOATS};
use crate::case::{Case, CaseResult, Ctx, Need};
use crate::cases::ops::elementwise::Layout;
use crate::cases::ops::reference::{block, uniform24};
use crate::cases::ops::values::eps;
use std::sync::Arc;
use unihal_hal::op::nn::acc_dtype;
use unihal_hal::{AttentionOptions, DType, OpCall, OpId, RngState, Stream};

/// One attention problem.
#[derive(Clone, Copy)]
struct Family {
    b: usize,
    hq: usize,
    hkv: usize,
    s: usize,
    sk: usize,
    d: usize,
    causal: bool,
    bias: Bias,
    /// q, k, v as views of one `(B, S, 3, H, D)` buffer (needs `S == Sk`, `Hq == Hkv`).
    fused: bool,
    dropout: f64,
}

#[derive(Clone, Copy, PartialEq)]
enum Bias {
    None,
    /// Random values, full shape `(B, Hq, S, Sk)`.
    Full,
    /// `(B, 1, S, Sk)`: batch 0 masks keys from 2/3 of Sk on, batch 1 masks its last query row
    /// entirely.
    Padding,
}

fn families() -> Vec<Family> {
    let f = |b, hq, hkv, s, sk, d| Family {
        b,
        hq,
        hkv,
        s,
        sk,
        d,
        causal: false,
        bias: Bias::None,
        fused: false,
        dropout: 0.0,
    };
    vec![
        Family {
            causal: true,
            ..f(2, 4, 2, 37, 37, 16)
        },
        Family {
            bias: Bias::Full,
            ..f(1, 2, 2, 19, 70, 64)
        },
        Family {
            bias: Bias::Padding,
            ..f(2, 2, 1, 12, 12, 8)
        },
        Family {
            causal: true,
            ..f(1, 1, 1, 9, 9, 256)
        },
        Family {
            fused: true,
            causal: true,
            ..f(2, 2, 2, 10, 10, 8)
        },
        f(1, 2, 1, 3, 0, 4),
        Family {
            dropout: 0.3,
            ..f(1, 2, 2, 20, 20, 16)
        },
    ]
}

/// Logical row-major `(B, H, S, D)` values of q, k, v, dout; the bias as a function.
struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    bias: Vec<f64>,
}

/// The reference outputs, each with the magnitude of what it sums.
#[derive(Default)]
struct Reference {
    out: Vec<f64>,
    out_mag: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dq_mag: Vec<f64>,
    dk: Vec<f64>,
    dk_mag: Vec<f64>,
    dv: Vec<f64>,
    dv_mag: Vec<f64>,
    /// Largest |score| of the problem.
    smax: f64,
}

fn reference(f: &Family, x: &Inputs, dout: &[f64], scale: f64, rng: RngState) -> Reference {
    let (s_, sk, d, group) = (f.s, f.sk, f.d, f.hq / f.hkv.max(1));
    let mut r = Reference {
        out: vec![0.0; f.b * f.hq * s_ * d],
        lse: vec![f64::NEG_INFINITY; f.b * f.hq * s_],
        dq: vec![0.0; f.b * f.hq * s_ * d],
        dk: vec![0.0; f.b * f.hkv * sk * d],
        dv: vec![0.0; f.b * f.hkv * sk * d],
        ..Default::default()
    };
    r.out_mag = r.out.clone();
    r.dq_mag = r.dq.clone();
    r.dk_mag = r.dk.clone();
    r.dv_mag = r.dv.clone();
    let keep_scale = 1.0 / (1.0 - f.dropout);
    for b in 0..f.b {
        for h in 0..f.hq {
            let hk = h / group;
            for i in 0..s_ {
                let qrow = ((b * f.hq + h) * s_ + i) * d;
                let krow = |j: usize| ((b * f.hkv + hk) * sk + j) * d;
                let mut sc = vec![f64::NEG_INFINITY; sk];
                for (j, sj) in sc.iter_mut().enumerate() {
                    if f.causal && j > i {
                        continue;
                    }
                    let dot: f64 = (0..d).map(|e| x.q[qrow + e] * x.k[krow(j) + e]).sum();
                    let bias = if f.bias == Bias::None {
                        0.0
                    } else {
                        x.bias[((b * f.hq + h) * s_ + i) * sk + j]
                    };
                    *sj = dot * scale + bias;
                    if sj.is_finite() {
                        r.smax = r.smax.max(sj.abs());
                    }
                }
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // fully masked: out 0, lse -inf, no gradient
                }
                let l: f64 = sc.iter().map(|&s| (s - m).exp()).sum();
                r.lse[(b * f.hq + h) * s_ + i] = m + l.ln();
                let p: Vec<f64> = sc.iter().map(|&s| (s - m).exp() / l).collect();
                let z: Vec<f64> = (0..sk)
                    .map(|j| {
                        if f.dropout == 0.0 {
                            return 1.0;
                        }
                        let c = (((b * f.hq + h) * s_ + i) * sk + j) as u64;
                        let keep = uniform24(block(rng.seed, rng.offset, c)[0]) >= f.dropout as f32;
                        if keep {
                            keep_scale
                        } else {
                            0.0
                        }
                    })
                    .collect();
                for e in 0..d {
                    for j in 0..sk {
                        r.out[qrow + e] += p[j] * z[j] * x.v[krow(j) + e];
                        r.out_mag[qrow + e] += p[j] * z[j] * x.v[krow(j) + e].abs();
                    }
                }
                // Backward.
                let dsum: f64 = (0..d).map(|e| dout[qrow + e] * r.out[qrow + e]).sum();
                let dsum_mag: f64 = (0..d)
                    .map(|e| (dout[qrow + e] * r.out[qrow + e]).abs())
                    .sum();
                for j in 0..sk {
                    let dp: f64 = (0..d).map(|e| dout[qrow + e] * x.v[krow(j) + e]).sum();
                    let dp_mag: f64 = (0..d)
                        .map(|e| (dout[qrow + e] * x.v[krow(j) + e]).abs())
                        .sum();
                    let ds = p[j] * (dp * z[j] - dsum);
                    let ds_mag = p[j] * (dp_mag * z[j] + dsum_mag);
                    for e in 0..d {
                        r.dq[qrow + e] += scale * ds * x.k[krow(j) + e];
                        r.dq_mag[qrow + e] += scale * ds_mag * x.k[krow(j) + e].abs();
                        r.dk[krow(j) + e] += scale * ds * x.q[qrow + e];
                        r.dk_mag[krow(j) + e] += scale * ds_mag * x.q[qrow + e].abs();
                        r.dv[krow(j) + e] += p[j] * z[j] * dout[qrow + e];
                        r.dv_mag[krow(j) + e] += p[j] * z[j] * dout[qrow + e].abs();
                    }
                }
            }
        }
    }
    r
}

/// Tolerances of results that sum `terms` terms of magnitude `mag`, rounded into `d`.
fn tolerances(d: DType, want: &[f64], mag: &[f64], terms: usize, smax: f64) -> Vec<f64> {
    let ae = acc_eps(d);
    want.iter()
        .zip(mag)
        .map(|(w, m)| {
            4.0 * ae * (terms as f64 + 32.0) * (4.0 + smax) * m + eps(d) * w.abs() + tiny(d)
        })
        .collect()
}

/// q, k, v placed for family `f` (fused: views of one QKV buffer), with their logical values.
fn place_qkv(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    d: DType,
    f: &Family,
    fi: u64,
) -> unihal_hal::Result<(Vec<Tensor>, Inputs)> {
    let qs = [f.b, f.hq, f.s, f.d].map(|v| v as u64);
    let ks = [f.b, f.hkv, f.sk, f.d].map(|v| v as u64);
    let bias_n = f.b * f.hq * f.s * f.sk;
    let mut bias = gen(bias_n, fi * 10 + 4, -1.0, 1.0);
    if f.bias == Bias::Padding {
        for b in 0..f.b {
            for h in 0..f.hq {
                for i in 0..f.s {
                    for j in 0..f.sk {
                        let masked = if b == 0 {
                            j >= 2 * f.sk / 3
                        } else {
                            i == f.s - 1
                        };
                        bias[((b * f.hq + h) * f.s + i) * f.sk + j] =
                            if masked { f64::NEG_INFINITY } else { 0.0 };
                    }
                }
            }
        }
    }
    if !f.fused {
        let q = put(
            ctx,
            s,
            d,
            &qs,
            Layout::Padded,
            &gen(numel(&qs), fi * 10 + 1, -1.0, 1.0),
        )?;
        let k = put(
            ctx,
            s,
            d,
            &ks,
            Layout::Dense,
            &gen(numel(&ks), fi * 10 + 2, -1.0, 1.0),
        )?;
        let v = put(
            ctx,
            s,
            d,
            &ks,
            Layout::Padded,
            &gen(numel(&ks), fi * 10 + 3, -1.0, 1.0),
        )?;
        let x = Inputs {
            q: q.vals.clone(),
            k: k.vals.clone(),
            v: v.vals.clone(),
            bias,
        };
        return Ok((vec![q, k, v], x));
    }
    // One (B, S, 3, H, D) buffer; q/k/v are (B, H, S, D) views into it.
    let (b, sl, h, dd) = (f.b, f.s, f.hq, f.d);
    let fused = [b, sl, 3, h, dd].map(|v| v as u64);
    let all = dense(
        ctx,
        s,
        d,
        &fused,
        &gen(numel(&fused), fi * 10 + 1, -1.0, 1.0),
    )?;
    let mut logical = vec![vec![0.0; b * h * sl * dd]; 3];
    for bi in 0..b {
        for si in 0..sl {
            for (w, part) in logical.iter_mut().enumerate() {
                for hi in 0..h {
                    for e in 0..dd {
                        part[((bi * h + hi) * sl + si) * dd + e] =
                            all.vals[(((bi * sl + si) * 3 + w) * h + hi) * dd + e];
                    }
                }
            }
        }
    }
    let x = Inputs {
        q: logical[0].clone(),
        k: logical[1].clone(),
        v: logical[2].clone(),
        bias,
    };
    Ok((vec![all], x))
}

fn run_attention(ctx: &Ctx, d: DType, backward: bool) -> CaseResult {
    let s = ctx.stream()?;
    let ad = acc_dtype(d);
    for (fi, f) in families().into_iter().enumerate() {
        let what = format!(
            "{} {d} family {fi} (B {} Hq {} Hkv {} S {} Sk {} D {})",
            if backward {
                "attention_backward"
            } else {
                "attention"
            },
            f.b,
            f.hq,
            f.hkv,
            f.s,
            f.sk,
            f.d
        );
        let (placed, x) = place_qkv(ctx, &s, d, &f, fi as u64)?;
        let (qv, kv, vv) = if f.fused {
            let all = placed[0].view();
            let esz = d.size() as u64;
            let (sl, h, dd) = (f.s as i64, f.hq as i64, f.d as i64);
            let strides = [sl * 3 * h * dd, dd, 3 * h * dd, 1];
            let shape = vec![f.b as u64, f.hq as u64, f.s as u64, f.d as u64];
            let part = |w: u64| {
                let mut v = all.clone().strided(w * (h * dd) as u64 * esz, &strides);
                v.shape = shape.clone();
                v
            };
            (part(0), part(1), part(2))
        } else {
            (placed[0].view(), placed[1].view(), placed[2].view())
        };
        let qs = [f.b, f.hq, f.s, f.d].map(|v| v as u64);
        let ks = [f.b, f.hkv, f.sk, f.d].map(|v| v as u64);
        let rows = [f.b, f.hq, f.s].map(|v| v as u64);
        let bias = match f.bias {
            Bias::None => None,
            Bias::Full => Some(dense(ctx, &s, d, &[qs[0], qs[1], qs[2], ks[2]], &x.bias)?),
            Bias::Padding => {
                // The (B, 1, S, Sk) mask; the reference's full-shape copy repeats it per head.
                let one: Vec<f64> = (0..f.b)
                    .flat_map(|b| {
                        let at = b * f.hq * f.s * f.sk;
                        x.bias[at..at + f.s * f.sk].to_vec()
                    })
                    .collect();
                Some(dense(ctx, &s, d, &[qs[0], 1, qs[2], ks[2]], &one)?)
            }
        };
        let scale = 1.0 / (f.d as f64).sqrt();
        let rng = RngState {
            seed: 0x5eed + fi as u64,
            offset: 1 << 20,
        };
        let o = AttentionOptions {
            scale,
            causal: f.causal,
            dropout_p: f.dropout,
            rng: (f.dropout > 0.0).then_some(rng),
        };
        let dout_vals = gen(numel(&qs), fi as u64 * 10 + 5, -1.0, 1.0);
        let dout = put(ctx, &s, d, &qs, Layout::Padded, &dout_vals)?;
        let want = reference(&f, &x, &dout.vals, scale, rng);
        let out = put(ctx, &s, d, &qs, Layout::Padded, &vec![0.0; numel(&qs)])?;
        let lse = dense(ctx, &s, ad, &rows, &vec![0.0; numel(&rows)])?;
        let bv = bias.as_ref().map(|b| b.view());
        let terms = f.sk + f.d + f.s * (f.hq / f.hkv.max(1));
        if !backward {
            let call = OpCall::attention(qv, kv, vv, bv, out.view(), lse.view(), o);
            s.run_op(&call)?;
            s.synchronize()?;
            let tol = tolerances(d, &want.out, &want.out_mag, terms, want.smax);
            check(
                &format!("{what}: out"),
                &out.read(ctx, "out")?,
                &want.out,
                &tol,
            )?;
            let lse_tol: Vec<f64> = want
                .lse
                .iter()
                .map(|l| 4.0 * acc_eps(d) * (terms as f64 + 32.0) * (4.0 + want.smax + l.abs()))
                .collect();
            check(
                &format!("{what}: lse"),
                &lse.read(ctx, "lse")?,
                &want.lse,
                &lse_tol,
            )?;
            continue;
        }
        // The backward pass reads out and lse as the forward wrote them (its own inputs).
        let fwd = OpCall::attention(
            qv.clone(),
            kv.clone(),
            vv.clone(),
            bv.clone(),
            out.view(),
            lse.view(),
            o,
        );
        s.run_op(&fwd)?;
        let dq = put(ctx, &s, d, &qs, Layout::Padded, &vec![7.0; numel(&qs)])?;
        let dk = put(ctx, &s, d, &ks, Layout::Padded, &vec![7.0; numel(&ks)])?;
        let dv = put(ctx, &s, d, &ks, Layout::Dense, &vec![7.0; numel(&ks)])?;
        let call = OpCall::attention_backward(
            qv,
            kv,
            vv,
            bv,
            out.view(),
            dout.view(),
            lse.view(),
            dq.view(),
            dk.view(),
            dv.view(),
            o,
        );
        s.run_op(&call)?;
        s.synchronize()?;
        for (name, t, w, m) in [
            ("dq", &dq, &want.dq, &want.dq_mag),
            ("dk", &dk, &want.dk, &want.dk_mag),
            ("dv", &dv, &want.dv, &want.dv_mag),
        ] {
            // out is rounded into d before the backward reads it: that rounding enters D_i.
            let got = t.read(ctx, name)?;
            let mut tol = tolerances(d, w, m, terms, want.smax);
            for (tl, mg) in tol.iter_mut().zip(m) {
                *tl += 4.0 * eps(d) * mg;
            }
            check(&format!("{what}: {name}"), &got, w, &tol)?;
        }
    }
    Ok(())
}

fn run_rope(ctx: &Ctx, d: DType, backward: bool) -> CaseResult {
    let s = ctx.stream()?;
    // (x shape, cos/sin shape, interleaved): (B, S, H, D) against (S, 1, D); (B, H, S, D) against
    // (S, D); a row of one pair; no rows.
    let families: [(Vec<u64>, Vec<u64>, bool); 5] = [
        (vec![2, 7, 3, 16], vec![7, 1, 16], false),
        (vec![2, 7, 3, 16], vec![7, 1, 16], true),
        (vec![1, 2, 9, 64], vec![9, 64], false),
        (vec![3, 2], vec![2], true),
        (vec![0, 4], vec![4], false),
    ];
    for (fi, (xs, cs, inter)) in families.into_iter().enumerate() {
        let n = numel(&xs);
        let dlen = *xs.last().unwrap() as usize;
        let x = put(
            ctx,
            &s,
            d,
            &xs,
            Layout::Padded,
            &gen(n, fi as u64 + 1, -2.0, 2.0),
        )?;
        let cn = numel(&cs);
        let cos = put(
            ctx,
            &s,
            d,
            &cs,
            Layout::Dense,
            &gen(cn, fi as u64 + 2, -1.0, 1.0),
        )?;
        let sin = put(
            ctx,
            &s,
            d,
            &cs,
            Layout::Padded,
            &gen(cn, fi as u64 + 3, -1.0, 1.0),
        )?;
        let y = put(ctx, &s, d, &xs, Layout::Padded, &vec![9.0; n])?;
        let call = if backward {
            OpCall::rope_backward(x.view(), cos.view(), sin.view(), y.view(), inter)
        } else {
            OpCall::rope(x.view(), cos.view(), sin.view(), y.view(), inter)
        };
        s.run_op(&call)?;
        s.synchronize()?;
        // cos/sin index of element i of x: broadcast from the right.
        let cidx = |i: usize| {
            let mut rem = i;
            let mut idx = 0;
            let mut mul = 1;
            for (k, &dim) in xs.iter().enumerate().rev() {
                let c = rem % dim as usize;
                rem /= dim as usize;
                let ck = k as isize - (xs.len() - cs.len()) as isize;
                if ck >= 0 {
                    let cd = cs[ck as usize] as usize;
                    if cd != 1 {
                        idx += c * mul;
                    }
                    mul *= cd;
                }
            }
            idx
        };
        let half = dlen / 2;
        let (mut want, mut tol) = (vec![0.0; n], vec![0.0; n]);
        for i in 0..n {
            let e = i % dlen;
            let row = i - e;
            // The partner of e and the sign of the rotation term.
            let (lo, hi) = if inter {
                (e & !1, e | 1)
            } else if e < half {
                (e, e + half)
            } else {
                (e - half, e)
            };
            let is_lo = e == lo;
            let (c, sn) = (&cos.vals, &sin.vals);
            let at = |k: usize| cidx(row + k);
            let xv = |k: usize| x.vals[row + k];
            let (v, m) = match (backward, is_lo) {
                (false, true) => (
                    xv(lo) * c[at(lo)] - xv(hi) * sn[at(lo)],
                    (xv(lo) * c[at(lo)]).abs() + (xv(hi) * sn[at(lo)]).abs(),
                ),
                (false, false) => (
                    xv(hi) * c[at(hi)] + xv(lo) * sn[at(hi)],
                    (xv(hi) * c[at(hi)]).abs() + (xv(lo) * sn[at(hi)]).abs(),
                ),
                (true, true) => (
                    xv(lo) * c[at(lo)] + xv(hi) * sn[at(hi)],
                    (xv(lo) * c[at(lo)]).abs() + (xv(hi) * sn[at(hi)]).abs(),
                ),
                (true, false) => (
                    xv(hi) * c[at(hi)] - xv(lo) * sn[at(lo)],
                    (xv(hi) * c[at(hi)]).abs() + (xv(lo) * sn[at(lo)]).abs(),
                ),
            };
            want[i] = v;
            tol[i] = 4.0 * acc_eps(d) * m + eps(d) * v.abs() + tiny(d);
        }
        let what = format!(
            "{} {d} family {fi} x {xs:?} cos {cs:?} interleaved {inter}",
            if backward { "rope_backward" } else { "rope" }
        );
        check(&what, &y.read(ctx, "y")?, &want, &tol)?;
    }
    Ok(())
}

fn run_add_norm(ctx: &Ctx, d: DType, rms: bool) -> CaseResult {
    let s = ctx.stream()?;
    let ad = acc_dtype(d);
    let ae = acc_eps(d);
    const EPS: f64 = 1e-5;
    for (fi, shape) in [vec![5u64, 300], vec![2, 3, 64], vec![0, 8], vec![1, 1]]
        .into_iter()
        .enumerate()
    {
        let len = *shape.last().unwrap() as usize;
        let n = numel(&shape);
        let rows = n / len.max(1);
        let rshape = shape[..shape.len() - 1].to_vec();
        let x = put(
            ctx,
            &s,
            d,
            &shape,
            Layout::Padded,
            &gen(n, fi as u64 + 1, -2.0, 2.0),
        )?;
        let r = put(
            ctx,
            &s,
            d,
            &shape,
            Layout::Dense,
            &gen(n, fi as u64 + 5, -2.0, 2.0),
        )?;
        let w = dense(
            ctx,
            &s,
            d,
            &[len as u64],
            &gen(len, fi as u64 + 2, 0.5, 1.5),
        )?;
        let b = dense(
            ctx,
            &s,
            d,
            &[len as u64],
            &gen(len, fi as u64 + 3, -1.0, 1.0),
        )?;
        let h = put(ctx, &s, d, &shape, Layout::Padded, &vec![0.0; n])?;
        let y = put(ctx, &s, d, &shape, Layout::Dense, &vec![0.0; n])?;
        let mean = dense(ctx, &s, ad, &rshape, &vec![0.0; rows])?;
        let rstd = dense(ctx, &s, ad, &rshape, &vec![0.0; rows])?;
        let call = if rms {
            OpCall::add_rms_norm(
                x.view(),
                r.view(),
                w.view(),
                h.view(),
                y.view(),
                rstd.view(),
                EPS,
            )
        } else {
            OpCall::add_layer_norm(
                x.view(),
                r.view(),
                w.view(),
                b.view(),
                h.view(),
                y.view(),
                mean.view(),
                rstd.view(),
                EPS,
            )
        };
        s.run_op(&call)?;
        s.synchronize()?;
        let what = format!(
            "{} {d} family {fi} {shape:?}",
            if rms {
                "add_rms_norm"
            } else {
                "add_layer_norm"
            }
        );
        // h is x + residual rounded once into d: exactly representable checks bit for bit.
        let want_h: Vec<f64> = x
            .vals
            .iter()
            .zip(&r.vals)
            .map(|(a, c)| super::super::values::decode(d, &super::super::values::encode(d, a + c)))
            .collect();
        let got_h = h.read(ctx, "h")?;
        let zero = vec![0.0; n];
        check(&format!("{what}: h"), &got_h, &want_h, &zero)?;
        let (mut want, mut tol, mut wr, mut tr) = (vec![], vec![], vec![], vec![]);
        let (mut wm, mut tm) = (vec![], vec![]);
        for row in 0..rows {
            let hr = &want_h[row * len..(row + 1) * len];
            let (yr, mu, rs) = norm(hr, &w.vals, (!rms).then_some(&b.vals[..]), EPS, rms);
            let amp = 1.0 + rs * hr.iter().map(|v| v.abs()).sum::<f64>() / len as f64;
            for (j, yj) in yr.iter().enumerate() {
                let xh = (hr[j] - mu) * rs;
                tol.push(
                    2.0 * ae * (len as f64 + 8.0) * (xh.abs() + amp) * w.vals[j].abs()
                        + if rms { 0.0 } else { ae * b.vals[j].abs() }
                        + eps(d) * yj.abs()
                        + tiny(d),
                );
            }
            want.extend(yr);
            wr.push(rs);
            tr.push(ae * (len as f64 + 8.0) * amp * amp * rs);
            wm.push(mu);
            tm.push(ae * (len as f64 + 2.0) * amp / rs.max(f64::MIN_POSITIVE));
        }
        check(&format!("{what}: y"), &y.read(ctx, "y")?, &want, &tol)?;
        check(&format!("{what}: rstd"), &rstd.read(ctx, "rstd")?, &wr, &tr)?;
        if !rms {
            check(&format!("{what}: mean"), &mean.read(ctx, "mean")?, &wm, &tm)?;
        }
    }
    Ok(())
}

/// The transformer-block cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for d in FLOATS {
        let mut add = |op: OpId, body: fn(&Ctx, DType) -> CaseResult| {
            // The backward cases run the forward pass first for its out and lse.
            let mut needs = vec![Need::Op(op, d)];
            if op == OpId::AttentionBackward {
                needs.push(Need::Op(OpId::Attention, d));
            }
            v.push(
                Case::new(format!("ops.{}.{}", op.name(), d.name()), move |ctx| {
                    body(ctx, d)
                })
                .needs(&needs),
            );
        };
        add(OpId::Attention, |c, d| run_attention(c, d, false));
        add(OpId::AttentionBackward, |c, d| run_attention(c, d, true));
        add(OpId::Rope, |c, d| run_rope(c, d, false));
        add(OpId::RopeBackward, |c, d| run_rope(c, d, true));
        add(OpId::AddLayerNorm, |c, d| run_add_norm(c, d, false));
        add(OpId::AddRmsNorm, |c, d| run_add_norm(c, d, true));
    }
    v
}
