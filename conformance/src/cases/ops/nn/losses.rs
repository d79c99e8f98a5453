//! `ops.cross_entropy.<dtype>` and `ops.cross_entropy_backward.<dtype>`: PyTorch's semantics for
//! every reduction, label smoothing, `ignore_index` rows (not counted by `mean`), i32 and i64
//! targets, one class, many classes, no rows; and `ops.cross_entropy.bad_target`: a target outside
//! `[0, C)` is an error on the stream, not a wild read.

use super::reference::{cross_entropy, cross_entropy_grad, extreme, logsumexp, sum};
use super::{acc_eps, check, dense, gen, tiny, HALVES};
use crate::case::{Case, CaseResult, Ctx, Failure, Need};
use crate::cases::ops::values::eps;
use crate::ensure;
use unihal_hal::{CeOptions, CeReduction, DType, HalError, OpCall, OpId};

const IGNORE: i64 = -100;

/// (rows, classes).
const SHAPES: [(usize, usize); 5] = [(37, 10), (5, 1000), (1, 1), (0, 4), (64, 3)];

fn run(ctx: &Ctx, d: DType, backward: bool) -> CaseResult {
    let s = ctx.stream()?;
    let ae = acc_eps(d);
    let mut combo = 0u64;
    for (n, c) in SHAPES {
        for red in [CeReduction::Mean, CeReduction::Sum, CeReduction::None] {
            for smoothing in [0.0, 0.1] {
                combo += 1;
                let idx = if combo % 2 == 0 {
                    DType::I32
                } else {
                    DType::I64
                };
                let x = dense(
                    ctx,
                    &s,
                    d,
                    &[n as u64, c as u64],
                    &gen(n * c, combo, -3.0, 3.0),
                )?;
                let tv: Vec<f64> = (0..n)
                    .map(|r| {
                        if r % 7 == 3 {
                            IGNORE as f64
                        } else {
                            ((r * 5 + 1) % c) as f64
                        }
                    })
                    .collect();
                let t = dense(ctx, &s, idx, &[n as u64], &tv)?;
                let o = CeOptions {
                    reduction: red,
                    ignore_index: IGNORE,
                    label_smoothing: smoothing,
                };
                let loss_shape: Vec<u64> = if red == CeReduction::None {
                    vec![n as u64]
                } else {
                    vec![]
                };
                let loss_n = if red == CeReduction::None { n } else { 1 };
                // Per-row references.
                let mut rows = Vec::new();
                for (r, &target) in tv.iter().enumerate() {
                    let row = &x.vals[r * c..(r + 1) * c];
                    let lse = logsumexp(row);
                    let scale = (extreme(&row.iter().map(|v| v.abs()).collect::<Vec<_>>(), true)
                        + lse.abs()
                        + 1.0)
                        * ae
                        * (c as f64 + 8.0);
                    let counted = target as i64 != IGNORE;
                    let l = if counted {
                        cross_entropy(row, target as usize, smoothing)
                    } else {
                        0.0
                    };
                    rows.push((counted, l, scale));
                }
                let count = rows.iter().filter(|r| r.0).count() as f64;
                let what = format!(
                    "{} {d} rows {n} classes {c} {red:?} smoothing {smoothing}",
                    if backward {
                        "cross_entropy_backward"
                    } else {
                        "cross_entropy"
                    }
                );
                if !backward {
                    let loss = dense(ctx, &s, DType::F32, &loss_shape, &vec![7.0; loss_n])?;
                    s.run_op(&OpCall::cross_entropy(x.view(), t.view(), loss.view(), o))?;
                    s.synchronize()?;
                    let got = loss.read(ctx, "loss")?;
                    let (want, tol): (Vec<f64>, Vec<f64>) = match red {
                        CeReduction::None => rows
                            .iter()
                            .map(|&(_, l, sc)| (l, sc + eps(DType::F32) * l.abs()))
                            .unzip(),
                        _ => {
                            let (total, abs) = sum(&rows.iter().map(|r| r.1).collect::<Vec<_>>());
                            let err: f64 =
                                rows.iter().map(|r| r.2).sum::<f64>() + ae * (n as f64 + 2.0) * abs;
                            let div = if red == CeReduction::Mean { count } else { 1.0 };
                            (
                                vec![total / div],
                                vec![err / div + eps(DType::F32) * (total / div).abs()],
                            )
                        }
                    };
                    check(&what, &got, &want, &tol)?;
                } else {
                    let gv = gen(loss_n, combo + 100, 0.5, 2.0);
                    let dloss = dense(ctx, &s, DType::F32, &loss_shape, &gv)?;
                    let dx = dense(ctx, &s, d, &[n as u64, c as u64], &vec![9.0; n * c])?;
                    s.run_op(&OpCall::cross_entropy_backward(
                        x.view(),
                        t.view(),
                        dloss.view(),
                        dx.view(),
                        o,
                    ))?;
                    s.synchronize()?;
                    let got = dx.read(ctx, "dlogits")?;
                    let (mut want, mut tol) = (Vec::new(), Vec::new());
                    for (r, &(counted, _, scale)) in rows.iter().enumerate() {
                        let g = match red {
                            CeReduction::None => dloss.vals[r],
                            CeReduction::Sum => dloss.vals[0],
                            CeReduction::Mean => dloss.vals[0] / count,
                        };
                        let row = &x.vals[r * c..(r + 1) * c];
                        if !counted {
                            want.extend(std::iter::repeat_n(0.0, c));
                            tol.extend(std::iter::repeat_n(0.0, c));
                            continue;
                        }
                        let w = cross_entropy_grad(row, tv[r] as usize, smoothing, g);
                        let p = super::reference::softmax(row, false);
                        for j in 0..c {
                            tol.push(
                                g.abs() * (p[j] * scale + 2.0 * ae) + eps(d) * w[j].abs() + tiny(d),
                            );
                        }
                        want.extend(w);
                    }
                    check(&what, &got, &want, &tol)?;
                }
            }
        }
    }
    Ok(())
}

/// A target outside [0, C) (and not ignore_index) fails the stream.
fn bad_target(ctx: &Ctx) -> CaseResult {
    for bad in [-1.0, 4.0] {
        let s = ctx.stream()?;
        let x = dense(ctx, &s, DType::F32, &[3, 4], &gen(12, 1, -1.0, 1.0))?;
        let t = dense(ctx, &s, DType::I64, &[3], &[0.0, bad, 2.0])?;
        let loss = dense(ctx, &s, DType::F32, &[3], &[0.0; 3])?;
        let o = CeOptions {
            reduction: CeReduction::None,
            ..CeOptions::default()
        };
        let call = OpCall::cross_entropy(x.view(), t.view(), loss.view(), o);
        let r = match s.run_op(&call) {
            // On a device whose faults poison it, the fault may surface from the op's own later
            // launches already.
            Err(e) if ctx.device.capabilities().optional.fault_poisons_device => {
                ensure!(
                    !matches!(
                        e,
                        HalError::InvalidArgument { .. } | HalError::Unsupported { .. }
                    ),
                    "target {bad} with 4 classes: run_op refused the call: {e}"
                );
                return Ok(());
            }
            r => r.and_then(|()| s.synchronize()),
        };
        ensure!(
            r.is_err(),
            "target {bad} with 4 classes: synchronize returned {r:?}"
        );
        if ctx.device.capabilities().optional.fault_poisons_device {
            return Ok(()); // the device is unusable now; the error was seen
        }
        let _ = loss
            .read(ctx, "loss")
            .map_err(|e| Failure::new(e.message))?;
    }
    Ok(())
}

/// The cross-entropy cases.
pub fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for d in HALVES {
        for (op, backward) in [
            (OpId::CrossEntropy, false),
            (OpId::CrossEntropyBackward, true),
        ] {
            v.push(
                Case::new(format!("ops.{}.{}", op.name(), d.name()), move |ctx| {
                    run(ctx, d, backward)
                })
                .needs(&[Need::Op(op, d)]),
            );
        }
    }
    v.push(
        Case::new("ops.cross_entropy.bad_target", bad_target)
            .needs(&[Need::Op(OpId::CrossEntropy, DType::F32)])
            .faulting(),
    );
    v
}
