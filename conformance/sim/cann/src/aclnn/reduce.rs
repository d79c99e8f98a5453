//! Reductions along axes (op map A.4 "Reductions"): `aclnnReduceSum`, `aclnnMean`, `aclnnAmax`,
//! `aclnnAmin` over a list of dims (one kernel pass per dim, through intermediates in the
//! workspace), `aclnnMaxDim`/`aclnnMinDim` (values and indices) and `aclnnArgMax`/`aclnnArgMin`.
//! An empty dims list reduces every dim. Without `keepDim` the reduced dims are dropped from
//! `out`'s shape, which must say so.

use super::{axis, invalid, Args, Build, Program};
use crate::aclnn_op;
use crate::conv::Err;
use crate::nnopbase::{IntArray, Tensor};
use std::sync::Arc;
use unihal_hal::{DType, OpCall, OpId, TensorView};

/// `out`'s view with the reduced dims (sorted) put back as size 1 (stride 0).
fn keep_dims(mut v: TensorView, dims: &[usize], keep: bool) -> TensorView {
    if !keep {
        for &d in dims {
            v.shape.insert(d, 1);
            v.strides.insert(d, 0);
        }
    }
    v
}

/// The dims of `list` (empty: all of them), sorted and unique.
pub(crate) fn dims_of(list: &[i64], rank: usize) -> Result<Vec<usize>, Err> {
    if list.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut d = list
        .iter()
        .map(|&x| axis(x, rank))
        .collect::<Result<Vec<_>, _>>()?;
    d.sort_unstable();
    if d.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid(format!("repeated dims {list:?}")));
    }
    Ok(d)
}

fn expected_shape(x: &Tensor, dims: &[usize], keep: bool) -> Vec<i64> {
    let mut s = Vec::new();
    for (i, &d) in x.view.iter().enumerate() {
        if dims.contains(&i) {
            if keep {
                s.push(1);
            }
        } else {
            s.push(d);
        }
    }
    s
}

/// One kernel pass per dim: `x` → intermediates → `out`.
fn chain(op: OpId, x: Tensor, dims: Vec<usize>, keep: bool, out: Tensor) -> Program {
    Arc::new(move |b: &mut Build| {
        let mut src = b.view(&x)?;
        let full = keep_dims(b.view(&out)?, &dims, keep);
        if x.view.is_empty() {
            return b.call(OpCall::reduce(op, src, full, 0));
        }
        for (k, &d) in dims.iter().enumerate() {
            let dst = if k + 1 == dims.len() {
                full.clone()
            } else {
                let mut shape = src.shape.clone();
                shape[d] = 1;
                b.temp(src.dtype, &shape)
            };
            b.call(OpCall::reduce(op, src, dst.clone(), d as i64))?;
            src = dst;
        }
        Ok(())
    })
}

fn reduce_program(
    a: &Args,
    x: Tensor,
    dims: &[i64],
    keep: bool,
    out: Tensor,
    op: OpId,
) -> Result<Program, Err> {
    a.dtype(&x)?;
    a.same_dtype(&x, &out, "self and out")?;
    let dims = dims_of(dims, x.view.len())?;
    let want = expected_shape(&x, &dims, keep);
    if out.view != want {
        return Err(invalid(format!(
            "out has shape {:?}, the reduction gives {want:?}",
            out.view
        )));
    }
    Ok(chain(op, x, dims, keep, out))
}

// Declared from: OM `math/reduce_sum/op_api/aclnn_reduce_sum.h`
aclnn_op!(aclnnReduceSum, aclnnReduceSumGetWorkspaceSize, "ReduceSum",
(self_: *const Tensor, dims: *const IntArray, keep_dims: bool, dtype: i32, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let d = a.ints(dims, "dims")?;
    let o = a.tensor(out, "out")?;
    if dtype != o.dtype {
        return Err(invalid(format!("dtype {dtype} is not out's ({})", o.dtype)));
    }
    reduce_program(a, x, &d, keep_dims, o, OpId::ReduceSum)
});

// Declared from: OM `math/reduce_mean/op_api/aclnn_mean.h`; OP `EXEC_NPU_CMD(aclnnMean, self, dimArray, keepdim, dstType, out)`
aclnn_op!(aclnnMean, aclnnMeanGetWorkspaceSize, "Mean",
(self_: *const Tensor, dim: *const IntArray, keep_dim: bool, dtype: i32, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let d = a.ints(dim, "dim")?;
    let o = a.tensor(out, "out")?;
    if dtype != o.dtype {
        return Err(invalid(format!("dtype {dtype} is not out's ({})", o.dtype)));
    }
    reduce_program(a, x, &d, keep_dim, o, OpId::ReduceMean)
});

// Declared from: OM `math/reduce_max/op_api/aclnn_amax.h`, `math/reduce_min/op_api/aclnn_amin.h`
aclnn_op!(aclnnAmax, aclnnAmaxGetWorkspaceSize, "Amax",
(self_: *const Tensor, dim: *const IntArray, keep_dim: bool, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let d = a.ints(dim, "dim")?;
    let o = a.tensor(out, "out")?;
    reduce_program(a, x, &d, keep_dim, o, OpId::ReduceMax)
});

// Declared from: OM `math/reduce_max/op_api/aclnn_amax.h`, `math/reduce_min/op_api/aclnn_amin.h`
aclnn_op!(aclnnAmin, aclnnAminGetWorkspaceSize, "Amin",
(self_: *const Tensor, dim: *const IntArray, keep_dim: bool, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let d = a.ints(dim, "dim")?;
    let o = a.tensor(out, "out")?;
    reduce_program(a, x, &d, keep_dim, o, OpId::ReduceMin)
});

/// An index output: `Argmax`/`Argmin` into i64 (directly, or through the workspace and a cast
/// for an I32 output).
fn index_into(
    b: &mut Build,
    op: OpId,
    x: TensorView,
    idx: TensorView,
    d: usize,
) -> Result<(), Err> {
    if idx.dtype == DType::I64 {
        return b.call(OpCall::reduce(op, x, idx, d as i64));
    }
    let tmp = b.temp(DType::I64, &idx.shape);
    b.call(OpCall::reduce(op, x, tmp.clone(), d as i64))?;
    b.call(OpCall::cast(tmp, idx))
}

fn arg_program(
    a: &Args,
    x: Tensor,
    dim: i64,
    keep: bool,
    values: Option<Tensor>,
    idx: Tensor,
    arg: OpId,
    val: OpId,
) -> Result<Program, Err> {
    a.dtype(&x)?;
    if let Some(v) = &values {
        a.same_dtype(&x, v, "self and out")?;
    }
    if !matches!(idx.dtype, 3 | 9) {
        return Err(invalid("indices must be INT32 or INT64"));
    }
    let d = axis(dim, x.view.len())?;
    let want = expected_shape(&x, &[d], keep);
    if idx.view != want || values.as_ref().is_some_and(|v| v.view != want) {
        return Err(invalid(format!("outputs must have shape {want:?}")));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let xv = b.view(&x)?;
        if let Some(v) = &values {
            let vv = keep_dims(b.view(v)?, &[d], keep);
            b.call(OpCall::reduce(val, xv.clone(), vv, d as i64))?;
        }
        let iv = keep_dims(b.view(&idx)?, &[d], keep);
        index_into(b, arg, xv, iv, d)
    }))
}

// Declared from: OM `math/arg_max_with_value/op_api/aclnn_max_dim.h`, `math/arg_min_with_value/op_api/aclnn_min_dim.h`
aclnn_op!(aclnnMaxDim, aclnnMaxDimGetWorkspaceSize, "MaxDim",
(self_: *const Tensor, dim: i64, keepdim: bool, out: *const Tensor, indices: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let (o, i) = (a.tensor(out, "out")?, a.tensor(indices, "indices")?);
    arg_program(a, x, dim, keepdim, Some(o), i, OpId::Argmax, OpId::ReduceMax)
});

// Declared from: OM `math/arg_max_with_value/op_api/aclnn_max_dim.h`, `math/arg_min_with_value/op_api/aclnn_min_dim.h`
aclnn_op!(aclnnMinDim, aclnnMinDimGetWorkspaceSize, "MinDim",
(self_: *const Tensor, dim: i64, keepdim: bool, out: *const Tensor, indices: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let (o, i) = (a.tensor(out, "out")?, a.tensor(indices, "indices")?);
    arg_program(a, x, dim, keepdim, Some(o), i, OpId::Argmin, OpId::ReduceMin)
});

// Declared from: OM `math/arg_max_v2/op_api/aclnn_argmax.h`, `math/arg_min/op_api/aclnn_argmin.h`; OP `ArgMax` call
aclnn_op!(aclnnArgMax, aclnnArgMaxGetWorkspaceSize, "ArgMax",
(self_: *const Tensor, dim: i64, keepdim: bool, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let i = a.tensor(out, "out")?;
    arg_program(a, x, dim, keepdim, None, i, OpId::Argmax, OpId::ReduceMax)
});

// Declared from: OM `math/arg_max_v2/op_api/aclnn_argmax.h`, `math/arg_min/op_api/aclnn_argmin.h`; OP `ArgMax` call
aclnn_op!(aclnnArgMin, aclnnArgMinGetWorkspaceSize, "ArgMin",
(self_: *const Tensor, dim: i64, keepdim: bool, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let i = a.tensor(out, "out")?;
    arg_program(a, x, dim, keepdim, None, i, OpId::Argmin, OpId::ReduceMin)
});
