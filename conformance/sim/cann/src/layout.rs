//! The CANN install layouts a backend loads the simulator from: a `lib64` directory holding the
//! real library names of the classic layout (`libascendcl.so`, `libopapi.so`,
//! `libnnopbase.so`, `libhccl.so`) or of the split one of recent CANN (`libacl_rt.so`,
//! `libnnopbase.so`, `libopapi_math.so`, `libopapi_nn.so`, `libopapi_transformer.so`,
//! `libhccl.so`).
//!
//! Each is a forwarding library built from `symbols.txt` (build.rs): it exports exactly the
//! symbols the real library of that name exports (a backend that resolves a symbol from the
//! wrong library fails here as it would on CANN), each a jump into the one simulator object,
//! `libunihal_sim_cann.so`, which sits next to them, so that all share one state (one runtime,
//! one set of devices), as CANN's libraries share the driver. `libhcomm.so`, where recent
//! torch_npu finds `HcclGroupStart`/`End`, is absent: the simulator has no group calls.

use std::path::{Path, PathBuf};

/// A CANN library layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// CANN up to 8.x: one `libopapi.so`, the runtime in `libascendcl.so`.
    Classic,
    /// Recent CANN: `libacl_rt.so`, operators split per package.
    Split,
}

impl Layout {
    /// The library file names of this layout.
    pub fn libraries(self) -> &'static [&'static str] {
        match self {
            Layout::Classic => &[
                "libascendcl.so",
                "libopapi.so",
                "libnnopbase.so",
                "libhccl.so",
            ],
            Layout::Split => &[
                "libacl_rt.so",
                "libnnopbase.so",
                "libopapi_math.so",
                "libopapi_nn.so",
                "libopapi_transformer.so",
                "libhccl.so",
            ],
        }
    }

    fn dir_name(self) -> &'static str {
        match self {
            Layout::Classic => "classic",
            Layout::Split => "split",
        }
    }
}

/// Where build.rs put the forwarding libraries.
pub fn forwarders() -> PathBuf {
    Path::new(env!("OUT_DIR")).join("forwarders")
}

/// Makes `<root>/<layout>/lib64` with the layout's forwarding libraries and a link to `object`
/// (the built `libunihal_sim_cann.so`), and returns the `lib64` path (what
/// `ASCEND_HOME_PATH/lib64` is).
///
/// # Errors
/// The file system's.
pub fn make(root: &Path, layout: Layout, object: &Path) -> std::io::Result<PathBuf> {
    let lib64 = root.join(layout.dir_name()).join("lib64");
    std::fs::create_dir_all(&lib64)?;
    let replace = |path: &Path| match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    let core = lib64.join("libunihal_sim_cann.so");
    replace(&core)?;
    std::os::unix::fs::symlink(object.canonicalize()?, &core)?;
    for name in layout.libraries() {
        let to = lib64.join(name);
        replace(&to)?;
        std::fs::copy(forwarders().join(name), &to)?;
    }
    Ok(lib64)
}

/// For tests in other crates: makes a simulated CANN install of `layout` under the temporary
/// directory (named by `tag` and this process), points `UNIHAL_ASCEND_LIB` at its `lib64` and sets
/// `UNIHAL_SIM_DEVICES` to `devices`; returns the `lib64` path. Call it once, from one thread,
/// before the process's first Ascend device opens (it sets environment variables).
///
/// # Errors
/// The file system's.
pub fn install_for_tests(tag: &str, layout: Layout, devices: usize) -> std::io::Result<PathBuf> {
    let root = std::env::temp_dir().join(format!("unihal-{tag}-{}", std::process::id()));
    let lib64 = make(&root, layout, &crate::built_library())?;
    std::env::set_var("UNIHAL_ASCEND_LIB", &lib64);
    std::env::set_var("UNIHAL_SIM_DEVICES", devices.to_string());
    Ok(lib64)
}
