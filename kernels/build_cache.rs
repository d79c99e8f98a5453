//! The build script's archive cache: the kernel library's archives kept between builds in
//! `UNIHAL_KERNELS_BUILD_CACHE` (a directory; unset, nothing is cached), so that each other
//! build of this crate (another profile, feature set, target directory or toolchain: the test
//! command, the release build, the sanitizer, fuzzing and loom builds) copies the archive instead
//! of compiling the library again at -O3 (about a minute per ISA variant on a 2-core machine).
//!
//! An archive is found under a key over everything that decides its bytes: the compiler's path,
//! its `--version`, its full argument list as `cc` builds it (defines, flags, the environment's
//! CXXFLAGS, the flags `cc` inherits from rustc; the build directory written as `<out>`), and the
//! contents of every source file, the generated catalogue included. Any difference is a miss and
//! compiles. Entries are written to a temporary name and renamed, so concurrent builds sharing the
//! directory see a whole archive or none. Nothing is ever evicted: the directory is meant for one
//! CI run or a developer's checkout, and may be deleted at any time.

use std::path::{Path, PathBuf};

/// The cache directory, when `UNIHAL_KERNELS_BUILD_CACHE` names one.
pub fn dir() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=UNIHAL_KERNELS_BUILD_CACHE");
    std::env::var_os("UNIHAL_KERNELS_BUILD_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// FNV-1a, 64 bits: stable across toolchains (unlike std's hasher), enough for a build cache.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    /// Feeds `bytes` and a length marker, so that adjacent fields cannot run into each other.
    fn field(&mut self, bytes: &[u8]) {
        for b in bytes.iter().chain(&(bytes.len() as u64).to_le_bytes()) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The key of the archive `build` makes from `sources`, with `out` (the build directory)
/// replaced by a placeholder in the arguments. Panics (failing the build with the reason) when
/// the compiler cannot be found or run.
pub fn key(build: &cc::Build, out: &Path, sources: &[PathBuf]) -> String {
    let tool = build.get_compiler();
    let mut h = Fnv::new();
    // The layout of an entry: bumped when what an archive holds changes for the same inputs
    // (v2: each variant compiled in its own object directory).
    h.field(b"unihal-kernels archive v2");
    h.field(tool.path().as_os_str().as_encoded_bytes());
    let version = std::process::Command::new(tool.path())
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} --version: {e}", tool.path().display()));
    h.field(&version.stdout);
    let out = out.to_string_lossy();
    for arg in tool.args() {
        h.field(arg.to_string_lossy().replace(&*out, "<out>").as_bytes());
    }
    for src in sources {
        let bytes = std::fs::read(src)
            .unwrap_or_else(|e| panic!("cannot read kernel source {}: {e}", src.display()));
        h.field(src.file_name().unwrap_or_default().as_encoded_bytes());
        h.field(&bytes);
    }
    format!("{:016x}", h.0)
}

/// Copies the cached archive `name` (e.g. `libunihal_kernels_uh_base.a`) of `key` to `out`;
/// false when there is none (or it cannot be copied: the caller compiles).
pub fn fetch(cache: &Path, key: &str, name: &str, out: &Path) -> bool {
    std::fs::copy(cache.join(key).join(name), out.join(name)).is_ok()
}

/// Stores `out/name` under `key`, atomically (a temporary file renamed into place). A failure
/// only warns: the build itself succeeded.
pub fn store(cache: &Path, key: &str, name: &str, out: &Path) {
    let dir = cache.join(key);
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let result = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::copy(out.join(name), &tmp))
        .and_then(|_| std::fs::rename(&tmp, dir.join(name)));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        println!(
            "cargo:warning=kernel archive not cached in {}: {e}",
            dir.display()
        );
    }
}
