//! A runtime whose `hipInit` fails for another reason than "no device" (here the simulated
//! runtime refusing an architecture it does not simulate) is Unavailable with HIP's error name,
//! not reported as a machine without a device.

use crate::support;

use unihal_hal::{Backend, HalError};

#[test]
fn a_failing_hip_init_is_unavailable_with_its_error() {
    if crate::own_process() {
        return;
    }
    let backend = support::simulated(&[("UNIHAL_SIM_HIP_ARCH", "gfx999")]);
    let e = backend
        .probe()
        .expect_err("the simulated runtime refuses gfx999");
    let HalError::Unavailable { reason, .. } = &e else {
        panic!("expected Unavailable, got {e:?}");
    };
    assert!(
        reason.contains("hipInit failed with hipErrorInvalidValue (1)"),
        "{reason}"
    );
    assert!(!reason.contains("no device"), "{reason}");
    assert!(reason.contains("libunihal_sim_hip.so"), "{reason}");
}
