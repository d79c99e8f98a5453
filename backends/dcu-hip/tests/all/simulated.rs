//! The HIP backend's own code on unihal's simulated HIP runtime (deferred mode, AMD Instinct
//! class gfx90a, ROCm 5's attribute numbering), in CI without a GPU: the runtime is found
//! through `UNIHAL_HIP_LIB`, named as simulated, reports what it should, and every conformance
//! case that is not a library op or a collective passes.

use crate::support;

use unihal_hal::Backend;

#[test]
fn non_op_cases_pass_on_the_simulated_runtime() {
    if crate::own_process() {
        return;
    }
    let backend = support::simulated(&[
        ("UNIHAL_SIM_MODE", "deferred"),
        ("UNIHAL_SIM_HIP_ARCH", "gfx90a"),
        ("UNIHAL_SIM_HIP_NUMBERING", "rocm5"),
    ]);
    assert_eq!(
        backend.probe().unwrap(),
        2,
        "the simulator's default device count"
    );
    let info = backend.info();
    assert!(
        info.simulated,
        "a simulated runtime must be reported as such"
    );
    assert!(
        !info.concurrent,
        "a deferred simulated runtime runs work only at synchronisation points"
    );
    assert_eq!(info.libraries[0].version.as_deref(), Some("6.2.41134"));
    let device = backend.open(0).unwrap();
    assert!(
        device.info().name.contains("simulated"),
        "{}",
        device.info().name
    );
    assert_eq!(device.info().vendor, "AMD");
    let caps = device.capabilities();
    assert_eq!(caps.optional.arch.as_deref(), Some("gfx90a"));
    assert_eq!(caps.mandatory.warp_size, 64, "wave64");
    assert!(
        caps.optional.stream_ordered_alloc,
        "the pools attribute says 1"
    );
    assert_eq!(caps.optional.peer_devices, vec![1]);
    let ran = support::non_op_cases(backend, device);
    assert!(ran >= 40, "only {ran} cases ran");
}
