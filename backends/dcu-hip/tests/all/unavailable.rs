//! The HIP backend without a usable device: Unavailable with the vendor's error name and the
//! library found, never a panic and never "0 devices".
//!
//! With `UNIHAL_TEST_REAL_HIP` set (by .ci/run, after installing Debian's `libamdhip64-5`), the
//! real AMD runtime must load and report "no device" (`hipInit` = 101 on a machine without an
//! AMD GPU); without it, a machine with no HIP runtime must list every library name tried.

use unihal_hal::{Backend, HalError};
use unihal_hip::HipBackend;

#[test]
fn no_device_or_no_runtime_is_unavailable_with_the_reason() {
    if crate::own_process() {
        return;
    }
    std::env::remove_var("UNIHAL_HIP_LIB");
    let backend = HipBackend::new();
    let e = backend.probe().expect_err("no HIP device here");
    let HalError::Unavailable { what, reason } = &e else {
        panic!("expected Unavailable, got {e:?}");
    };
    assert_eq!(what, "HIP runtime");
    let real = std::env::var("UNIHAL_TEST_REAL_HIP").is_ok();
    if real || !reason.contains("no HIP runtime library found") {
        // The runtime loaded: hipInit (or the device count) said there is no device.
        assert!(reason.contains("no device"), "{reason}");
        assert!(
            reason.contains("hipErrorInvalidDevice") || reason.contains("hipErrorNoDevice"),
            "{reason}"
        );
        assert!(
            reason.contains("libamdhip64") || reason.contains("galaxyhip"),
            "{reason}"
        );
        assert!(
            reason.contains("HIP 5.") || reason.contains("HIP 6."),
            "{reason}"
        );
    } else {
        for name in unihal_hip::loader::NAMES {
            assert!(reason.contains(name), "{name} missing from: {reason}");
        }
        assert!(reason.contains("UNIHAL_HIP_LIB"), "{reason}");
    }
    // Every later call says the same, and the backend reports it.
    assert_eq!(backend.probe().unwrap_err().to_string(), e.to_string());
    let info = backend.info();
    assert!(info.libraries[0].error.is_some());
    assert!(backend.open(0).is_err());
}
