//! What the plugin tests share: finding the plugins cargo built, building the template as a port
//! builds it, compiling the C plugins.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A plugin library cargo built for this test run (a dev-dependency's cdylib).
pub fn built(file: &str) -> PathBuf {
    unihal_sim::built_library(file)
}

/// The target directory this test runs from: `CARGO_TARGET_DIR` when absolute (scripts/asan.sh),
/// else the directory above the profile's (`<target>/debug/deps/<test>`).
fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from) {
        if d.is_absolute() {
            return d;
        }
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.ancestors()
        .nth(3)
        .unwrap_or_else(|| panic!("no target directory above {}", exe.display()))
        .to_path_buf()
}

/// Builds `plugin/template` as docs/PORTING.md tells a port to (the template is no member of the
/// workspace): copied into `<target>/template-plugin/unihal-template-plugin`, beside a link
/// `unihal` to this checkout, and built there with `cargo build --release --offline` (every
/// crate it needs is in cargo's cache once the workspace built), in its own target directory,
/// kept between runs so a rebuild compiles the template alone. Under a sanitizer's `RUSTFLAGS`
/// (scripts/asan.sh) the build names the host target, as that script's builds do, so the
/// flags stay off build scripts and proc-macros. Returns `libunihal_template_plugin.so`.
///
/// # Panics
/// When cargo fails: the test needs the library.
pub fn build_template() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("plugin/ is in the checkout")
        .to_path_buf();
    let base = target_dir().join("template-plugin");
    let dir = base.join("unihal-template-plugin");
    std::fs::create_dir_all(dir.join("src")).expect("the template's build directory");
    let link = base.join("unihal");
    if std::fs::read_link(&link).ok().as_deref() != Some(root.as_path()) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&root, &link).expect("a link to the checkout");
    }
    let template = root.join("plugin/template");
    for f in ["Cargo.toml", "conformance.manifest", "src/lib.rs"] {
        let (from, to) = (template.join(f), dir.join(f));
        // Copied only when changed, so cargo's fingerprint (the file times) stays fresh.
        let new = std::fs::read(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
        if std::fs::read(&to).ok().as_ref() != Some(&new) {
            std::fs::write(&to, new).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
        }
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--release", "--offline", "--quiet"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", dir.join("target"));
    let mut out = dir.join("target");
    if std::env::var("RUSTFLAGS").is_ok_and(|f| f.contains("sanitizer")) {
        let triple = host_triple();
        cmd.args(["--target", &triple]);
        out = out.join(triple);
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cargo ({cargo}) does not run: {e}"));
    assert!(
        status.success(),
        "cargo build --release of the template in {} failed",
        dir.display()
    );
    let lib = out.join("release/libunihal_template_plugin.so");
    assert!(lib.is_file(), "no {}", lib.display());
    lib
}

/// The host's target triple, as rustc prints it.
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let o = Command::new(&rustc)
        .arg("-vV")
        .output()
        .unwrap_or_else(|e| panic!("{rustc} does not run: {e}"));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_string()
}

/// The C header's directory.
pub fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("abi/include")
}

/// Compiles `tests/c/minimal_plugin.c` with `defines` (see [`compile_c`]).
pub fn compile_c_plugin(tag: &str, defines: &[&str]) -> PathBuf {
    compile_c("minimal_plugin.c", tag, defines)
}

/// Compiles `tests/c/<source>` with the system C compiler (`cc`, or `$CC`) and `defines` into a
/// shared library under the temporary directory, named after `tag`, with the flags
/// docs/PORTING.md gives a C plugin (`-std=c11 -O2 -Wall -Wextra -shared -fPIC -pthread -I
/// plugin/abi/include`), warnings as errors.
///
/// # Panics
/// When no C compiler runs or the compile fails: the test needs it (CI installs one).
pub fn compile_c(source: &str, tag: &str, defines: &[&str]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("unihal-c-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let out = dir.join(format!("libcplugin_{tag}.so"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source);
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread",
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

/// Asserts that every case of the areas a C example does not implement (kernels, library ops,
/// collectives) was skipped with a reason naming the example (`who`, from its manifest).
pub fn assert_unsupported_areas_skipped(report: &unihal_conformance::Report, who: &str) {
    for t in &report.targets {
        for r in &t.results {
            let unsupported_area = ["kernels.", "ops.", "ccl."]
                .iter()
                .any(|p| r.id.starts_with(p));
            if unsupported_area {
                assert!(
                    matches!(&r.outcome, unihal_conformance::Outcome::Skipped { reason } if reason.contains(who)),
                    "{}: {:?}",
                    r.id,
                    r.outcome
                );
            }
        }
    }
}

/// The CPU backend's plugin table, loaded once from the built `libunihal_cpu_plugin.so` with
/// host services of this ABI version (the real entries that tests wrapping the table call).
/// Valid forever: the library is never unloaded.
pub fn cpu_plugin_table() -> &'static unihal_plugin::abi::UhPluginApi {
    use std::sync::OnceLock;
    use unihal_plugin::abi::*;
    static REAL: OnceLock<usize> = OnceLock::new();
    static HOST: UhHostApi = UhHostApi {
        size: std::mem::size_of::<UhHostApi>() as u32,
        abi_major: UH_ABI_MAJOR,
        abi_minor: UH_ABI_MINOR,
        reserved: 0,
        log: None,
    };
    let t = *REAL.get_or_init(|| {
        let path = built("libunihal_cpu_plugin.so");
        // SAFETY: the CPU backend's plugin, built for this test run.
        let lib = unsafe { libloading::Library::new(&path) }.expect("the CPU plugin");
        // SAFETY: the plugin's entry symbol has the header's entry type.
        let entry: UhPluginEntryFn =
            *unsafe { lib.get(UH_PLUGIN_ENTRY_SYMBOL.as_bytes()) }.expect("the entry symbol");
        std::mem::forget(lib);
        let mut err = UhError::new();
        // SAFETY: our host services (valid forever) and an error record.
        let t = unsafe { entry(&HOST, &mut err) };
        assert!(!t.is_null());
        t as usize
    });
    // SAFETY: the table is valid forever (header rule 5; the library is never unloaded).
    unsafe { &*(t as *const UhPluginApi) }
}
