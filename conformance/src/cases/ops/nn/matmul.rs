//! `ops.matmul.<dtype>`: `c = alpha * a @ b + beta * c` over square and ragged sizes that cross
//! the 64-wide tiles, transposed operands (column-major views), K = 1, K = 0 (c = beta * c), a long
//! inner dimension, batches with broadcasting, strided (padded) outputs, and `beta = 0` with NaN
//! in `c` (not read, as in BLAS).

use super::reference::matmul;
use super::{acc_eps, check, gen, numel, per_dtype, put, tiny, FLOATS};
use crate::case::{Case, CaseResult, Ctx};
use crate::cases::ops::elementwise::Layout;
use crate::cases::ops::values::eps;
use unihal_hal::{DType, OpCall, OpId};

struct Family {
    a: Vec<u64>,
    b: Vec<u64>,
    la: Layout,
    lb: Layout,
    lc: Layout,
    alpha: f64,
    beta: f64,
}

fn fam(a: &[u64], b: &[u64], la: Layout, lb: Layout, lc: Layout, alpha: f64, beta: f64) -> Family {
    Family {
        a: a.to_vec(),
        b: b.to_vec(),
        la,
        lb,
        lc,
        alpha,
        beta,
    }
}

fn families() -> Vec<Family> {
    use Layout::*;
    vec![
        fam(&[64, 64], &[64, 64], Dense, Dense, Dense, 1.0, 0.0),
        fam(&[37, 129], &[129, 70], Transposed, Dense, Padded, 0.5, -1.5),
        fam(&[130, 200], &[200, 150], Dense, Transposed, Dense, 1.0, 1.0),
        fam(&[5, 1], &[1, 3], Dense, Dense, Dense, 2.0, 0.0),
        fam(&[4, 0], &[0, 6], Dense, Dense, Dense, 1.0, 0.5),
        fam(&[1, 4099], &[4099, 2], Dense, Dense, Dense, 1.0, 0.0),
        fam(&[3, 17, 33], &[33, 9], Dense, Dense, Dense, 1.0, 0.0),
        fam(
            &[2, 1, 5, 6],
            &[3, 6, 4],
            Padded,
            Transposed,
            Dense,
            1.0,
            0.25,
        ),
        fam(&[0, 4, 5], &[5, 2], Dense, Dense, Dense, 1.0, 0.0),
    ]
}

/// The broadcast batch shape of two leading shapes.
fn batch_shape(a: &[u64], b: &[u64]) -> Vec<u64> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let get = |s: &[u64]| {
                if i + s.len() >= n {
                    s[i + s.len() - n]
                } else {
                    1
                }
            };
            let (x, y) = (get(a), get(b));
            if x == 1 {
                y
            } else {
                x
            }
        })
        .collect()
}

/// Row-major batch index of `lead` for a batch multi-index of `batch` (broadcasting).
fn batch_index(lead: &[u64], batch: &[u64], mut flat: usize) -> usize {
    let mut idx = vec![0u64; batch.len()];
    for d in (0..batch.len()).rev() {
        idx[d] = flat as u64 % batch[d];
        flat /= batch[d] as usize;
    }
    let off = batch.len() - lead.len();
    let mut r = 0u64;
    for (d, &size) in lead.iter().enumerate() {
        r = r * size + if size == 1 { 0 } else { idx[off + d] };
    }
    r as usize
}

fn run(ctx: &Ctx, d: DType) -> CaseResult {
    let s = ctx.stream()?;
    let ae = acc_eps(d);
    for (fi, f) in families().into_iter().enumerate() {
        let (na, nb) = (f.a.len(), f.b.len());
        let (m, k, n) = (f.a[na - 2], f.a[na - 1], f.b[nb - 1]);
        let batch = batch_shape(&f.a[..na - 2], &f.b[..nb - 2]);
        let cshape: Vec<u64> = [&batch[..], &[m, n]].concat();
        let a = put(
            ctx,
            &s,
            d,
            &f.a,
            f.la,
            &gen(numel(&f.a), fi as u64 + 1, -1.0, 1.0),
        )?;
        let b = put(
            ctx,
            &s,
            d,
            &f.b,
            f.lb,
            &gen(numel(&f.b), fi as u64 + 2, -1.0, 1.0),
        )?;
        let cinit: Vec<f64> = if f.beta == 0.0 {
            vec![f64::NAN; numel(&cshape)]
        } else {
            gen(numel(&cshape), fi as u64 + 3, -1.0, 1.0)
        };
        let c = put(ctx, &s, d, &cshape, f.lc, &cinit)?;
        s.run_op(&OpCall::matmul(
            a.view(),
            b.view(),
            c.view(),
            f.alpha,
            f.beta,
        ))?;
        s.synchronize()?;
        let got = c.read(ctx, "c")?;
        let (m, k, n) = (m as usize, k as usize, n as usize);
        let (mut want, mut tol) = (Vec::new(), Vec::new());
        for bi in 0..numel(&batch) {
            let ia = batch_index(&f.a[..na - 2], &batch, bi);
            let ib = batch_index(&f.b[..nb - 2], &batch, bi);
            let (w, scale) = matmul(
                &a.vals[ia * m * k..(ia + 1) * m * k],
                &b.vals[ib * k * n..(ib + 1) * k * n],
                &c.vals[bi * m * n..(bi + 1) * m * n],
                m,
                n,
                k,
                f.alpha,
                f.beta,
            );
            for (wv, sc) in w.iter().zip(&scale) {
                tol.push(ae * (k as f64 + 2.0) * sc + eps(d) * wv.abs() + tiny(d));
            }
            want.extend(w);
        }
        check(
            &format!("matmul {d} family {fi}: {:?} @ {:?}", f.a, f.b),
            &got,
            &want,
            &tol,
        )?;
    }
    Ok(())
}

/// One case per dtype.
pub fn cases() -> Vec<Case> {
    per_dtype(&[OpId::Matmul], &FLOATS, |ctx, _, d| run(ctx, d))
}
