//! Without a usable driver the backend is `Unavailable` with what it tried: never a panic, never
//! "0 devices". (Its own process: the driver is opened once per process.)

use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, HalError};

#[test]
fn a_missing_driver_is_unavailable_with_the_path_tried() {
    std::env::set_var("UNIHAL_CUDA_LIB", "/nonexistent/libcuda.so");
    let b = CudaBackend::new();
    match b.probe() {
        Err(HalError::Unavailable { what, reason }) => {
            assert!(what.contains("CUDA driver"), "{what}");
            assert!(
                reason.contains("/nonexistent/libcuda.so: ") && reason.contains("UNIHAL_CUDA_LIB"),
                "{reason}"
            );
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // Asking again gives the same answer (the outcome is kept), and opening fails the same way.
    assert!(matches!(b.probe(), Err(HalError::Unavailable { .. })));
    assert!(matches!(b.open(0), Err(HalError::Unavailable { .. })));
    let info = b.info();
    assert!(info.libraries.is_empty() && !info.simulated);
}
