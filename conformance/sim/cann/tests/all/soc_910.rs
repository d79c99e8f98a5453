//! The first-generation chip (`UNIHAL_SIM_SOC=Ascend910A`): its name, and the operators and
//! dtypes its documentation lacks, refused in phase 1.

use crate::support;

use std::ffi::CStr;
use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::aclnn::elementwise::*;
use unihal_sim_cann::aclnn::nn::*;
use unihal_sim_cann::aclnn::Executor;
use unihal_sim_cann::runtime::*;

fn init910() {
    init_with(&[("UNIHAL_SIM_SOC", "Ascend910A")]);
}

#[test]
fn the_910_lacks_bf16_and_the_a2_operators() {
    if crate::own_process() {
        return;
    }
    init910();
    assert_eq!(
        // SAFETY: a NUL-terminated string owned by the simulator.
        unsafe { CStr::from_ptr(aclrtGetSocName()) }
            .to_str()
            .unwrap(),
        "Ascend910A"
    );
    let d = dev(&[0u16; 8]);
    let bf = contiguous(d, ACL_BF16, &[8]);
    let alpha = f32_scalar(1.0);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    // SAFETY: live descriptors and out-pointers.
    let r = unsafe { aclnnAddGetWorkspaceSize(bf, bf, alpha, bf, &mut ws, &mut ex) };
    assert_eq!(r, 161_002);
    assert!(
        msg().contains("does not support bf16 on Ascend910A"),
        "{}",
        msg()
    );
    let f = dev(&[0f32; 8]);
    let ft = contiguous(f, ACL_FLOAT, &[8]);
    // SAFETY: as above.
    let r = unsafe { aclnnRmsNormGetWorkspaceSize(ft, ft, 1e-6, ft, ft, &mut ws, &mut ex) };
    assert_eq!(r, 161_002);
    assert!(msg().contains("not available on Ascend910A"), "{}", msg());
    // F16 add is there.
    let h = contiguous(d, ACL_FLOAT16, &[8]);
    assert_eq!(
        // SAFETY: as above.
        unsafe { aclnnAddGetWorkspaceSize(h, h, alpha, h, &mut ws, &mut ex) },
        0
    );
    ok(unihal_sim_cann::aclnn::aclDestroyAclOpExecutor(ex));
}

#[test]
fn f32_matmul_keeping_its_dtype_is_rejected_on_the_910() {
    if crate::own_process() {
        return;
    }
    init910();
    let d = dev(&[0f32; 4]);
    let t = contiguous(d, ACL_FLOAT, &[2, 2]);
    let (mut ws, mut ex) = (0u64, null_mut::<Executor>());
    assert_eq!(
        // SAFETY: live descriptors and out-pointers.
        unsafe { aclnnMmGetWorkspaceSize(t, t, t, 0, &mut ws, &mut ex) },
        161_002
    );
    assert!(msg().contains("KEEP_DTYPE"), "{}", msg());
}
