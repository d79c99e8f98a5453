//! Without the library, each instance is `Unavailable` listing every path it tried with the
//! loader's message: the override alone when set, else the system names and the install roots
//! (RCCL: `ROCM_PATH`, Hygon DTK's `DTKROOT`). Its own process: it sets the variables.

use crate::support;

use std::sync::Arc;
use unihal_ccl::{NcclEngine as Engine, NCCL, RCCL};
use unihal_hal::{Collectives, HalError};

#[test]
fn a_missing_library_names_every_path_tried() {
    if crate::own_process() {
        return;
    }
    std::env::remove_var("UNIHAL_NCCL_LIB");
    std::env::set_var("UNIHAL_RCCL_LIB", "");
    std::env::set_var("ROCM_PATH", "/nonexistent/rocm");
    std::env::set_var("DTKROOT", "/nonexistent/dtk");
    let rccl = Engine::new(RCCL, Arc::new(support::NoDevices));
    let Err(HalError::Unavailable { what, reason }) = rccl.lib().map(|_| ()) else {
        panic!("RCCL opened on a machine without it");
    };
    assert_eq!(what, "RCCL");
    for path in [
        "librccl.so.1: ",
        "/nonexistent/rocm/lib/librccl.so.1: ",
        "/nonexistent/dtk/lib/librccl.so.1: ",
        "/nonexistent/dtk/rccl/lib/librccl.so: ",
        "set UNIHAL_RCCL_LIB",
    ] {
        assert!(reason.contains(path), "{path} missing from: {reason}");
    }
    assert_eq!(rccl.capabilities().engine, "RCCL (unavailable)");
    assert!(rccl.capabilities().ops.is_empty());

    std::env::set_var("UNIHAL_NCCL_LIB", "/nonexistent/libnccl.so.2");
    let nccl = Engine::new(NCCL, Arc::new(support::NoDevices));
    let Err(HalError::Unavailable { reason, .. }) = nccl.lib().map(|_| ()) else {
        panic!("NCCL opened from a path that does not exist");
    };
    assert!(
        reason.starts_with("/nonexistent/libnccl.so.2: ")
            && reason.ends_with("(from UNIHAL_NCCL_LIB)"),
        "{reason}"
    );
}
