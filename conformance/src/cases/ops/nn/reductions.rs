//! `ops.reduce_{sum,mean,max,min}.<dtype>`, `ops.arg{max,min}.<dtype>`: reductions along each axis
//! of dense, transposed and padded tensors, long rows (block-cooperative on GPUs), empty axes (sum
//! 0, mean NaN), no rows,
//! NaN and infinities, and rows whose sum cancels to near zero.

use super::reference::{arg, extreme, sum};
use super::{acc_eps, check, gen, numel, per_dtype, put, tiny, FLOATS};
use crate::case::{Case, CaseResult, Ctx};
use crate::cases::ops::elementwise::Layout;
use crate::cases::ops::values::eps;
use unihal_hal::{DType, OpCall, OpId};

const OPS: [OpId; 6] = [
    OpId::ReduceSum,
    OpId::ReduceMean,
    OpId::ReduceMax,
    OpId::ReduceMin,
    OpId::Argmax,
    OpId::Argmin,
];

/// (shape, axis, layout of x, special values).
fn families() -> Vec<(Vec<u64>, i64, Layout, bool)> {
    vec![
        (vec![5, 1037], 1, Layout::Dense, false),
        (vec![5, 1037], -2, Layout::Dense, false),
        (vec![3, 4, 70], 1, Layout::Transposed, false),
        (vec![3, 4, 70], 2, Layout::Padded, true),
        (vec![4099], 0, Layout::Reversed, false),
        (vec![6, 33], 1, Layout::Dense, true),
        (vec![0, 5], 1, Layout::Dense, false),
        (vec![2, 0, 3], 1, Layout::Dense, false),
        (vec![2, 1, 3], 1, Layout::Dense, false),
    ]
}

/// Values for x: uniform in [-2, 2); with `specials`, row-wise NaN, infinities, ties and rows
/// that cancel (+-1000 pairs plus small terms).
fn values(n: usize, len: usize, seed: u64, specials: bool) -> Vec<f64> {
    let mut v = gen(n, seed, -2.0, 2.0);
    if specials {
        for (i, x) in v.iter_mut().enumerate() {
            match (i / len.max(1)) % 6 {
                1 if i % 7 == 3 => *x = f64::NAN,
                2 if i % 5 == 1 => *x = f64::INFINITY,
                3 if i % 5 == 2 => *x = f64::NEG_INFINITY,
                4 => *x = if i % 2 == 0 { 1000.0 } else { -1000.0 } + (i % 3) as f64 * 0.25,
                5 => *x = (i % 4) as f64, // ties
                _ => {}
            }
        }
    }
    v
}

fn reduce(ctx: &Ctx, op: OpId, d: DType) -> CaseResult {
    let s = ctx.stream()?;
    for (fi, (shape, axis, layout, specials)) in families().into_iter().enumerate() {
        let nd = shape.len();
        let ax = if axis < 0 { axis + nd as i64 } else { axis } as usize;
        let len = shape[ax] as usize;
        if len == 0 && !matches!(op, OpId::ReduceSum | OpId::ReduceMean) {
            continue; // rejected by validation (see ops.nn.misuse)
        }
        let n = numel(&shape);
        // Specials along the reduced axis: generate in an axis-last order, then permute.
        let x = put(
            ctx,
            &s,
            d,
            &shape,
            layout,
            &values(n, len, fi as u64 + 3, specials),
        )?;
        let mut oshape = shape.clone();
        oshape[ax] = 1;
        let arg_op = matches!(op, OpId::Argmax | OpId::Argmin);
        let od = if arg_op { DType::I64 } else { d };
        let out = put(
            ctx,
            &s,
            od,
            &oshape,
            Layout::Padded,
            &vec![0.0; numel(&oshape)],
        )?;
        s.run_op(&OpCall::reduce(op, x.view(), out.view(), axis))?;
        s.synchronize()?;
        let got = out.read(ctx, "out")?;
        // Reference per output element.
        let inner: usize = shape[ax + 1..].iter().product::<u64>() as usize;
        let outer: usize = shape[..ax].iter().product::<u64>() as usize;
        let (mut want, mut tol) = (Vec::new(), Vec::new());
        for o in 0..outer {
            for i in 0..inner {
                let row: Vec<f64> = (0..len)
                    .map(|j| x.vals[(o * len + j) * inner + i])
                    .collect();
                let (w, t) = match op {
                    OpId::ReduceSum | OpId::ReduceMean => {
                        let (sm, abs) = sum(&row);
                        let div = if op == OpId::ReduceMean {
                            len as f64
                        } else {
                            1.0
                        };
                        let w = sm / div;
                        let t = acc_eps(d) * (len as f64 + 2.0) * abs / div
                            + eps(d) * w.abs()
                            + tiny(d);
                        (w, t)
                    }
                    OpId::ReduceMax => (extreme(&row, true), 0.0),
                    OpId::ReduceMin => (extreme(&row, false), 0.0),
                    OpId::Argmax => (arg(&row, true) as f64, 0.0),
                    _ => (arg(&row, false) as f64, 0.0),
                };
                want.push(w);
                tol.push(t);
            }
        }
        check(
            &format!("{op} {d} family {fi} {shape:?} axis {axis}"),
            &got,
            &want,
            &tol,
        )?;
    }
    Ok(())
}

/// One case per reduction and dtype.
pub fn cases() -> Vec<Case> {
    per_dtype(&OPS, &FLOATS, reduce)
}
