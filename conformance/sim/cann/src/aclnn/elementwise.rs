//! Elementwise operators: fills, copies and casts, unary functions and their in-place twins,
//! activation backwards, binary operators with broadcasting (and `alpha`), their scalar and
//! in-place forms, clamps, powers and `aclnnSWhere` (op map A.4, "Memory / conversion",
//! "Unary", "Activation backward", "Binary"; A.5 "axpy").
//!
//! Every operand of one call has one dtype (aclnn would promote mixed dtypes; unihal never
//! passes them, so the simulator refuses them instead of guessing the promotion).

use super::{invalid, Args, Build, Program};
use crate::aclnn_op;
use crate::conv::Err;
use crate::nnopbase::{Scalar as AclScalar, Tensor};
use std::ffi::{c_char, CStr};
use std::sync::Arc;
use unihal_hal::{DType, OpCall, OpId, Scalar};

/// `alpha * v`, integral when both are.
fn times(alpha: Scalar, v: Scalar) -> Scalar {
    match (alpha, v) {
        (Scalar::I64(a), Scalar::I64(b)) => Scalar::I64(a.wrapping_mul(b)),
        _ => Scalar::F64(alpha.as_f64() * v.as_f64()),
    }
}

fn is_one(s: Scalar) -> bool {
    s.as_f64() == 1.0
}

/// `out = a + alpha * b` (`sub`: minus), the alpha form through an intermediate.
fn add_alpha(
    b: &mut Build,
    x: &Tensor,
    y: &Tensor,
    alpha: Scalar,
    out: &Tensor,
    sub: bool,
) -> Result<(), Err> {
    let (xv, yv, ov) = (b.view(x)?, b.view(y)?, b.view(out)?);
    let op = if sub { OpId::Sub } else { OpId::Add };
    if is_one(alpha) {
        return b.call(OpCall::binary(op, xv, yv, ov));
    }
    let tmp = b.temp(ov.dtype, &ov.shape);
    b.call(OpCall::binary_scalar(
        OpId::MulScalar,
        yv,
        alpha,
        tmp.clone(),
    ))?;
    b.call(OpCall::binary(op, xv, tmp, ov))
}

fn binary_program(a: &Args, x: Tensor, y: Tensor, out: Tensor, op: OpId) -> Result<Program, Err> {
    a.dtype(&x)?;
    a.same_dtype(&x, &y, "self and other")?;
    a.same_dtype(&x, &out, "self and out")?;
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, yv, ov) = (b.view(&x)?, b.view(&y)?, b.view(&out)?);
        b.call(OpCall::binary(op, xv, yv, ov))
    }))
}

fn scalar_program(a: &Args, x: Tensor, s: Scalar, out: Tensor, op: OpId) -> Result<Program, Err> {
    a.dtype(&x)?;
    a.same_dtype(&x, &out, "self and out")?;
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, ov) = (b.view(&x)?, b.view(&out)?);
        b.call(OpCall::binary_scalar(op, xv, s, ov))
    }))
}

fn alpha_program(
    a: &Args,
    x: Tensor,
    y: Tensor,
    alpha: Scalar,
    out: Tensor,
    sub: bool,
) -> Result<Program, Err> {
    a.dtype(&x)?;
    a.same_dtype(&x, &y, "self and other")?;
    a.same_dtype(&x, &out, "self and out")?;
    Ok(Arc::new(move |b: &mut Build| {
        add_alpha(b, &x, &y, alpha, &out, sub)
    }))
}

fn unary_program(a: &Args, x: Tensor, out: Tensor, op: OpId) -> Result<Program, Err> {
    a.dtype(&x)?;
    a.same_dtype(&x, &out, "self and out")?;
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, ov) = (b.view(&x)?, b.view(&out)?);
        b.call(OpCall::unary(op, xv, ov))
    }))
}

fn fill_program(a: &Args, t: Tensor, v: Scalar) -> Result<Program, Err> {
    a.dtype(&t)?;
    Ok(Arc::new(move |b: &mut Build| {
        let tv = b.view(&t)?;
        b.call(OpCall::fill(tv, v))
    }))
}

// --- Memory / conversion -------------------------------------------------------------------

// Declared from: OM `conversion/fill/op_api/aclnn_fill_scalar.h`; OP `InplaceFillScalar` call sites
aclnn_op!(aclnnInplaceFillScalar, aclnnInplaceFillScalarGetWorkspaceSize, "InplaceFillScalar",
(self_ref: *const Tensor, value: *const AclScalar) |a| {
    let t = a.tensor(self_ref, "selfRef")?;
    let v = a.scalar(value, "value")?;
    fill_program(a, t, v)
});

// Declared from: OM `math/zero_op/op_api/aclnn_zero.h`, `math/ones_like/op_api/aclnn_ones.h`
aclnn_op!(aclnnInplaceZero, aclnnInplaceZeroGetWorkspaceSize, "InplaceZero",
(self_ref: *const Tensor) |a| {
    let t = a.tensor(self_ref, "selfRef")?;
    fill_program(a, t, Scalar::I64(0))
});

// Declared from: OM `math/zero_op/op_api/aclnn_zero.h`, `math/ones_like/op_api/aclnn_ones.h`
aclnn_op!(aclnnInplaceOne, aclnnInplaceOneGetWorkspaceSize, "InplaceOne",
(self_ref: *const Tensor) |a| {
    let t = a.tensor(self_ref, "selfRef")?;
    fill_program(a, t, Scalar::I64(1))
});

// Declared from: OM `conversion/fill/op_api/aclnn_fill_tensor.h`
aclnn_op!(aclnnInplaceFillTensor, aclnnInplaceFillTensorGetWorkspaceSize, "InplaceFillTensor",
(self_ref: *const Tensor, value: *const Tensor) |a| {
    let t = a.tensor(self_ref, "selfRef")?;
    let v = a.tensor(value, "value")?;
    a.dtype(&t)?;
    a.same_dtype(&t, &v, "selfRef and value")?;
    if v.numel() != 1 {
        return Err(invalid(format!("value has {} elements, not 1", v.numel())));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (tv, mut vv) = (b.view(&t)?, b.view(&v)?);
        // The one element, broadcast to every element of selfRef.
        vv.shape = Vec::new();
        vv.strides = Vec::new();
        b.call(OpCall::copy(vv, tv))
    }))
});

// Declared from: OM `conversion/view_copy/op_api/aclnn_copy.h`, doc; TN `CopyKernelOpApi.cpp` (`EXEC_NPU_CMD(aclnnInplaceCopy, dst, src)`)
aclnn_op!(aclnnInplaceCopy, aclnnInplaceCopyGetWorkspaceSize, "InplaceCopy",
(self_ref: *const Tensor, src: *const Tensor) |a| {
    let dst = a.tensor(self_ref, "selfRef")?;
    let src = a.tensor(src, "src")?;
    a.dtype(&dst)?;
    a.dtype(&src)?;
    Ok(Arc::new(move |b: &mut Build| {
        let (dv, sv) = (b.view(&dst)?, b.view(&src)?);
        if dv.dtype == sv.dtype {
            b.call(OpCall::copy(sv, dv))
        } else {
            b.call(OpCall::cast(sv, dv))
        }
    }))
});

// Declared from: OM `math/cast/op_api/aclnn_cast.h`; OP `CastKernelNpuOpApi.cpp`
aclnn_op!(aclnnCast, aclnnCastGetWorkspaceSize, "Cast",
(self_: *const Tensor, dtype: i32, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let o = a.tensor(out, "out")?;
    a.dtype(&x)?;
    a.dtype(&o)?;
    if o.dtype != dtype {
        return Err(invalid(format!("dtype {dtype} but out is {}", o.dtype)));
    }
    // The kernel library casts among the float types, i32 and i64; aclnnCast also takes BOOL and
    // the other integer types (op map A.4): those on the host, element by element (to BOOL:
    // non-zero, NaN included; to integers: truncated and saturated; through f64, so 64-bit
    // integers beyond 2^53 are rounded, which the operator's documentation leaves open).
    let kernel = |d: DType| {
        matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::Bf16 | DType::I32 | DType::I64)
    };
    let (xd, od) = (a.dtype(&x)?, a.dtype(&o)?);
    if !(kernel(xd) && kernel(od)) && xd != od {
        if x.numel() != o.numel() || x.view != o.view {
            return Err(invalid("self and out must have the same shape"));
        }
        return Ok(Arc::new(move |b: &mut Build| {
            let (x, o) = (x.clone(), o.clone());
            b.host(move || {
                for (s, d) in super::host::addrs(&x).into_iter().zip(super::host::addrs(&o)) {
                    // SAFETY: elements of live descriptors (checked at enqueue).
                    unsafe { super::host::write(d, od, super::host::read(s, xd)) };
                }
                Ok(())
            });
            Ok(())
        }));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, ov) = (b.view(&x)?, b.view(&o)?);
        if xv.dtype == ov.dtype {
            b.call(OpCall::copy(xv, ov))
        } else {
            b.call(OpCall::cast(xv, ov))
        }
    }))
});

// --- Unary -----------------------------------------------------------------------------------

macro_rules! unary {
    ($run:ident, $ws:ident, $name:literal, $inrun:ident, $inws:ident, $inname:literal, $op:expr) => {
        aclnn_op!($run, $ws, $name, (self_: *const Tensor, out: *const Tensor) |a| {
            let x = a.tensor(self_, "self")?;
            let o = a.tensor(out, "out")?;
            unary_program(a, x, o, $op)
        });
        aclnn_op!($inrun, $inws, $inname, (self_ref: *const Tensor) |a| {
            let x = a.tensor(self_ref, "selfRef")?;
            unary_program(a, x.clone(), x, $op)
        });
    };
}

unary!(
    aclnnNeg,
    aclnnNegGetWorkspaceSize,
    "Neg",
    aclnnInplaceNeg,
    aclnnInplaceNegGetWorkspaceSize,
    "InplaceNeg",
    OpId::Neg
);
unary!(
    aclnnExp,
    aclnnExpGetWorkspaceSize,
    "Exp",
    aclnnInplaceExp,
    aclnnInplaceExpGetWorkspaceSize,
    "InplaceExp",
    OpId::Exp
);
unary!(
    aclnnLog,
    aclnnLogGetWorkspaceSize,
    "Log",
    aclnnInplaceLog,
    aclnnInplaceLogGetWorkspaceSize,
    "InplaceLog",
    OpId::Log
);
unary!(
    aclnnSqrt,
    aclnnSqrtGetWorkspaceSize,
    "Sqrt",
    aclnnInplaceSqrt,
    aclnnInplaceSqrtGetWorkspaceSize,
    "InplaceSqrt",
    OpId::Sqrt
);
unary!(
    aclnnRsqrt,
    aclnnRsqrtGetWorkspaceSize,
    "Rsqrt",
    aclnnInplaceRsqrt,
    aclnnInplaceRsqrtGetWorkspaceSize,
    "InplaceRsqrt",
    OpId::Rsqrt
);
unary!(
    aclnnTanh,
    aclnnTanhGetWorkspaceSize,
    "Tanh",
    aclnnInplaceTanh,
    aclnnInplaceTanhGetWorkspaceSize,
    "InplaceTanh",
    OpId::Tanh
);
unary!(
    aclnnSigmoid,
    aclnnSigmoidGetWorkspaceSize,
    "Sigmoid",
    aclnnInplaceSigmoid,
    aclnnInplaceSigmoidGetWorkspaceSize,
    "InplaceSigmoid",
    OpId::Sigmoid
);
unary!(
    aclnnRelu,
    aclnnReluGetWorkspaceSize,
    "Relu",
    aclnnInplaceRelu,
    aclnnInplaceReluGetWorkspaceSize,
    "InplaceRelu",
    OpId::Relu
);

// Declared from: OM `math/abs/op_api/aclnn_abs.h`
aclnn_op!(aclnnAbs, aclnnAbsGetWorkspaceSize, "Abs", (self_: *const Tensor, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let o = a.tensor(out, "out")?;
    unary_program(a, x, o, OpId::Abs)
});

// Declared from: ON `activation/swish/op_api/aclnn_silu.h`
aclnn_op!(aclnnSilu, aclnnSiluGetWorkspaceSize, "Silu", (self_: *const Tensor, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let o = a.tensor(out, "out")?;
    unary_program(a, x, o, OpId::Silu)
});

// Declared from: ON `activation/gelu_v2/op_api/aclnn_gelu_v2.h` (approximate: 0 = none/erf, 1 = tanh), `activation/gelu/docs/aclnnGelu.md`; OP `GeluOutKernelNpuOpApi.cpp`, yaml `exec: aclnnGeluV2, self, approximate_mode, out`
aclnn_op!(aclnnGeluV2, aclnnGeluV2GetWorkspaceSize, "GeluV2",
(x: *const Tensor, approximate: i64, y: *const Tensor) |a| {
    let x = a.tensor(x, "x")?;
    let y = a.tensor(y, "y")?;
    let op = match approximate {
        0 => OpId::GeluErf,
        1 => OpId::GeluTanh,
        v => return Err(invalid(format!("approximate {v} (0: none, 1: tanh)"))),
    };
    unary_program(a, x, y, op)
});

// Declared from: op map A.5 (the global-norm clip composition: `aclnnReciprocal`)
aclnn_op!(aclnnReciprocal, aclnnReciprocalGetWorkspaceSize, "Reciprocal",
(self_: *const Tensor, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let o = a.tensor(out, "out")?;
    a.dtype(&x)?;
    a.same_dtype(&x, &o, "self and out")?;
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, ov) = (b.view(&x)?, b.view(&o)?);
        let one = b.temp(xv.dtype, &[]);
        b.call(OpCall::fill(one.clone(), Scalar::I64(1)))?;
        b.call(OpCall::binary(OpId::Div, one, xv, ov))
    }))
});

// --- Activation backward -------------------------------------------------------------------

fn backward_program(a: &Args, x: Tensor, dy: Tensor, dx: Tensor, op: OpId) -> Result<Program, Err> {
    a.dtype(&x)?;
    a.same_dtype(&x, &dy, "self and gradOutput")?;
    a.same_dtype(&x, &dx, "self and gradInput")?;
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, dyv, dxv) = (b.view(&x)?, b.view(&dy)?, b.view(&dx)?);
        b.call(OpCall::unary_backward(op, xv, dyv, dxv))
    }))
}

// Declared from: ON `activation/threshold_grad_v2_d/op_api/aclnn_threshold_backward.h`
aclnn_op!(aclnnThresholdBackward, aclnnThresholdBackwardGetWorkspaceSize, "ThresholdBackward",
(grad_output: *const Tensor, self_: *const Tensor, threshold: *const AclScalar, out: *const Tensor) |a| {
    let dy = a.tensor(grad_output, "gradOutput")?;
    let x = a.tensor(self_, "self")?;
    let t = a.scalar(threshold, "threshold")?;
    let o = a.tensor(out, "out")?;
    if t.as_f64() != 0.0 {
        return Err(invalid("a threshold other than 0 is not simulated (relu's backward uses 0)"));
    }
    backward_program(a, x, dy, o, OpId::ReluBackward)
});

// Declared from: ON `activation/gelu_grad_v2/op_api/aclnn_gelu_backward_v2.h`; OP `GeluBackwardKernelNpuOpApi.cpp` (uses V2 unless legacy path)
aclnn_op!(aclnnGeluBackwardV2, aclnnGeluBackwardV2GetWorkspaceSize, "GeluBackwardV2",
(grad_output: *const Tensor, self_: *const Tensor, approximate: *const c_char, grad_input: *const Tensor) |a| {
    let dy = a.tensor(grad_output, "gradOutput")?;
    let x = a.tensor(self_, "self")?;
    let dx = a.tensor(grad_input, "gradInput")?;
    if approximate.is_null() {
        return Err(Err::new(crate::conv::ACLNN_ERR_PARAM_NULLPTR, "approximate is NULL"));
    }
    // SAFETY: a NUL-terminated string kept alive by the caller until phase 1 returns.
    let mode = unsafe { CStr::from_ptr(approximate) }.to_string_lossy().into_owned();
    let op = match mode.as_str() {
        "none" => OpId::GeluErfBackward,
        "tanh" => OpId::GeluTanhBackward,
        m => return Err(invalid(format!("approximate \"{m}\" (\"none\" or \"tanh\")"))),
    };
    backward_program(a, x, dy, dx, op)
});

// Declared from: ON `activation/silu_grad/op_api/aclnn_silu_backward.h`; OP `SiluBackward` call sites
aclnn_op!(aclnnSiluBackward, aclnnSiluBackwardGetWorkspaceSize, "SiluBackward",
(grad_output: *const Tensor, self_: *const Tensor, grad_input: *const Tensor) |a| {
    let dy = a.tensor(grad_output, "gradOutput")?;
    let x = a.tensor(self_, "self")?;
    let dx = a.tensor(grad_input, "gradInput")?;
    backward_program(a, x, dy, dx, OpId::SiluBackward)
});

// --- Binary ----------------------------------------------------------------------------------

// Declared from: OM `math/add/op_api/aclnn_add.h`
aclnn_op!(aclnnAdd, aclnnAddGetWorkspaceSize, "Add",
(self_: *const Tensor, other: *const Tensor, alpha: *const AclScalar, out: *const Tensor) |a| {
    let (x, y) = (a.tensor(self_, "self")?, a.tensor(other, "other")?);
    let al = a.scalar(alpha, "alpha")?;
    let o = a.tensor(out, "out")?;
    alpha_program(a, x, y, al, o, false)
});

// Declared from: same
aclnn_op!(aclnnInplaceAdd, aclnnInplaceAddGetWorkspaceSize, "InplaceAdd",
(self_ref: *const Tensor, other: *const Tensor, alpha: *const AclScalar) |a| {
    let (x, y) = (a.tensor(self_ref, "selfRef")?, a.tensor(other, "other")?);
    let al = a.scalar(alpha, "alpha")?;
    alpha_program(a, x.clone(), y, al, x, false)
});

// Declared from: OM `math/sub/op_api/aclnn_sub.h`
aclnn_op!(aclnnSub, aclnnSubGetWorkspaceSize, "Sub",
(self_: *const Tensor, other: *const Tensor, alpha: *const AclScalar, out: *const Tensor) |a| {
    let (x, y) = (a.tensor(self_, "self")?, a.tensor(other, "other")?);
    let al = a.scalar(alpha, "alpha")?;
    let o = a.tensor(out, "out")?;
    alpha_program(a, x, y, al, o, true)
});

// Declared from: OM `math/sub/op_api/aclnn_sub.h`
aclnn_op!(aclnnInplaceSub, aclnnInplaceSubGetWorkspaceSize, "InplaceSub",
(self_ref: *const Tensor, other: *const Tensor, alpha: *const AclScalar) |a| {
    let (x, y) = (a.tensor(self_ref, "selfRef")?, a.tensor(other, "other")?);
    let al = a.scalar(alpha, "alpha")?;
    alpha_program(a, x.clone(), y, al, x, true)
});

// Declared from: same
aclnn_op!(aclnnAdds, aclnnAddsGetWorkspaceSize, "Adds",
(self_: *const Tensor, other: *const AclScalar, alpha: *const AclScalar, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let (v, al) = (a.scalar(other, "other")?, a.scalar(alpha, "alpha")?);
    let o = a.tensor(out, "out")?;
    scalar_program(a, x, times(al, v), o, OpId::AddScalar)
});

// Declared from: same
aclnn_op!(aclnnInplaceAdds, aclnnInplaceAddsGetWorkspaceSize, "InplaceAdds",
(self_ref: *const Tensor, other: *const AclScalar, alpha: *const AclScalar) |a| {
    let x = a.tensor(self_ref, "selfRef")?;
    let (v, al) = (a.scalar(other, "other")?, a.scalar(alpha, "alpha")?);
    scalar_program(a, x.clone(), times(al, v), x, OpId::AddScalar)
});

// Declared from: OM `math/sub/op_api/aclnn_sub.h`
aclnn_op!(aclnnSubs, aclnnSubsGetWorkspaceSize, "Subs",
(self_: *const Tensor, other: *const AclScalar, alpha: *const AclScalar, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    let (v, al) = (a.scalar(other, "other")?, a.scalar(alpha, "alpha")?);
    let o = a.tensor(out, "out")?;
    scalar_program(a, x, times(al, v), o, OpId::SubScalar)
});

macro_rules! binary {
    ($run:ident, $ws:ident, $name:literal, $op:expr) => {
        aclnn_op!($run, $ws, $name, (self_: *const Tensor, other: *const Tensor, out: *const Tensor) |a| {
            let (x, y, o) = (a.tensor(self_, "self")?, a.tensor(other, "other")?, a.tensor(out, "out")?);
            binary_program(a, x, y, o, $op)
        });
    };
    (inplace $run:ident, $ws:ident, $name:literal, $op:expr) => {
        aclnn_op!($run, $ws, $name, (self_ref: *const Tensor, other: *const Tensor) |a| {
            let (x, y) = (a.tensor(self_ref, "selfRef")?, a.tensor(other, "other")?);
            binary_program(a, x.clone(), y, x, $op)
        });
    };
    (scalar $run:ident, $ws:ident, $name:literal, $op:expr) => {
        aclnn_op!($run, $ws, $name, (self_: *const Tensor, other: *const AclScalar, out: *const Tensor) |a| {
            let x = a.tensor(self_, "self")?;
            let v = a.scalar(other, "other")?;
            let o = a.tensor(out, "out")?;
            scalar_program(a, x, v, o, $op)
        });
    };
    (inplace_scalar $run:ident, $ws:ident, $name:literal, $op:expr) => {
        aclnn_op!($run, $ws, $name, (self_ref: *const Tensor, other: *const AclScalar) |a| {
            let x = a.tensor(self_ref, "selfRef")?;
            let v = a.scalar(other, "other")?;
            scalar_program(a, x.clone(), v, x, $op)
        });
    };
}

// Declared from: OM `math/mul/op_api/aclnn_mul.h`
binary!(aclnnMul, aclnnMulGetWorkspaceSize, "Mul", OpId::Mul);
// Declared from: OM `math/div/op_api/aclnn_div.h`
binary!(aclnnDiv, aclnnDivGetWorkspaceSize, "Div", OpId::Div);
binary!(
    aclnnMaximum,
    aclnnMaximumGetWorkspaceSize,
    "Maximum",
    OpId::Maximum
);
binary!(
    aclnnMinimum,
    aclnnMinimumGetWorkspaceSize,
    "Minimum",
    OpId::Minimum
);
binary!(
    aclnnPowTensorTensor,
    aclnnPowTensorTensorGetWorkspaceSize,
    "PowTensorTensor",
    OpId::Pow
);
// Declared from: OM `math/mul/op_api/aclnn_mul.h`
binary!(inplace aclnnInplaceMul, aclnnInplaceMulGetWorkspaceSize, "InplaceMul", OpId::Mul);
// Declared from: OM `math/div/op_api/aclnn_div.h`
binary!(inplace aclnnInplaceDiv, aclnnInplaceDivGetWorkspaceSize, "InplaceDiv", OpId::Div);
// Declared from: OM `math/mul/op_api/aclnn_mul.h`
binary!(scalar aclnnMuls, aclnnMulsGetWorkspaceSize, "Muls", OpId::MulScalar);
// Declared from: OM `math/div/op_api/aclnn_div.h`
binary!(scalar aclnnDivs, aclnnDivsGetWorkspaceSize, "Divs", OpId::DivScalar);
// Declared from: OM `conversion/clip_by_value_v2/op_api/aclnn_clamp.h`
binary!(scalar aclnnClampMin, aclnnClampMinGetWorkspaceSize, "ClampMin", OpId::MaximumScalar);
// Declared from: OM `conversion/clip_by_value_v2/op_api/aclnn_clamp.h`
binary!(scalar aclnnClampMax, aclnnClampMaxGetWorkspaceSize, "ClampMax", OpId::MinimumScalar);
// Declared from: OM `math/pow/op_api/aclnn_pow_tensor_tensor.h`, `aclnn_pow.h`
binary!(scalar aclnnPowTensorScalar, aclnnPowTensorScalarGetWorkspaceSize, "PowTensorScalar", OpId::PowScalar);
// Declared from: OM `math/mul/op_api/aclnn_mul.h`
binary!(inplace_scalar aclnnInplaceMuls, aclnnInplaceMulsGetWorkspaceSize, "InplaceMuls", OpId::MulScalar);
// Declared from: OM `math/div/op_api/aclnn_div.h`
binary!(inplace_scalar aclnnInplaceDivs, aclnnInplaceDivsGetWorkspaceSize, "InplaceDivs", OpId::DivScalar);

// Declared from: OM `conversion/clip_by_value_v2/op_api/aclnn_clamp.h`
aclnn_op!(aclnnClamp, aclnnClampGetWorkspaceSize, "Clamp",
(self_: *const Tensor, min: *const AclScalar, max: *const AclScalar, out: *const Tensor) |a| {
    let x = a.tensor(self_, "self")?;
    // SAFETY-free: NULL means "no bound" here.
    let lo = if min.is_null() { None } else { Some(a.scalar(min, "min")?) };
    let hi = if max.is_null() { None } else { Some(a.scalar(max, "max")?) };
    let o = a.tensor(out, "out")?;
    a.dtype(&x)?;
    a.same_dtype(&x, &o, "self and out")?;
    if lo.is_none() && hi.is_none() {
        return Err(invalid("aclnnClamp needs min or max"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (xv, ov) = (b.view(&x)?, b.view(&o)?);
        let mut src = xv;
        if let Some(lo) = lo {
            b.call(OpCall::binary_scalar(OpId::MaximumScalar, src, lo, ov.clone()))?;
            src = ov.clone();
        }
        if let Some(hi) = hi {
            b.call(OpCall::binary_scalar(OpId::MinimumScalar, src, hi, ov))?;
        }
        Ok(())
    }))
});

// Declared from: OM `math/pow/op_api/aclnn_pow_tensor_tensor.h`, `aclnn_pow.h`
aclnn_op!(aclnnPowScalarTensor, aclnnPowScalarTensorGetWorkspaceSize, "PowScalarTensor",
(self_: *const AclScalar, exponent: *const Tensor, out: *const Tensor) |a| {
    let base = a.scalar(self_, "self")?;
    let e = a.tensor(exponent, "exponent")?;
    let o = a.tensor(out, "out")?;
    a.dtype(&e)?;
    a.same_dtype(&e, &o, "exponent and out")?;
    Ok(Arc::new(move |b: &mut Build| {
        let (ev, ov) = (b.view(&e)?, b.view(&o)?);
        let bv = b.temp(ev.dtype, &[]);
        b.call(OpCall::fill(bv.clone(), base))?;
        b.call(OpCall::binary(OpId::Pow, bv, ev, ov))
    }))
});

// Declared from: OM `math/select/op_api/aclnn_s_where.h`; OP `EXEC_NPU_CMD(aclnnSWhere, cond, self, other, out)`
aclnn_op!(aclnnSWhere, aclnnSWhereGetWorkspaceSize, "SWhere",
(condition: *const Tensor, self_: *const Tensor, other: *const Tensor, out: *const Tensor) |a| {
    let c = a.tensor(condition, "condition")?;
    let (x, y, o) = (a.tensor(self_, "self")?, a.tensor(other, "other")?, a.tensor(out, "out")?);
    a.dtype(&x)?;
    a.same_dtype(&x, &y, "self and other")?;
    a.same_dtype(&x, &o, "self and out")?;
    if !matches!(c.dtype, 4 | 12) {
        return Err(invalid("condition must be BOOL or UINT8"));
    }
    Ok(Arc::new(move |b: &mut Build| {
        let (cv, xv, yv, ov) = (b.view(&c)?, b.view(&x)?, b.view(&y)?, b.view(&o)?);
        b.call(OpCall::where_(cv, xv, yv, ov))
    }))
});
