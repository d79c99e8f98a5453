//! Compiling the library with AMD's hiprtc to a code object for one gfx architecture.
//!
//! hiprtc is its own library from ROCm 5.6 (`libhiprtc.so.6`, `.5`), and is also exported by the
//! HIP runtime (`libamdhip64.so.5`, `.6`, Hygon DTK's `libgalaxyhip.so.5`), or the path in
//! `UNIHAL_HIPRTC_LIB`. hiprtc 5.x aborts the whole process on architectures it does not know
//! (gfx940+, gfx11xx, Hygon gfx92x/93x), so [`Hiprtc::compile`] passes it only the architectures
//! in [`SAFE_ARCHS`]; others are `Unsupported` there, and the HIP backend compiles them with
//! [`Hiprtc::compile_unchecked`] in a helper process, where an abort kills only the helper.

use super::hiprtc_sys::{HiprtcProgram, HiprtcSys};
use super::{compile_program, read_output, RtcApi};
use unihal_dynlib::{c_str, Candidates, Library};
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

/// A loaded hiprtc.
pub struct Hiprtc {
    sys: HiprtcSys,
    path: String,
    version: (i32, i32),
}

/// Output of one compilation.
#[derive(Debug, Clone)]
pub struct HiprtcOutput {
    /// AMDGPU ELF code object.
    pub code: Vec<u8>,
    pub log: String,
}

impl RtcApi for HiprtcSys {
    const WHAT: &'static str = "hiprtc";
    unsafe fn create(
        &self,
        prog: *mut HiprtcProgram,
        src: *const std::ffi::c_char,
        name: *const std::ffi::c_char,
    ) -> i32 {
        (self.create_program)(prog, src, name, 0, std::ptr::null(), std::ptr::null())
    }
    unsafe fn compile(
        &self,
        prog: HiprtcProgram,
        n: i32,
        opts: *const *const std::ffi::c_char,
    ) -> i32 {
        (self.compile_program)(prog, n, opts)
    }
    unsafe fn log(&self, prog: HiprtcProgram) -> String {
        read_output(
            "hiprtc log",
            |n| (self.get_program_log_size)(prog, n),
            |p| (self.get_program_log)(prog, p),
        )
        .map(|b| {
            String::from_utf8_lossy(&b)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default()
    }
    unsafe fn destroy(&self, prog: *mut HiprtcProgram) {
        (self.destroy_program)(prog);
    }
    fn error_name(&self, code: i32) -> String {
        // SAFETY: hiprtcGetErrorString returns a static string for any code.
        unsafe { c_str((self.get_error_string)(code)) }
    }
}

impl Hiprtc {
    /// Opens hiprtc.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] listing every library tried, or a missing symbol.
    pub fn load() -> Result<Hiprtc> {
        let candidates = Candidates::new("hiprtc", "UNIHAL_HIPRTC_LIB", &CANDIDATES)
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
            );
        let lib = Library::open(&candidates)?;
        let path = lib.path().to_string();
        let sys = HiprtcSys::new(&lib)?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: hiprtcVersion writes two ints.
        unsafe { (sys.version)(&mut major, &mut minor) };
        Ok(Hiprtc {
            sys,
            path,
            version: (major, minor),
        })
    }

    /// `(major, minor)` as hiprtc reports it.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The library path that was opened.
    pub fn path(&self) -> &str {
        &self.path
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
        let options = Hiprtc::options(arch);
        let sys = &self.sys;
        let (code, log) = compile_program(sys, src, name, &options, |prog| {
            // SAFETY: prog is the live, compiled program; the size comes from the matching call.
            unsafe {
                read_output(
                    "hiprtc code",
                    |n| (sys.get_code_size)(prog, n),
                    |p| (sys.get_code)(prog, p),
                )
            }
        })?;
        Ok(HiprtcOutput { code, log })
    }
}
