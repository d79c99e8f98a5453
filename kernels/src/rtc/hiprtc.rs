//! Compiling the library with AMD's hiprtc to a code object for one gfx architecture.
//!
//! hiprtc is its own library from ROCm 5.6 (`libhiprtc.so.6`, `.5`), and is also exported by the
//! HIP runtime (`libamdhip64.so.5`, `.6`, Hygon DTK's `libgalaxyhip.so.5`), or the path in
//! `UNIHAL_HIPRTC_LIB`. hiprtc 5.x aborts the whole process on architectures it does not know
//! (gfx940+, gfx11xx, Hygon gfx92x/93x), so [`Hiprtc::compile`] passes it only the architectures
//! in [`SAFE_ARCHS`]; others are `Unsupported` there, and the HIP backend compiles them with
//! [`Hiprtc::compile_unchecked`] in a helper process, where an abort kills only the helper.

use super::compiler::{Compiler, Flavor, Output};
use unihal_dynlib::Candidates;
use unihal_hal::{HalError, Result};

/// Library names tried, in order.
pub const CANDIDATES: [&str; 7] = [
    "libhiprtc.so.6",
    "libhiprtc.so.5",
    "libhiprtc.so",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
    "libgalaxyhip.so.5",
];

/// Architectures this hiprtc compiles without aborting the process.
pub const SAFE_ARCHS: [&str; 4] = ["gfx906", "gfx908", "gfx90a", "gfx1030"];

/// hiprtc as a flavor of the runtime-compiler family: a code object.
pub static HIPRTC: Flavor = Flavor {
    what: "hiprtc",
    prefix: "hiprtc",
    candidates: || {
        Candidates::new("hiprtc", "UNIHAL_HIPRTC_LIB", &CANDIDATES)
            .under_root(&["ROCM_PATH"], Some("/opt/rocm"), "lib", &CANDIDATES[..6])
            .under_root(
                &["DTKROOT"],
                Some("/opt/dtk"),
                "lib",
                &["libhiprtc.so", "libgalaxyhip.so.5"],
            )
            .under_root(
                &["DTKROOT"],
                Some("/opt/dtk"),
                "hip/lib",
                &["libgalaxyhip.so.5"],
            )
    },
    outputs: &[Output {
        name: "code",
        size: "GetCodeSize",
        read: "GetCode",
    }],
};

/// A loaded hiprtc.
pub struct Hiprtc(Compiler);

/// Output of one compilation.
#[derive(Debug, Clone)]
pub struct HiprtcOutput {
    /// AMDGPU ELF code object.
    pub code: Vec<u8>,
    pub log: String,
}

impl Hiprtc {
    /// Opens hiprtc.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] listing every library tried, or a missing symbol.
    pub fn load() -> Result<Hiprtc> {
        Compiler::load(&HIPRTC).map(Hiprtc)
    }

    /// `(major, minor)` as hiprtc reports it.
    pub fn version(&self) -> (i32, i32) {
        self.0.version()
    }

    /// The library path that was opened.
    pub fn path(&self) -> &str {
        self.0.path()
    }

    /// Compiles `src` to a code object for `arch`.
    ///
    /// # Errors
    /// [`HalError::Unsupported`] for an architecture outside [`SAFE_ARCHS`] (never passed to
    /// hiprtc); [`HalError::Vendor`] with the compiler log.
    pub fn compile(&self, src: &str, name: &str, arch: &str) -> Result<HiprtcOutput> {
        if !SAFE_ARCHS.contains(&arch) {
            return Err(HalError::unsupported(format!(
                "hiprtc compilation for {arch}: this hiprtc aborts the process on architectures outside {SAFE_ARCHS:?}"
            )));
        }
        self.compile_unchecked(src, name, arch)
    }

    /// The options every compilation passes (the kernel cache keys on them).
    pub fn options(arch: &str) -> Vec<String> {
        vec![
            format!("--offload-arch={arch}"),
            "-ffp-contract=off".to_string(),
            "-std=c++14".to_string(),
        ]
    }

    /// As [`Hiprtc::compile`] for any architecture. hiprtc may abort the whole process on one it
    /// does not know: call this only in a process whose death is acceptable (the HIP backend's
    /// compile helper).
    ///
    /// # Errors
    /// [`HalError::Vendor`] with the compiler log.
    pub fn compile_unchecked(&self, src: &str, name: &str, arch: &str) -> Result<HiprtcOutput> {
        let (mut parts, log) = self.0.compile(src, name, &Hiprtc::options(arch), 1)?;
        let code = parts.pop().unwrap_or_default();
        Ok(HiprtcOutput { code, log })
    }
}
