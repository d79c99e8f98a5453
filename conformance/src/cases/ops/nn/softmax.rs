//! `ops.{softmax,log_softmax}{,_masked,_backward}.<dtype>`: along the last axis over long rows,
//! a single-element row, strided leading dims, large logits, `-inf` entries and fully masked rows
//! (NaN, as PyTorch), NaN inputs, and masks broadcast over rows, per row, or given in full.

use super::reference::{extreme, logsumexp, softmax, softmax_backward, sum};
use super::{acc_eps, check, gen, numel, per_dtype, put, tiny, FLOATS};
use crate::case::{Case, CaseResult, Ctx};
use crate::cases::ops::elementwise::Layout;
use crate::cases::ops::values::eps;
use unihal_hal::{DType, OpCall, OpId};

/// (shape, layout, specials).
fn families() -> Vec<(Vec<u64>, Layout, bool)> {
    vec![
        (vec![7, 1037], Layout::Dense, false),
        (vec![3, 5, 64], Layout::Padded, true),
        (vec![1, 4099], Layout::Dense, false),
        (vec![4, 1], Layout::Dense, false),
        (vec![0, 8], Layout::Dense, false),
        (vec![6, 40], Layout::Dense, true),
    ]
}

/// Logits: uniform in [-4, 4); with specials, per row: large values, -inf entries, a fully -inf
/// row and a NaN.
fn logits(d: DType, n: usize, len: usize, seed: u64, specials: bool) -> Vec<f64> {
    let big = if d == DType::F16 { 3.0e4 } else { 1.0e6 };
    let mut v = gen(n, seed, -4.0, 4.0);
    if specials {
        for (i, x) in v.iter_mut().enumerate() {
            match (i / len) % 5 {
                1 => *x += if i % 2 == 0 { big } else { big - 3.0 },
                2 if i % 3 == 0 => *x = f64::NEG_INFINITY,
                3 => *x = f64::NEG_INFINITY,
                4 if i % len == len / 2 => *x = f64::NAN,
                _ => {}
            }
        }
    }
    v
}

fn run(ctx: &Ctx, op: OpId, d: DType) -> CaseResult {
    let s = ctx.stream()?;
    let masked = matches!(op, OpId::SoftmaxMasked | OpId::LogSoftmaxMasked);
    let backward = matches!(op, OpId::SoftmaxBackward | OpId::LogSoftmaxBackward);
    let log = matches!(
        op,
        OpId::LogSoftmax | OpId::LogSoftmaxMasked | OpId::LogSoftmaxBackward
    );
    let ae = acc_eps(d);
    for (fi, (shape, layout, specials)) in families().into_iter().enumerate() {
        let len = *shape.last().unwrap() as usize;
        let n = numel(&shape);
        let rows = n / len.max(1);
        let xv = logits(d, n, len, fi as u64 + 11, specials && !backward);
        let x = put(ctx, &s, d, &shape, layout, &xv)?;
        // Masks: full, broadcast over rows, or one value per row (stride 0 along the row).
        let mask_shape: Vec<u64> = match fi % 3 {
            0 => shape.clone(),
            1 => vec![len as u64],
            _ => [&shape[..shape.len() - 1], &[1]].concat(),
        };
        let mv: Vec<f64> = gen(numel(&mask_shape), fi as u64 + 5, -1.0, 1.0)
            .into_iter()
            .enumerate()
            .map(|(i, v)| if i % 4 == 1 { f64::NEG_INFINITY } else { v })
            .collect();
        let mask = put(ctx, &s, d, &mask_shape, Layout::Dense, &mv)?;
        let mval = |r: usize, j: usize| -> f64 {
            match fi % 3 {
                0 => mask.vals[r * len + j],
                1 => mask.vals[j],
                _ => mask.vals[r],
            }
        };
        // Backward inputs: y = the forward output (rounded), dy random.
        let y_in: Vec<f64> = (0..rows)
            .flat_map(|r| softmax(&x.vals[r * len..(r + 1) * len], log))
            .collect();
        let yt = put(ctx, &s, d, &shape, Layout::Dense, &y_in)?;
        let dy = put(
            ctx,
            &s,
            d,
            &shape,
            layout,
            &gen(n, fi as u64 + 21, -1.0, 1.0),
        )?;
        let out = put(ctx, &s, d, &shape, Layout::Padded, &vec![0.0; n])?;
        let call = if backward {
            OpCall::softmax_backward(op, yt.view(), dy.view(), out.view())
        } else if masked {
            OpCall::softmax_masked(op, x.view(), mask.view(), out.view())
        } else {
            OpCall::softmax(op, x.view(), out.view())
        };
        s.run_op(&call)?;
        s.synchronize()?;
        let got = out.read(ctx, "y")?;
        let (mut want, mut tol) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for r in 0..rows {
            let span = r * len..(r + 1) * len;
            if backward {
                let (yr, dyr) = (&yt.vals[span.clone()], &dy.vals[span]);
                let w = softmax_backward(yr, dyr, log);
                let s_abs = if log {
                    sum(dyr).1
                } else {
                    sum(&yr.iter().zip(dyr).map(|(a, b)| a * b).collect::<Vec<_>>()).1
                };
                for j in 0..len {
                    let scale = if log {
                        dyr[j].abs() + yr[j].exp() * s_abs
                    } else {
                        yr[j].abs() * (dyr[j].abs() + s_abs)
                    };
                    tol.push(ae * (len as f64 + 8.0) * scale + eps(d) * w[j].abs() + tiny(d));
                }
                want.extend(w);
                continue;
            }
            let v: Vec<f64> = (0..len)
                .map(|j| x.vals[r * len + j] + if masked { mval(r, j) } else { 0.0 })
                .collect();
            let w = softmax(&v, log);
            let (m, lse) = (extreme(&v, true), logsumexp(&v));
            for (j, &wj) in w.iter().enumerate() {
                let xin = x.vals[r * len + j].abs() + if masked { mval(r, j).abs() } else { 0.0 };
                let t = if log {
                    2.0 * ae * (xin + m.abs() + lse.abs() + len as f64 + 8.0)
                } else if wj == 0.0 {
                    0.0
                } else {
                    ae * (len as f64 + 8.0 + (v[j] - m).abs() + xin) * wj.abs()
                };
                tol.push(t + eps(d) * wj.abs() + tiny(d));
            }
            want.extend(w);
        }
        check(
            &format!("{op} {d} family {fi} {shape:?}"),
            &got,
            &want,
            &tol,
        )?;
    }
    Ok(())
}

/// One case per softmax op and dtype.
pub fn cases() -> Vec<Case> {
    let ops = [
        OpId::Softmax,
        OpId::LogSoftmax,
        OpId::SoftmaxMasked,
        OpId::LogSoftmaxMasked,
        OpId::SoftmaxBackward,
        OpId::LogSoftmaxBackward,
    ];
    per_dtype(&ops, &FLOATS, run)
}
