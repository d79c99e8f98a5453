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

// Declared from: ON `loss/nll_loss/op_api/aclnn_nll_loss.h`; OP `NLLLossKernelNpuOpApi.cpp`
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
    let per_row = if reduction == 0 { n } else { 1 };
    if o.numel() != per_row || tw.numel() != 1 || t.numel() != n {
        return Err(invalid(format!(
            "out must have {per_row} elements, totalWeightOut one and target {n}"
        )));
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

// Declared from: ON `loss/nll_loss_grad/op_api/aclnn_nll_loss_backward.h`
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
    let per_row = if reduction == 0 { n } else { 1 };
    if g.numel() != per_row || tw.numel() != 1 || t.numel() != n {
        return Err(invalid(format!(
            "gradOutput must have {per_row} elements, totalWeight one and target {n}"
        )));
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

// Declared from: ON `index/scatter_elements_v2/op_api/aclnn_scatter_add.h`, `index/scatter_add/docs/aclnnScatterAdd.md`
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

/// `"mean"`, `"sum"` or `"none"` as unihal's reduction.
fn reduction_of(p: *const std::ffi::c_char) -> Result<CeReduction, crate::conv::Err> {
    if p.is_null() {
        return Ok(CeReduction::Mean);
    }
    // SAFETY: a NUL-terminated string the caller keeps alive until phase 1 returns.
    match unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes() {
        b"mean" => Ok(CeReduction::Mean),
        b"sum" => Ok(CeReduction::Sum),
        b"none" => Ok(CeReduction::None),
        other => Err(invalid(format!(
            "reduction \"{}\" (\"mean\", \"sum\" or \"none\")",
            String::from_utf8_lossy(other)
        ))),
    }
}

use unihal_hal::op::nn::{CeOptions, CeReduction};
use unihal_hal::{OpCall, OpId};

// Declared from: ON `loss/cross_entropy_loss/docs/aclnnCrossEntropyLoss.md`
aclnn_op!(aclnnCrossEntropyLoss, aclnnCrossEntropyLossGetWorkspaceSize, "CrossEntropyLoss",
(input: *const Tensor, target_: *const Tensor, weight: *const Tensor, reduction: *const std::ffi::c_char,
 ignore_index: i64, label_smoothing: f64, _lse_square_scale_for_zloss: f64, return_zloss: bool,
 loss_out: *const Tensor, log_prob_out: *const Tensor, _zloss_out: *const Tensor,
 _lse_for_zloss_out: *const Tensor) |a| {
    let x = a.tensor(input, "input")?;
    let t = a.tensor(target_, "target")?;
    if !weight.is_null() {
        return Err(invalid("a class weight is not simulated"));
    }
    if return_zloss {
        return Err(invalid("returnZloss: zloss is not implemented (as documented)"));
    }
    let (l, lp) = (a.tensor(loss_out, "lossOut")?, a.tensor(log_prob_out, "logProbOut")?);
    let red = reduction_of(reduction)?;
    a.dtype(&x)?;
    a.same_dtype(&x, &lp, "input and logProbOut")?;
    if x.view.len() != 2 || !matches!(t.dtype, 3 | 9) || !(0.0..=1.0).contains(&label_smoothing) {
        return Err(invalid("input (N, C), target INT32/INT64 (N), labelSmoothing in [0, 1]"));
    }
    let o = CeOptions { reduction: red, ignore_index, label_smoothing };
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, tv, lv, lpv) = (b.view(&x)?, b.view(&t)?, b.view(&l)?, b.view(&lp)?);
        // unihal's loss is FLOAT32; a loss of the input's dtype goes through a cast.
        let shape = lv.shape.clone();
        let loss = if lv.dtype == DType::F32 { lv.clone() } else { b.temp(DType::F32, &shape) };
        b.call(OpCall::cross_entropy(xv.clone(), tv, loss.clone(), o))?;
        if lv.dtype != DType::F32 {
            b.call(OpCall::cast(loss, lv))?;
        }
        b.call(OpCall::softmax(OpId::LogSoftmax, xv, lpv))
    }))
});

// Declared from: ON `loss/cross_entropy_loss_grad/docs/aclnnCrossEntropyLossGrad.md`
aclnn_op!(aclnnCrossEntropyLossGrad, aclnnCrossEntropyLossGradGetWorkspaceSize, "CrossEntropyLossGrad",
(grad_loss: *const Tensor, log_prob: *const Tensor, target_: *const Tensor, weight: *const Tensor,
 grad_zloss: *const Tensor, lse_for_zloss: *const Tensor, reduction: *const std::ffi::c_char, ignore_index: i64,
 label_smoothing: f64, _lse_square_scale_for_zloss: f64, out: *const Tensor) |a| {
    let g = a.tensor(grad_loss, "gradLoss")?;
    let lp = a.tensor(log_prob, "logProb")?;
    let t = a.tensor(target_, "target")?;
    let o = a.tensor(out, "out")?;
    if !weight.is_null() || !grad_zloss.is_null() || !lse_for_zloss.is_null() {
        return Err(invalid("weight and zloss inputs are not simulated"));
    }
    if label_smoothing != 0.0 {
        return Err(invalid("labelSmoothing: only 0.0 (as documented); compose the smoothing term"));
    }
    let red = reduction_of(reduction)?;
    let dt = a.dtype(&lp)?;
    a.same_dtype(&lp, &o, "logProb and out")?;
    if t.dtype != 9 {
        return Err(invalid("target must be INT64"));
    }
    let (n, c) = rows_classes(&lp)?;
    let per_row = if red == CeReduction::None { n } else { 1 };
    if g.numel() != per_row || t.numel() != n {
        return Err(invalid(format!(
            "gradLoss must have {per_row} elements and target {n}"
        )));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (g, lp, t, o) = (g.clone(), lp.clone(), t.clone(), o.clone());
        b.host(move || {
            let gdt = g.dt().map_err(|e| e.msg)?;
            let gs = addrs(&g);
            let mut targets = Vec::new();
            for i in 0..n {
                targets.push(target(&t, i, c, ignore_index)?);
            }
            let counted = targets.iter().filter(|k| k.is_some()).count().max(1) as f64;
            for (i, k) in targets.into_iter().enumerate() {
                // SAFETY: elements of live descriptors (checked at enqueue).
                let gi = unsafe { read(gs[if red == CeReduction::None { i } else { 0 }], gdt) };
                let scale = match (k, red) {
                    (None, _) => 0.0,
                    (Some(_), CeReduction::Mean) => gi / counted,
                    (Some(_), _) => gi,
                };
                for j in 0..c {
                    let hot = if k == Some(j) { 1.0 } else { 0.0 };
                    // SAFETY: as above.
                    unsafe {
                        let p = read(elem(&lp, i as i64, j), dt).exp();
                        write(elem(&o, i as i64, j), dt, (p - hot) * scale);
                    }
                }
            }
            Ok(())
        });
        Ok(())
    }))
});
