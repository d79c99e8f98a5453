//! The simulated aclnn operators through their C entry points, both phases, against Rust
//! references on strided and broadcast descriptors; and the misuse each phase refuses.

use crate::support;

use std::ffi::c_void;
use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::aclnn::elementwise::*;
use unihal_sim_cann::aclnn::nn::*;
use unihal_sim_cann::aclnn::reduce::*;
use unihal_sim_cann::aclnn::Executor;
use unihal_sim_cann::nnopbase::*;
use unihal_sim_cann::runtime::*;

fn phase1_ok(r: i32) {
    assert_eq!(r, 0, "phase 1: {r}: {}", msg());
}

#[test]
fn add_with_alpha_on_a_transposed_and_a_broadcast_view() {
    if crate::own_process() {
        return;
    }
    init();
    // self: a 3x2 transposed view of a 2x3 matrix; other: a row of 2 broadcast over 3 rows.
    let a: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let b = [10.0f32, 20.0];
    let (da, db, dout) = (dev(&a), dev(&b), dev(&[0f32; 6]));
    let x = tensor(da, ACL_FLOAT, &[3, 2], &[1, 3], 0, 6);
    let y = tensor(db, ACL_FLOAT, &[2], &[1], 0, 2);
    let o = contiguous(dout, ACL_FLOAT, &[3, 2]);
    let alpha = f32_scalar(0.5);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // SAFETY: live descriptors and out-pointers.
    phase1_ok(unsafe { aclnnAddGetWorkspaceSize(x, y, alpha, o, &mut ws, &mut ex) });
    assert!(ws > 0, "alpha != 1 uses an intermediate in the workspace");
    run(ws, ex, aclnnAdd);
    let got = host::<f32>(dout, 6);
    let mut want = Vec::new();
    for r in 0..3 {
        for c in 0..2 {
            want.push(a[c * 3 + r] + 0.5 * b[c]);
        }
    }
    assert_eq!(got, want);
    for t in [x, y, o] {
        ok(aclDestroyTensor(t));
    }
    ok(aclDestroyScalar(alpha));
}

#[test]
fn reduce_sum_over_two_dims_and_softmax_along_the_first() {
    if crate::own_process() {
        return;
    }
    init();
    let x: Vec<f32> = (0..24).map(|i| (i % 7) as f32 * 0.25).collect();
    let (dx, dsum, dsm) = (dev(&x), dev(&[0f32; 3]), dev(&[0f32; 24]));
    let xt = contiguous(dx, ACL_FLOAT, &[2, 3, 4]);
    let st = contiguous(dsum, ACL_FLOAT, &[3]);
    let dims = [0i64, 2];
    // SAFETY: an array of 2 values.
    let d = unsafe { aclCreateIntArray(dims.as_ptr(), 2) };
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // SAFETY: live descriptors and out-pointers.
    phase1_ok(unsafe {
        aclnnReduceSumGetWorkspaceSize(xt, d, false, ACL_FLOAT, st, &mut ws, &mut ex)
    });
    run(ws, ex, aclnnReduceSum);
    let got = host::<f32>(dsum, 3);
    for (j, g) in got.iter().enumerate() {
        let mut want = 0f32;
        for i in 0..2 {
            for k in 0..4 {
                want += x[i * 12 + j * 4 + k];
            }
        }
        assert!((g - want).abs() < 1e-5, "{j}: {g} vs {want}");
    }
    let sm = contiguous(dsm, ACL_FLOAT, &[2, 3, 4]);
    // SAFETY: as above.
    phase1_ok(unsafe { aclnnSoftmaxGetWorkspaceSize(xt, 0, sm, &mut ws, &mut ex) });
    run(ws, ex, aclnnSoftmax);
    let got = host::<f32>(dsm, 24);
    for r in 0..12 {
        let (p, q) = (x[r], x[12 + r]);
        let m = p.max(q);
        let z = (p - m).exp() + (q - m).exp();
        assert!((got[r] - (p - m).exp() / z).abs() < 1e-6);
        assert!((got[12 + r] - (q - m).exp() / z).abs() < 1e-6);
    }
    ok(aclDestroyIntArray(d));
}

#[test]
fn matmul_with_a_transposed_operand() {
    if crate::own_process() {
        return;
    }
    init();
    let a: Vec<f32> = (0..6).map(|i| i as f32).collect(); // 2x3
    let b: Vec<f32> = (0..6).map(|i| (i as f32) - 2.0).collect(); // stored 2x3, used as its 3x2 transpose
    let (da, db, dc) = (dev(&a), dev(&b), dev(&[0f32; 4]));
    let at = contiguous(da, ACL_FLOAT, &[2, 3]);
    let bt = tensor(db, ACL_FLOAT, &[3, 2], &[1, 3], 0, 6);
    let ct = contiguous(dc, ACL_FLOAT, &[2, 2]);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // SAFETY: live descriptors and out-pointers.
    phase1_ok(unsafe { aclnnMmGetWorkspaceSize(at, bt, ct, 0, &mut ws, &mut ex) });
    run(ws, ex, aclnnMm);
    let got = host::<f32>(dc, 4);
    for i in 0..2 {
        for j in 0..2 {
            let want: f32 = (0..3).map(|k| a[i * 3 + k] * b[j * 3 + k]).sum();
            assert_eq!(got[i * 2 + j], want);
        }
    }
}

#[test]
fn an_executor_runs_once() {
    if crate::own_process() {
        return;
    }
    init();
    let d = dev(&[1f32; 8]);
    let t = contiguous(d, ACL_FLOAT, &[8]);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // SAFETY: live descriptors and out-pointers.
    phase1_ok(unsafe { aclnnNegGetWorkspaceSize(t, t, &mut ws, &mut ex) });
    ok(aclnnNeg(null_mut(), 0, ex, null_mut()));
    assert_eq!(
        aclnnNeg(null_mut(), 0, ex, null_mut()),
        161_002,
        "a second run"
    );
    assert!(msg().contains("already run"), "{}", msg());
    assert_eq!(
        aclnnNeg(null_mut(), 0, null_mut(), null_mut()),
        161_001,
        "phase 2 without phase 1"
    );
    // SAFETY: as above.
    phase1_ok(unsafe { aclnnNegGetWorkspaceSize(t, t, &mut ws, &mut ex) });
    assert_eq!(
        aclnnExp(null_mut(), 0, ex, null_mut()),
        161_002,
        "another operator's executor"
    );
    ok(unihal_sim_cann::aclnn::aclDestroyAclOpExecutor(ex));
    ok(aclrtSynchronizeStream(null_mut()));
    assert_eq!(host::<f32>(d, 8), vec![-1f32; 8]);
}

#[test]
fn the_workspace_is_checked_and_used() {
    if crate::own_process() {
        return;
    }
    init();
    let (da, db) = (dev(&[1f32; 64]), dev(&[2f32; 64]));
    let (x, y) = (
        contiguous(da, ACL_FLOAT, &[64]),
        contiguous(db, ACL_FLOAT, &[64]),
    );
    let alpha = f32_scalar(3.0);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // SAFETY: live descriptors and out-pointers.
    phase1_ok(unsafe { aclnnAddGetWorkspaceSize(x, y, alpha, x, &mut ws, &mut ex) });
    assert!(ws >= 256);
    assert_eq!(
        aclnnAdd(null_mut(), ws - 1, ex, null_mut()),
        161_002,
        "too small"
    );
    let mut host_ws = vec![0u8; ws as usize];
    assert_eq!(
        aclnnAdd(host_ws.as_mut_ptr() as *mut c_void, ws, ex, null_mut()),
        161_002,
        "host memory"
    );
    assert!(msg().contains("not device memory"), "{}", msg());
    let (mut w, mut stream) = (null_mut(), null_mut());
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtMalloc(&mut w, ws as usize, 0)) };
    // A stream of its own: the default stream is shared with the tests running beside this one,
    // and one of them synchronising it would run the operator before the free below.
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtCreateStream(&mut stream)) };
    ok(aclnnAdd(w, ws, ex, stream));
    // Deferred mode: the operator has not run; its workspace cannot be freed under it.
    assert_eq!(aclrtFree(w), 207_002);
    ok(aclrtSynchronizeStream(stream));
    ok(aclrtFree(w));
    ok(aclrtDestroyStream(stream));
    assert_eq!(host::<f32>(da, 64), vec![7f32; 64]);
}

#[test]
fn descriptors_destroyed_between_the_phases_are_refused() {
    if crate::own_process() {
        return;
    }
    init();
    let d = dev(&[1f32; 4]);
    let t = contiguous(d, ACL_FLOAT, &[4]);
    let o = contiguous(d, ACL_FLOAT, &[4]);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // SAFETY: live descriptors and out-pointers.
    phase1_ok(unsafe { aclnnAbsGetWorkspaceSize(t, o, &mut ws, &mut ex) });
    ok(aclDestroyTensor(t));
    assert_eq!(aclnnAbs(null_mut(), 0, ex, null_mut()), 161_002);
    assert!(msg().contains("destroyed before phase 2"), "{}", msg());
    assert_eq!(aclDestroyTensor(t), 161_002, "a double destroy");
}

#[test]
fn what_an_acl_tensor_cannot_express_is_refused() {
    if crate::own_process() {
        return;
    }
    init();
    let d = dev(&[0f32; 8]);
    // SAFETY: arrays of the given lengths.
    let neg = unsafe {
        aclCreateTensor(
            [4i64].as_ptr(),
            1,
            ACL_FLOAT,
            [-1i64].as_ptr(),
            3,
            ACL_FORMAT_ND,
            [8i64].as_ptr(),
            1,
            d,
        )
    };
    assert!(
        neg.is_null() && msg().contains("negative strides"),
        "{}",
        msg()
    );
    // SAFETY: as above.
    let past = unsafe {
        aclCreateTensor(
            [4i64].as_ptr(),
            1,
            ACL_FLOAT,
            [2i64].as_ptr(),
            2,
            ACL_FORMAT_ND,
            [8i64].as_ptr(),
            1,
            d,
        )
    };
    assert!(
        past.is_null() && msg().contains("past the storage"),
        "{}",
        msg()
    );
    // Dims whose product overflows, or strides that reach past every storage: refused, no panic.
    let huge = [1i64 << 40, 1 << 40];
    // SAFETY: as above.
    let t = unsafe {
        aclCreateTensor(
            huge.as_ptr(),
            2,
            ACL_FLOAT,
            [1i64, 1].as_ptr(),
            0,
            ACL_FORMAT_ND,
            huge.as_ptr(),
            2,
            d,
        )
    };
    assert!(t.is_null() && msg().contains("overflow"), "{}", msg());
    // SAFETY: as above.
    let t = unsafe {
        aclCreateTensor(
            [2i64].as_ptr(),
            1,
            ACL_FLOAT,
            [i64::MAX].as_ptr(),
            0,
            ACL_FORMAT_ND,
            [8i64].as_ptr(),
            1,
            d,
        )
    };
    assert!(
        t.is_null() && msg().contains("past the storage"),
        "{}",
        msg()
    );
    // A byte offset that is not a whole element: data not aligned to the dtype.
    let odd = tensor((d as u64 + 2) as *mut c_void, ACL_FLOAT, &[2], &[1], 0, 2);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    assert_eq!(
        // SAFETY: live descriptors and out-pointers.
        unsafe { aclnnAbsGetWorkspaceSize(odd, odd, &mut ws, &mut ex) },
        161_002
    );
    assert!(msg().contains("not aligned"), "{}", msg());
}

#[test]
fn a_dtype_the_chip_lacks_is_refused_in_phase_one() {
    if crate::own_process() {
        return;
    }
    init();
    let d = dev(&[0u16; 4]);
    let t = contiguous(d, ACL_FLOAT16, &[4]);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // Tanh has no F64 anywhere; F16 is fine on the A2 chip.
    // SAFETY: live descriptors and out-pointers.
    phase1_ok(unsafe { aclnnTanhGetWorkspaceSize(t, t, &mut ws, &mut ex) });
    ok(unihal_sim_cann::aclnn::aclDestroyAclOpExecutor(ex));
    let d64 = dev(&[0f64; 4]);
    let t64 = contiguous(d64, 11, &[4]);
    assert_eq!(
        // SAFETY: as above.
        unsafe { aclnnTanhGetWorkspaceSize(t64, t64, &mut ws, &mut ex) },
        161_002
    );
    assert!(msg().contains("does not support f64"), "{}", msg());
}

#[test]
fn nll_loss_mean_and_its_backward_and_scatter_add() {
    if crate::own_process() {
        return;
    }
    use unihal_sim_cann::aclnn::loss::*;
    init();
    // Log-probabilities of 3 rows x 4 classes; the second row's target is ignored.
    let x: Vec<f32> = (0..12).map(|i| -(i as f32) * 0.1 - 0.05).collect();
    let tgt = [2i64, -100, 1];
    let w = [1.0f32, 2.0, 3.0, 4.0];
    let (dx, dt, dw, dl, dtw) = (dev(&x), dev(&tgt), dev(&w), dev(&[0f32]), dev(&[0f32]));
    let xt = contiguous(dx, ACL_FLOAT, &[3, 4]);
    let tt = contiguous(dt, ACL_INT64, &[3]);
    let wt = contiguous(dw, ACL_FLOAT, &[4]);
    let lt = tensor(dl, ACL_FLOAT, &[], &[], 0, 1);
    let twt = tensor(dtw, ACL_FLOAT, &[], &[], 0, 1);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    phase1_ok(
        // SAFETY: live descriptors and out-pointers.
        unsafe { aclnnNLLLossGetWorkspaceSize(xt, tt, wt, 1, -100, lt, twt, &mut ws, &mut ex) },
    );
    run(ws, ex, aclnnNLLLoss);
    // A target shorter than the rows is refused in phase 1 (never read past its storage).
    let short = contiguous(dt, ACL_INT64, &[2]);
    let x4 = contiguous(dx, ACL_FLOAT, &[4, 3]);
    assert_eq!(
        // SAFETY: as above.
        unsafe { aclnnNLLLossGetWorkspaceSize(x4, short, wt, 1, -100, lt, twt, &mut ws, &mut ex) },
        161_002
    );
    let want = -(3.0 * x[2] + 2.0 * x[9]) / 5.0;
    assert!((host::<f32>(dl, 1)[0] - want).abs() < 1e-6);
    assert_eq!(host::<f32>(dtw, 1)[0], 5.0);
    let (dg, dgrad) = (dev(&[1f32]), dev(&[9f32; 12]));
    let gt = tensor(dg, ACL_FLOAT, &[], &[], 0, 1);
    let gx = contiguous(dgrad, ACL_FLOAT, &[3, 4]);
    phase1_ok(
        // SAFETY: as above.
        unsafe {
            aclnnNLLLossBackwardGetWorkspaceSize(gt, xt, tt, wt, 1, -100, twt, gx, &mut ws, &mut ex)
        },
    );
    run(ws, ex, aclnnNLLLossBackward);
    let mut want = vec![0f32; 12];
    want[2] = -3.0 / 5.0;
    want[9] = -2.0 / 5.0;
    assert_eq!(host::<f32>(dgrad, 12), want);
    // Scatter-add along dim 1 of a 2x3 tensor.
    let (ds, di, dsrc) = (
        dev(&[0f32; 6]),
        dev(&[2i64, 0, 2, 1]),
        dev(&[1f32, 2.0, 3.0, 4.0]),
    );
    let st = contiguous(ds, ACL_FLOAT, &[2, 3]);
    let it = contiguous(di, ACL_INT64, &[2, 2]);
    let srct = contiguous(dsrc, ACL_FLOAT, &[2, 2]);
    phase1_ok(
        // SAFETY: as above.
        unsafe { aclnnScatterAddGetWorkspaceSize(st, 1, it, srct, st, &mut ws, &mut ex) },
    );
    run(ws, ex, aclnnScatterAdd);
    assert_eq!(host::<f32>(ds, 6), vec![2.0, 0.0, 1.0, 0.0, 4.0, 3.0]);
}

#[test]
fn a_list_owns_its_members() {
    if crate::own_process() {
        return;
    }
    init();
    let d = dev(&[0f32; 4]);
    let (a, b) = (
        contiguous(d, ACL_FLOAT, &[2]),
        contiguous(d, ACL_FLOAT, &[4]),
    );
    let ts = [a as *const Tensor, b];
    // SAFETY: an array of two live tensors.
    let l = unsafe { aclCreateTensorList(ts.as_ptr(), 2) };
    assert!(!l.is_null());
    // SAFETY: as above: `a` already belongs to a list.
    assert!(unsafe { aclCreateTensorList(ts.as_ptr(), 1) }.is_null());
    assert_eq!(
        aclDestroyTensor(a),
        161_002,
        "a member is destroyed by its list"
    );
    ok(aclDestroyTensorList(l));
    assert_eq!(aclDestroyTensorList(l), 161_002, "a list destroyed twice");
    assert_eq!(aclDestroyTensor(b), 161_002, "members went with their list");
}
