//! The CANN install layouts a backend loads the simulator from: a `lib64` directory holding the
//! real library names of the classic layout (`libascendcl.so`, `libopapi.so`,
//! `libnnopbase.so`, `libhccl.so`) or of the split one of recent CANN (`libacl_rt.so`,
//! `libnnopbase.so`, `libopapi_math.so`, `libopapi_nn.so`, `libhccl.so`, `libhcomm.so`).
//!
//! Each name is a symbolic link to the one simulator object: the dynamic loader recognises the
//! same file behind every name and loads it once, so the libraries share one state (one
//! runtime, one set of devices), as CANN's libraries share the driver. Every name therefore
//! exports every symbol of `symbols.txt`; that a backend resolves each symbol from the library
//! that really exports it is checked against the committed per-library lists (`symbols.txt`),
//! not by the loader.

use std::path::{Path, PathBuf};

/// A CANN library layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// CANN up to 8.x: one `libopapi.so`, the runtime in `libascendcl.so`.
    Classic,
    /// Recent CANN: `libacl_rt.so`, operators split per package, groups in `libhcomm.so`.
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
                "libhccl.so",
                "libhcomm.so",
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

/// Makes `<root>/<layout>/lib64` with the layout's library names linked to `object` (the built
/// `libunihal_sim_cann.so`) and returns the `lib64` path (what `ASCEND_HOME_PATH/lib64` is).
///
/// # Errors
/// The file system's.
pub fn make(root: &Path, layout: Layout, object: &Path) -> std::io::Result<PathBuf> {
    let lib64 = root.join(layout.dir_name()).join("lib64");
    std::fs::create_dir_all(&lib64)?;
    let object = object.canonicalize()?;
    for name in layout.libraries() {
        let link = lib64.join(name);
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::os::unix::fs::symlink(&object, &link)?;
    }
    Ok(lib64)
}
