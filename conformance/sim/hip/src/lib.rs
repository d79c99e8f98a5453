//! # A simulated AMD stack: the HIP runtime (`libamdhip64`), RCCL and rocBLAS
//!
//! Test infrastructure, never a product path: the HIP runtime API subset unihal's HIP backend
//! calls ([`runtime`]), written from AMD's documented API, and the NCCL API RCCL exports
//! ([`nccl`], the shared simulated NCCL face; set `UNIHAL_SIM_NCCL_FLAVOR=rccl` for RCCL's
//! version and result numbering) and the rocBLAS GEMM the backend calls ([`rocblas`]), on the
//! simulator core (`unihal-sim`) over host memory. Built
//! as one shared object, `libunihal_sim_hip.so`, loaded through the backend's overrides exactly
//! like the real libraries (`UNIHAL_HIP_LIB`, `UNIHAL_RCCL_LIB` and `UNIHAL_ROCBLAS_LIB` all
//! pointing at it): one object, because collectives and GEMMs queue on the runtime's streams.
//!
//! Devices are named "unihal simulated HIP device N (not a GPU)", so nobody mistakes their
//! results for a GPU's. Modules are real AMDGPU code objects (what hiprtc produced), read as
//! AMD's loader reads them: the architecture in the ELF header must be the device's
//! (`hipErrorNoBinaryForGpu` otherwise), kernels are the symbols with a kernel descriptor
//! (`.kd`), their argument sizes come from the msgpack metadata; each kernel then runs the host
//! function of unihal's portable library (or of the conformance test kernels) with its name. No
//! device code runs: wave-64 paths included, the code objects' instructions execute nowhere.
//!
//! Settings (besides the core's `UNIHAL_SIM_MODE`, `UNIHAL_SIM_DEVICES`, `UNIHAL_SIM_MEMORY`,
//! `UNIHAL_SIM_WATCHDOG_MS`, `UNIHAL_SIM_FAIL`):
//!
//! * `UNIHAL_SIM_HIP_ARCH`: `gfx90a` (default: an AMD Instinct MI200-class part) or `gfx906`
//!   (a Hygon DCU-class part: Z100); both wave64.
//! * `UNIHAL_SIM_HIP_NUMBERING`: `rocm5` (default: the `hipDeviceAttribute_t` numbering of ROCm
//!   5.0 to 6.2, reporting HIP 6.2, `hipGetDevicePropertiesR0600` filling the 1472-byte layout)
//!   or `legacy` (the pre-5.0 numbering that Hygon DTK keeps while reporting HIP 6.3; its
//!   `hipGetDevicePropertiesR0600` refuses, so only the 792-byte layout of the plain entry is
//!   there).
//!
//! As the real runtime: the calling thread's current device is 0 until `hipSetDevice`;
//! `hipLaunchHostFunc` is not exported (ROCm 5.2's library does not export it either: callbacks
//! go through `hipStreamAddCallback`); events created with `hipEventDisableTiming` refuse
//! `hipEventElapsedTime`. Stricter than the real library where it leaves misuse undefined: a
//! runtime call from inside a host function is refused and recorded as a violation
//! (`unihal_sim_violations`, [`fault`]).

#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)] // every entry point follows its vendor API's contract

pub mod conv;
pub mod rocblas;
pub mod runtime;

/// The C test controls (injected failures, violations), exported from this object.
pub use unihal_sim::fault_c as fault;
/// How backends learn that this runtime is simulated (`unihal_dynlib::SIMULATED_SYMBOL`).
pub use unihal_sim::gpu::unihal_simulated_runtime;
/// The NCCL face of this library (RCCL's API), exported from this object.
pub use unihal_sim_nccl::{api as nccl, conv as nccl_conv};

use conv::*;
use std::sync::OnceLock;
use unihal_sim::gpu::ops::{self, EntryCodes};
use unihal_sim::gpu::GpuFace;
use unihal_sim::SimError;

/// The simulated architectures.
pub const ARCHS: [&str; 2] = ["gfx90a", "gfx906"];

/// The face's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HipSettings {
    pub arch: &'static str,
    pub numbering: Numbering,
}

impl HipSettings {
    /// `hipRuntimeGetVersion`: HIP 6.2 with ROCm 5's numbering, 6.3 (as DTK reports) with the
    /// legacy one.
    pub fn version(&self) -> i32 {
        match self.numbering {
            Numbering::Rocm5 => 60_241_134,
            Numbering::Legacy => 60_325_422,
        }
    }

    /// The numbering `UNIHAL_SIM_HIP_NUMBERING` chooses (`rocm5` when unset).
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] for another value.
    fn numbering_setting() -> Result<Numbering, SimError> {
        match std::env::var("UNIHAL_SIM_HIP_NUMBERING")
            .as_deref()
            .map(str::trim)
        {
            Err(_) | Ok("rocm5") => Ok(Numbering::Rocm5),
            Ok("legacy") => Ok(Numbering::Legacy),
            Ok(v) => Err(SimError::InvalidValue(format!(
                "UNIHAL_SIM_HIP_NUMBERING={v}: rocm5 or legacy"
            ))),
        }
    }

    /// The numbering chosen by `UNIHAL_SIM_HIP_NUMBERING` (ROCm 5's when unset or invalid: the
    /// invalid value is reported by `hipInit`).
    pub fn numbering_from_env() -> Numbering {
        HipSettings::numbering_setting().unwrap_or(Numbering::Rocm5)
    }

    fn from_env() -> Result<HipSettings, SimError> {
        let arch = match std::env::var("UNIHAL_SIM_HIP_ARCH") {
            Err(_) => ARCHS[0],
            Ok(v) => *ARCHS.iter().find(|a| **a == v.trim()).ok_or_else(|| {
                SimError::InvalidValue(format!("UNIHAL_SIM_HIP_ARCH={v}: one of {ARCHS:?}"))
            })?,
        };
        let numbering = HipSettings::numbering_setting()?;
        Ok(HipSettings { arch, numbering })
    }
}

/// The started face: the core's GPU face state and this face's settings.
pub(crate) struct Sim {
    pub(crate) face: &'static GpuFace,
    pub(crate) settings: HipSettings,
}

static SIM: OnceLock<Result<Sim, i32>> = OnceLock::new();

fn start() -> Result<Sim, i32> {
    let settings = HipSettings::from_env().map_err(|e| {
        eprintln!("unihal-sim-hip: {e}");
        code(&e)
    })?;
    let face = unihal_sim::gpu::global().map_err(|e| {
        eprintln!("unihal-sim-hip: {e}");
        code(&e)
    })?;
    Ok(Sim { face, settings })
}

/// The simulator, once `hipInit` succeeded; the calling thread's current device is 0 until it
/// sets one (HIP's default device).
pub(crate) fn sim() -> Result<&'static Sim, i32> {
    match SIM.get() {
        Some(Ok(s)) => {
            if s.face.current().is_none() {
                s.face.set_current(Some(0));
            }
            Ok(s)
        }
        Some(Err(e)) => Err(*e),
        None => Err(HIP_ERROR_NOT_INITIALIZED),
    }
}

/// Runs entry point `name` ([`ops::entry`] with HIP's codes; a call from a host function is
/// `hipErrorNotSupported`, HIP having no "not permitted").
pub(crate) fn api(name: &str, f: impl FnOnce() -> Result<(), i32>) -> i32 {
    let codes = EntryCodes {
        not_permitted: HIP_ERROR_NOT_SUPPORTED,
        unknown: HIP_ERROR_UNKNOWN,
    };
    ops::entry(name, codes, f)
}

/// Writes `v` through an out-pointer (`hipErrorInvalidValue` for a null one).
///
/// # Safety
/// `p` is null (an error) or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), i32> {
    // SAFETY: the caller's contract.
    unsafe { ops::out(p, v, HIP_ERROR_INVALID_VALUE) }
}

/// The built simulator (`libunihal_sim_hip.so`) next to the running test executable.
///
/// # Panics
/// When it is not built there (see [`unihal_sim::built_library`]).
pub fn built_library() -> std::path::PathBuf {
    unihal_sim::built_library("libunihal_sim_hip.so")
}
