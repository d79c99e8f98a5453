//! The NCCL binding against NVIDIA's real `libnccl.so.2` (no GPU needed for these calls): every
//! symbol resolves, the version is the one `.ci/run` pinned, and a unique id comes back. Fails,
//! never skips, when `UNIHAL_TEST_REAL_NCCL` (the library's path, set by `.ci/run`) is missing.
//! Ignored unless asked for (`cargo test -p unihal-ccl --test all -- --ignored real_nccl::`).

use crate::support;

use std::sync::Arc;
use unihal_ccl::nccl::ffi::Nccl;
use unihal_ccl::{NcclEngine as Engine, NCCL};
use unihal_hal::Collectives;

#[test]
#[ignore = "needs NVIDIA's libnccl: UNIHAL_TEST_REAL_NCCL=PATH, run with --ignored (CI does)"]
fn real_libnccl_loads_and_makes_unique_ids() {
    if crate::own_process() {
        return;
    }
    let path = std::env::var("UNIHAL_TEST_REAL_NCCL")
        .expect("UNIHAL_TEST_REAL_NCCL must name NVIDIA's libnccl.so.2 (set by .ci/run)");
    let want: i32 = std::env::var("UNIHAL_TEST_REAL_NCCL_VERSION")
        .expect("UNIHAL_TEST_REAL_NCCL_VERSION must give the pinned version code (e.g. 23007)")
        .parse()
        .unwrap();
    std::env::set_var("UNIHAL_NCCL_LIB", &path);
    // Bootstrap on loopback (CI machines may have no other interface).
    std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    let lib = Nccl::load(&NCCL).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(lib.version(), want, "NCCL version code");
    assert_eq!(
        lib.all_to_all_name,
        Some("ncclAlltoAll"),
        "NCCL >= 2.28.3 has ncclAlltoAll"
    );
    assert!(lib.comm_split.is_some(), "NCCL >= 2.18 has ncclCommSplit");
    let engine = Engine::new(NCCL, Arc::new(support::NoDevices));
    let caps = engine.capabilities();
    assert!(caps.engine.starts_with("NCCL 2."), "{}", caps.engine);
    let (a, b) = (engine.unique_id().unwrap(), engine.unique_id().unwrap());
    assert_eq!(a.0.len(), 128);
    assert!(a.0.iter().any(|&x| x != 0), "an all-zero unique id");
    assert_ne!(a, b, "two unique ids are equal");
}
