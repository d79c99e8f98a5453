//! The built simulator exports exactly the committed list (`symbols.txt`), and the layouts'
//! directories load it under every real library name.

use std::collections::BTreeSet;
use unihal_sim_cann::layout::{make, Layout};

fn committed() -> BTreeSet<String> {
    let text = include_str!("../symbols.txt");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .map(String::from)
        .collect()
}

#[test]
fn the_object_exports_exactly_the_committed_symbols() {
    let lib = unihal_sim_cann::built_library();
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) runs");
    assert!(
        out.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exported: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(String::from))
        .collect();
    let want = committed();
    let extra: Vec<_> = exported.difference(&want).collect();
    let missing: Vec<_> = want.difference(&exported).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "not in symbols.txt: {extra:?}; not exported: {missing:?}"
    );
}

#[test]
fn both_layouts_load_under_the_real_names() {
    let lib = unihal_sim_cann::built_library();
    let root = std::env::temp_dir().join(format!("unihal-cann-layouts-{}", std::process::id()));
    for layout in [Layout::Classic, Layout::Split] {
        let dir = make(&root, layout, &lib).unwrap();
        for name in layout.libraries() {
            // SAFETY: the simulator's object; loading runs no initialiser with preconditions.
            let l = unsafe { libloading::Library::new(dir.join(name)) }.unwrap();
            // SAFETY: a symbol lookup only.
            let init: Result<libloading::Symbol<unsafe extern "C" fn(*const i8) -> i32>, _> =
                unsafe { l.get(b"aclInit\0") };
            assert!(init.is_ok(), "{name}");
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}
