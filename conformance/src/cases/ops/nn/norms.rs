//! `ops.{layer_norm,rms_norm}{,_backward}.<dtype>`: over the last axis for long rows, one element
//! rows, strided leading dims, no rows (the weight gradients are then zero), a 1-d input and rows
//! with a large common offset (a one-pass variance would cancel catastrophically). The backward
//! cases take the saved statistics as inputs, so they test the backward kernels alone.

use super::reference::{norm, norm_backward, sum};
use super::{acc_eps, check, dense, gen, numel, put, tiny, FLOATS};
use crate::case::{Case, CaseResult, Ctx, Need};
use crate::cases::ops::elementwise::Layout;
use crate::cases::ops::values::eps;
use unihal_hal::op::nn::acc_dtype;
use unihal_hal::{DType, OpCall, OpId};

const EPS: f64 = 1e-5;

fn families() -> Vec<(Vec<u64>, Layout, f64)> {
    vec![
        (vec![7, 1037], Layout::Dense, 0.0),
        (vec![2, 3, 64], Layout::Padded, 0.0),
        (vec![1, 4099], Layout::Dense, 0.0),
        (vec![5, 1], Layout::Dense, 0.0),
        (vec![0, 16], Layout::Dense, 0.0),
        (vec![16], Layout::Dense, 0.0),
        (vec![4, 300], Layout::Dense, 100.0),
    ]
}

fn run(ctx: &Ctx, d: DType, rms: bool, backward: bool) -> CaseResult {
    let s = ctx.stream()?;
    let ae = acc_eps(d);
    let ad = acc_dtype(d);
    for (fi, (shape, layout, offset)) in families().into_iter().enumerate() {
        if offset != 0.0 && matches!(d, DType::F16 | DType::Bf16) {
            continue; // the offset leaves no precision for the spread in 16 bits
        }
        let len = *shape.last().unwrap() as usize;
        let n = numel(&shape);
        let rows = n / len.max(1);
        let rshape = shape[..shape.len() - 1].to_vec();
        let xv: Vec<f64> = gen(n, fi as u64 + 1, -2.0, 2.0)
            .iter()
            .map(|v| v + offset)
            .collect();
        let x = put(ctx, &s, d, &shape, layout, &xv)?;
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
        // Reference statistics from the stored x.
        let stats: Vec<(Vec<f64>, f64, f64)> = (0..rows)
            .map(|r| {
                let row = &x.vals[r * len..(r + 1) * len];
                norm(row, &w.vals, (!rms).then_some(&b.vals[..]), EPS, rms)
            })
            .collect();
        let mean_abs = |r: usize| sum(&x.vals[r * len..(r + 1) * len]).1 / len as f64;
        let what = format!(
            "{}{} {d} family {fi} {shape:?}",
            if rms { "rms_norm" } else { "layer_norm" },
            if backward { "_backward" } else { "" }
        );
        if !backward {
            let y = put(ctx, &s, d, &shape, Layout::Padded, &vec![0.0; n])?;
            let mean = dense(ctx, &s, ad, &rshape, &vec![0.0; rows])?;
            let rstd = dense(ctx, &s, ad, &rshape, &vec![0.0; rows])?;
            let call = if rms {
                OpCall::rms_norm(x.view(), w.view(), y.view(), rstd.view(), EPS)
            } else {
                OpCall::layer_norm(
                    x.view(),
                    w.view(),
                    b.view(),
                    y.view(),
                    mean.view(),
                    rstd.view(),
                    EPS,
                )
            };
            s.run_op(&call)?;
            s.synchronize()?;
            let (mut want, mut tol) = (Vec::new(), Vec::new());
            let (mut wm, mut tm, mut wr, mut tr) = (vec![], vec![], vec![], vec![]);
            for (r, (yr, mu, rs)) in stats.iter().enumerate() {
                let amp = 1.0 + rs * mean_abs(r);
                for (j, yj) in yr.iter().enumerate() {
                    let xh = (x.vals[r * len + j] - mu) * rs;
                    let t = 2.0 * ae * (len as f64 + 8.0) * (xh.abs() + amp) * w.vals[j].abs()
                        + if rms { 0.0 } else { ae * b.vals[j].abs() };
                    tol.push(t + eps(d) * yj.abs() + tiny(d));
                }
                want.extend(yr);
                wm.push(*mu);
                tm.push(ae * (len as f64 + 2.0) * mean_abs(r));
                wr.push(*rs);
                tr.push(ae * (len as f64 + 8.0) * amp * amp * rs);
            }
            check(&format!("{what}: y"), &y.read(ctx, "y")?, &want, &tol)?;
            check(&format!("{what}: rstd"), &rstd.read(ctx, "rstd")?, &wr, &tr)?;
            if !rms {
                check(&format!("{what}: mean"), &mean.read(ctx, "mean")?, &wm, &tm)?;
            }
            continue;
        }
        let dy = put(
            ctx,
            &s,
            d,
            &shape,
            layout,
            &gen(n, fi as u64 + 4, -1.0, 1.0),
        )?;
        let mu: Vec<f64> = stats.iter().map(|s| if rms { 0.0 } else { s.1 }).collect();
        let mean = dense(ctx, &s, ad, &rshape, &mu)?;
        let rstd = dense(
            ctx,
            &s,
            ad,
            &rshape,
            &stats.iter().map(|s| s.2).collect::<Vec<_>>(),
        )?;
        let (mu, rs) = (&mean.vals, &rstd.vals);
        let dx = put(ctx, &s, d, &shape, Layout::Padded, &vec![0.0; n])?;
        let dw = dense(ctx, &s, d, &[len as u64], &vec![5.0; len])?;
        let db = dense(ctx, &s, d, &[len as u64], &vec![5.0; len])?;
        let call = if rms {
            OpCall::rms_norm_backward(
                x.view(),
                dy.view(),
                w.view(),
                rstd.view(),
                dx.view(),
                dw.view(),
            )
        } else {
            OpCall::layer_norm_backward(
                x.view(),
                dy.view(),
                w.view(),
                mean.view(),
                rstd.view(),
                dx.view(),
                dw.view(),
                db.view(),
            )
        };
        s.run_op(&call)?;
        s.synchronize()?;
        let (mut want, mut tol) = (Vec::new(), Vec::new());
        let (mut gw, mut gb) = (vec![vec![]; len], vec![vec![]; len]);
        for r in 0..rows {
            let (xr, dyr) = (
                &x.vals[r * len..(r + 1) * len],
                &dy.vals[r * len..(r + 1) * len],
            );
            let wdx = norm_backward(xr, dyr, &w.vals, mu[r], rs[r], rms);
            let g: Vec<f64> = dyr.iter().zip(&w.vals).map(|(a, b)| a * b).collect();
            let xh: Vec<f64> = xr.iter().map(|&v| (v - mu[r]) * rs[r]).collect();
            let mg = sum(&g).1 / len as f64;
            let mgx =
                sum(&g.iter().zip(&xh).map(|(a, b)| a * b).collect::<Vec<_>>()).1 / len as f64;
            for j in 0..len {
                let t =
                    2.0 * ae * (len as f64 + 8.0) * rs[r] * (g[j].abs() + mg + xh[j].abs() * mgx);
                tol.push(t + eps(d) * wdx[j].abs() + tiny(d));
                gw[j].push(dyr[j] * xh[j]);
                gb[j].push(dyr[j]);
            }
            want.extend(wdx);
        }
        check(&format!("{what}: dx"), &dx.read(ctx, "dx")?, &want, &tol)?;
        let col = |terms: &Vec<Vec<f64>>| -> (Vec<f64>, Vec<f64>) {
            terms
                .iter()
                .map(|t| {
                    let (v, a) = sum(t);
                    (
                        v,
                        2.0 * ae * (rows as f64 + len as f64 + 8.0) * a
                            + eps(d) * v.abs()
                            + tiny(d),
                    )
                })
                .unzip()
        };
        let (ww, tw) = col(&gw);
        check(
            &format!("{what}: dweight"),
            &dw.read(ctx, "dweight")?,
            &ww,
            &tw,
        )?;
        if !rms {
            let (wb, tb) = col(&gb);
            check(&format!("{what}: dbias"), &db.read(ctx, "dbias")?, &wb, &tb)?;
        }
    }
    Ok(())
}

/// The norm cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (op, rms, backward) in [
        (OpId::LayerNorm, false, false),
        (OpId::LayerNormBackward, false, true),
        (OpId::RmsNorm, true, false),
        (OpId::RmsNormBackward, true, true),
    ] {
        for d in FLOATS {
            v.push(
                Case::new(format!("ops.{}.{}", op.name(), d.name()), move |ctx| {
                    run(ctx, d, rms, backward)
                })
                .needs(&[Need::Op(op, d)]),
            );
        }
    }
    v
}
