//! Losses and element scatter (op map A.4 "Softmax and cross-entropy" portable path and
//! "Gather / scatter"): `aclnnNLLLoss`, `aclnnNLLLossBackward` and `aclnnScatterAdd`, computed
//! on the host (the kernel library has cross-entropy from logits, not NLL from log-probabilities,
//! and no element scatter). Accumulation in f64; a target outside `[0, C)` that is not
//! `ignoreIndex`, or a scatter index outside its dim, is a fault of the stream (sticky), never a
//! wild write.

use super::host::{addrs, read, write};
use super::{axis, invalid, Build};
use crate::aclnn_op;
use crate::nnopbase::Tensor;
use std::sync::Arc;
use unihal_hal::DType;

/// The address of element `idx` of `t`.
fn at(t: &Tensor, idx: &[i64]) -> u64 {
    let esize = t.dt().map_or(1, |d| d.size() as u64);
    let e: i64 = t.offset + idx.iter().zip(&t.strides).map(|(i, s)| i * s).sum::<i64>();
    t.data + e as u64 * esize
}

/// `(rows, classes)` of NLL's input: `(N, C)` or `(C)`.
fn rows_classes(x: &Tensor) -> Result<(i64, i64), crate::conv::Err> {
    match x.view.as_slice() {
        [n, c] => Ok((*n, *c)),
        [c] => Ok((1, *c)),
        v => Err(invalid(format!("self must be (N, C) or (C), not {v:?}"))),
    }
}

fn elem(x: &Tensor, i: i64, c: i64) -> u64 {
    if x.view.len() == 2 {
        at(x, &[i, c])
    } else {
        at(x, &[c])
    }
}

/// Target `i` (checked against the classes unless it is `ignore`).
fn target(t: &Tensor, i: i64, classes: i64, ignore: i64) -> Result<Option<i64>, String> {
    let dt = t.dt().map_err(|e| e.msg)?;
    let a = if t.view.is_empty() {
        at(t, &[])
    } else {
        at(t, &[i])
    };
    // SAFETY: an element of a live descriptor (checked at enqueue).
    let v = unsafe { read(a, dt) } as i64;
    if v == ignore {
        return Ok(None);
    }
    if !(0..classes).contains(&v) {
        return Err(format!("aclnnNLLLoss: target {v} outside [0, {classes})"));
    }
    Ok(Some(v))
}

fn check_target(t: &Tensor) -> Result<(), crate::conv::Err> {
    if !matches!(t.dtype, 3 | 4 | 9) {
        return Err(invalid("target must be INT64, INT32 or UINT8"));
    }
    Ok(())
}

aclnn_op!(aclnnNLLLoss, aclnnNLLLossGetWorkspaceSize, "NLLLoss",
(self_: *const Tensor, target_: *const Tensor, weight: *const Tensor, reduction: i64, ignore_index: i64,
 out: *const Tensor, total_weight_out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let t = a.tensor(target_, "target")?;
    let w = a.tensor(weight, "weight")?;
    let (o, tw) = (a.tensor(out, "out")?, a.tensor(total_weight_out, "totalWeightOut")?);
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &w, "self and weight")?;
    check_target(&t)?;
    let (n, c) = rows_classes(&x)?;
    if w.numel() != c || !(0..=2).contains(&reduction) {
        return Err(invalid("weight must have C elements; reduction 0, 1 or 2"));
    }
    if reduction == 0 && o.numel() != n {
        return Err(invalid("out must have N elements with reduction none"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (x, t, w, o, tw) = (x.clone(), t.clone(), w.clone(), o.clone(), tw.clone());
        b.host(move || {
            let (odt, twdt) = (o.dt().map_err(|e| e.msg)?, tw.dt().map_err(|e| e.msg)?);
            let (mut sum, mut wsum) = (0f64, 0f64);
            let outs = addrs(&o);
            for i in 0..n {
                let loss = match target(&t, i, c, ignore_index)? {
                    None => 0.0,
                    Some(k) => {
                        // SAFETY: elements of live descriptors (checked at enqueue).
                        let (wk, xk) = unsafe { (read(at(&w, &[k]), dt), read(elem(&x, i, k), dt)) };
                        wsum += wk;
                        -wk * xk
                    }
                };
                sum += loss;
                if reduction == 0 {
                    // SAFETY: as above.
                    unsafe { write(outs[i as usize], odt, loss) };
                }
            }
            let total = match reduction {
                1 => sum / wsum,
                _ => sum,
            };
            // SAFETY: as above.
            unsafe {
                if reduction != 0 {
                    write(outs[0], odt, total);
                }
                if let Some(&twa) = addrs(&tw).first() {
                    write(twa, twdt, wsum);
                }
            }
            Ok(())
        });
        Ok(())
    }))
});

aclnn_op!(aclnnNLLLossBackward, aclnnNLLLossBackwardGetWorkspaceSize, "NLLLossBackward",
(grad_output: *const Tensor, self_: *const Tensor, target_: *const Tensor, weight: *const Tensor,
 reduction: i64, ignore_index: i64, total_weight: *const Tensor, out: *const Tensor) |a| {
    let g = a.tensor(grad_output, "gradOutput")?;
    let x = a.tensor(self_, "self")?;
    let t = a.tensor(target_, "target")?;
    let w = a.tensor(weight, "weight")?;
    let tw = a.tensor(total_weight, "totalWeight")?;
    let o = a.tensor(out, "out")?;
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &o, "self and out")?;
    check_target(&t)?;
    let (n, c) = rows_classes(&x)?;
    if o.view != x.view || w.numel() != c || !(0..=2).contains(&reduction) {
        return Err(invalid("out must have self's shape, weight C elements; reduction 0, 1 or 2"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (g, t, w, tw, o) = (g.clone(), t.clone(), w.clone(), tw.clone(), o.clone());
        b.host(move || {
            let gdt = g.dt().map_err(|e| e.msg)?;
            let gs = addrs(&g);
            for e in addrs(&o) {
                // SAFETY: elements of live descriptors (checked at enqueue).
                unsafe { write(e, dt, 0.0) };
            }
            // SAFETY: as above.
            let total = unsafe { read(addrs(&tw)[0], tw.dt().map_err(|e| e.msg)?) };
            for i in 0..n {
                let Some(k) = target(&t, i, c, ignore_index)? else {
                    continue;
                };
                // SAFETY: as above.
                unsafe {
                    let gi = read(gs[if reduction == 0 { i as usize } else { 0 }], gdt);
                    let scale = if reduction == 1 { gi / total } else { gi };
                    write(elem(&o, i, k), dt, -read(at(&w, &[k]), dt) * scale);
                }
            }
            Ok(())
        });
        Ok(())
    }))
});

aclnn_op!(aclnnScatterAdd, aclnnScatterAddGetWorkspaceSize, "ScatterAdd",
(self_: *const Tensor, dim: i64, index: *const Tensor, src: *const Tensor, out: *const Tensor) |a| {
    let (x, i, s, o) = (a.tensor(self_, "self")?, a.tensor(index, "index")?, a.tensor(src, "src")?, a.tensor(out, "out")?);
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &s, "self and src")?;
    a.same_dtype(&x, &o, "self and out")?;
    if !matches!(i.dtype, 3 | 9) {
        return Err(invalid("index must be INT32 or INT64"));
    }
    let d = axis(dim, x.view.len())?;
    let rank = x.view.len();
    if i.view.len() != rank || s.view.len() != rank || o.view != x.view
        || (0..rank).any(|k| i.view[k] > s.view[k] || (k != d && i.view[k] > x.view[k]))
    {
        return Err(invalid("index, src and self must agree as torch.scatter_add requires"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (x, i, s, o) = (x.clone(), i.clone(), s.clone(), o.clone());
        b.host(move || {
            let idt: DType = i.dt().map_err(|e| e.msg)?;
            for (xe, oe) in addrs(&x).into_iter().zip(addrs(&o)) {
                if xe != oe {
                    // SAFETY: elements of live descriptors (checked at enqueue).
                    unsafe { write(oe, dt, read(xe, dt)) };
                }
            }
            let n = i.numel();
            let mut idx = vec![0i64; rank];
            for _ in 0..n {
                // SAFETY: as above.
                let k = unsafe { read(at(&i, &idx), idt) } as i64;
                if !(0..x.view[d]).contains(&k) {
                    return Err(format!("aclnnScatterAdd: index {k} outside dim {d} of size {}", x.view[d]));
                }
                let mut to = idx.clone();
                to[d] = k;
                // SAFETY: as above.
                unsafe {
                    let v = read(at(&o, &to), dt) + read(at(&s, &idx), dt);
                    write(at(&o, &to), dt, v);
                }
                for q in (0..rank).rev() {
                    idx[q] += 1;
                    if idx[q] < i.view[q] {
                        break;
                    }
                    idx[q] = 0;
                }
            }
            Ok(())
        });
        Ok(())
    }))
});
