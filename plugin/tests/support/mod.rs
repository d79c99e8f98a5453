//! What the plugin tests share: finding the plugins cargo built, compiling the C plugin.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A plugin library cargo built for this test run (a dev-dependency's cdylib).
pub fn built(file: &str) -> PathBuf {
    unihal_sim::built_library(file)
}

/// The C header's directory.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("abi/include")
}

/// Compiles `tests/c/minimal_plugin.c` with the system C compiler (`cc`, or `$CC`) and
/// `defines` into a shared library under the temporary directory, named after `tag`.
///
/// # Panics
/// When no C compiler runs or the compile fails: the test needs it (CI installs one).
pub fn compile_c_plugin(tag: &str, defines: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("unihal-c-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let out = dir.join(format!("libcplugin_{tag}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/minimal_plugin.c");
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
    ])
    .arg("-I")
    .arg(include_dir())
    .args(defines.iter().map(|d| format!("-D{d}")))
    .arg("-o")
    .arg(&out)
    .arg(&src);
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("the C compiler {cc:?} does not run: {e}"));
    assert!(
        o.status.success(),
        "{cc} failed on {}:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}
