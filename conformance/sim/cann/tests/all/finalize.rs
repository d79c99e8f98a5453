//! `aclFinalize` ends ACL for the process (a test binary of its own).

use crate::support;

use support::*;
use unihal_sim_cann::runtime::*;

#[test]
fn after_finalize_nothing_runs_and_init_is_refused() {
    if crate::own_process() {
        return;
    }
    let mut n = 0u32;
    assert_eq!(
        // SAFETY: a live out-pointer.
        unsafe { aclrtGetDeviceCount(&mut n) },
        100_001,
        "before aclInit"
    );
    assert_eq!(aclFinalize(), 100_001, "finalize before init");
    init();
    ok(aclFinalize());
    assert_eq!(aclFinalize(), 100_037, "a second finalize");
    // SAFETY: a live out-pointer.
    assert_eq!(unsafe { aclrtGetDeviceCount(&mut n) }, 100_001);
    assert_eq!(aclInit(std::ptr::null()), 100_002);
    assert!(msg().contains("after aclFinalize"), "{}", msg());
}
