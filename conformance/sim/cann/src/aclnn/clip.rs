//! The pieces of the global-norm clip composition (op map A.5): `aclnnForeachNorm` (one L2
//! norm per tensor), `aclnnStack`, `aclnnLinalgVectorNorm` and `aclnnForeachMulScalar` (the
//! scale read from a device tensor when the stream runs it). Norms accumulate in f64 on the host;
//! the stack and the scaling run through the kernel library. Only the L2 norm is simulated.

use super::host::{addrs, read, write};
use super::reduce::dims_of;
use super::{axis, invalid, Build};
use crate::aclnn_op;
use crate::nnopbase::{IntArray, Scalar as AclScalar, Tensor, TensorList};
use std::sync::Arc;
use unihal_hal::{OpCall, OpId, TensorView};

fn l2(t: &Tensor) -> Result<f64, String> {
    let dt = t.dt().map_err(|e| e.msg)?;
    // SAFETY: elements of a live descriptor (checked at enqueue).
    Ok(addrs(t)
        .into_iter()
        .map(|e| unsafe { read(e, dt) }.powi(2))
        .sum::<f64>()
        .sqrt())
}

fn check_p2(p: unihal_hal::Scalar) -> Result<(), crate::conv::Err> {
    if p.as_f64() != 2.0 {
        return Err(invalid(format!(
            "p = {} (only the L2 norm is simulated)",
            p.as_f64()
        )));
    }
    Ok(())
}

// Declared from: ON `foreach/foreach_norm/docs/` (op map A.5)
aclnn_op!(aclnnForeachNorm, aclnnForeachNormGetWorkspaceSize, "ForeachNorm",
(x: *const TensorList, scalar: *const AclScalar, out: *const TensorList) |a| {
    let xs = a.list(x, "x")?;
    let p = a.scalar(scalar, "scalar")?;
    let outs = a.list(out, "out")?;
    check_p2(p)?;
    if xs.len() != outs.len() || outs.iter().any(|o| o.numel() != 1) {
        return Err(invalid("one one-element output per input"));
    }
    for t in &xs {
        a.dtype(t)?;
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (xs, outs) = (xs.clone(), outs.clone());
        b.host(move || {
            for (x, o) in xs.iter().zip(&outs) {
                let n = l2(x)?;
                let odt = o.dt().map_err(|e| e.msg)?;
                // SAFETY: the element of a live descriptor (checked at enqueue).
                unsafe { write(addrs(o)[0], odt, n) };
            }
            Ok(())
        });
        Ok(())
    }))
});

// Declared from: ON `norm/lp_norm_v2/op_api/aclnn_linalg_vector_norm.h` (op map A.5)
aclnn_op!(aclnnLinalgVectorNorm, aclnnLinalgVectorNormGetWorkspaceSize, "LinalgVectorNorm",
(self_: *const Tensor, ord: *const AclScalar, dims: *const IntArray, keep_dims: bool, dtype: i32,
 out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let p = a.scalar(ord, "ord")?;
    let d = a.ints(dims, "dims")?;
    let o = a.tensor(out, "out")?;
    check_p2(p)?;
    a.dtype(&x)?;
    if dtype != o.dtype {
        return Err(invalid("dtype must be out's"));
    }
    let dims = dims_of(&d, x.view.len())?;
    if dims.len() != x.view.len() {
        return Err(invalid("only a norm over every dim is simulated"));
    }
    let _ = keep_dims;
    if o.numel() != 1 {
        return Err(invalid("out must have one element"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (x, o) = (x.clone(), o.clone());
        b.host(move || {
            let n = l2(&x)?;
            let odt = o.dt().map_err(|e| e.msg)?;
            // SAFETY: the element of a live descriptor (checked at enqueue).
            unsafe { write(addrs(&o)[0], odt, n) };
            Ok(())
        });
        Ok(())
    }))
});

// Declared from: OM `conversion/pack/op_api/aclnn_stack.h` (op map A.5, global-norm clip)
aclnn_op!(aclnnStack, aclnnStackGetWorkspaceSize, "Stack",
(tensors: *const TensorList, dim: i64, out: *const Tensor) |a| {
    let ts = a.list(tensors, "tensors")?;
    let o = a.tensor(out, "out")?;
    a.dtype(&o)?;
    let first = ts.first().ok_or_else(|| invalid("an empty list"))?;
    let d = axis(dim, first.view.len() + 1)?;
    let mut want = first.view.clone();
    want.insert(d, ts.len() as i64);
    if o.view != want || ts.iter().any(|t| t.view != first.view || t.dtype != o.dtype) {
        return Err(invalid(format!("out must be {want:?} and every input {:?} of out's dtype", first.view)));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let ov = b.view(&o)?;
        for (k, t) in ts.iter().enumerate() {
            let mut slot = TensorView {
                offset: ov.offset + k as u64 * ov.strides[d] as u64 * ov.dtype.size() as u64,
                ..ov.clone()
            };
            slot.shape.remove(d);
            slot.strides.remove(d);
            b.call(OpCall::copy(b.view(t)?, slot))?;
        }
        Ok(())
    }))
});

// Declared from: ON `foreach/foreach_mul_scalar/docs/`; OP `ForeachMulScalarKernelOpApi.cpp` (op map A.5)
aclnn_op!(aclnnForeachMulScalar, aclnnForeachMulScalarGetWorkspaceSize, "ForeachMulScalar",
(x: *const TensorList, scalar: *const Tensor, out: *const TensorList) |a| {
    let xs = a.list(x, "x")?;
    let s = a.tensor(scalar, "scalar")?;
    let outs = a.list(out, "out")?;
    if xs.len() != outs.len() || s.numel() != 1 {
        return Err(invalid("as many outputs as inputs; a one-element scalar"));
    }
    for (x, o) in xs.iter().zip(&outs) {
        a.dtype(x)?;
        a.same_dtype(x, o, "x and out")?;
        a.same_dtype(x, &s, "x and scalar")?;
    }
    Ok(Arc::new(move |b: &mut Build| {
        let mut sv = b.view(&s)?;
        sv.shape = Vec::new();
        sv.strides = Vec::new();
        for (x, o) in xs.iter().zip(&outs) {
            b.call(OpCall::binary(OpId::Mul, b.view(x)?, sv.clone(), b.view(o)?))?;
        }
        Ok(())
    }))
});
