//! The library is never unloaded: dropping the last handle of the binding leaves it mapped (its
//! threads and memory may outlive our handles). Only the binding is loaded here (no driver, no
//! call into it), so nothing else keeps the simulated library mapped.

use crate::support;

use support::simulated_library as simulated_driver;
use unihal_ccl::nccl::ffi::Nccl;

/// glibc's `RTLD_NOLOAD` (dlfcn.h): open only a library already loaded.
const RTLD_NOLOAD: std::ffi::c_int = 4;

#[test]
fn nccl_stays_loaded_after_its_last_handle_drops() {
    if crate::own_process() {
        return;
    }
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_NCCL_LIB", &lib);
    let nccl = Nccl::load(&unihal_ccl::NCCL).unwrap();
    drop(nccl);
    // RTLD_NOLOAD: succeeds only if the library is still mapped.
    // SAFETY: opens nothing new (RTLD_NOLOAD); no initialiser runs.
    let still = unsafe {
        libloading::os::unix::Library::open(
            Some(&lib),
            RTLD_NOLOAD | libloading::os::unix::RTLD_LAZY,
        )
    };
    assert!(
        still.is_ok(),
        "NCCL was unloaded when its last handle dropped"
    );
    // Keep the reference counts as they were.
    std::mem::forget(still);
}
