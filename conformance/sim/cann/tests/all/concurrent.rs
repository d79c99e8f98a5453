//! The face in concurrent mode (work runs as it is enqueued, kernels on threads of their own):
//! operators, copies and callbacks give the same results, and injected failures surface as the
//! entry point's code.

use crate::support;

use std::ffi::c_void;
use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::aclnn::elementwise::*;
use unihal_sim_cann::aclnn::Executor;
use unihal_sim_cann::runtime::*;

#[test]
fn operators_run_in_concurrent_mode() {
    if crate::own_process() {
        return;
    }
    init_with(&[("UNIHAL_SIM_MODE", "concurrent")]);
    let a: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let (da, db) = (dev(&a), dev(&vec![1f32; 1000]));
    let (x, y) = (
        contiguous(da, ACL_FLOAT, &[1000]),
        contiguous(db, ACL_FLOAT, &[1000]),
    );
    let mut s = null_mut();
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtCreateStream(&mut s)) };
    let two = f32_scalar(2.0);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    assert_eq!(
        // SAFETY: live descriptors and out-pointers.
        unsafe { aclnnAddGetWorkspaceSize(x, y, two, y, &mut ws, &mut ex) },
        0,
        "{}",
        msg()
    );
    let mut w = null_mut();
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtMalloc(&mut w, ws as usize, 0)) };
    ok(aclnnAdd(w, ws, ex, s));
    ok(aclrtSynchronizeStream(s));
    ok(aclrtFree(w));
    let got = host::<f32>(db, 1000);
    assert!(got.iter().enumerate().all(|(i, &v)| v == i as f32 + 2.0));
    ok(aclrtDestroyStream(s));
}

#[test]
fn injected_failures_return_the_chosen_code() {
    if crate::own_process() {
        return;
    }
    init_with(&[("UNIHAL_SIM_MODE", "concurrent")]);
    assert_eq!(
        // SAFETY: a NUL-terminated name.
        unsafe { unihal_sim_cann::fault::unihal_sim_fail(c"aclrtMalloc".as_ptr(), 1, 207_001) },
        0
    );
    let mut p: *mut c_void = null_mut();
    // SAFETY: a live out-pointer.
    assert_eq!(unsafe { aclrtMalloc(&mut p, 64, 0) }, 207_001);
    assert!(msg().contains("injected"), "{}", msg());
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtMalloc(&mut p, 64, 0)) };
    ok(aclrtFree(p));
    assert_eq!(
        // SAFETY: a NUL-terminated name.
        unsafe {
            unihal_sim_cann::fault::unihal_sim_fail(
                c"aclnnAddGetWorkspaceSize".as_ptr(),
                1,
                561_000,
            )
        },
        0
    );
    let d = dev(&[0f32; 4]);
    let t = contiguous(d, ACL_FLOAT, &[4]);
    let one = f32_scalar(1.0);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    assert_eq!(
        // SAFETY: live descriptors and out-pointers.
        unsafe { aclnnAddGetWorkspaceSize(t, t, one, t, &mut ws, &mut ex) },
        561_000
    );
}
