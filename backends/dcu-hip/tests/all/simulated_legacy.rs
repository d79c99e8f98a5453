//! The HIP backend on a simulated runtime that keeps the pre-ROCm-5 attribute numbering while
//! reporting HIP 6.3 (as Hygon DTK does), with a Hygon-class gfx906 device: the numbering is
//! found by probing, never by the version; the architecture comes from the 792-byte property
//! layout (the R0600 entry refuses); stream-ordered allocation is probed (the old numbering has
//! no attribute for it); and every non-op conformance case passes (concurrent mode).

use crate::support;

use unihal_hal::Backend;
use unihal_hip::conv::Numbering;

#[test]
fn the_legacy_numbering_is_found_by_probing() {
    if crate::own_process() {
        return;
    }
    let backend = support::simulated(&[
        ("UNIHAL_SIM_MODE", "concurrent"),
        ("UNIHAL_SIM_HIP_ARCH", "gfx906"),
        ("UNIHAL_SIM_HIP_NUMBERING", "legacy"),
    ]);
    assert_eq!(backend.probe().unwrap(), 2);
    let rt = unihal_hip::loader::runtime().unwrap();
    assert_eq!(
        rt.numbering,
        Numbering::Legacy,
        "HIP {} must not decide it",
        rt.version
    );
    assert_eq!(
        backend.info().libraries[0].version.as_deref(),
        Some("6.3.25422")
    );
    let device = backend.open(1).unwrap();
    let caps = device.capabilities();
    assert_eq!(caps.optional.arch.as_deref(), Some("gfx906"));
    assert_eq!(caps.mandatory.warp_size, 64);
    assert_eq!(caps.mandatory.max_threads_per_block, 1024);
    assert_eq!(caps.mandatory.max_grid[0], i32::MAX as u32);
    assert!(
        caps.optional.stream_ordered_alloc,
        "probed with hipMallocAsync"
    );
    let ran = support::non_op_cases(backend, device);
    assert!(ran >= 40, "only {ran} cases ran");
}
