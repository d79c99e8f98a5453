//! The built simulator exports exactly the committed list (`symbols.txt`); each forwarding
//! library of both CANN layouts exports exactly its own part of it, and calls through any of
//! them reach the one simulator state.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_char;
use unihal_sim_cann::layout::{forwarders, make, Layout};
use unihal_sim_cann::symbols::{libraries, SYMBOLS_TXT};

/// Library name → its symbols.
fn committed() -> BTreeMap<String, BTreeSet<String>> {
    libraries(SYMBOLS_TXT)
        .into_iter()
        .map(|(lib, syms)| (lib, syms.into_iter().collect()))
        .collect()
}

fn exported(lib: &std::path::Path) -> BTreeSet<String> {
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm (binutils) runs");
    assert!(
        out.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
        .collect()
}

fn same(what: &str, got: &BTreeSet<String>, want: &BTreeSet<String>) {
    let extra: Vec<_> = got.difference(want).collect();
    let missing: Vec<_> = want.difference(got).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{what}: not in symbols.txt: {extra:?}; not exported: {missing:?}"
    );
}

#[test]
fn the_object_exports_exactly_the_committed_symbols() {
    if crate::own_process() {
        return;
    }
    let all: BTreeSet<String> = committed().into_values().flatten().collect();
    same(
        "libunihal_sim_cann.so",
        &exported(&unihal_sim_cann::built_library()),
        &all,
    );
}

#[test]
fn each_forwarding_library_exports_exactly_its_part() {
    if crate::own_process() {
        return;
    }
    let libs = committed();
    for layout in [Layout::Classic, Layout::Split] {
        for name in layout.libraries() {
            let want = libs
                .get(*name)
                .unwrap_or_else(|| panic!("{name} has no section"));
            same(name, &exported(&forwarders().join(name)), want);
        }
    }
    assert!(libs["libascendcl.so"].contains("aclInit"));
    assert!(!libs["libascendcl.so"].contains("aclCreateTensor"));
    assert!(
        libs["libopapi_math.so"].contains("aclnnAdd")
            && !libs["libopapi_nn.so"].contains("aclnnAdd")
    );
    assert!(
        libs["libopapi.so"].contains("aclnnAdd") && libs["libopapi.so"].contains("aclnnMatmul")
    );
}

type Init = unsafe extern "C" fn(*const c_char) -> i32;
type Count = unsafe extern "C" fn(*mut u32) -> i32;

#[test]
fn both_layouts_load_and_share_one_state() {
    if crate::own_process() {
        return;
    }
    let lib = unihal_sim_cann::built_library();
    let root = std::env::temp_dir().join(format!("unihal-cann-layouts-{}", std::process::id()));
    let classic = make(&root, Layout::Classic, &lib).unwrap();
    let split = make(&root, Layout::Split, &lib).unwrap();
    // SAFETY: the forwarding libraries and the simulator; their constructors only resolve
    // symbols. Every call below follows the ACL contract with live out-pointers.
    unsafe {
        let acl = libloading::Library::new(classic.join("libascendcl.so")).unwrap();
        let rt = libloading::Library::new(split.join("libacl_rt.so")).unwrap();
        let nnop = libloading::Library::new(split.join("libnnopbase.so")).unwrap();
        assert!(
            rt.get::<Init>(b"aclCreateTensor\0").is_err(),
            "not the runtime's"
        );
        assert!(nnop.get::<Init>(b"aclCreateTensor\0").is_ok());
        let init: libloading::Symbol<Init> = acl.get(b"aclInit\0").unwrap();
        let r = init(std::ptr::null());
        assert!(r == 0 || r == 100_002, "{r}");
        // The split layout's runtime is the same state: initialised already.
        let init2: libloading::Symbol<Init> = rt.get(b"aclInit\0").unwrap();
        assert_eq!(init2(std::ptr::null()), 100_002);
        let count: libloading::Symbol<Count> = rt.get(b"aclrtGetDeviceCount\0").unwrap();
        let mut n = 0;
        assert_eq!(count(&mut n), 0);
        assert!(n >= 1);
    }
    let _ = std::fs::remove_dir_all(&root);
}
