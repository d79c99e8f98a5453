//! `UNIHAL_SIM_NCCL_FLAVOR=rccl`: the simulated NCCL API answers as RCCL: RCCL's version code,
//! no result code beyond `ncclInProgress = 7` (a timeout is `ncclSystemError`), and RCCL's
//! all-to-all spelling runs. Its own process: the flavor is read once.

use std::ffi::c_int;
use unihal_sim::SimError;
use unihal_sim_cuda::nccl::*;
use unihal_sim_cuda::nccl_conv::*;

#[test]
fn the_library_answers_as_rccl() {
    if crate::own_process() {
        return;
    }
    std::env::set_var("UNIHAL_SIM_NCCL_FLAVOR", "rccl");
    assert_eq!(flavor(), Flavor::Rccl);
    let mut v: c_int = 0;
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { ncclGetVersion(&mut v) }, NCCL_SUCCESS);
    assert_eq!(v, RCCL_VERSION_CODE);
    assert_eq!(code(&SimError::Timeout("peers".into())), NCCL_SYSTEM_ERROR);
    assert_eq!(
        error_string(NCCL_TIMEOUT).to_str().unwrap(),
        "unknown result code",
        "RCCL has no ncclTimeout"
    );
    assert_eq!(
        code(&SimError::InvalidUsage("x".into())),
        NCCL_INVALID_USAGE
    );
}
