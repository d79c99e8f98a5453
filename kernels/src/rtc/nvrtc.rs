//! Compiling the library with NVIDIA's NVRTC, to PTX and to cubin for one SM architecture.
//!
//! The library is `libnvrtc.so.13` (CUDA 13; `.12` is also tried), or the path in
//! `UNIHAL_NVRTC_LIB`. Kernels are compiled without fused multiply-add contraction (`--fmad=false`)
//! so that results match the CPU build bit for bit where the math is IEEE.

use super::nvrtc_sys::{NvrtcProgram, NvrtcSys};
use super::{compile_program, read_output, RtcApi};
use unihal_dynlib::{c_str, Candidates, Library};
use unihal_hal::{HalError, Invalid, Result};

/// Library names tried, in order.
pub const CANDIDATES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// A loaded NVRTC.
pub struct Nvrtc {
    sys: NvrtcSys,
    path: String,
    version: (i32, i32),
}

/// Output of one compilation.
#[derive(Debug, Clone)]
pub struct NvrtcOutput {
    pub ptx: String,
    /// Empty when compiled for a virtual architecture (`compute_XX`).
    pub cubin: Vec<u8>,
    pub log: String,
}

impl RtcApi for NvrtcSys {
    const WHAT: &'static str = "nvrtc";
    unsafe fn create(
        &self,
        prog: *mut NvrtcProgram,
        src: *const std::ffi::c_char,
        name: *const std::ffi::c_char,
    ) -> i32 {
        (self.create_program)(prog, src, name, 0, std::ptr::null(), std::ptr::null())
    }
    unsafe fn compile(
        &self,
        prog: NvrtcProgram,
        n: i32,
        opts: *const *const std::ffi::c_char,
    ) -> i32 {
        (self.compile_program)(prog, n, opts)
    }
    unsafe fn log(&self, prog: NvrtcProgram) -> String {
        read_output(
            "nvrtc log",
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
    unsafe fn destroy(&self, prog: *mut NvrtcProgram) {
        (self.destroy_program)(prog);
    }
    fn error_name(&self, code: i32) -> String {
        // SAFETY: nvrtcGetErrorString returns a static string for any code.
        unsafe { c_str((self.get_error_string)(code)) }
    }
}

impl Nvrtc {
    /// Opens NVRTC.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] listing every library tried, or a missing symbol.
    pub fn load() -> Result<Nvrtc> {
        let lib = Library::open(&Candidates::new("NVRTC", "UNIHAL_NVRTC_LIB", &CANDIDATES))?;
        let path = lib.path().to_string();
        let sys = NvrtcSys::new(&lib)?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion writes two ints.
        unsafe { (sys.version)(&mut major, &mut minor) };
        Ok(Nvrtc {
            sys,
            path,
            version: (major, minor),
        })
    }

    /// `(major, minor)` of the loaded NVRTC.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The library path that was opened.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The options [`Nvrtc::compile`] passes for `arch` (part of a compile cache's key).
    pub fn options(arch: &str) -> Vec<String> {
        vec![
            format!("--gpu-architecture={arch}"),
            "--fmad=false".to_string(),
            "--std=c++14".to_string(),
        ]
    }

    /// Compiles `src` for `arch` (`sm_90` gives PTX and cubin, `compute_90` PTX only).
    ///
    /// # Errors
    /// [`Invalid::Value`] for a malformed arch; [`HalError::Vendor`] with the compiler log.
    pub fn compile(&self, src: &str, name: &str, arch: &str) -> Result<NvrtcOutput> {
        let ok = (arch.starts_with("sm_") || arch.starts_with("compute_"))
            && arch
                .split('_')
                .nth(1)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()));
        if !ok {
            return Err(HalError::invalid(
                "arch",
                Invalid::Value {
                    value: arch.to_string(),
                    accepted: "sm_<NN> or compute_<NN>".into(),
                },
            ));
        }
        let options = Nvrtc::options(arch);
        let sys = &self.sys;
        let ((ptx, cubin), log) = compile_program(sys, src, name, &options, |prog| {
            // SAFETY: prog is the live, compiled program; sizes come from the matching size calls.
            let ptx = unsafe {
                read_output(
                    "nvrtc PTX",
                    |n| (sys.get_ptx_size)(prog, n),
                    |p| (sys.get_ptx)(prog, p),
                )?
            };
            let cubin = if arch.starts_with("sm_") {
                // SAFETY: as above.
                unsafe {
                    read_output(
                        "nvrtc CUBIN",
                        |n| (sys.get_cubin_size)(prog, n),
                        |p| (sys.get_cubin)(prog, p),
                    )?
                }
            } else {
                Vec::new()
            };
            Ok((
                String::from_utf8_lossy(&ptx)
                    .trim_end_matches('\0')
                    .to_string(),
                cubin,
            ))
        })?;
        Ok(NvrtcOutput { ptx, cubin, log })
    }
}
