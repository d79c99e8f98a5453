//! Without CANN the backend is `Unavailable`, naming every path it tried with the loader's
//! message and the variable to set, and `info` reports the runtime as missing.

use unihal_ascend::AscendBackend;
use unihal_hal::{Backend, HalError};

#[test]
fn a_machine_without_cann_lists_every_path_tried() {
    if crate::own_process() {
        return;
    }
    let empty = std::env::temp_dir().join(format!("unihal-no-cann-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    std::env::set_var("UNIHAL_ASCEND_LIB", &empty);
    let b = AscendBackend::new();
    let e = b.probe().expect_err("no CANN here");
    let HalError::Unavailable { what, reason } = &e else {
        panic!("not Unavailable: {e:?}");
    };
    assert_eq!(what, "ACL runtime");
    for name in ["libascendcl.so", "libacl_rt.so"] {
        let path = empty.join(name);
        assert!(
            reason.contains(&*path.to_string_lossy()),
            "{name} under UNIHAL_ASCEND_LIB not listed: {reason}"
        );
    }
    assert!(
        reason.contains("cannot open shared object file"),
        "{reason}"
    );
    assert!(reason.contains("UNIHAL_ACL_LIB"), "{reason}");
    let info = b.info();
    assert!(!info.simulated);
    assert!(info.libraries[0]
        .error
        .as_deref()
        .is_some_and(|m| m.contains("libascendcl.so")));
    assert!(b.collectives().is_none());
}
