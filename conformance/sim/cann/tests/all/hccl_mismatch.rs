//! The simulated HCCL: a mismatched collective fails every rank (in a test binary of its own:
//! the failure is sticky on the ranks' devices, as a failed collective is on an NPU).

use crate::support;

use std::ffi::c_void;
use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::hccl::*;
use unihal_sim_cann::runtime::*;

#[test]
fn a_mismatched_call_fails_every_rank() {
    if crate::own_process() {
        return;
    }
    init();
    let id = std::sync::Arc::new(root());
    let out = ranks(2, move |r| {
        let mut comm = null_mut();
        assert_eq!(
            // SAFETY: live pointers.
            unsafe { HcclCommInitRootInfo(2, &*id, r, &mut comm) },
            0,
            "{}",
            msg()
        );
        let buf: *mut c_void = dev(&[1f32; 8]);
        let count = if r == 0 { 8 } else { 4 };
        assert_eq!(
            HcclAllReduce(buf, buf, count, HCCL_FP32, HCCL_SUM, comm, null_mut()),
            0
        );
        aclrtSynchronizeStream(null_mut())
    });
    assert!(out.iter().all(|&c| c != 0), "every rank fails: {out:?}");
}
