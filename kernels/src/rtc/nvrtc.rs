//! Compiling the library with NVIDIA's NVRTC, to PTX and to cubin for one SM architecture.
//!
//! The library is `libnvrtc.so.13` (CUDA 13; `.12` is also tried), or the path in
//! `UNIHAL_NVRTC_LIB`. Kernels are compiled without fused multiply-add contraction (`--fmad=false`)
//! so that results match the CPU build bit for bit where the math is IEEE. The calls are the
//! shared [`Compiler`]'s (NVRTC's flavor, [`NVRTC`]).

use super::compiler::{Compiler, Flavor, Output};
use unihal_dynlib::Candidates;
use unihal_hal::{HalError, Invalid, Result};

/// Library names tried, in order.
pub const CANDIDATES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// NVRTC as a flavor of the runtime-compiler family: PTX, then cubin.
pub static NVRTC: Flavor = Flavor {
    what: "NVRTC",
    prefix: "nvrtc",
    candidates: || Candidates::new("NVRTC", "UNIHAL_NVRTC_LIB", &CANDIDATES),
    outputs: &[
        Output {
            name: "PTX",
            size: "GetPTXSize",
            read: "GetPTX",
        },
        Output {
            name: "CUBIN",
            size: "GetCUBINSize",
            read: "GetCUBIN",
        },
    ],
};

/// A loaded NVRTC.
pub struct Nvrtc(Compiler);

/// Output of one compilation.
#[derive(Debug, Clone)]
pub struct NvrtcOutput {
    pub ptx: String,
    /// Empty when compiled for a virtual architecture (`compute_XX`).
    pub cubin: Vec<u8>,
    pub log: String,
}

impl Nvrtc {
    /// Opens NVRTC.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] listing every library tried, or a missing symbol.
    pub fn load() -> Result<Nvrtc> {
        Compiler::load(&NVRTC).map(Nvrtc)
    }

    /// `(major, minor)` of the loaded NVRTC.
    pub fn version(&self) -> (i32, i32) {
        self.0.version()
    }

    /// The library path that was opened.
    pub fn path(&self) -> &str {
        self.0.path()
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
        // A virtual architecture gives PTX alone.
        let outputs = if arch.starts_with("sm_") { 2 } else { 1 };
        let (mut parts, log) = self.0.compile(src, name, &Nvrtc::options(arch), outputs)?;
        let cubin = if parts.len() > 1 {
            parts.pop().unwrap_or_default()
        } else {
            Vec::new()
        };
        let ptx = parts.pop().unwrap_or_default();
        Ok(NvrtcOutput {
            ptx: String::from_utf8_lossy(&ptx)
                .trim_end_matches('\0')
                .to_string(),
            cubin,
            log,
        })
    }
}
