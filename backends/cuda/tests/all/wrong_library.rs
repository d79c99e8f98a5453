//! `UNIHAL_CUDA_LIB` naming a library that loads but is no CUDA driver (here the C math
//! library) is `Unavailable` naming that library and what it lacks: never "no driver found",
//! never a crash. (Its own process: the driver is opened once per process.)

use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, HalError};

#[test]
fn an_override_naming_another_library_is_unavailable_naming_it() {
    if crate::own_process() {
        return;
    }
    std::env::set_var("UNIHAL_CUDA_LIB", "libm.so.6");
    match CudaBackend::new().probe() {
        Err(HalError::Unavailable { reason, .. }) => assert!(
            reason.contains("UNIHAL_CUDA_LIB names")
                && reason.contains("libm.so.6")
                && reason.contains("not a CUDA driver")
                && reason.contains("cuInit"),
            "{reason}"
        ),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
