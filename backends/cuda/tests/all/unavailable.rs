//! Without a usable driver the backend is `Unavailable` with what it tried: never a panic, never
//! "0 devices". (Its own process: the driver is opened once per process.)

use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, HalError};

#[test]
fn a_missing_driver_is_unavailable_with_the_path_tried() {
    if crate::own_process() {
        return;
    }
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
    // The report lists the driver as not found, with the path tried (and nothing it would need
    // the driver for).
    let info = b.info();
    assert!(!info.simulated);
    assert_eq!(info.libraries.len(), 1, "{:?}", info.libraries);
    let l = &info.libraries[0];
    assert_eq!(
        (l.role.as_str(), l.name.as_str()),
        ("driver", "CUDA driver")
    );
    assert!(
        l.path.is_none()
            && l.error
                .as_deref()
                .is_some_and(|e| e.contains("/nonexistent/libcuda.so")),
        "{l:?}"
    );
}
