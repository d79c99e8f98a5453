//! A rank that never calls its collective: the peer's synchronisation fails after the watchdog
//! (CUDA_ERROR_LAUNCH_TIMEOUT, sticky: the device is poisoned, hence this test's own process)
//! and the communicator reports ncclTimeout, instead of hanging as real NCCL would.

use crate::support;

use std::ffi::c_void;
use std::ptr::null_mut;
use support::*;
use unihal_sim_cuda::conv::CUDA_ERROR_LAUNCH_TIMEOUT;
use unihal_sim_cuda::driver::*;
use unihal_sim_cuda::nccl::*;
use unihal_sim_cuda::nccl_conv::*;

#[test]
fn a_missing_rank_times_out_instead_of_hanging() {
    if crate::own_process() {
        return;
    }
    let codes = on_ranks(2, |r, comm| {
        let b = upload(&[1f32; 4]) as *mut c_void;
        let mut s = null_mut();
        // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
        unsafe { assert_eq!(cuStreamCreate(&mut s, 0), 0) };
        if r == 0 {
            ok(ncclAllReduce(b, b, 4, F32, SUM, comm, s));
            let sync = cuStreamSynchronize(s);
            let mut err = -1;
            // SAFETY: a call of the simulated driver's C API with out-pointers to live locals and handles made here.
            unsafe { ok(ncclCommGetAsyncError(comm, &mut err)) };
            (sync, err)
        } else {
            std::thread::sleep(std::time::Duration::from_millis(100));
            (0, 0)
        }
    });
    assert_eq!(codes[0], (CUDA_ERROR_LAUNCH_TIMEOUT, NCCL_TIMEOUT));
}
