//! `unihal::open_preferred` takes the first backend that has a device, in preference order, and
//! falls back to the CPU when the accelerator is not there. (Its own process: it sets the
//! environment before the backends open.)

#[test]
fn falls_back_to_the_cpu_when_no_accelerator_opens() {
    if crate::own_process() {
        return;
    }
    std::env::set_var("UNIHAL_CUDA_LIB", "/nonexistent/libcuda.so");
    std::env::set_var("UNIHAL_BACKENDS", "cuda,cpu");
    let d = unihal::open_preferred().unwrap();
    assert_eq!(d.id().to_string(), "cpu:0");
    // Only an unavailable backend: the error says why.
    std::env::set_var("UNIHAL_BACKENDS", "cuda");
    match unihal::open_preferred() {
        Err(unihal::HalError::Unavailable { reason, .. }) => {
            assert!(
                reason.contains("cuda: ") && reason.contains("/nonexistent/libcuda.so"),
                "{reason}"
            )
        }
        other => panic!("{:?}", other.map(|d| d.id())),
    }
    std::env::set_var("UNIHAL_BACKENDS", "nosuch");
    assert!(unihal::open_preferred().is_err());
}
