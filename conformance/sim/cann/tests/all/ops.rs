//! Every simulated aclnn operator, both phases, against Rust references (no numpy), on strided,
//! offset and broadcast descriptors.
#![allow(clippy::type_complexity, clippy::needless_range_loop)]

use crate::support;

use std::ffi::c_void;
use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::aclnn::elementwise::*;
use unihal_sim_cann::aclnn::nn::*;
use unihal_sim_cann::aclnn::optim::*;
use unihal_sim_cann::aclnn::random::*;
use unihal_sim_cann::aclnn::reduce::*;
use unihal_sim_cann::aclnn::transformer::*;
use unihal_sim_cann::aclnn::Executor;
use unihal_sim_cann::nnopbase::*;

type Phase2 = extern "C" fn(*mut c_void, u64, *mut Executor, *mut c_void) -> i32;

/// Phase 1 through `p1`, then phase 2 on a fresh workspace, then a synchronise.
fn op(p1: impl FnOnce(*mut u64, *mut *mut Executor) -> i32, p2: Phase2) {
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    let r = p1(&mut ws, &mut ex);
    assert_eq!(r, 0, "phase 1: {r}: {}", msg());
    run(ws, ex, p2);
}

fn close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()) || (w.is_nan() && g.is_nan()),
            "element {i}: {g} vs {w}"
        );
    }
}

fn erf(x: f64) -> f64 {
    // Abramowitz and Stegun 7.1.26 (|error| < 1.5e-7).
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t
            + 0.254_829_592)
            * t
            * (-x * x).exp();
    y.copysign(x)
}

/// 8 values read every other element (stride 2) from offset 1 of 17.
fn strided_input() -> (Vec<f32>, *mut c_void, *mut Tensor, Vec<f64>) {
    let store: Vec<f32> = (0..17).map(|i| (i as f32 - 8.0) * 0.37).collect();
    let d = dev(&store);
    let t = tensor(d, ACL_FLOAT, &[8], &[2], 1, 17);
    let vals: Vec<f64> = (0..8).map(|i| store[1 + 2 * i] as f64).collect();
    (store, d, t, vals)
}

type UnaryP1 =
    unsafe extern "C" fn(*const Tensor, *const Tensor, *mut u64, *mut *mut Executor) -> i32;

#[test]
fn unary_operators_on_a_strided_view() {
    if crate::own_process() {
        return;
    }
    init();
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let cases: Vec<(&str, UnaryP1, Phase2, Box<dyn Fn(f64) -> f64>)> = vec![
        ("neg", aclnnNegGetWorkspaceSize, aclnnNeg, Box::new(|x| -x)),
        (
            "abs",
            aclnnAbsGetWorkspaceSize,
            aclnnAbs,
            Box::new(f64::abs),
        ),
        (
            "exp",
            aclnnExpGetWorkspaceSize,
            aclnnExp,
            Box::new(f64::exp),
        ),
        (
            "log",
            aclnnLogGetWorkspaceSize,
            aclnnLog,
            Box::new(|x: f64| x.abs().ln()),
        ),
        (
            "sqrt",
            aclnnSqrtGetWorkspaceSize,
            aclnnSqrt,
            Box::new(|x: f64| x.abs().sqrt()),
        ),
        (
            "rsqrt",
            aclnnRsqrtGetWorkspaceSize,
            aclnnRsqrt,
            Box::new(|x: f64| 1.0 / x.abs().sqrt()),
        ),
        (
            "tanh",
            aclnnTanhGetWorkspaceSize,
            aclnnTanh,
            Box::new(f64::tanh),
        ),
        (
            "sigmoid",
            aclnnSigmoidGetWorkspaceSize,
            aclnnSigmoid,
            Box::new(sig),
        ),
        (
            "relu",
            aclnnReluGetWorkspaceSize,
            aclnnRelu,
            Box::new(|x: f64| x.max(0.0)),
        ),
        (
            "silu",
            aclnnSiluGetWorkspaceSize,
            aclnnSilu,
            Box::new(move |x| x * sig(x)),
        ),
        (
            "reciprocal",
            aclnnReciprocalGetWorkspaceSize,
            aclnnReciprocal,
            Box::new(|x| 1.0 / x),
        ),
    ];
    for (name, p1, p2, f) in cases {
        let (_, _, x, vals) = strided_input();
        // log, sqrt and rsqrt of |x|: their input is the absolute value.
        let (xin, vals) = if matches!(name, "log" | "sqrt" | "rsqrt") {
            let a: Vec<f32> = vals.iter().map(|v| v.abs() as f32).collect();
            let d = dev(&a);
            (
                contiguous(d, ACL_FLOAT, &[8]),
                a.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            )
        } else {
            (x, vals)
        };
        let dout = dev(&[0f32; 8]);
        let out = contiguous(dout, ACL_FLOAT, &[8]);
        // SAFETY: live descriptors and out-pointers.
        op(|w, e| unsafe { p1(xin, out, w, e) }, p2);
        let want: Vec<f64> = vals.iter().map(|&v| f(v)).collect();
        let got = host::<f32>(dout, 8);
        let want = if matches!(name, "log" | "sqrt" | "rsqrt") {
            vals.iter().map(|&v| f(v)).collect()
        } else {
            want
        };
        close(&got, &want, 2e-6);
    }
}

#[test]
fn in_place_unary_twins_write_their_input() {
    if crate::own_process() {
        return;
    }
    init();
    let (_, d, x, vals) = strided_input();
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnInplaceNegGetWorkspaceSize(x, w, e) },
        aclnnInplaceNeg,
    );
    let store = host::<f32>(d, 17);
    let got: Vec<f32> = (0..8).map(|i| store[1 + 2 * i]).collect();
    close(&got, &vals.iter().map(|v| -v).collect::<Vec<_>>(), 0.0);
    assert_eq!(store[0], -8.0 * 0.37, "elements outside the view untouched");
}

#[test]
fn gelu_both_forms_and_the_activation_backwards() {
    if crate::own_process() {
        return;
    }
    init();
    let (_, _, x, vals) = strided_input();
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let tanh_gelu = |v: f64| 0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh());
    let erf_gelu = |v: f64| 0.5 * v * (1.0 + erf(v / 2f64.sqrt()));
    for (approx, f) in [(1i64, &tanh_gelu as &dyn Fn(f64) -> f64), (0, &erf_gelu)] {
        let dout = dev(&[0f32; 8]);
        let out = contiguous(dout, ACL_FLOAT, &[8]);
        // SAFETY: live descriptors and out-pointers.
        op(
            |w, e| unsafe { aclnnGeluV2GetWorkspaceSize(x, approx, out, w, e) },
            aclnnGeluV2,
        );
        close(
            &host::<f32>(dout, 8),
            &vals.iter().map(|&v| f(v)).collect::<Vec<_>>(),
            1e-5,
        );
    }
    // Backwards with dy = 2.
    let dy = dev(&[2f32; 8]);
    let dyt = contiguous(dy, ACL_FLOAT, &[8]);
    let h = 1e-4;
    let num = |f: &dyn Fn(f64) -> f64, v: f64| 2.0 * (f(v + h) - f(v - h)) / (2.0 * h);
    for (mode, f) in [
        (c"tanh", &tanh_gelu as &dyn Fn(f64) -> f64),
        (c"none", &erf_gelu),
    ] {
        let dout = dev(&[0f32; 8]);
        let out = contiguous(dout, ACL_FLOAT, &[8]);
        // SAFETY: live descriptors, a NUL-terminated string and out-pointers.
        op(
            |w, e| unsafe { aclnnGeluBackwardV2GetWorkspaceSize(dyt, x, mode.as_ptr(), out, w, e) },
            aclnnGeluBackwardV2,
        );
        close(
            &host::<f32>(dout, 8),
            &vals.iter().map(|&v| num(f, v)).collect::<Vec<_>>(),
            1e-4,
        );
    }
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let dout = dev(&[0f32; 8]);
    let out = contiguous(dout, ACL_FLOAT, &[8]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnSiluBackwardGetWorkspaceSize(dyt, x, out, w, e) },
        aclnnSiluBackward,
    );
    let want: Vec<f64> = vals
        .iter()
        .map(|&v| 2.0 * sig(v) * (1.0 + v * (1.0 - sig(v))))
        .collect();
    close(&host::<f32>(dout, 8), &want, 1e-5);
    let zero = f32_scalar(0.0);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnThresholdBackwardGetWorkspaceSize(dyt, x, zero, out, w, e) },
        aclnnThresholdBackward,
    );
    let want: Vec<f64> = vals
        .iter()
        .map(|&v| if v > 0.0 { 2.0 } else { 0.0 })
        .collect();
    close(&host::<f32>(dout, 8), &want, 0.0);
}

type BinaryP1 = unsafe extern "C" fn(
    *const Tensor,
    *const Tensor,
    *const Tensor,
    *mut u64,
    *mut *mut Executor,
) -> i32;

#[test]
fn binary_operators_broadcast() {
    if crate::own_process() {
        return;
    }
    init();
    // a: [2, 3] read through a column-major view; b: [3] broadcast over rows.
    let a: Vec<f32> = vec![1.5, -2.0, 3.25, 0.5, 4.0, -1.0];
    let b: Vec<f32> = vec![2.0, 0.5, -3.0];
    let (da, db) = (dev(&a), dev(&b));
    let at = tensor(da, ACL_FLOAT, &[2, 3], &[1, 2], 0, 6);
    let bt = contiguous(db, ACL_FLOAT, &[3]);
    let av = |r: usize, c: usize| a[r + 2 * c] as f64;
    let cases: Vec<(BinaryP1, Phase2, fn(f64, f64) -> f64)> = vec![
        (aclnnMulGetWorkspaceSize, aclnnMul, |x, y| x * y),
        (aclnnDivGetWorkspaceSize, aclnnDiv, |x, y| x / y),
        (aclnnMaximumGetWorkspaceSize, aclnnMaximum, f64::max),
        (aclnnMinimumGetWorkspaceSize, aclnnMinimum, f64::min),
        (
            aclnnPowTensorTensorGetWorkspaceSize,
            aclnnPowTensorTensor,
            |x: f64, y| x.abs().powf(y),
        ),
    ];
    for (k, (p1, p2, f)) in cases.into_iter().enumerate() {
        let pos = k == 4;
        let (ax, avf): (*mut Tensor, Box<dyn Fn(usize, usize) -> f64>) = if pos {
            let abs: Vec<f32> = a.iter().map(|v| v.abs()).collect();
            let d = dev(&abs);
            (
                tensor(d, ACL_FLOAT, &[2, 3], &[1, 2], 0, 6),
                Box::new(move |r, c| abs[r + 2 * c] as f64),
            )
        } else {
            (at, Box::new(av))
        };
        let dout = dev(&[0f32; 6]);
        let out = contiguous(dout, ACL_FLOAT, &[2, 3]);
        // SAFETY: live descriptors and out-pointers.
        op(|w, e| unsafe { p1(ax, bt, out, w, e) }, p2);
        let mut want = Vec::new();
        for r in 0..2 {
            for c in 0..3 {
                want.push(f(avf(r, c), b[c] as f64));
            }
        }
        close(&host::<f32>(dout, 6), &want, 1e-6);
    }
    // Sub with alpha and the scalar forms.
    let dout = dev(&[0f32; 6]);
    let out = contiguous(dout, ACL_FLOAT, &[2, 3]);
    let two = f32_scalar(2.0);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnSubGetWorkspaceSize(at, bt, two, out, w, e) },
        aclnnSub,
    );
    let want: Vec<f64> = (0..6)
        .map(|i| av(i / 3, i % 3) - 2.0 * b[i % 3] as f64)
        .collect();
    close(&host::<f32>(dout, 6), &want, 1e-6);
    let half = f32_scalar(0.5);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnAddsGetWorkspaceSize(at, half, two, out, w, e) },
        aclnnAdds,
    );
    close(
        &host::<f32>(dout, 6),
        &(0..6).map(|i| av(i / 3, i % 3) + 1.0).collect::<Vec<_>>(),
        1e-6,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnSubsGetWorkspaceSize(at, half, two, out, w, e) },
        aclnnSubs,
    );
    close(
        &host::<f32>(dout, 6),
        &(0..6).map(|i| av(i / 3, i % 3) - 1.0).collect::<Vec<_>>(),
        1e-6,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnMulsGetWorkspaceSize(at, two, out, w, e) },
        aclnnMuls,
    );
    close(
        &host::<f32>(dout, 6),
        &(0..6).map(|i| av(i / 3, i % 3) * 2.0).collect::<Vec<_>>(),
        1e-6,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnDivsGetWorkspaceSize(at, two, out, w, e) },
        aclnnDivs,
    );
    close(
        &host::<f32>(dout, 6),
        &(0..6).map(|i| av(i / 3, i % 3) / 2.0).collect::<Vec<_>>(),
        1e-6,
    );
    let lo = f32_scalar(-1.5);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnClampGetWorkspaceSize(at, lo, two, out, w, e) },
        aclnnClamp,
    );
    close(
        &host::<f32>(dout, 6),
        &(0..6)
            .map(|i| av(i / 3, i % 3).clamp(-1.5, 2.0))
            .collect::<Vec<_>>(),
        0.0,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnClampMinGetWorkspaceSize(at, lo, out, w, e) },
        aclnnClampMin,
    );
    close(
        &host::<f32>(dout, 6),
        &(0..6)
            .map(|i| av(i / 3, i % 3).max(-1.5))
            .collect::<Vec<_>>(),
        0.0,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnClampMaxGetWorkspaceSize(at, two, out, w, e) },
        aclnnClampMax,
    );
    close(
        &host::<f32>(dout, 6),
        &(0..6)
            .map(|i| av(i / 3, i % 3).min(2.0))
            .collect::<Vec<_>>(),
        0.0,
    );
    // 2^b broadcast to [2, 3] through PowScalarTensor; b^2 through PowTensorScalar.
    let dpow = dev(&[0f32; 3]);
    let pout = contiguous(dpow, ACL_FLOAT, &[3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnPowScalarTensorGetWorkspaceSize(two, bt, pout, w, e) },
        aclnnPowScalarTensor,
    );
    close(
        &host::<f32>(dpow, 3),
        &b.iter().map(|&v| 2f64.powf(v as f64)).collect::<Vec<_>>(),
        1e-6,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnPowTensorScalarGetWorkspaceSize(bt, two, pout, w, e) },
        aclnnPowTensorScalar,
    );
    close(
        &host::<f32>(dpow, 3),
        &b.iter().map(|&v| (v as f64).powi(2)).collect::<Vec<_>>(),
        1e-6,
    );
}

#[test]
fn in_place_binaries_and_axpy() {
    if crate::own_process() {
        return;
    }
    init();
    let y = dev(&[1f32, 2.0, 3.0, 4.0]);
    let x = dev(&[10f32]);
    let yt = contiguous(y, ACL_FLOAT, &[4]);
    let xt = tensor(x, ACL_FLOAT, &[4], &[0], 0, 1);
    let alpha = f32_scalar(0.5);
    // y += 0.5 * x (the op map's axpy composition), x broadcast through a zero stride.
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnInplaceAddGetWorkspaceSize(yt, xt, alpha, w, e) },
        aclnnInplaceAdd,
    );
    assert_eq!(host::<f32>(y, 4), [6.0, 7.0, 8.0, 9.0]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceSubGetWorkspaceSize(yt, xt, alpha, w, e) },
        aclnnInplaceSub,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceMulGetWorkspaceSize(yt, xt, w, e) },
        aclnnInplaceMul,
    );
    assert_eq!(host::<f32>(y, 4), [10.0, 20.0, 30.0, 40.0]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceDivGetWorkspaceSize(yt, xt, w, e) },
        aclnnInplaceDiv,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceMulsGetWorkspaceSize(yt, alpha, w, e) },
        aclnnInplaceMuls,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceAddsGetWorkspaceSize(yt, alpha, alpha, w, e) },
        aclnnInplaceAdds,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceDivsGetWorkspaceSize(yt, alpha, w, e) },
        aclnnInplaceDivs,
    );
    assert_eq!(host::<f32>(y, 4), [1.5, 2.5, 3.5, 4.5]);
}

#[test]
fn fills_copies_casts_and_where() {
    if crate::own_process() {
        return;
    }
    init();
    let d = dev(&[0f32; 6]);
    let t = contiguous(d, ACL_FLOAT, &[2, 3]);
    let v = f32_scalar(2.5);
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnInplaceFillScalarGetWorkspaceSize(t, v, w, e) },
        aclnnInplaceFillScalar,
    );
    assert_eq!(host::<f32>(d, 6), [2.5; 6]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceZeroGetWorkspaceSize(t, w, e) },
        aclnnInplaceZero,
    );
    assert_eq!(host::<f32>(d, 6), [0.0; 6]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceOneGetWorkspaceSize(t, w, e) },
        aclnnInplaceOne,
    );
    assert_eq!(host::<f32>(d, 6), [1.0; 6]);
    let one = dev(&[7f32]);
    let ot = tensor(one, ACL_FLOAT, &[1], &[1], 0, 1);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceFillTensorGetWorkspaceSize(t, ot, w, e) },
        aclnnInplaceFillTensor,
    );
    assert_eq!(host::<f32>(d, 6), [7.0; 6]);
    // A transposing copy with a cast: i32 [3, 2] (transposed view) into f32 [2, 3]... as i32 → f32.
    let src = dev(&[1i32, 2, 3, 4, 5, 6]);
    let st = tensor(src, ACL_INT32, &[2, 3], &[1, 2], 0, 6);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceCopyGetWorkspaceSize(t, st, w, e) },
        aclnnInplaceCopy,
    );
    assert_eq!(host::<f32>(d, 6), [1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
    let di = dev(&[0i64; 6]);
    let it = contiguous(di, ACL_INT64, &[2, 3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnCastGetWorkspaceSize(t, ACL_INT64, it, w, e) },
        aclnnCast,
    );
    assert_eq!(host::<i64>(di, 6), [1, 3, 5, 2, 4, 6]);
    // To BOOL and UINT8, which the kernel library does not cast: non-zero (NaN too) is true,
    // integers truncate and saturate.
    let fx = dev(&[0f32, 1.5, -2.0, f32::NAN, 300.0, -0.0]);
    let ft = contiguous(fx, ACL_FLOAT, &[6]);
    let db = dev(&[7u8; 6]);
    let bt = contiguous(db, 12, &[6]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnCastGetWorkspaceSize(ft, 12, bt, w, e) },
        aclnnCast,
    );
    assert_eq!(host::<u8>(db, 6), [0, 1, 1, 1, 1, 0]);
    let du = dev(&[7u8; 6]);
    let ut = contiguous(du, 4, &[6]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnCastGetWorkspaceSize(ft, 4, ut, w, e) },
        aclnnCast,
    );
    assert_eq!(host::<u8>(du, 6), [0, 1, 0, 0, 255, 0]);
    let cond = dev(&[1u8, 0, 1]);
    let ct = contiguous(cond, 12, &[3]);
    let other = dev(&[-1f32]);
    let other_t = tensor(other, ACL_FLOAT, &[1], &[0], 0, 1);
    let dout = dev(&[0f32; 6]);
    let out = contiguous(dout, ACL_FLOAT, &[2, 3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnSWhereGetWorkspaceSize(ct, t, other_t, out, w, e) },
        aclnnSWhere,
    );
    assert_eq!(host::<f32>(dout, 6), [1.0, -1.0, 5.0, 2.0, -1.0, 6.0]);
}

#[test]
fn reductions_along_dims() {
    if crate::own_process() {
        return;
    }
    init();
    let x: Vec<f32> = vec![
        3.0, -1.0, 4.0, 1.0, -5.0, 9.0, 2.0, 6.0, -5.0, 3.0, 5.0, 8.0,
    ];
    let dx = dev(&x);
    let xt = contiguous(dx, ACL_FLOAT, &[3, 4]);
    let d1 = [1i64];
    // SAFETY: an array of one value.
    let dims = unsafe { aclCreateIntArray(d1.as_ptr(), 1) };
    let row = |r: usize| &x[r * 4..r * 4 + 4];
    let dout = dev(&[0f32; 3]);
    let out = contiguous(dout, ACL_FLOAT, &[3, 1]);
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnMeanGetWorkspaceSize(xt, dims, true, ACL_FLOAT, out, w, e) },
        aclnnMean,
    );
    close(
        &host::<f32>(dout, 3),
        &(0..3)
            .map(|r| row(r).iter().map(|&v| v as f64).sum::<f64>() / 4.0)
            .collect::<Vec<_>>(),
        1e-6,
    );
    let out3 = contiguous(dout, ACL_FLOAT, &[3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnAmaxGetWorkspaceSize(xt, dims, false, out3, w, e) },
        aclnnAmax,
    );
    assert_eq!(host::<f32>(dout, 3), [4.0, 9.0, 8.0]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnAminGetWorkspaceSize(xt, dims, false, out3, w, e) },
        aclnnAmin,
    );
    assert_eq!(host::<f32>(dout, 3), [-1.0, -5.0, -5.0]);
    // Along dim 0 (a strided reduction) with values and I32 indices.
    let (dv, di) = (dev(&[0f32; 4]), dev(&[0i32; 4]));
    let (vt, it) = (
        contiguous(dv, ACL_FLOAT, &[4]),
        contiguous(di, ACL_INT32, &[4]),
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnMaxDimGetWorkspaceSize(xt, 0, false, vt, it, w, e) },
        aclnnMaxDim,
    );
    assert_eq!(host::<f32>(dv, 4), [3.0, 9.0, 5.0, 8.0]);
    assert_eq!(host::<i32>(di, 4), [0, 1, 2, 2]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnMinDimGetWorkspaceSize(xt, 0, false, vt, it, w, e) },
        aclnnMinDim,
    );
    assert_eq!(host::<f32>(dv, 4), [-5.0, -1.0, 2.0, 1.0]);
    assert_eq!(host::<i32>(di, 4), [1, 0, 1, 0]);
    let dl = dev(&[0i64; 3]);
    let lt = contiguous(dl, ACL_INT64, &[3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnArgMaxGetWorkspaceSize(xt, -1, false, lt, w, e) },
        aclnnArgMax,
    );
    assert_eq!(host::<i64>(dl, 3), [2, 1, 3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnArgMinGetWorkspaceSize(xt, 1, false, lt, w, e) },
        aclnnArgMin,
    );
    assert_eq!(host::<i64>(dl, 3), [1, 0, 0]);
}

#[test]
fn softmax_family_and_backwards() {
    if crate::own_process() {
        return;
    }
    init();
    let x: Vec<f32> = vec![0.5, -1.0, 2.0, 0.0, 1.5, -0.5];
    let dx = dev(&x);
    let xt = contiguous(dx, ACL_FLOAT, &[2, 3]);
    let (dy, dls) = (dev(&[0f32; 6]), dev(&[0f32; 6]));
    let (yt, lst) = (
        contiguous(dy, ACL_FLOAT, &[2, 3]),
        contiguous(dls, ACL_FLOAT, &[2, 3]),
    );
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnLogSoftmaxGetWorkspaceSize(xt, 1, lst, w, e) },
        aclnnLogSoftmax,
    );
    let mut want = Vec::new();
    for r in 0..2 {
        let row: Vec<f64> = x[r * 3..r * 3 + 3].iter().map(|&v| v as f64).collect();
        let m = row.iter().cloned().fold(f64::MIN, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        want.extend(row.iter().map(|v| v - lse));
    }
    close(&host::<f32>(dls, 6), &want, 1e-6);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnSoftmaxGetWorkspaceSize(xt, -1, yt, w, e) },
        aclnnSoftmax,
    );
    let y: Vec<f64> = want.iter().map(|v| v.exp()).collect();
    close(&host::<f32>(dy, 6), &y, 1e-6);
    let g: Vec<f32> = vec![1.0, 2.0, -1.0, 0.5, 0.0, 3.0];
    let dg = dev(&g);
    let gt = contiguous(dg, ACL_FLOAT, &[2, 3]);
    let dgrad = dev(&[0f32; 6]);
    let grad = contiguous(dgrad, ACL_FLOAT, &[2, 3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnSoftmaxBackwardGetWorkspaceSize(gt, yt, 1, grad, w, e) },
        aclnnSoftmaxBackward,
    );
    let mut want = Vec::new();
    for r in 0..2 {
        let dot: f64 = (0..3).map(|c| g[r * 3 + c] as f64 * y[r * 3 + c]).sum();
        want.extend((0..3).map(|c| y[r * 3 + c] * (g[r * 3 + c] as f64 - dot)));
    }
    close(&host::<f32>(dgrad, 6), &want, 1e-5);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnLogSoftmaxBackwardGetWorkspaceSize(gt, lst, 1, grad, w, e) },
        aclnnLogSoftmaxBackward,
    );
    let mut want = Vec::new();
    for r in 0..2 {
        let s: f64 = (0..3).map(|c| g[r * 3 + c] as f64).sum();
        want.extend((0..3).map(|c| g[r * 3 + c] as f64 - y[r * 3 + c] * s));
    }
    close(&host::<f32>(dgrad, 6), &want, 1e-5);
}

#[test]
fn layer_norm_and_rms_norm_with_their_backwards() {
    if crate::own_process() {
        return;
    }
    init();
    let x: Vec<f32> = vec![1.0, 2.0, 4.0, -1.0, 0.5, 3.0, 2.0, -2.0];
    let wv = [0.5f32, 1.5, 1.0, 2.0];
    let bv = [0.1f32, 0.0, -0.2, 0.3];
    let (dx, dw, db) = (dev(&x), dev(&wv), dev(&bv));
    let xt = contiguous(dx, ACL_FLOAT, &[2, 4]);
    let (wt, bt) = (
        contiguous(dw, ACL_FLOAT, &[4]),
        contiguous(db, ACL_FLOAT, &[4]),
    );
    let (dy, dm, dr) = (dev(&[0f32; 8]), dev(&[0f32; 2]), dev(&[0f32; 2]));
    let yt = contiguous(dy, ACL_FLOAT, &[2, 4]);
    let (mt, rt) = (
        contiguous(dm, ACL_FLOAT, &[2, 1]),
        contiguous(dr, ACL_FLOAT, &[2, 1]),
    );
    let ns = [4i64];
    // SAFETY: an array of one value.
    let nsa = unsafe { aclCreateIntArray(ns.as_ptr(), 1) };
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnLayerNormGetWorkspaceSize(xt, nsa, wt, bt, 1e-5, yt, mt, rt, w, e) },
        aclnnLayerNorm,
    );
    let mut want = Vec::new();
    let mut stats = Vec::new();
    for r in 0..2 {
        let row: Vec<f64> = x[r * 4..r * 4 + 4].iter().map(|&v| v as f64).collect();
        let m = row.iter().sum::<f64>() / 4.0;
        let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 4.0;
        let rs = 1.0 / (var + 1e-5).sqrt();
        stats.push((m, rs));
        want.extend((0..4).map(|c| (row[c] - m) * rs * wv[c] as f64 + bv[c] as f64));
    }
    close(&host::<f32>(dy, 8), &want, 1e-5);
    close(
        &host::<f32>(dm, 2),
        &stats.iter().map(|s| s.0).collect::<Vec<_>>(),
        1e-6,
    );
    close(
        &host::<f32>(dr, 2),
        &stats.iter().map(|s| s.1).collect::<Vec<_>>(),
        1e-5,
    );
    // Backward with dy = 1: dbias = column sums of dy, dweight = Σ dy·x̂.
    let ones = dev(&[1f32; 8]);
    let gt = contiguous(ones, ACL_FLOAT, &[2, 4]);
    let (dgx, dgw, dgb) = (dev(&[0f32; 8]), dev(&[0f32; 4]), dev(&[0f32; 4]));
    let (gxt, gwt, gbt) = (
        contiguous(dgx, ACL_FLOAT, &[2, 4]),
        contiguous(dgw, ACL_FLOAT, &[4]),
        contiguous(dgb, ACL_FLOAT, &[4]),
    );
    let mask = [true, true, true];
    // SAFETY: an array of three values.
    let maska = unsafe { aclCreateBoolArray(mask.as_ptr(), 3) };
    op(
        // SAFETY: as above.
        |w, e| unsafe {
            aclnnLayerNormBackwardGetWorkspaceSize(
                gt, xt, nsa, mt, rt, wt, bt, maska, gxt, gwt, gbt, w, e,
            )
        },
        aclnnLayerNormBackward,
    );
    close(&host::<f32>(dgb, 4), &[2.0; 4], 1e-6);
    let xhat = |r: usize, c: usize| (x[r * 4 + c] as f64 - stats[r].0) * stats[r].1;
    close(
        &host::<f32>(dgw, 4),
        &(0..4).map(|c| xhat(0, c) + xhat(1, c)).collect::<Vec<_>>(),
        1e-5,
    );
    // dx of a row with dy = 1 is w-weighted: rs·(w - mean(w) - x̂·mean(w·x̂)).
    let mut want = Vec::new();
    for r in 0..2 {
        let mw: f64 = wv.iter().map(|&v| v as f64).sum::<f64>() / 4.0;
        let mwx: f64 = (0..4).map(|c| wv[c] as f64 * xhat(r, c)).sum::<f64>() / 4.0;
        want.extend((0..4).map(|c| stats[r].1 * (wv[c] as f64 - mw - xhat(r, c) * mwx)));
    }
    close(&host::<f32>(dgx, 8), &want, 1e-4);
    // RMS norm.
    let drs = dev(&[0f32; 2]);
    let rst = contiguous(drs, ACL_FLOAT, &[2, 1]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnRmsNormGetWorkspaceSize(xt, wt, 1e-6, yt, rst, w, e) },
        aclnnRmsNorm,
    );
    let mut want = Vec::new();
    let mut rstd = Vec::new();
    for r in 0..2 {
        let row: Vec<f64> = x[r * 4..r * 4 + 4].iter().map(|&v| v as f64).collect();
        let rs = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / 4.0 + 1e-6).sqrt();
        rstd.push(rs);
        want.extend((0..4).map(|c| row[c] * rs * wv[c] as f64));
    }
    close(&host::<f32>(dy, 8), &want, 1e-5);
    close(&host::<f32>(drs, 2), &rstd, 1e-5);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnRmsNormGradGetWorkspaceSize(gt, xt, rst, wt, gxt, gwt, w, e) },
        aclnnRmsNormGrad,
    );
    close(
        &host::<f32>(dgw, 4),
        &(0..4)
            .map(|c| (0..2).map(|r| x[r * 4 + c] as f64 * rstd[r]).sum())
            .collect::<Vec<_>>(),
        1e-5,
    );
}

#[test]
fn matmul_broadcasts_batches() {
    if crate::own_process() {
        return;
    }
    init();
    // self [2, 2, 3], mat2 [3, 2] broadcast over the batch; BatchMatMul of [2,2,3] x [2,3,2].
    let a: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let b: Vec<f32> = (0..6).map(|i| 1.0 - i as f32 * 0.25).collect();
    let (da, db, dc) = (dev(&a), dev(&b), dev(&[0f32; 8]));
    let (at, bt, ct) = (
        contiguous(da, ACL_FLOAT, &[2, 2, 3]),
        contiguous(db, ACL_FLOAT, &[3, 2]),
        contiguous(dc, ACL_FLOAT, &[2, 2, 2]),
    );
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnMatmulGetWorkspaceSize(at, bt, ct, 0, w, e) },
        aclnnMatmul,
    );
    let mut want = Vec::new();
    for bi in 0..2 {
        for i in 0..2 {
            for j in 0..2 {
                want.push(
                    (0..3)
                        .map(|k| a[bi * 6 + i * 3 + k] as f64 * b[k * 2 + j] as f64)
                        .sum(),
                );
            }
        }
    }
    close(&host::<f32>(dc, 8), &want, 1e-6);
    let bb = tensor(db, ACL_FLOAT, &[2, 3, 2], &[0, 2, 1], 0, 6);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnBatchMatMulGetWorkspaceSize(at, bb, ct, 0, w, e) },
        aclnnBatchMatMul,
    );
    close(&host::<f32>(dc, 8), &want, 1e-6);
}

#[test]
fn gathers_and_scatters() {
    if crate::own_process() {
        return;
    }
    init();
    let table: Vec<f32> = (0..12).map(|i| i as f32).collect(); // [4, 3]
    let dt = dev(&table);
    let tt = contiguous(dt, ACL_FLOAT, &[4, 3]);
    let idx = dev(&[3i64, 0, 3]);
    let it = contiguous(idx, ACL_INT64, &[3]);
    let dout = dev(&[0f32; 9]);
    let out = contiguous(dout, ACL_FLOAT, &[3, 3]);
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnEmbeddingGetWorkspaceSize(tt, it, out, w, e) },
        aclnnEmbedding,
    );
    assert_eq!(
        host::<f32>(dout, 9),
        [9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 9.0, 10.0, 11.0]
    );
    // index_select along dim 1 (a strided gather).
    let i2 = dev(&[2i32, 0]);
    let i2t = contiguous(i2, ACL_INT32, &[2]);
    let d2 = dev(&[0f32; 8]);
    let o2 = contiguous(d2, ACL_FLOAT, &[4, 2]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnIndexSelectGetWorkspaceSize(tt, 1, i2t, o2, w, e) },
        aclnnIndexSelect,
    );
    assert_eq!(
        host::<f32>(d2, 8),
        [2.0, 0.0, 5.0, 3.0, 8.0, 6.0, 11.0, 9.0]
    );
    // index_add with alpha 2 into a copy.
    let src = dev(&[1f32; 9]);
    let st = contiguous(src, ACL_FLOAT, &[3, 3]);
    let dacc = dev(&[0f32; 12]);
    let acc = contiguous(dacc, ACL_FLOAT, &[4, 3]);
    let two = f32_scalar(2.0);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnIndexAddGetWorkspaceSize(tt, 0, it, st, two, acc, w, e) },
        aclnnIndexAdd,
    );
    let got = host::<f32>(dacc, 12);
    let mut want: Vec<f32> = table.clone();
    for c in 0..3 {
        want[c] += 2.0;
        want[9 + c] += 4.0;
    }
    assert_eq!(got, want);
    // Embedding backward with padding row 0.
    let dgw = dev(&[0f32; 12]);
    let gw = contiguous(dgw, ACL_FLOAT, &[4, 3]);
    // SAFETY: as above.
    op(
        |w, e| unsafe {
            aclnnEmbeddingDenseBackwardGetWorkspaceSize(st, it, 4, 0, false, gw, w, e)
        },
        aclnnEmbeddingDenseBackward,
    );
    assert_eq!(
        host::<f32>(dgw, 12),
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0]
    );
}

#[test]
fn random_numbers_are_statistically_right_and_reproducible() {
    if crate::own_process() {
        return;
    }
    init();
    let n = 20_000usize;
    let d = dev(&vec![0f32; n]);
    let t = contiguous(d, ACL_FLOAT, &[n as i64]);
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnInplaceUniformGetWorkspaceSize(t, -1.0, 3.0, 42, 0, w, e) },
        aclnnInplaceUniform,
    );
    let u = host::<f32>(d, n);
    let mean = u.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    assert!(
        (mean - 1.0).abs() < 0.05 && u.iter().all(|&v| (-1.0..3.0).contains(&v)),
        "mean {mean}"
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceUniformGetWorkspaceSize(t, -1.0, 3.0, 42, 0, w, e) },
        aclnnInplaceUniform,
    );
    assert_eq!(host::<f32>(d, n), u, "same seed and offset, same numbers");
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnInplaceNormalGetWorkspaceSize(t, 2.0, 0.5, 7, 0, w, e) },
        aclnnInplaceNormal,
    );
    let g = host::<f32>(d, n);
    let m = g.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = g.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
    assert!(
        (m - 2.0).abs() < 0.02 && (var.sqrt() - 0.5).abs() < 0.02,
        "{m} {var}"
    );
    // Dropout: keep rate, scale, mask shape; backward applies the same mask.
    let x = dev(&vec![1f32; n]);
    let xt = contiguous(x, ACL_FLOAT, &[n as i64]);
    let bytes = (n as u64).div_ceil(128) * 128 / 8;
    let dm = dev(&vec![0u8; bytes as usize]);
    let mt = contiguous(dm, 4, &[bytes as i64]);
    let dout = dev(&vec![0f32; n]);
    let out = contiguous(dout, ACL_FLOAT, &[n as i64]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnDropoutGetWorkspaceSize(xt, 0.25, true, 5, 0, out, mt, w, e) },
        aclnnDropout,
    );
    let y = host::<f32>(dout, n);
    let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
    assert!((kept - 0.75).abs() < 0.02, "keep rate {kept}");
    assert!(y.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
    let dg = dev(&vec![0f32; n]);
    let gt = contiguous(dg, ACL_FLOAT, &[n as i64]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnDropoutBackwardGetWorkspaceSize(xt, mt, 4.0 / 3.0, gt, w, e) },
        aclnnDropoutBackward,
    );
    assert_eq!(host::<f32>(dg, n), y, "the same mask and scale");
    let dims = [n as i64];
    // SAFETY: an array of one value.
    let shape = unsafe { aclCreateIntArray(dims.as_ptr(), 1) };
    // SAFETY: as above.
    op(
        |w, e| unsafe {
            aclnnDropoutGenMaskV2GetWorkspaceSize(shape, 0.25, 5, 0, ACL_FLOAT, mt, w, e)
        },
        aclnnDropoutGenMaskV2,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnDropoutDoMaskGetWorkspaceSize(xt, mt, 0.25, gt, w, e) },
        aclnnDropoutDoMask,
    );
    assert_eq!(
        host::<f32>(dg, n),
        y,
        "gen-mask then do-mask is the one-call dropout"
    );
}

#[test]
fn optimisers_and_loss_scaling() {
    if crate::own_process() {
        return;
    }
    init();
    // SGD with momentum on two parameters.
    let (p1, p2) = (dev(&[1f32, 2.0]), dev(&[3f32]));
    let (g1, g2) = (dev(&[0.5f32, -1.0]), dev(&[2f32]));
    let (m1, m2) = (dev(&[0f32; 2]), dev(&[0f32]));
    let list = |a: *mut c_void, b: *mut c_void| {
        let ts = [
            contiguous(a, ACL_FLOAT, &[2]) as *const Tensor,
            contiguous(b, ACL_FLOAT, &[1]),
        ];
        // SAFETY: an array of two live tensors.
        unsafe { aclCreateTensorList(ts.as_ptr(), 2) }
    };
    let (pl, gl, ml) = (list(p1, p2), list(g1, g2), list(m1, m2));
    op(
        // SAFETY: live descriptors and out-pointers.
        |w, e| unsafe {
            aclnnFusedSgdGetWorkspaceSize(
                pl,
                gl,
                ml,
                null_mut(),
                0.0,
                0.9,
                0.1,
                0.0,
                false,
                false,
                true,
                w,
                e,
            )
        },
        aclnnFusedSgd,
    );
    close(&host::<f32>(p1, 2), &[0.95, 2.1], 1e-6);
    close(&host::<f32>(p2, 1), &[2.8], 1e-6);
    close(&host::<f32>(m1, 2), &[0.5, -1.0], 0.0);
    // AdamW, step 1 from a device tensor.
    let (p, g, m, v) = (dev(&[1f32]), dev(&[0.5f32]), dev(&[0f32]), dev(&[0f32]));
    let step = dev(&[1i64]);
    let t = |d| contiguous(d, ACL_FLOAT, &[1]);
    let st = contiguous(step, ACL_INT64, &[1]);
    let (pt, gt, mt, vt) = (t(p), t(g), t(m), t(v));
    op(
        // SAFETY: as above.
        |w, e| unsafe {
            aclnnApplyAdamWV2GetWorkspaceSize(
                pt,
                mt,
                vt,
                null_mut(),
                gt,
                st,
                0.1,
                0.9,
                0.999,
                0.01,
                1e-8,
                false,
                false,
                w,
                e,
            )
        },
        aclnnApplyAdamWV2,
    );
    // p = 1·(1 - 0.1·0.01) - 0.1·m̂/(√v̂ + eps) with m̂ = 0.5, v̂ = 0.25.
    close(&host::<f32>(p, 1), &[0.999 - 0.1], 1e-5);
    // Non-finite check and unscale, then the scale update.
    let (gf, fi, inv) = (dev(&[2f32, f32::INFINITY]), dev(&[0f32]), dev(&[0.5f32]));
    let gts = [contiguous(gf, ACL_FLOAT, &[2]) as *const Tensor];
    // SAFETY: an array of one live tensor.
    let gfl = unsafe { aclCreateTensorList(gts.as_ptr(), 1) };
    let (fit, invt) = (t(fi), t(inv));
    op(
        // SAFETY: as above.
        |w, e| unsafe {
            aclnnForeachNonFiniteCheckAndUnscaleGetWorkspaceSize(gfl, fit, invt, w, e)
        },
        aclnnForeachNonFiniteCheckAndUnscale,
    );
    assert_eq!(host::<f32>(fi, 1), [1.0]);
    assert_eq!(host::<f32>(gf, 2)[0], 1.0);
    let (sc, tr) = (dev(&[1024f32]), dev(&[3i32]));
    let (sct, trt) = (t(sc), contiguous(tr, ACL_INT32, &[1]));
    op(
        // SAFETY: as above.
        |w, e| unsafe {
            aclnnAmpUpdateScaleGetWorkspaceSize(sct, trt, fit, 2.0, 0.5, 2000, sct, trt, w, e)
        },
        aclnnAmpUpdateScale,
    );
    assert_eq!(host::<f32>(sc, 1), [512.0]);
    assert_eq!(host::<i32>(tr, 1), [0]);
    ok(aclDestroyTensorList(pl));
    ok(aclDestroyTensorList(gl));
    ok(aclDestroyTensorList(ml));
    ok(aclDestroyTensorList(gfl));
}

#[test]
fn fused_cross_entropy_and_its_gradient() {
    if crate::own_process() {
        return;
    }
    use unihal_sim_cann::aclnn::loss::*;
    init();
    let x: Vec<f32> = vec![0.2, -1.0, 0.5, 1.5, 0.0, -0.3];
    let tgt = [2i64, 0];
    let (dx, dt) = (dev(&x), dev(&tgt));
    let (xt, tt) = (
        contiguous(dx, ACL_FLOAT, &[2, 3]),
        contiguous(dt, ACL_INT64, &[2]),
    );
    let (dl, dlp) = (dev(&[0f32]), dev(&[0f32; 6]));
    let lt = tensor(dl, ACL_FLOAT, &[], &[], 0, 1);
    let lpt = contiguous(dlp, ACL_FLOAT, &[2, 3]);
    op(
        // SAFETY: live descriptors, a NUL-terminated string and out-pointers.
        |w, e| unsafe {
            aclnnCrossEntropyLossGetWorkspaceSize(
                xt,
                tt,
                null_mut(),
                c"mean".as_ptr(),
                -100,
                0.1,
                0.0,
                false,
                lt,
                lpt,
                null_mut(),
                null_mut(),
                w,
                e,
            )
        },
        aclnnCrossEntropyLoss,
    );
    let mut logp = Vec::new();
    for r in 0..2 {
        let row: Vec<f64> = x[r * 3..r * 3 + 3].iter().map(|&v| v as f64).collect();
        let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        logp.extend(row.iter().map(|v| v - lse));
    }
    close(&host::<f32>(dlp, 6), &logp, 1e-6);
    let smooth = |r: usize, t: usize| {
        -(0.9 * logp[r * 3 + t] + 0.1 / 3.0 * (0..3).map(|c| logp[r * 3 + c]).sum::<f64>())
    };
    close(
        &host::<f32>(dl, 1),
        &[(smooth(0, 2) + smooth(1, 0)) / 2.0],
        1e-6,
    );
    let dg = dev(&[1f32]);
    let gt = tensor(dg, ACL_FLOAT, &[], &[], 0, 1);
    let dgrad = dev(&[0f32; 6]);
    let grad = contiguous(dgrad, ACL_FLOAT, &[2, 3]);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    assert_eq!(
        // SAFETY: as above.
        unsafe {
            aclnnCrossEntropyLossGradGetWorkspaceSize(
                gt,
                lpt,
                tt,
                null_mut(),
                null_mut(),
                null_mut(),
                c"mean".as_ptr(),
                -100,
                0.1,
                0.0,
                grad,
                &mut ws,
                &mut ex,
            )
        },
        161_002,
        "label smoothing other than 0 is documented as unsupported"
    );
    op(
        // SAFETY: as above.
        |w, e| unsafe {
            aclnnCrossEntropyLossGradGetWorkspaceSize(
                gt,
                lpt,
                tt,
                null_mut(),
                null_mut(),
                null_mut(),
                c"mean".as_ptr(),
                -100,
                0.0,
                0.0,
                grad,
                w,
                e,
            )
        },
        aclnnCrossEntropyLossGrad,
    );
    let want: Vec<f64> = (0..6)
        .map(|i| (logp[i].exp() - if i == 2 || i == 3 { 1.0 } else { 0.0 }) / 2.0)
        .collect();
    close(&host::<f32>(dgrad, 6), &want, 1e-6);
}

#[test]
fn the_global_norm_clip_composition() {
    if crate::own_process() {
        return;
    }
    use unihal_sim_cann::aclnn::clip::*;
    init();
    // Two gradients; clip to max_norm 1: ForeachNorm → Stack → LinalgVectorNorm → Adds(1e-6) →
    // Reciprocal → Muls(max_norm) → ClampMax(1) → ForeachMulScalar, all stream-ordered.
    let (g1, g2) = (dev(&[3f32, 4.0]), dev(&[12f32]));
    let gl = {
        let ts = [
            contiguous(g1, ACL_FLOAT, &[2]) as *const Tensor,
            contiguous(g2, ACL_FLOAT, &[1]),
        ];
        // SAFETY: an array of two live tensors.
        unsafe { aclCreateTensorList(ts.as_ptr(), 2) }
    };
    let (n1, n2) = (dev(&[0f32]), dev(&[0f32]));
    let nl = {
        let ts = [
            contiguous(n1, ACL_FLOAT, &[1]) as *const Tensor,
            contiguous(n2, ACL_FLOAT, &[1]),
        ];
        // SAFETY: as above.
        unsafe { aclCreateTensorList(ts.as_ptr(), 2) }
    };
    let two = f32_scalar(2.0);
    // SAFETY: live descriptors and out-pointers.
    op(
        |w, e| unsafe { aclnnForeachNormGetWorkspaceSize(gl, two, nl, w, e) },
        aclnnForeachNorm,
    );
    let dv = dev(&[0f32; 2]);
    let vt = contiguous(dv, ACL_FLOAT, &[2, 1]);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnStackGetWorkspaceSize(nl, 0, vt, w, e) },
        aclnnStack,
    );
    assert_eq!(host::<f32>(dv, 2), [5.0, 12.0]);
    let dtot = dev(&[0f32]);
    let tot = tensor(dtot, ACL_FLOAT, &[], &[], 0, 1);
    let all: [i64; 0] = [];
    // SAFETY: an empty array.
    let dims = unsafe { aclCreateIntArray(all.as_ptr(), 0) };
    // SAFETY: as above.
    op(
        |w, e| unsafe {
            aclnnLinalgVectorNormGetWorkspaceSize(vt, two, dims, false, ACL_FLOAT, tot, w, e)
        },
        aclnnLinalgVectorNorm,
    );
    assert_eq!(host::<f32>(dtot, 1), [13.0]);
    let (eps, one, max_norm) = (f32_scalar(1e-6), f32_scalar(1.0), f32_scalar(1.0));
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnAddsGetWorkspaceSize(tot, eps, one, tot, w, e) },
        aclnnAdds,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnReciprocalGetWorkspaceSize(tot, tot, w, e) },
        aclnnReciprocal,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnMulsGetWorkspaceSize(tot, max_norm, tot, w, e) },
        aclnnMuls,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnClampMaxGetWorkspaceSize(tot, one, tot, w, e) },
        aclnnClampMax,
    );
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnForeachMulScalarGetWorkspaceSize(gl, tot, gl, w, e) },
        aclnnForeachMulScalar,
    );
    let coef = 1.0 / (13.0 + 1e-6);
    close(&host::<f32>(g1, 2), &[3.0 * coef, 4.0 * coef], 1e-6);
    close(&host::<f32>(g2, 1), &[12.0 * coef], 1e-6);
}

type InplaceP1 = unsafe extern "C" fn(*const Tensor, *mut u64, *mut *mut Executor) -> i32;

#[test]
fn every_in_place_unary_twin() {
    if crate::own_process() {
        return;
    }
    init();
    assert_eq!(unihal_sim_cann::nnopbase::aclnnInit(std::ptr::null()), 0);
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let cases: Vec<(InplaceP1, Phase2, Box<dyn Fn(f64) -> f64>)> = vec![
        (
            aclnnInplaceExpGetWorkspaceSize,
            aclnnInplaceExp,
            Box::new(f64::exp),
        ),
        (
            aclnnInplaceLogGetWorkspaceSize,
            aclnnInplaceLog,
            Box::new(f64::ln),
        ),
        (
            aclnnInplaceSqrtGetWorkspaceSize,
            aclnnInplaceSqrt,
            Box::new(f64::sqrt),
        ),
        (
            aclnnInplaceRsqrtGetWorkspaceSize,
            aclnnInplaceRsqrt,
            Box::new(|x: f64| 1.0 / x.sqrt()),
        ),
        (
            aclnnInplaceTanhGetWorkspaceSize,
            aclnnInplaceTanh,
            Box::new(f64::tanh),
        ),
        (
            aclnnInplaceSigmoidGetWorkspaceSize,
            aclnnInplaceSigmoid,
            Box::new(sig),
        ),
        (
            aclnnInplaceReluGetWorkspaceSize,
            aclnnInplaceRelu,
            Box::new(|x: f64| x.max(0.0)),
        ),
    ];
    for (p1, p2, f) in cases {
        // Positive values through a stride-3 view; the elements between stay as they were.
        let store: Vec<f32> = (0..12).map(|i| 0.25 + i as f32 * 0.5).collect();
        let d = dev(&store);
        let t = tensor(d, ACL_FLOAT, &[4], &[3], 0, 12);
        // SAFETY: live descriptors and out-pointers.
        op(|w, e| unsafe { p1(t, w, e) }, p2);
        let got = host::<f32>(d, 12);
        for (i, (&g, &s)) in got.iter().zip(&store).enumerate() {
            let want = if i % 3 == 0 { f(s as f64) } else { s as f64 };
            assert!(
                (g as f64 - want).abs() <= 2e-6 * (1.0 + want.abs()),
                "element {i}: {g} vs {want}"
            );
        }
    }
    assert_eq!(unihal_sim_cann::nnopbase::aclnnFinalize(), 0);
}

const ACL_UINT8: i32 = 4;

/// Causal attention by a host computation: `(out, max, sum)` per `(h, i)` of one batch, GQA
/// head `h` reading kv head `h / (n / nkv)`, all `(N, S, D)` row-major.
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (n, nkv, s, d): (usize, usize, usize, usize),
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<Vec<f64>>) {
    let (mut out, mut mx, mut sm, mut probs) = (vec![0.0; n * s * d], vec![], vec![], vec![]);
    for h in 0..n {
        let hk = h / (n / nkv);
        for i in 0..s {
            let sc: Vec<f64> = (0..=i)
                .map(|j| {
                    scale
                        * (0..d)
                            .map(|e| q[(h * s + i) * d + e] as f64 * k[(hk * s + j) * d + e] as f64)
                            .sum::<f64>()
                })
                .collect();
            let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = sc.iter().map(|x| (x - m).exp()).sum();
            let p: Vec<f64> = sc.iter().map(|x| (x - m).exp() / l).collect();
            for e in 0..d {
                out[(h * s + i) * d + e] =
                    (0..=i).map(|j| p[j] * v[(hk * s + j) * d + e] as f64).sum();
            }
            mx.push(m);
            sm.push(l);
            probs.push(p);
        }
    }
    (out, mx, sm, probs)
}

#[test]
fn flash_attention_causal_gqa_and_its_gradient() {
    if crate::own_process() {
        return;
    }
    init();
    // B 1, N 2 query heads over 1 kv head, S = Skv = 5, D 4, BNSD; sparseMode 2 (leftUpCausal)
    // with the compressed 2048 x 2048 mask.
    let (n, nkv, s, d) = (2usize, 1usize, 5usize, 4usize);
    let gen = |len: usize, k: f32| -> Vec<f32> {
        (0..len)
            .map(|i| (i as f32 * 0.37 + k).sin() * 0.9)
            .collect()
    };
    let (q, k, v) = (
        gen(n * s * d, 0.1),
        gen(nkv * s * d, 1.3),
        gen(nkv * s * d, 2.7),
    );
    let (dq_, dk_, dv_) = (dev(&q), dev(&k), dev(&v));
    let qt = contiguous(dq_, ACL_FLOAT, &[1, n as i64, s as i64, d as i64]);
    let kt = contiguous(dk_, ACL_FLOAT, &[1, nkv as i64, s as i64, d as i64]);
    let vt = contiguous(dv_, ACL_FLOAT, &[1, nkv as i64, s as i64, d as i64]);
    let mut mask = vec![0u8; 2048 * 2048];
    for (i, row) in mask.chunks_mut(2048).enumerate() {
        row[i + 1..].fill(1);
    }
    let mt = contiguous(dev(&mask), ACL_UINT8, &[2048, 2048]);
    let (dmx, dsm) = (dev(&vec![0f32; n * s * 8]), dev(&vec![0f32; n * s * 8]));
    let stats = [1, n as i64, s as i64, 8];
    let (mxt, smt) = (
        contiguous(dmx, ACL_FLOAT, &stats),
        contiguous(dsm, ACL_FLOAT, &stats),
    );
    let dout = dev(&vec![0f32; n * s * d]);
    let ot = contiguous(dout, ACL_FLOAT, &[1, n as i64, s as i64, d as i64]);
    let layout = c"BNSD";
    let scale = 0.5;
    let none: *const Tensor = std::ptr::null();
    // SAFETY: live descriptors, the layout string and out-pointers.
    op(
        |w, e| unsafe {
            aclnnFlashAttentionScoreGetWorkspaceSize(
                qt,
                kt,
                vt,
                none,
                none,
                none,
                mt,
                std::ptr::null(),
                scale,
                1.0,
                2147483647,
                2147483647,
                n as i64,
                layout.as_ptr(),
                0,
                2,
                mxt,
                smt,
                none,
                ot,
                w,
                e,
            )
        },
        aclnnFlashAttentionScore,
    );
    let (want, wmx, wsm, probs) = attention_reference(&q, &k, &v, (n, nkv, s, d), scale);
    close(&host::<f32>(dout, n * s * d), &want, 1e-5);
    let every8 = |w: &[f64]| w.iter().flat_map(|&x| [x; 8]).collect::<Vec<_>>();
    close(&host::<f32>(dmx, n * s * 8), &every8(&wmx), 1e-5);
    close(&host::<f32>(dsm, n * s * 8), &every8(&wsm), 1e-5);

    // The gradient, from the saved max and sum and the output.
    let g = gen(n * s * d, 4.1);
    let dg = dev(&g);
    let gt = contiguous(dg, ACL_FLOAT, &[1, n as i64, s as i64, d as i64]);
    let (gq, gk, gv) = (
        dev(&vec![0f32; n * s * d]),
        dev(&vec![0f32; nkv * s * d]),
        dev(&vec![0f32; nkv * s * d]),
    );
    let gqt = contiguous(gq, ACL_FLOAT, &[1, n as i64, s as i64, d as i64]);
    let gkt = contiguous(gk, ACL_FLOAT, &[1, nkv as i64, s as i64, d as i64]);
    let gvt = contiguous(gv, ACL_FLOAT, &[1, nkv as i64, s as i64, d as i64]);
    // SAFETY: as above.
    op(
        |w, e| unsafe {
            aclnnFlashAttentionScoreGradGetWorkspaceSize(
                qt,
                kt,
                vt,
                gt,
                none,
                none,
                none,
                mt,
                mxt,
                smt,
                none,
                ot,
                std::ptr::null(),
                scale,
                1.0,
                2147483647,
                2147483647,
                n as i64,
                layout.as_ptr(),
                0,
                2,
                gqt,
                gkt,
                gvt,
                none,
                w,
                e,
            )
        },
        aclnnFlashAttentionScoreGrad,
    );
    let (mut wq, mut wk, mut wv) = (
        vec![0.0; n * s * d],
        vec![0.0; nkv * s * d],
        vec![0.0; nkv * s * d],
    );
    for h in 0..n {
        for i in 0..s {
            let p = &probs[h * s + i];
            let row = |t: &[f32], e: usize| t[(h * s + i) * d + e] as f64;
            let dsum: f64 = (0..d).map(|e| row(&g, e) * want[(h * s + i) * d + e]).sum();
            for j in 0..=i {
                let dp: f64 = (0..d).map(|e| row(&g, e) * v[j * d + e] as f64).sum();
                let ds = p[j] * (dp - dsum);
                for e in 0..d {
                    wq[(h * s + i) * d + e] += scale * ds * k[j * d + e] as f64;
                    wk[j * d + e] += scale * ds * row(&q, e);
                    wv[j * d + e] += p[j] * row(&g, e);
                }
            }
        }
    }
    close(&host::<f32>(gq, n * s * d), &wq, 1e-5);
    close(&host::<f32>(gk, nkv * s * d), &wk, 1e-5);
    close(&host::<f32>(gv, nkv * s * d), &wv, 1e-5);

    // Refused as the docs say: the causal modes take the compressed 2048 x 2048 mask, not an
    // [S, Skv] one; keepProb is in (0, 1]; the layouts are BSH, SBH, BSND, BNSD.
    let small = contiguous(dev(&vec![0u8; s * s]), ACL_UINT8, &[s as i64, s as i64]);
    let refused = |mask: *mut Tensor, keep: f64, lay: &std::ffi::CStr| {
        let (mut w, mut e) = (0u64, null_mut::<Executor>());
        // SAFETY: as above.
        let r = unsafe {
            aclnnFlashAttentionScoreGetWorkspaceSize(
                qt,
                kt,
                vt,
                none,
                none,
                none,
                mask,
                std::ptr::null(),
                scale,
                keep,
                2147483647,
                2147483647,
                n as i64,
                lay.as_ptr(),
                0,
                2,
                mxt,
                smt,
                none,
                ot,
                &mut w,
                &mut e,
            )
        };
        assert_eq!(r, 161002, "{}", msg());
    };
    refused(small, 1.0, layout);
    refused(mt, 0.0, layout);
    refused(mt, 1.0, c"BHSD");
}

#[test]
fn residual_add_norms_and_the_rotary_embedding() {
    if crate::own_process() {
        return;
    }
    init();
    let x1: Vec<f32> = vec![1.0, 2.0, 4.0, -1.0, 0.5, 3.0, 2.0, -2.0];
    let x2: Vec<f32> = vec![0.5, -1.0, 0.25, 2.0, 1.5, -0.5, 0.0, 1.0];
    let gv = [0.5f32, 1.5, 1.0, 2.0];
    let bv = [0.1f32, 0.0, -0.2, 0.3];
    let (a, b) = (
        contiguous(dev(&x1), ACL_FLOAT, &[2, 4]),
        contiguous(dev(&x2), ACL_FLOAT, &[2, 4]),
    );
    let (gt, bt) = (
        contiguous(dev(&gv), ACL_FLOAT, &[4]),
        contiguous(dev(&bv), ACL_FLOAT, &[4]),
    );
    let (dy, dh, dm, dr) = (
        dev(&[0f32; 8]),
        dev(&[0f32; 8]),
        dev(&[0f32; 2]),
        dev(&[0f32; 2]),
    );
    let (yt, ht) = (
        contiguous(dy, ACL_FLOAT, &[2, 4]),
        contiguous(dh, ACL_FLOAT, &[2, 4]),
    );
    let (mt, rt) = (
        contiguous(dm, ACL_FLOAT, &[2, 1]),
        contiguous(dr, ACL_FLOAT, &[2, 1]),
    );
    let h: Vec<f64> = x1.iter().zip(&x2).map(|(p, q)| (p + q) as f64).collect();
    // SAFETY: live descriptors and out-pointers (biasOptional NULL).
    op(
        |w, e| unsafe {
            aclnnAddLayerNormGetWorkspaceSize(
                a,
                b,
                gt,
                bt,
                std::ptr::null(),
                1e-5,
                true,
                yt,
                mt,
                rt,
                ht,
                w,
                e,
            )
        },
        aclnnAddLayerNorm,
    );
    let (mut want, mut means, mut rstds) = (vec![], vec![], vec![]);
    for r in 0..2 {
        let row = &h[r * 4..r * 4 + 4];
        let m = row.iter().sum::<f64>() / 4.0;
        let rs = 1.0 / (row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 4.0 + 1e-5).sqrt();
        want.extend((0..4).map(|c| (row[c] - m) * rs * gv[c] as f64 + bv[c] as f64));
        means.push(m);
        rstds.push(rs);
    }
    close(&host::<f32>(dh, 8), &h, 0.0);
    close(&host::<f32>(dy, 8), &want, 1e-5);
    close(&host::<f32>(dm, 2), &means, 1e-6);
    close(&host::<f32>(dr, 2), &rstds, 1e-5);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnAddRmsNormGetWorkspaceSize(a, b, gt, 1e-6, yt, rt, ht, w, e) },
        aclnnAddRmsNorm,
    );
    let mut want = vec![];
    for r in 0..2 {
        let row = &h[r * 4..r * 4 + 4];
        let rs = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / 4.0 + 1e-6).sqrt();
        want.extend((0..4).map(|c| row[c] * rs * gv[c] as f64));
    }
    close(&host::<f32>(dy, 8), &want, 1e-5);

    // Rope, half mode: x (1, 2, 1, 4) [BSND], cos/sin (1, 2, 1, 4) [1S1D].
    let (c, sn) = (
        [0.5f32, 0.8, -0.3, 1.0, 0.2, 0.9, 0.7, -0.6],
        [0.1f32, -0.4, 0.6, 0.3, 0.5, 0.0, -0.8, 0.4],
    );
    let shape = [1i64, 2, 1, 4];
    let (xt, ct, st) = (
        contiguous(dev(&x1), ACL_FLOAT, &shape),
        contiguous(dev(&c), ACL_FLOAT, &shape),
        contiguous(dev(&sn), ACL_FLOAT, &shape),
    );
    let ot = contiguous(dy, ACL_FLOAT, &shape);
    // SAFETY: as above.
    op(
        |w, e| unsafe { aclnnRotaryPositionEmbeddingGetWorkspaceSize(xt, ct, st, 0, ot, w, e) },
        aclnnRotaryPositionEmbedding,
    );
    let mut want = vec![0.0; 8];
    for r in 0..2 {
        for e in 0..4 {
            let i = r * 4 + e;
            let rot = if e < 2 {
                -x1[r * 4 + e + 2]
            } else {
                x1[r * 4 + e - 2]
            };
            want[i] = (x1[i] * c[i] + rot * sn[i]) as f64;
        }
    }
    close(&host::<f32>(dy, 8), &want, 1e-6);
    // Mode 2 (quarter) is not an A2 mode.
    let (mut w, mut e) = (0u64, null_mut::<Executor>());
    // SAFETY: as above.
    let r =
        unsafe { aclnnRotaryPositionEmbeddingGetWorkspaceSize(xt, ct, st, 2, ot, &mut w, &mut e) };
    assert_eq!(r, 161002);
}
