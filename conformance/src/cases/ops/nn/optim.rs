//! `ops.sgd_momentum.<grad dtype>`, `ops.adamw.<grad dtype>`, `ops.amp_unscale.<dtype>`,
//! `ops.amp_update_scale`, `ops.clip_grad_norm.<dtype>` and `ops.optim.misuse`: the multi-tensor
//! training steps against f64 references written here.
//!
//! Optimizer steps run three times in a row on 36 groups (more than one launch's worth), of sizes
//! 0 to 40000 (several blocks), with and without an f16/bf16 copy; every step is checked against
//! the reference computed from the values the previous step left, within a few f32 roundings of
//! the magnitudes involved, plus the error of `1 - beta` (or `1 - dampening`) computed from the
//! f32 value of the hyper-parameter, as single-precision kernels do; the copy must be exactly the
//! rounding of the returned parameter. AMP unscaling is exact (the f32 product, then rounding into the
//! gradient dtype); the loss-scale update is exact; clipping checks the norm against the
//! accumulation error bound and the scaled gradients against the factor from the reported norm.

use super::{acc_eps, dense, gen, numel, same_bits, tiny, Tensor, HALVES};
use crate::case::{expect_invalid, Case, CaseResult, Ctx, Failure, Need};
use crate::cases::ops::values::{eps, round_to};
use crate::ensure;
use std::sync::Arc;
use unihal_hal::{
    AdamWOptions, DType, Invalid, OpCall, OpId, ParamGroup, Result as HalResult, SgdOptions,
    Stream, TensorView,
};

const F32_EPS: f64 = f32::EPSILON as f64;

/// `v` as an f32 value.
fn r32(v: f64) -> f64 {
    v as f32 as f64
}

/// The copy dtypes of the optimizer variants.
/// The parameter copies the optimizer cases write: none and f16 in the main cases; bf16 in cases
/// of their own, which also need a cast into bf16 (the Atlas 910 has none).
const COPIES: [Option<DType>; 2] = [None, Some(DType::F16)];
const COPY_BF16: [Option<DType>; 1] = [Some(DType::Bf16)];

/// The group shapes of one optimizer call: empty, tiny, 2-D, large, then 30 small ones (more than
/// `MT_MAX_GROUPS` in all).
fn group_shapes() -> Vec<Vec<u64>> {
    let mut v = vec![
        vec![0],
        vec![1],
        vec![5],
        vec![10, 10],
        vec![40000],
        vec![3, 11],
    ];
    v.extend((0..30).map(|k| vec![k % 7 + 1]));
    v
}

/// `got` within `tol` of `want`, element by element.
fn within(what: &str, got: &[f64], want: &[f64], tol: &[f64]) -> CaseResult {
    super::check(what, got, want, tol)
}

/// One element's reference update: the new parameter and state, and how far each may be off.
#[derive(Debug, Clone, Copy)]
struct Upd {
    p: f64,
    st: [f64; 2],
    tol_p: f64,
    tol_st: [f64; 2],
}

/// Unit roundoff of f32.
const U: f64 = F32_EPS / 2.0;

/// `torch.optim.SGD`'s step for one element (state: `[momentum_buffer]`).
///
/// Tolerances: 8 f32 roundings of the magnitudes of the terms, plus the error of `1 - dampening`
/// computed from the f32 value of `dampening` (at most `U * dampening`).
fn sgd_ref(o: &SgdOptions, p: f64, g: f64, st: &[f64]) -> Upd {
    let buf = st[0];
    let d0 = g + o.weight_decay * p;
    let m0 = g.abs() + o.weight_decay * p.abs();
    if o.momentum == 0.0 {
        // No momentum: the buffer is neither read nor written.
        return Upd {
            p: p - o.lr * d0,
            st: [buf, 0.0],
            tol_p: 8.0 * F32_EPS * (p.abs() + o.lr * m0),
            tol_st: [0.0; 2],
        };
    }
    let (b, mb, coef) = if o.first_step {
        (d0, m0, 0.0)
    } else {
        (
            o.momentum * buf + (1.0 - o.dampening) * d0,
            o.momentum * buf.abs() + (1.0 - o.dampening) * m0,
            U * o.dampening * d0.abs(),
        )
    };
    let (d, md, coef_d) = if o.nesterov {
        (d0 + o.momentum * b, m0 + o.momentum * mb, o.momentum * coef)
    } else {
        (b, mb, coef)
    };
    Upd {
        p: p - o.lr * d,
        st: [b, 0.0],
        tol_p: 8.0 * F32_EPS * (p.abs() + o.lr * md) + o.lr * coef_d,
        tol_st: [8.0 * F32_EPS * mb + coef, 0.0],
    }
}

/// `torch.optim.AdamW`'s step for one element (state: `[exp_avg, exp_avg_sq]`).
///
/// Tolerances: 8 f32 roundings of the magnitudes of the terms, plus the errors of `1 - beta1` and
/// `1 - beta2` computed from the f32 values of the betas (at most `U * beta`; `1 - beta2` is small
/// so this is many ulps of it) carried through to the parameter. The bias corrections must be
/// accurate to f32 rounding.
fn adamw_ref(o: &AdamWOptions, p: f64, g: f64, st: &[f64]) -> Upd {
    let (m, v) = (st[0], st[1]);
    let m1 = o.beta1 * m + (1.0 - o.beta1) * g;
    let mm = o.beta1 * m.abs() + (1.0 - o.beta1) * g.abs();
    let coef_m = U * o.beta1 * g.abs();
    let v1 = o.beta2 * v + (1.0 - o.beta2) * g * g;
    let coef_v = U * o.beta2 * g * g;
    let bc1 = 1.0 - o.beta1.powi(o.step as i32);
    let bc2 = (1.0 - o.beta2.powi(o.step as i32)).sqrt();
    let root = v1.sqrt() / bc2;
    let denom = root + o.eps;
    let step_size = o.lr / bc1;
    // A relative error e of v1 moves m1 / denom by at most |m1| / denom * e / 2 * root / denom.
    let via_v = if v1 > 0.0 {
        (m1 / denom).abs() * coef_v / (2.0 * v1) * (root / denom)
    } else {
        0.0
    };
    Upd {
        p: p * (1.0 - o.lr * o.weight_decay) - step_size * (m1 / denom),
        st: [m1, v1],
        tol_p: 8.0 * F32_EPS * (p.abs() + step_size * (m1.abs() + mm) / denom)
            + step_size * (coef_m / denom + via_v),
        tol_st: [8.0 * F32_EPS * mm + coef_m, 8.0 * F32_EPS * v1 + coef_v],
    }
}

/// The device tensors of one optimizer call and the host values they hold.
struct Groups {
    shapes: Vec<Vec<u64>>,
    params: Vec<Tensor>,
    states: Vec<Vec<Tensor>>,
    copies: Vec<Option<Tensor>>,
    p: Vec<Vec<f64>>,
    st: Vec<Vec<Vec<f64>>>,
}

impl Groups {
    /// Parameters in [-2, 2), state from `state(k, n, seed)` for each of `nstate` states, copies
    /// holding stale values.
    fn new(
        ctx: &Ctx,
        s: &Arc<dyn Stream>,
        nstate: usize,
        copy: Option<DType>,
        seed: u64,
        state: impl Fn(usize, usize, u64) -> Vec<f64>,
    ) -> HalResult<Groups> {
        let shapes = group_shapes();
        let (mut params, mut states, mut copies, mut p, mut st) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (g, sh) in shapes.iter().enumerate() {
            let n = numel(sh);
            let sd = seed + 100 * g as u64;
            let t = dense(ctx, s, DType::F32, sh, &gen(n, sd, -2.0, 2.0))?;
            p.push(t.vals.clone());
            params.push(t);
            let mut ts = Vec::new();
            let mut vs = Vec::new();
            for k in 0..nstate {
                let t = dense(ctx, s, DType::F32, sh, &state(k, n, sd + 1 + k as u64))?;
                vs.push(t.vals.clone());
                ts.push(t);
            }
            states.push(ts);
            st.push(vs);
            copies.push(match copy {
                Some(cd) => Some(dense(ctx, s, cd, sh, &gen(n, sd + 9, 5.0, 6.0))?),
                None => None,
            });
        }
        Ok(Groups {
            shapes,
            params,
            states,
            copies,
            p,
            st,
        })
    }

    #[allow(clippy::too_many_arguments)]
    /// Runs one step with fresh gradients in `gd` and checks every tensor against `reference`
    /// (taking `(p, g, state)`).
    fn step(
        &mut self,
        ctx: &Ctx,
        s: &Arc<dyn Stream>,
        gd: DType,
        seed: u64,
        what: &str,
        make: impl Fn(&[ParamGroup]) -> OpCall,
        reference: impl Fn(f64, f64, &[f64]) -> Upd,
    ) -> CaseResult {
        let mut grads = Vec::new();
        for (g, sh) in self.shapes.iter().enumerate() {
            let n = numel(sh);
            grads.push(dense(ctx, s, gd, sh, &gen(n, seed + g as u64, -1.0, 1.0))?);
        }
        let groups: Vec<ParamGroup> = (0..self.shapes.len())
            .map(|g| ParamGroup {
                param: self.params[g].view(),
                grad: grads[g].view(),
                state: self.states[g].iter().map(|t| t.view()).collect(),
                copy: self.copies[g].as_ref().map(|t| t.view()),
            })
            .collect();
        s.run_op(&make(&groups))?;
        s.synchronize()?;
        for (g, grad) in grads.iter().enumerate() {
            let wg = format!("{what}: group {g} {:?}", self.shapes[g]);
            let got_p = self.params[g].read(ctx, &format!("{wg}: param"))?;
            let got_st: Vec<Vec<f64>> = self.states[g]
                .iter()
                .enumerate()
                .map(|(k, t)| t.read(ctx, &format!("{wg}: state {k}")))
                .collect::<Result<_, Failure>>()?;
            let n = got_p.len();
            let nstate = got_st.len();
            let (mut want_p, mut tol_p) = (Vec::with_capacity(n), Vec::with_capacity(n));
            let mut want_st = vec![Vec::with_capacity(n); nstate];
            let mut tol_st = vec![Vec::with_capacity(n); nstate];
            for i in 0..n {
                let st: Vec<f64> = (0..nstate).map(|k| self.st[g][k][i]).collect();
                let gi = grad.vals[i];
                let p = self.p[g][i];
                let u = reference(p, gi, &st);
                want_p.push(u.p);
                tol_p.push(u.tol_p);
                for k in 0..nstate {
                    want_st[k].push(u.st[k]);
                    tol_st[k].push(u.tol_st[k]);
                }
            }
            within(&format!("{wg}: param"), &got_p, &want_p, &tol_p)?;
            for k in 0..nstate {
                within(
                    &format!("{wg}: state {k}"),
                    &got_st[k],
                    &want_st[k],
                    &tol_st[k],
                )?;
            }
            if let Some(c) = &self.copies[g] {
                let got_c = c.read(ctx, &format!("{wg}: copy"))?;
                let want_c: Vec<f64> = got_p.iter().map(|&v| round_to(c.dtype, v)).collect();
                same_bits(
                    &format!("{wg}: {} copy of the returned param", c.dtype),
                    c.dtype,
                    &got_c,
                    &want_c,
                )?;
            }
            self.p[g] = got_p;
            self.st[g] = got_st;
        }
        Ok(())
    }
}

fn sgd(ctx: &Ctx, gd: DType, copies: &[Option<DType>]) -> CaseResult {
    let s = ctx.stream()?;
    let mut seed = 1000;
    for &copy in copies {
        for (momentum, nesterov) in [(0.9, false), (0.9, true), (0.0, false)] {
            seed += 10_000;
            let mut groups = Groups::new(ctx, &s, 1, copy, seed, |_, n, sd| gen(n, sd, -0.5, 0.5))?;
            for step in 0..3 {
                let o = SgdOptions {
                    lr: 0.1,
                    momentum,
                    dampening: 0.1,
                    weight_decay: 0.01,
                    nesterov,
                    first_step: step == 0,
                };
                let what = format!(
                    "sgd_momentum {gd} (momentum {momentum}, nesterov {nesterov}, copy {copy:?}) step {}",
                    step + 1
                );
                groups.step(
                    ctx,
                    &s,
                    gd,
                    seed + 1000 * step,
                    &what,
                    |g| OpCall::sgd_momentum(g, o),
                    |p, g, st| sgd_ref(&o, p, g, st),
                )?;
            }
        }
    }
    Ok(())
}

fn adamw(ctx: &Ctx, gd: DType, copies: &[Option<DType>]) -> CaseResult {
    let s = ctx.stream()?;
    let mut seed = 2000;
    for &copy in copies {
        seed += 10_000;
        let mut groups = Groups::new(ctx, &s, 2, copy, seed, |k, n, sd| {
            if k == 0 {
                gen(n, sd, -0.1, 0.1)
            } else {
                gen(n, sd, 0.0, 0.01)
            }
        })?;
        for step in 1..=3u64 {
            let o = AdamWOptions {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                step,
            };
            let what = format!("adamw {gd} (copy {copy:?}) step {step}");
            groups.step(
                ctx,
                &s,
                gd,
                seed + 1000 * step,
                &what,
                |g| OpCall::adamw(g, o),
                |p, g, st| adamw_ref(&o, p, g, st),
            )?;
        }
    }
    Ok(())
}

/// Gradient values of magnitudes 2^-20 to 2^15, both signs (rounded into `d` when placed).
fn spread(n: usize, seed: u64) -> Vec<f64> {
    let e = gen(n, seed, -20.0, 15.0);
    let sign = gen(n, seed + 1, -1.0, 1.0);
    e.iter()
        .zip(&sign)
        .map(|(&e, &s)| 2f64.powf(e).copysign(s))
        .collect()
}

fn unscale(ctx: &Ctx, d: DType) -> CaseResult {
    let few: Vec<u64> = vec![1, 100, 0, 3000, 7];
    let many: Vec<u64> = (0..30).map(|k| k % 5 + 1).collect();
    // (name, sizes, inv_scale, found_inf before, planted (tensor, element, value), found after)
    type Variant = (
        &'static str,
        Vec<u64>,
        f64,
        f64,
        Vec<(usize, usize, f64)>,
        f64,
    );
    let variants: Vec<Variant> = vec![
        ("finite", few.clone(), 1.0 / 3.0, 0.0, vec![], 0.0),
        (
            "inf and NaN",
            few.clone(),
            1.0 / 3.0,
            0.0,
            vec![(1, 17, f64::INFINITY), (3, 2999, f64::NAN)],
            1.0,
        ),
        (
            "-inf",
            few.clone(),
            2f64.powi(-16),
            0.0,
            vec![(4, 6, f64::NEG_INFINITY)],
            1.0,
        ),
        ("finite, found_inf already set", few, 0.7, 1.0, vec![], 1.0),
        ("30 finite", many.clone(), 1.0 / 3.0, 0.0, vec![], 0.0),
        (
            "30, inf in the second launch",
            many,
            1.0 / 3.0,
            0.0,
            vec![(27, 0, f64::INFINITY)],
            1.0,
        ),
    ];
    let s = ctx.stream()?;
    for (vi, (name, sizes, inv, before, planted, after)) in variants.into_iter().enumerate() {
        let found = dense(ctx, &s, DType::F32, &[1], &[before])?;
        let inv_t = dense(ctx, &s, DType::F32, &[], &[inv])?;
        let invf = inv_t.vals[0];
        let mut grads = Vec::new();
        for (k, &n) in sizes.iter().enumerate() {
            let mut v = spread(n as usize, 77 + 10 * (vi * 100 + k) as u64);
            for &(t, i, x) in &planted {
                if t == k {
                    v[i] = x;
                }
            }
            grads.push(dense(ctx, &s, d, &[n], &v)?);
        }
        let views: Vec<TensorView> = grads.iter().map(|t| t.view()).collect();
        s.run_op(&OpCall::amp_unscale(found.view(), inv_t.view(), &views))?;
        s.synchronize()?;
        let what = format!("amp_unscale {d} ({name}, inv_scale {invf:e})");
        for (k, t) in grads.iter().enumerate() {
            let got = t.read(ctx, &what)?;
            // The f32 product (exact in f64 for f32 operands, then rounded once), then the dtype.
            let want: Vec<f64> = t.vals.iter().map(|&g| round_to(d, r32(g * invf))).collect();
            same_bits(&format!("{what}: grad {k}"), d, &got, &want)?;
        }
        let f = found.read(ctx, &what)?[0];
        ensure!(
            f == after,
            "{what}: found_inf {f} after the call (was {before}), expected {after}"
        );
        ensure!(
            inv_t.read(ctx, &what)?[0] == invf,
            "{what}: inv_scale changed"
        );
    }
    Ok(())
}

fn update_scale(ctx: &Ctx) -> CaseResult {
    // (growth, backoff, interval, scale, tracker, found_inf of each step)
    let seqs: [(f64, f64, i64, f64, i32, Vec<bool>); 4] = [
        (
            2.0,
            0.5,
            3,
            65536.0,
            0,
            [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0]
                .map(|x| x != 0)
                .to_vec(),
        ),
        // 2^127 * 2 overflows: the scale stays, the tracker resets.
        (2.0, 0.5, 2, 2f64.powi(126), 1, vec![false; 6]),
        // Non-power-of-two factors; 3e38 * 1.5 overflows, 2.25e38 * 1.5 does not.
        (1.5, 0.75, 1, 3e38, 0, vec![false, true, false, false, true]),
        // A tracker that starts part way, backoff by 4.
        (
            2.0,
            0.25,
            4,
            1.0,
            2,
            vec![false, false, true, false, false, false, false],
        ),
    ];
    let s = ctx.stream()?;
    for (growth, backoff, interval, scale0, tracker0, founds) in seqs {
        let scale = dense(ctx, &s, DType::F32, &[1], &[scale0])?;
        let tracker = dense(ctx, &s, DType::I32, &[], &[tracker0 as f64])?;
        let clean = dense(ctx, &s, DType::F32, &[], &[0.0])?;
        let inf = dense(ctx, &s, DType::F32, &[1], &[1.0])?;
        let (mut sc, mut tr) = (scale.vals[0], tracker0 as i64);
        for (k, &f) in founds.iter().enumerate() {
            let found = if f { &inf } else { &clean };
            s.run_op(&OpCall::amp_update_scale(
                scale.view(),
                tracker.view(),
                found.view(),
                growth,
                backoff,
                interval,
            ))?;
            s.synchronize()?;
            // Reference: f32 arithmetic with the (exactly representable) factors.
            if f {
                sc = r32(sc * backoff);
                tr = 0;
            } else {
                tr += 1;
                if tr == interval {
                    let ns = r32(sc * growth);
                    if ns.is_finite() {
                        sc = ns;
                    }
                    tr = 0;
                }
            }
            let what = format!(
                "amp_update_scale (growth {growth}, backoff {backoff}, interval {interval}, from scale {scale0:e} tracker {tracker0}) step {} (found_inf {f})",
                k + 1
            );
            let (gs, gt) = (scale.read(ctx, &what)?[0], tracker.read(ctx, &what)?[0]);
            ensure!(
                gs == sc && gt == tr as f64,
                "{what}: scale {gs:e}, tracker {gt}; expected {sc:e}, {tr}"
            );
        }
        ensure!(
            clean.read(ctx, "found_inf")?[0] == 0.0 && inf.read(ctx, "found_inf")?[0] == 1.0,
            "amp_update_scale wrote found_inf"
        );
    }
    Ok(())
}

fn clip(ctx: &Ctx, d: DType) -> CaseResult {
    let few: Vec<u64> = vec![1, 100, 0, 3000, 7, 40000];
    let many: Vec<u64> = (0..30).map(|k| (k * 3) % 17 + 1).collect();
    let s = ctx.stream()?;
    let mut seed = 300;
    for sizes in [few, many] {
        for ratio in [0.25, 4.0, 0.5, 2.0] {
            seed += 100;
            let total_t = dense(ctx, &s, DType::F32, &[], &[123.0])?;
            let mut grads = Vec::new();
            for (k, &n) in sizes.iter().enumerate() {
                grads.push(dense(
                    ctx,
                    &s,
                    d,
                    &[n],
                    &gen(n as usize, seed + k as u64, -1.0, 1.0),
                )?);
            }
            let total: f64 = grads
                .iter()
                .flat_map(|t| t.vals.iter())
                .map(|v| v * v)
                .sum::<f64>()
                .sqrt();
            let max_norm = ratio * total;
            let views: Vec<TensorView> = grads.iter().map(|t| t.view()).collect();
            s.run_op(&OpCall::clip_grad_norm(total_t.view(), &views, max_norm))?;
            s.synchronize()?;
            let what = format!(
                "clip_grad_norm {d}: {} grads, max_norm {ratio} x the norm",
                sizes.len()
            );
            let got_total = total_t.read(ctx, &what)?[0];
            // Squares summed per tensor, then over tensors, in the accumulation dtype.
            let terms = *sizes.iter().max().expect("non-empty") as f64 + sizes.len() as f64 + 2.0;
            let tol = terms * acc_eps(d) * total;
            ensure!(
                (got_total - total).abs() <= tol,
                "{what}: total_norm {got_total:e}, expected {total:e} within {tol:e}"
            );
            // The factor from the reported norm, in f32.
            let c = (r32(max_norm) / (got_total + 1e-6)).min(1.0);
            for (k, t) in grads.iter().enumerate() {
                let got = t.read(ctx, &what)?;
                if ratio >= 2.0 {
                    // max_norm well above the norm: the gradients are unchanged.
                    same_bits(&format!("{what}: grad {k} (not clipped)"), d, &got, &t.vals)?;
                    continue;
                }
                let want: Vec<f64> = t.vals.iter().map(|&g| g * c).collect();
                let tol: Vec<f64> = want
                    .iter()
                    .map(|w| w.abs() * (4.0 * F32_EPS + eps(d)) + tiny(d))
                    .collect();
                within(&format!("{what}: grad {k}"), &got, &want, &tol)?;
            }
        }
    }
    Ok(())
}

/// A fresh dense tensor of `n` elements.
fn t(ctx: &Ctx, d: DType, n: u64) -> HalResult<TensorView> {
    Ok(TensorView::contiguous(
        &ctx.device.alloc(n.max(1) as usize * d.size())?,
        d,
        &[n],
    ))
}

fn value_err(r: Invalid, what: &str, want_value: Option<(&str, &str)>) -> CaseResult {
    match (&r, want_value) {
        (Invalid::Value { value, accepted }, Some((v, a))) => {
            ensure!(
                value == v && accepted == a,
                "{what}: got value {value:?} accepted {accepted:?}, expected {v:?} and {a:?}"
            );
            Ok(())
        }
        (Invalid::Value { .. }, None) => Ok(()),
        _ => Err(Failure::new(format!(
            "{what}: {r:?}, expected Invalid::Value"
        ))),
    }
}

fn optim_misuse(ctx: &Ctx) -> CaseResult {
    use DType::*;
    let s = ctx.stream()?;
    let n = 8;
    let sgd_g = |copy: Option<DType>| -> HalResult<ParamGroup> {
        Ok(ParamGroup {
            param: t(ctx, F32, n)?,
            grad: t(ctx, F32, n)?,
            state: vec![t(ctx, F32, n)?],
            copy: match copy {
                Some(cd) => Some(t(ctx, cd, n)?),
                None => None,
            },
        })
    };
    let adam_g = || -> HalResult<ParamGroup> {
        Ok(ParamGroup {
            param: t(ctx, F32, n)?,
            grad: t(ctx, F32, n)?,
            state: vec![t(ctx, F32, n)?, t(ctx, F32, n)?],
            copy: None,
        })
    };
    let so = SgdOptions {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        first_step: true,
    };
    let ao = AdamWOptions {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 1,
    };
    // The well-formed calls run.
    let good_sgd = vec![sgd_g(Some(F16))?, sgd_g(Some(F16))?];
    let good_adam = vec![adam_g()?, adam_g()?];
    s.run_op(&OpCall::sgd_momentum(&good_sgd, so))?;
    s.run_op(&OpCall::adamw(&good_adam, ao))?;
    s.synchronize()?;

    let sgd = |g: &[ParamGroup], o: SgdOptions| s.run_op(&OpCall::sgd_momentum(g, o));
    let adam = |g: &[ParamGroup], o: AdamWOptions| s.run_op(&OpCall::adamw(g, o));

    // Group width: a copy in one group only; AdamW with one state tensor.
    let r = expect_invalid(sgd(&[sgd_g(Some(F16))?, sgd_g(None)?], so), "tensors")?;
    value_err(
        r,
        "sgd with a copy in one group only",
        Some((
            "7 tensors",
            "groups of 4 (param, grad, state..., copy if any)",
        )),
    )?;
    let mut g = adam_g()?;
    g.state.pop();
    let r = expect_invalid(adam(&[g], ao), "tensors")?;
    value_err(r, "adamw with one state tensor", None)?;

    // Dtypes.
    let mut g = sgd_g(None)?;
    g.param = t(ctx, F16, n)?;
    let r = expect_invalid(sgd(&[g], so), "tensors")?;
    ensure!(
        matches!(&r, Invalid::Value { value, .. } if value.contains("f16")),
        "f16 param: {r:?}"
    );
    let mut g = adam_g()?;
    g.state[1] = t(ctx, Bf16, n)?;
    let r = expect_invalid(adam(&[g], ao), "tensors")?;
    value_err(r, "bf16 exp_avg_sq", None)?;
    let mut g = sgd_g(None)?;
    g.copy = Some(t(ctx, F32, n)?);
    let r = expect_invalid(sgd(&[g], so), "tensors")?;
    value_err(r, "f32 copy", None)?;
    let mut g2 = sgd_g(None)?;
    g2.grad = t(ctx, F16, n)?;
    let r = expect_invalid(sgd(&[sgd_g(None)?, g2], so), "tensors")?;
    value_err(r, "gradients of two dtypes", None)?;
    let r = expect_invalid(sgd(&[sgd_g(Some(F16))?, sgd_g(Some(Bf16))?], so), "copy")?;
    value_err(r, "copies of two dtypes", None)?;
    let mut g = adam_g()?;
    g.grad = t(ctx, I32, n)?;
    // The key dtype (the gradient's) outside the op's dtypes: Unsupported or InvalidArgument.
    match adam(&[g], ao) {
        Err(unihal_hal::HalError::Unsupported { .. })
        | Err(unihal_hal::HalError::InvalidArgument { .. }) => {}
        other => return Err(Failure::new(format!("adamw with i32 gradients: {other:?}"))),
    }

    // A non-dense tensor.
    let mut g = sgd_g(None)?;
    g.param =
        TensorView::contiguous(&ctx.device.alloc(2 * n as usize * 4)?, F32, &[n]).strided(0, &[2]);
    let r = expect_invalid(sgd(&[g], so), "tensors")?;
    value_err(r, "strided param", None)?;
    let mut g = adam_g()?;
    g.state[0] = TensorView::contiguous(&ctx.device.alloc(n as usize * 4)?, F32, &[2, 4])
        .strided(0, &[1, 2]);
    let r = expect_invalid(adam(&[g], ao), "tensors")?;
    value_err(r, "transposed exp_avg", None)?;

    // Element counts within a group.
    let mut g = sgd_g(None)?;
    g.grad = t(ctx, F32, n - 1)?;
    let r = expect_invalid(sgd(&[g], so), "tensors")?;
    ensure!(
        matches!(&r, Invalid::Value { value, .. } if value.contains("7 elements against 8")),
        "a 7-element gradient for an 8-element param: {r:?}"
    );
    let mut g = adam_g()?;
    g.state[1] = t(ctx, F32, n + 1)?;
    let r = expect_invalid(adam(&[g], ao), "tensors")?;
    value_err(r, "a 9-element exp_avg_sq", None)?;

    // Overlap: the same tensor twice, a partial overlap, across groups.
    let mut g = sgd_g(None)?;
    g.state[0] = g.param.clone();
    let r = expect_invalid(sgd(&[g], so), "output")?;
    ensure!(
        matches!(r, Invalid::Overlap { .. }),
        "buffer = param: {r:?}"
    );
    let big = ctx.device.alloc((n as usize + 1) * 4)?;
    let mut g = sgd_g(None)?;
    g.param = TensorView::contiguous(&big, F32, &[n]);
    g.state[0] = TensorView::contiguous(&big, F32, &[n]).strided(4, &[1]);
    let r = expect_invalid(sgd(&[g], so), "output")?;
    ensure!(
        matches!(r, Invalid::Overlap { len: 28, .. }),
        "buffer one element past param: {r:?}"
    );
    let g0 = adam_g()?;
    let mut g1 = adam_g()?;
    g1.param = g0.grad.clone();
    let r = expect_invalid(adam(&[g0, g1], ao), "output")?;
    ensure!(
        matches!(r, Invalid::Overlap { .. }),
        "a param that is another group's gradient: {r:?}"
    );

    // Hyper-parameters.
    let g = [adam_g()?];
    for (o, arg, value, accepted) in [
        (AdamWOptions { beta1: 1.0, ..ao }, "beta1", "1", "[0, 1)"),
        (AdamWOptions { beta1: 1.5, ..ao }, "beta1", "1.5", "[0, 1)"),
        (AdamWOptions { beta2: 1.0, ..ao }, "beta2", "1", "[0, 1)"),
        (AdamWOptions { step: 0, ..ao }, "step", "0", "at least 1"),
        (
            AdamWOptions { eps: 0.0, ..ao },
            "eps",
            "0",
            "a finite eps > 0",
        ),
        (
            AdamWOptions { lr: -1e-3, ..ao },
            "lr",
            "-0.001",
            "a finite lr >= 0",
        ),
        (
            AdamWOptions {
                weight_decay: f64::NAN,
                ..ao
            },
            "weight_decay",
            "NaN",
            "a finite value >= 0",
        ),
    ] {
        let r = expect_invalid(adam(&g, o), arg)?;
        value_err(r, &format!("adamw {o:?}"), Some((value, accepted)))?;
    }
    let g = [sgd_g(None)?];
    for (o, arg) in [
        (
            SgdOptions {
                momentum: 1.5,
                ..so
            },
            "momentum",
        ),
        (
            SgdOptions {
                dampening: -0.1,
                ..so
            },
            "dampening",
        ),
        (
            SgdOptions {
                lr: f64::INFINITY,
                ..so
            },
            "lr",
        ),
        (
            SgdOptions {
                weight_decay: -0.01,
                ..so
            },
            "weight_decay",
        ),
    ] {
        let r = expect_invalid(sgd(&g, o), arg)?;
        value_err(r, &format!("sgd {o:?}"), None)?;
    }

    // AMP and clipping, where the device runs them.
    let caps = ctx.device.capabilities();
    let one = || t(ctx, F32, 1);
    if caps.supports(OpId::AmpUnscale, F32) {
        let grads = [t(ctx, F32, n)?, t(ctx, F32, 3)?];
        let unscale = |f: TensorView, i: TensorView, g: &[TensorView]| {
            s.run_op(&OpCall::amp_unscale(f, i, g))
        };
        let r = expect_invalid(unscale(t(ctx, F32, 2)?, one()?, &grads), "found_inf")?;
        value_err(r, "two-element found_inf", None)?;
        let r = expect_invalid(unscale(one()?, t(ctx, F16, 1)?, &grads), "inv_scale")?;
        value_err(r, "f16 inv_scale", None)?;
        let r = expect_invalid(unscale(one()?, one()?, &[]), "tensors")?;
        value_err(r, "no gradients", None)?;
        let r = expect_invalid(
            unscale(one()?, one()?, &[grads[0].clone(), t(ctx, F16, 3)?]),
            "grads",
        )?;
        value_err(r, "gradients of two dtypes", None)?;
        let f = one()?;
        let r = expect_invalid(unscale(f.clone(), one()?, &[grads[0].clone(), f]), "output")?;
        ensure!(
            matches!(r, Invalid::Overlap { .. }),
            "found_inf as a gradient: {r:?}"
        );
    }
    if caps.supports(OpId::ClipGradNorm, F32) {
        let grads = [t(ctx, F32, n)?];
        for m in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            let r = expect_invalid(
                s.run_op(&OpCall::clip_grad_norm(one()?, &grads, m)),
                "max_norm",
            )?;
            value_err(r, &format!("clip_grad_norm max_norm {m}"), None)?;
        }
    }
    if caps.supports(OpId::AmpUpdateScale, F32) {
        let found = one()?;
        let upd = |sc: TensorView, tr: TensorView, g: f64, b: f64, i: i64| {
            s.run_op(&OpCall::amp_update_scale(sc, tr, found.clone(), g, b, i))
        };
        let r = expect_invalid(upd(one()?, t(ctx, F32, 1)?, 2.0, 0.5, 10), "growth_tracker")?;
        value_err(r, "f32 growth tracker", None)?;
        let r = expect_invalid(upd(one()?, t(ctx, I32, 1)?, 2.0, 0.5, 0), "growth_interval")?;
        value_err(r, "growth_interval 0", Some(("0", "at least 1")))?;
        let r = expect_invalid(upd(one()?, t(ctx, I32, 1)?, 0.0, 0.5, 10), "growth_factor")?;
        value_err(r, "growth_factor 0", None)?;
        let r = expect_invalid(
            upd(one()?, t(ctx, I32, 1)?, 2.0, f64::NAN, 10),
            "backoff_factor",
        )?;
        value_err(r, "backoff_factor NaN", None)?;
        let sc = one()?;
        let tr = TensorView::contiguous(&sc.buffer, I32, &[1]);
        let r = expect_invalid(upd(sc, tr, 2.0, 0.5, 10), "output")?;
        ensure!(
            matches!(r, Invalid::Overlap { .. }),
            "tracker aliasing scale: {r:?}"
        );
    }

    // Refused calls do not poison the stream: a good call still runs.
    s.synchronize()?;
    s.run_op(&OpCall::sgd_momentum(
        &good_sgd,
        SgdOptions {
            first_step: false,
            ..so
        },
    ))?;
    s.synchronize()?;
    Ok(())
}

/// The optimizer and AMP cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for d in HALVES {
        let n = d.name();
        v.push(
            Case::new(format!("ops.sgd_momentum.{n}"), move |c| sgd(c, d, &COPIES))
                .needs(&[Need::Op(OpId::SgdMomentum, d)]),
        );
        v.push(
            Case::new(format!("ops.sgd_momentum.{n}.copy_bf16"), move |c| {
                sgd(c, d, &COPY_BF16)
            })
            .needs(&[
                Need::Op(OpId::SgdMomentum, d),
                Need::Op(OpId::Cast, DType::Bf16),
            ]),
        );
        v.push(
            Case::new(format!("ops.adamw.{n}"), move |c| adamw(c, d, &COPIES))
                .needs(&[Need::Op(OpId::AdamW, d)]),
        );
        v.push(
            Case::new(format!("ops.adamw.{n}.copy_bf16"), move |c| {
                adamw(c, d, &COPY_BF16)
            })
            .needs(&[Need::Op(OpId::AdamW, d), Need::Op(OpId::Cast, DType::Bf16)]),
        );
        v.push(
            Case::new(format!("ops.amp_unscale.{n}"), move |c| unscale(c, d))
                .needs(&[Need::Op(OpId::AmpUnscale, d)]),
        );
        v.push(
            Case::new(format!("ops.clip_grad_norm.{n}"), move |c| clip(c, d))
                .needs(&[Need::Op(OpId::ClipGradNorm, d)]),
        );
    }
    v.push(
        Case::new("ops.amp_update_scale.f32", update_scale)
            .needs(&[Need::Op(OpId::AmpUpdateScale, DType::F32)]),
    );
    v.push(Case::new("ops.optim.misuse", optim_misuse).needs(&[
        Need::Op(OpId::SgdMomentum, DType::F32),
        Need::Op(OpId::AdamW, DType::F32),
    ]));
    v
}
