//! The training operators beyond elementwise (op map A.4 "Softmax", "Normalisation", "Matrix
//! products", "Gather / scatter"; A.5 "softmax with additive mask" is `aclnnAdd` then
//! `aclnnSoftmax`). Where the kernel library wants a dense axis (softmax's, the norms', a gather
//! table's rows) and the descriptor's view is strided differently, the operator copies through
//! a dense intermediate in the workspace, as a real operator's internal transdata would.

use super::{axis, dim_first, dim_last, invalid, Args, Build, Program};
use crate::aclnn_op;
use crate::conv::Err;
use crate::nnopbase::{BoolArray, IntArray, Scalar as AclScalar, Tensor};
use std::sync::Arc;
use unihal_hal::op::contiguous_strides;
use unihal_hal::{DType, OpCall, OpId, Scalar, TensorView};

/// Whether a view is dense row-major.
fn is_dense(v: &TensorView) -> bool {
    let want = contiguous_strides(&v.shape);
    v.shape
        .iter()
        .zip(v.strides.iter().zip(&want))
        .all(|(&d, (&s, &w))| d <= 1 || s == w)
}

/// `v` itself when dense, else a dense copy in the workspace.
fn dense_in(b: &mut Build, v: TensorView) -> Result<TensorView, Err> {
    if is_dense(&v) {
        return Ok(v);
    }
    let t = b.temp(v.dtype, &v.shape);
    b.call(OpCall::copy(v, t.clone()))?;
    Ok(t)
}

/// Where to write `v`: itself when dense, else a dense intermediate copied back by [`finish`].
fn dense_out(b: &mut Build, v: &TensorView) -> TensorView {
    if is_dense(v) {
        v.clone()
    } else {
        b.temp(v.dtype, &v.shape)
    }
}

fn finish(b: &mut Build, tmp: TensorView, v: TensorView) -> Result<(), Err> {
    if tmp.buffer.device_addr() == v.buffer.device_addr() && tmp.offset == v.offset {
        return Ok(());
    }
    b.call(OpCall::copy(tmp, v))
}

/// A view with its last `k` dims merged into one (they must be dense among themselves).
fn merge_tail(v: &TensorView, k: usize) -> Result<TensorView, Err> {
    let n = v.shape.len();
    if k == 0 || k > n {
        return Err(invalid(format!("{k} normalized dims of a {n}-dim tensor")));
    }
    let tail = TensorView {
        shape: v.shape[n - k..].to_vec(),
        strides: v.strides[n - k..].to_vec(),
        ..v.clone()
    };
    if !is_dense(&tail) {
        return Err(invalid("the normalized dims are not dense (not simulated)"));
    }
    let mut m = v.clone();
    let d: u64 = tail.shape.iter().product();
    m.shape.truncate(n - k);
    m.strides.truncate(n - k);
    m.shape.push(d);
    m.strides.push(1);
    Ok(m)
}

/// The leading dims of a per-row statistics tensor (`[A..., 1...1]` or `[A...]`) as `[A...]`.
fn leading(v: TensorView, rank: usize) -> TensorView {
    let mut v = v;
    v.shape.truncate(rank);
    v.strides.truncate(rank);
    v
}

/// The accumulation dtype of the norms' statistics.
fn acc(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Where to write a statistics output of dtype `want`: itself, or an intermediate cast later.
fn stat_out(
    b: &mut Build,
    v: Option<TensorView>,
    want: DType,
    shape: &[u64],
) -> (TensorView, Option<TensorView>) {
    match v {
        Some(v) if v.dtype == want => (v, None),
        Some(v) => (b.temp(want, shape), Some(v)),
        None => (b.temp(want, shape), None),
    }
}

fn cast_back(b: &mut Build, tmp: TensorView, v: Option<TensorView>) -> Result<(), Err> {
    match v {
        Some(v) => b.call(OpCall::cast(tmp, v)),
        None => Ok(()),
    }
}

// --- Softmax -------------------------------------------------------------------------------------

fn softmax_program(a: &Args, x: Tensor, dim: i64, out: Tensor, op: OpId) -> Result<Program, Err> {
    a.dtype(&x)?;
    a.same_dtype(&x, &out, "self and out")?;
    if x.view != out.view {
        return Err(invalid("self and out shapes differ"));
    }
    let d = axis(dim, x.view.len())?;
    Ok(Arc::new(move |b: &mut Build| {
        let xv = dense_in(b, dim_last(b.view(&x)?, d))?;
        let ov = dim_last(b.view(&out)?, d);
        let t = dense_out(b, &ov);
        b.call(OpCall::softmax(op, xv, t.clone()))?;
        finish(b, t, ov)
    }))
}

// Declared from: ON `activation/softmax_v2/op_api/aclnn_softmax.h`, `activation/log_softmax_v2/op_api/aclnn_logsoftmax.h`
aclnn_op!(aclnnSoftmax, aclnnSoftmaxGetWorkspaceSize, "Softmax",
(self_: *const Tensor, dim: i64, out: *const Tensor) |a| {
    let (x, o) = (a.tensor(self_, "self")?, a.tensor(out, "out")?);
    softmax_program(a, x, dim, o, OpId::Softmax)
});

// Declared from: ON `activation/softmax_v2/op_api/aclnn_softmax.h`, `activation/log_softmax_v2/op_api/aclnn_logsoftmax.h`
aclnn_op!(aclnnLogSoftmax, aclnnLogSoftmaxGetWorkspaceSize, "LogSoftmax",
(self_: *const Tensor, dim: i64, out: *const Tensor) |a| {
    let (x, o) = (a.tensor(self_, "self")?, a.tensor(out, "out")?);
    softmax_program(a, x, dim, o, OpId::LogSoftmax)
});

fn softmax_backward_program(
    a: &Args,
    dy: Tensor,
    y: Tensor,
    dim: i64,
    dx: Tensor,
    op: OpId,
) -> Result<Program, Err> {
    a.dtype(&y)?;
    a.same_dtype(&y, &dy, "output and gradOutput")?;
    a.same_dtype(&y, &dx, "output and out")?;
    let d = axis(dim, y.view.len())?;
    Ok(Arc::new(move |b: &mut Build| {
        let yv = dense_in(b, dim_last(b.view(&y)?, d))?;
        let dyv = dense_in(b, dim_last(b.view(&dy)?, d))?;
        let dxv = dim_last(b.view(&dx)?, d);
        let t = dense_out(b, &dxv);
        b.call(OpCall::softmax_backward(op, yv, dyv, t.clone()))?;
        finish(b, t, dxv)
    }))
}

// Declared from: ON `activation/softmax_grad/op_api/aclnn_softmax_backward.h`, `activation/log_softmax_grad/op_api/aclnn_logsoftmax_backward.h`
aclnn_op!(aclnnSoftmaxBackward, aclnnSoftmaxBackwardGetWorkspaceSize, "SoftmaxBackward",
(grad_output: *const Tensor, output: *const Tensor, dim: i64, out: *const Tensor) |a| {
    let (dy, y, dx) = (a.tensor(grad_output, "gradOutput")?, a.tensor(output, "output")?, a.tensor(out, "out")?);
    softmax_backward_program(a, dy, y, dim, dx, OpId::SoftmaxBackward)
});

// Declared from: ON `activation/softmax_grad/op_api/aclnn_softmax_backward.h`, `activation/log_softmax_grad/op_api/aclnn_logsoftmax_backward.h`
aclnn_op!(aclnnLogSoftmaxBackward, aclnnLogSoftmaxBackwardGetWorkspaceSize, "LogSoftmaxBackward",
(grad_output: *const Tensor, output: *const Tensor, dim: i64, out: *const Tensor) |a| {
    let (dy, y, dx) = (a.tensor(grad_output, "gradOutput")?, a.tensor(output, "output")?, a.tensor(out, "out")?);
    softmax_backward_program(a, dy, y, dim, dx, OpId::LogSoftmaxBackward)
});

// --- Normalisation -------------------------------------------------------------------------------

/// A `[D]` vector operand: the given one (merged), or an intermediate filled with `value`.
fn vector_or(
    b: &mut Build,
    t: &Option<Tensor>,
    dtype: DType,
    d: u64,
    value: i64,
) -> Result<TensorView, Err> {
    match t {
        Some(t) => merge_tail(&b.view(t)?, t.view.len()),
        None => {
            let v = b.temp(dtype, &[d]);
            b.call(OpCall::fill(v.clone(), Scalar::I64(value)))?;
            Ok(v)
        }
    }
}

// Declared from: ON `norm/layer_norm_v4/op_host/op_api/aclnn_layer_norm.h`; OP `LayerNormKernelNpuOpApi.cpp`
aclnn_op!(aclnnLayerNorm, aclnnLayerNormGetWorkspaceSize, "LayerNorm",
(input: *const Tensor, normalized_shape: *const IntArray, weight: *const Tensor, bias: *const Tensor,
 eps: f64, out: *const Tensor, mean_out: *const Tensor, rstd_out: *const Tensor) |a| {
    let x = a.tensor(input, "input")?;
    let ns = a.ints(normalized_shape, "normalizedShape")?;
    let (w, bi) = (a.opt_tensor(weight, "weight")?, a.opt_tensor(bias, "bias")?);
    let o = a.tensor(out, "out")?;
    let (m, r) = (a.opt_tensor(mean_out, "meanOut")?, a.opt_tensor(rstd_out, "rstdOut")?);
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &o, "input and out")?;
    let k = ns.len();
    if k == 0 || k > x.view.len() || x.view[x.view.len() - k..] != ns[..] {
        return Err(invalid(format!("normalizedShape {ns:?} is not the tail of {:?}", x.view)));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let xv = merge_tail(&b.view(&x)?, k)?;
        let ov = merge_tail(&b.view(&o)?, k)?;
        let d = *xv.shape.last().expect("at least one dim");
        let lead: Vec<u64> = xv.shape[..xv.shape.len() - 1].to_vec();
        let wv = vector_or(b, &w, dt, d, 1)?;
        let bv = vector_or(b, &bi, dt, d, 0)?;
        let mv = m.as_ref().map(|m| b.view(m)).transpose()?.map(|v| leading(v, lead.len()));
        let rv = r.as_ref().map(|r| b.view(r)).transpose()?.map(|v| leading(v, lead.len()));
        let (mt, mback) = stat_out(b, mv, acc(dt), &lead);
        let (rt, rback) = stat_out(b, rv, acc(dt), &lead);
        b.call(OpCall::layer_norm(xv, wv, bv, ov, mt.clone(), rt.clone(), eps))?;
        cast_back(b, mt, mback)?;
        cast_back(b, rt, rback)
    }))
});

// Declared from: ON `norm/layer_norm_grad_v3/op_host/op_api/aclnn_layer_norm_backward.h`
aclnn_op!(aclnnLayerNormBackward, aclnnLayerNormBackwardGetWorkspaceSize, "LayerNormBackward",
(grad_out: *const Tensor, input: *const Tensor, normalized_shape: *const IntArray, mean: *const Tensor,
 rstd: *const Tensor, weight: *const Tensor, bias: *const Tensor, output_mask: *const BoolArray,
 grad_input: *const Tensor, grad_weight: *const Tensor, grad_bias: *const Tensor) |a| {
    let dy = a.tensor(grad_out, "gradOut")?;
    let x = a.tensor(input, "input")?;
    let ns = a.ints(normalized_shape, "normalizedShape")?;
    let (m, r) = (a.tensor(mean, "mean")?, a.tensor(rstd, "rstd")?);
    let w = a.opt_tensor(weight, "weight")?;
    let _ = a.opt_tensor(bias, "bias")?;
    let mask = a.bools(output_mask, "outputMask")?;
    if mask.len() != 3 {
        return Err(invalid("outputMask must have 3 entries"));
    }
    let dx = if mask[0] { Some(a.tensor(grad_input, "gradInputOut")?) } else { None };
    let dw = if mask[1] { Some(a.tensor(grad_weight, "gradWeightOut")?) } else { None };
    let db = if mask[2] { Some(a.tensor(grad_bias, "gradBiasOut")?) } else { None };
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &dy, "input and gradOut")?;
    let k = ns.len();
    if k == 0 || k > x.view.len() || x.view[x.view.len() - k..] != ns[..] {
        return Err(invalid(format!("normalizedShape {ns:?} is not the tail of {:?}", x.view)));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let xv = merge_tail(&b.view(&x)?, k)?;
        let dyv = merge_tail(&b.view(&dy)?, k)?;
        let d = *xv.shape.last().expect("at least one dim");
        let lead_rank = xv.shape.len() - 1;
        let wv = vector_or(b, &w, dt, d, 1)?;
        let mv = leading(b.view(&m)?, lead_rank);
        let rv = leading(b.view(&r)?, lead_rank);
        let dxv = match &dx {
            Some(t) => merge_tail(&b.view(t)?, k)?,
            None => b.temp(dt, &xv.shape),
        };
        let dwv = match &dw {
            Some(t) => merge_tail(&b.view(t)?, t.view.len())?,
            None => b.temp(dt, &[d]),
        };
        let dbv = match &db {
            Some(t) => merge_tail(&b.view(t)?, t.view.len())?,
            None => b.temp(dt, &[d]),
        };
        b.call(OpCall::layer_norm_backward(xv, dyv, wv, mv, rv, dxv, dwv, dbv))
    }))
});

// Declared from: ON `norm/rms_norm/docs/aclnnRmsNorm.md`; HD 8.3 page; OP `EXEC_NPU_CMD(aclnnRmsNorm, self, gamma, epsilon, y, rstd)`
aclnn_op!(aclnnRmsNorm, aclnnRmsNormGetWorkspaceSize, "RmsNorm",
(x: *const Tensor, gamma: *const Tensor, epsilon: f64, y_out: *const Tensor, rstd_out: *const Tensor) |a| {
    let x = a.tensor(x, "x")?;
    let g = a.tensor(gamma, "gamma")?;
    let (y, r) = (a.tensor(y_out, "yOut")?, a.tensor(rstd_out, "rstdOut")?);
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &g, "x and gamma")?;
    a.same_dtype(&x, &y, "x and yOut")?;
    let k = g.view.len();
    if k == 0 || k > x.view.len() || x.view[x.view.len() - k..] != g.view[..] {
        return Err(invalid(format!("gamma's shape {:?} is not the tail of x's {:?}", g.view, x.view)));
    }
    if r.dt()? != DType::F32 && dt != DType::F64 {
        return Err(invalid("rstdOut must be FLOAT32"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let xv = merge_tail(&b.view(&x)?, k)?;
        let gv = merge_tail(&b.view(&g)?, k)?;
        let yv = merge_tail(&b.view(&y)?, k)?;
        let rv = leading(b.view(&r)?, xv.shape.len() - 1);
        b.call(OpCall::rms_norm(xv, gv, yv, rv, epsilon))
    }))
});

// Declared from: ON `norm/rms_norm_grad/docs/aclnnRmsNormGrad.md`; OP `RmsNormBackwardKernelOpApi.cpp`
aclnn_op!(aclnnRmsNormGrad, aclnnRmsNormGradGetWorkspaceSize, "RmsNormGrad",
(dy: *const Tensor, x: *const Tensor, rstd: *const Tensor, gamma: *const Tensor, dx_out: *const Tensor,
 dgamma_out: *const Tensor) |a| {
    let dy = a.tensor(dy, "dy")?;
    let x = a.tensor(x, "x")?;
    let r = a.tensor(rstd, "rstd")?;
    let g = a.tensor(gamma, "gamma")?;
    let (dx, dg) = (a.tensor(dx_out, "dxOut")?, a.tensor(dgamma_out, "dgammaOut")?);
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &dy, "x and dy")?;
    let k = g.view.len();
    if k == 0 || k > x.view.len() || x.view[x.view.len() - k..] != g.view[..] {
        return Err(invalid("gamma's shape is not the tail of x's"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let xv = merge_tail(&b.view(&x)?, k)?;
        let dyv = merge_tail(&b.view(&dy)?, k)?;
        let gv = merge_tail(&b.view(&g)?, k)?;
        let rv = leading(b.view(&r)?, xv.shape.len() - 1);
        let dxv = merge_tail(&b.view(&dx)?, k)?;
        let dgv = merge_tail(&b.view(&dg)?, k)?;
        // The library's dgamma has gamma's dtype; dgammaOut is FLOAT32 for every input.
        let (t, back) = stat_out(b, Some(dgv), dt, &[gv.shape[0]]);
        b.call(OpCall::rms_norm_backward(xv, dyv, gv, rv, dxv, t.clone()))?;
        cast_back(b, t, back)
    }))
});

// --- Matrix products ---------------------------------------------------------------------------

fn matmul_program(
    a: &Args,
    x: Tensor,
    y: Tensor,
    out: Tensor,
    cube: i8,
    ranks: Option<usize>,
) -> Result<Program, Err> {
    let dt = a.dtype(&x)?;
    a.same_dtype(&x, &y, "self and mat2")?;
    a.same_dtype(&x, &out, "self and out")?;
    if !(0..=4).contains(&cube) {
        return Err(invalid(format!("cubeMathType {cube}")));
    }
    if let Some(r) = ranks {
        if x.view.len() != r || y.view.len() != r || out.view.len() != r {
            return Err(invalid(format!("aclnn{} takes {r}-dim tensors", a.op)));
        }
    }
    if a.soc_is_910() && dt == DType::F32 && cube == 0 {
        return Err(invalid(
            "FLOAT32 with cubeMathType KEEP_DTYPE is rejected on the Atlas training series (F32 matmul goes through F16 there)",
        ));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (mut xv, mut yv, mut ov) = (b.view(&x)?, b.view(&y)?, b.view(&out)?);
        // torch.matmul's 1-D rules: a vector is a row (left) or a column (right).
        if xv.shape.len() == 1 {
            xv.shape.insert(0, 1);
            xv.strides.insert(0, 0);
            ov.shape.insert(ov.shape.len().saturating_sub(1), 1);
            ov.strides.insert(ov.strides.len().saturating_sub(1), 0);
        }
        if yv.shape.len() == 1 {
            yv.shape.push(1);
            yv.strides.push(0);
            ov.shape.push(1);
            ov.strides.push(0);
        }
        b.call(OpCall::matmul(xv, yv, ov, 1.0, 0.0))
    }))
}

// Declared from: ON `matmul/mat_mul_v3/op_host/op_api/aclnn_matmul.h`, `aclnn_mm.h`, docs
aclnn_op!(aclnnMatmul, aclnnMatmulGetWorkspaceSize, "Matmul",
(self_: *const Tensor, mat2: *const Tensor, out: *const Tensor, cube_math_type: i8) |a| {
    let (x, y, o) = (a.tensor(self_, "self")?, a.tensor(mat2, "mat2")?, a.tensor(out, "out")?);
    matmul_program(a, x, y, o, cube_math_type, None)
});

// Declared from: ON `matmul/mat_mul_v3/op_host/op_api/aclnn_matmul.h`, `aclnn_mm.h`, docs
aclnn_op!(aclnnMm, aclnnMmGetWorkspaceSize, "Mm",
(self_: *const Tensor, mat2: *const Tensor, out: *const Tensor, cube_math_type: i8) |a| {
    let (x, y, o) = (a.tensor(self_, "self")?, a.tensor(mat2, "mat2")?, a.tensor(out, "out")?);
    matmul_program(a, x, y, o, cube_math_type, Some(2))
});

// Declared from: ON `matmul/batch_mat_mul_v3/op_host/op_api/aclnn_batch_matmul.h`; OP `EXEC_NPU_CMD(aclnnBatchMatMul, self, mat2, result, cube_math_type)`
aclnn_op!(aclnnBatchMatMul, aclnnBatchMatMulGetWorkspaceSize, "BatchMatMul",
(self_: *const Tensor, mat2: *const Tensor, out: *const Tensor, cube_math_type: i8) |a| {
    let (x, y, o) = (a.tensor(self_, "self")?, a.tensor(mat2, "mat2")?, a.tensor(out, "out")?);
    matmul_program(a, x, y, o, cube_math_type, Some(3))
});

// --- Gather / scatter ----------------------------------------------------------------------------

fn check_index(t: &Tensor) -> Result<(), Err> {
    if !matches!(t.dtype, 3 | 9) {
        return Err(invalid("indices must be INT32 or INT64"));
    }
    Ok(())
}

/// A dense view of `v` flattened to 1-D.
fn flat(b: &mut Build, v: TensorView) -> Result<TensorView, Err> {
    let v = dense_in(b, v)?;
    let n = v.numel();
    Ok(TensorView {
        shape: vec![n],
        strides: vec![1],
        ..v
    })
}

// Declared from: ON `index/embedding/op_api/aclnn_embedding.h`, doc; OP `EXEC_NPU_CMD(aclnnEmbedding, weight, indices, result)`
aclnn_op!(aclnnEmbedding, aclnnEmbeddingGetWorkspaceSize, "Embedding",
(weight: *const Tensor, indices: *const Tensor, out: *const Tensor) |a| {
    let (w, i, o) = (a.tensor(weight, "weight")?, a.tensor(indices, "indices")?, a.tensor(out, "out")?);
    a.dtype(&w)?;
    a.same_dtype(&w, &o, "weight and out")?;
    check_index(&i)?;
    if w.view.len() != 2 {
        return Err(invalid("weight must be 2-D"));
    }
    let mut want = i.view.clone();
    want.push(w.view[1]);
    if o.view != want {
        return Err(invalid(format!("out has shape {:?}, not {want:?}", o.view)));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let wv = dense_in(b, b.view(&w)?)?;
        let iv = flat(b, b.view(&i)?)?;
        let ov = b.view(&o)?;
        let d = wv.shape[1];
        let t = dense_out(b, &ov);
        let rows = TensorView {
            shape: vec![iv.shape[0], d],
            strides: vec![d as i64, 1],
            ..t.clone()
        };
        b.call(OpCall::index_select(wv, iv, rows))?;
        finish(b, t, ov)
    }))
});

// Declared from: ON `index/gather_v2/op_api/aclnn_index_select.h`
aclnn_op!(aclnnIndexSelect, aclnnIndexSelectGetWorkspaceSize, "IndexSelect",
(self_: *const Tensor, dim: i64, index: *const Tensor, out: *const Tensor) |a| {
    let (x, i, o) = (a.tensor(self_, "self")?, a.tensor(index, "index")?, a.tensor(out, "out")?);
    a.dtype(&x)?;
    a.same_dtype(&x, &o, "self and out")?;
    check_index(&i)?;
    if i.view.len() > 1 {
        return Err(invalid("index must be 1-D"));
    }
    let d = axis(dim, x.view.len())?;
    Ok(Arc::new(move |b: &mut Build| {
        let xv = dense_in(b, dim_first(b.view(&x)?, d))?;
        let iv = flat(b, b.view(&i)?)?;
        let ov = dim_first(b.view(&o)?, d);
        let t = dense_out(b, &ov);
        b.call(OpCall::index_select(xv, iv, t.clone()))?;
        finish(b, t, ov)
    }))
});

// Declared from: ON `index/inplace_scatter_add/op_host/op_api/aclnn_index_add.h`; OP `EXEC_NPU_CMD(aclnnIndexAdd, result, dim, index, source, alpha, result)`
aclnn_op!(aclnnIndexAdd, aclnnIndexAddGetWorkspaceSize, "IndexAdd",
(self_: *const Tensor, dim: i64, index: *const Tensor, source: *const Tensor, alpha: *const AclScalar,
 out: *const Tensor) |a| {
    let (x, i, s) = (a.tensor(self_, "self")?, a.tensor(index, "index")?, a.tensor(source, "source")?);
    let al = a.scalar(alpha, "alpha")?;
    let o = a.tensor(out, "out")?;
    a.dtype(&x)?;
    a.same_dtype(&x, &s, "self and source")?;
    a.same_dtype(&x, &o, "self and out")?;
    check_index(&i)?;
    if x.view != o.view {
        return Err(invalid("self and out shapes differ"));
    }
    let d = axis(dim, x.view.len())?;
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, ov) = (b.view(&x)?, b.view(&o)?);
        if xv.buffer.device_addr() != ov.buffer.device_addr() || xv.offset != ov.offset {
            b.call(OpCall::copy(xv, ov.clone()))?;
        }
        let mut sv = dense_in(b, dim_first(b.view(&s)?, d))?;
        if al.as_f64() != 1.0 {
            let t = b.temp(sv.dtype, &sv.shape);
            b.call(OpCall::binary_scalar(OpId::MulScalar, sv, al, t.clone()))?;
            sv = t;
        }
        let iv = flat(b, b.view(&i)?)?;
        let ov = dim_first(ov, d);
        let t = if is_dense(&ov) {
            ov.clone()
        } else {
            let t = b.temp(ov.dtype, &ov.shape);
            b.call(OpCall::copy(ov.clone(), t.clone()))?;
            t
        };
        b.call(OpCall::index_add(sv, iv, t.clone()))?;
        finish(b, t, ov)
    }))
});

// Declared from: ON `index/embedding_dense_grad_v2/op_api/aclnn_embedding_dense_backward.h`
aclnn_op!(aclnnEmbeddingDenseBackward, aclnnEmbeddingDenseBackwardGetWorkspaceSize, "EmbeddingDenseBackward",
(grad: *const Tensor, indices: *const Tensor, num_weights: u64, padding_idx: u64, scale_grad_by_freq: bool,
 out: *const Tensor) |a| {
    let (g, i, o) = (a.tensor(grad, "grad")?, a.tensor(indices, "indices")?, a.tensor(out, "out")?);
    a.dtype(&g)?;
    a.same_dtype(&g, &o, "grad and out")?;
    check_index(&i)?;
    if scale_grad_by_freq {
        return Err(invalid("scaleGradByFreq is not simulated"));
    }
    if o.view.len() != 2 || o.view[0] as u64 != num_weights {
        return Err(invalid(format!("out must be [numWeights={num_weights}, D]")));
    }
    // A negative paddingIdx, passed through the uint64_t parameter, means none (assumed, as
    // the op map notes).
    let pad = (padding_idx < num_weights).then_some(padding_idx);
    Ok(Arc::new(move |b: &mut Build| {
        let ov = b.view(&o)?;
        let d = ov.shape[1];
        let t = dense_out(b, &ov);
        b.call(OpCall::fill(t.clone(), Scalar::I64(0)))?;
        let gv = flat(b, b.view(&g)?)?;
        let rows = TensorView {
            shape: vec![gv.shape[0] / d.max(1), d],
            strides: vec![d as i64, 1],
            ..gv
        };
        let iv = flat(b, b.view(&i)?)?;
        b.call(OpCall::index_add(rows, iv, t.clone()))?;
        if let Some(p) = pad {
            let row = TensorView {
                offset: t.offset + p * d * t.dtype.size() as u64,
                shape: vec![d],
                strides: vec![1],
                ..t.clone()
            };
            b.call(OpCall::fill(row, Scalar::I64(0)))?;
        }
        finish(b, t, ov)
    }))
});

// --- Residual add + normalisation ----------------------------------------------------------------

/// The statistics output of the add + norm operators: FLOAT, x's rank, its leading dims then 1s.
fn keepdim_stat(t: &Tensor, x: &Tensor, k: usize, what: &str) -> Result<(), Err> {
    let n = x.view.len();
    let mut want = x.view[..n - k].to_vec();
    want.extend(std::iter::repeat_n(1, k));
    if t.dt()? != DType::F32 || t.view != want {
        return Err(invalid(format!(
            "{what} must be FLOAT of shape {want:?}, not {:?}",
            t.view
        )));
    }
    Ok(())
}

/// The shape checks of the add + norm operators: x1, x2, yOut, xOut alike, gamma (and beta) the
/// tail of x1 (1 to 8 dims each, no 0 dim in x1 or gamma unless the tensor is empty).
fn add_norm_shapes(x1: &Tensor, x2: &Tensor, g: &Tensor, outs: &[&Tensor]) -> Result<usize, Err> {
    let n = x1.view.len();
    let k = g.view.len();
    if !(1..=8).contains(&n) || k == 0 || k > n || x1.view[n - k..] != g.view[..] {
        return Err(invalid(format!(
            "gamma {:?} is not the tail of x1 {:?}",
            g.view, x1.view
        )));
    }
    if g.view.contains(&0) {
        return Err(invalid("a 0 dim in gamma"));
    }
    if x2.view != x1.view || outs.iter().any(|o| o.view != x1.view) {
        return Err(invalid("x1, x2, yOut and xOut shapes differ"));
    }
    Ok(k)
}

// Declared from: ON `norm/add_layer_norm/docs/aclnnAddLayerNorm_en.md` (hicann/ops-nn)
aclnn_op!(aclnnAddLayerNorm, aclnnAddLayerNormGetWorkspaceSize, "AddLayerNorm",
(x1: *const Tensor, x2: *const Tensor, gamma: *const Tensor, beta: *const Tensor, bias_optional: *const Tensor,
 epsilon: f64, additional_output: bool, y_out: *const Tensor, mean_out: *const Tensor, rstd_out: *const Tensor,
 x_out: *const Tensor) |a| {
    let (x1, x2) = (a.tensor(x1, "x1")?, a.tensor(x2, "x2")?);
    let (g, be) = (a.tensor(gamma, "gamma")?, a.tensor(beta, "beta")?);
    if a.opt_tensor(bias_optional, "biasOptional")?.is_some() {
        return Err(invalid("biasOptional is not simulated"));
    }
    let y = a.tensor(y_out, "yOut")?;
    let (m, r) = (a.tensor(mean_out, "meanOut")?, a.tensor(rstd_out, "rstdOut")?);
    let xo = a.tensor(x_out, "xOut")?;
    a.dtype(&x1)?;
    // The docs' uniform-dtype rows; the mixed rows (FLOAT32 with FLOAT16 ...) are not simulated.
    for (t, what) in [(&x2, "x2"), (&g, "gamma"), (&be, "beta"), (&y, "yOut"), (&xo, "xOut")] {
        a.same_dtype(&x1, t, &format!("x1 and {what}"))?;
    }
    if g.view != be.view {
        return Err(invalid("gamma and beta shapes differ"));
    }
    let k = add_norm_shapes(&x1, &x2, &g, &[&y, &xo])?;
    keepdim_stat(&m, &x1, k, "meanOut")?;
    keepdim_stat(&r, &x1, k, "rstdOut")?;
    Ok(Arc::new(move |b: &mut Build| {
        let xv = merge_tail(&b.view(&x1)?, k)?;
        let rv = merge_tail(&b.view(&x2)?, k)?;
        let gv = merge_tail(&b.view(&g)?, k)?;
        let bv = merge_tail(&b.view(&be)?, k)?;
        let yv = merge_tail(&b.view(&y)?, k)?;
        let lead = xv.shape.len() - 1;
        let hv = if additional_output {
            merge_tail(&b.view(&xo)?, k)?
        } else {
            b.temp(xv.dtype, &xv.shape)
        };
        let (mv, sv) = (leading(b.view(&m)?, lead), leading(b.view(&r)?, lead));
        b.call(OpCall::add_layer_norm(xv, rv, gv, bv, hv, yv, mv, sv, epsilon))
    }))
});

// Declared from: ON `norm/add_rms_norm/docs/aclnnAddRmsNorm_en.md` (hicann/ops-nn)
aclnn_op!(aclnnAddRmsNorm, aclnnAddRmsNormGetWorkspaceSize, "AddRmsNorm",
(x1: *const Tensor, x2: *const Tensor, gamma: *const Tensor, epsilon: f64, y_out: *const Tensor,
 rstd_out: *const Tensor, x_out: *const Tensor) |a| {
    let (x1, x2, g) = (a.tensor(x1, "x1")?, a.tensor(x2, "x2")?, a.tensor(gamma, "gamma")?);
    let y = a.tensor(y_out, "yOut")?;
    let r = a.opt_tensor(rstd_out, "rstdOut")?;
    let xo = a.opt_tensor(x_out, "xOut")?;
    let (Some(r), Some(xo)) = (r, xo) else {
        if !rstd_out.is_null() {
            return Err(Err::new(crate::conv::ACLNN_ERR_PARAM_NULLPTR, "rstdOut without xOut"));
        }
        return Err(invalid("a NULL rstdOut or xOut (the [1, D] gamma rows) is not simulated"));
    };
    a.dtype(&x1)?;
    for (t, what) in [(&x2, "x2"), (&g, "gamma"), (&y, "yOut"), (&xo, "xOut")] {
        a.same_dtype(&x1, t, &format!("x1 and {what}"))?;
    }
    if epsilon.is_nan() || epsilon < 0.0 {
        return Err(invalid(format!("epsilon {epsilon} < 0")));
    }
    let k = add_norm_shapes(&x1, &x2, &g, &[&y, &xo])?;
    keepdim_stat(&r, &x1, k, "rstdOut")?;
    Ok(Arc::new(move |b: &mut Build| {
        let xv = merge_tail(&b.view(&x1)?, k)?;
        let rv = merge_tail(&b.view(&x2)?, k)?;
        let gv = merge_tail(&b.view(&g)?, k)?;
        let yv = merge_tail(&b.view(&y)?, k)?;
        let hv = merge_tail(&b.view(&xo)?, k)?;
        let sv = leading(b.view(&r)?, xv.shape.len() - 1);
        b.call(OpCall::add_rms_norm(xv, rv, gv, hv, yv, sv, epsilon))
    }))
});
