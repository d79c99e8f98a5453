//! Conversions of the HIP backend: `hipError_t` to [`HalError`] (HIP's name and number kept),
//! the two numberings of `hipDeviceAttribute_t` and how to tell them apart, and architecture and
//! vendor names.

use crate::ffi::{self, hipError_t, HipApi};
use unihal_dynlib::c_str;
use unihal_gpu::gemm::Op;
use unihal_hal::{HalError, Result};

/// `hipError_t` values the backend tests for (HIP's header; identical from ROCm 5.0 to 6.x).
pub mod codes {
    pub const INVALID_VALUE: i32 = 1;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NO_DEVICE: i32 = 100;
    pub const INVALID_DEVICE: i32 = 101;
    pub const NOT_FOUND: i32 = 500;
    pub const NOT_READY: i32 = 600;
    pub const ILLEGAL_ADDRESS: i32 = 700;
    pub const LAUNCH_TIMEOUT: i32 = 702;
    pub const PEER_ACCESS_ALREADY_ENABLED: i32 = 704;
    pub const ASSERT: i32 = 710;
    pub const LAUNCH_FAILURE: i32 = 719;
}

/// The library label of the backend's vendor errors.
pub const LIBRARY: &str = "HIP runtime";

/// HIP's name of a code (`hipGetErrorName`); `hipError_t <n>` for one the runtime does not
/// know.
pub fn error_name(api: &HipApi, code: hipError_t) -> String {
    // SAFETY: returns a static NUL-terminated string (or null) for any code.
    let name = unsafe { c_str((api.get_error_name)(code)) };
    if name.is_empty() || (name.contains("Unknown") && code != 999) {
        format!("hipError_t {code}")
    } else {
        name
    }
}

/// A failed HIP call as a vendor error: `HIP runtime: <call> failed with hipErrorX (n): text`.
/// Names come from the runtime itself (`hipGetErrorName`/`hipGetErrorString`); a code it does not
/// know still gives the number.
pub fn vendor(api: &HipApi, call: &str, code: hipError_t) -> HalError {
    let name = error_name(api, code);
    // SAFETY: returns a static NUL-terminated string (or null) for any code.
    let text = unsafe { c_str((api.get_error_string)(code)) };
    HalError::Vendor {
        library: LIBRARY.into(),
        call: call.into(),
        code: code as i64,
        name,
        message: text,
    }
}

/// True for errors after which the device is unusable (a memory fault, a killed or failed
/// kernel, a device-side assert).
pub fn poisons(code: i64) -> bool {
    matches!(
        code as i32,
        codes::ILLEGAL_ADDRESS | codes::LAUNCH_TIMEOUT | codes::ASSERT | codes::LAUNCH_FAILURE
    )
}

/// Which `hipDeviceAttribute_t` numbering the runtime speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numbering {
    /// ROCm 5.0 and later (identical to 6.2): CUDA-compatible attributes first.
    Rocm5,
    /// HIP up to ROCm 4.5, which Hygon DTK keeps while reporting HIP 6.x.
    Legacy,
}

/// The attributes the backend reads, in one numbering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attributes {
    pub max_threads_per_block: i32,
    pub max_block: [i32; 3],
    pub max_grid: [i32; 3],
    pub max_shared_per_block: i32,
    pub warp_size: i32,
    pub multiprocessor_count: i32,
    /// `hipDeviceAttributeMemoryPoolsSupported` (none in the legacy numbering).
    pub memory_pools: Option<i32>,
}

impl Numbering {
    /// The attribute values of this numbering (HIP's headers: rocm-5.0.0 to 6.2.0 for
    /// [`Numbering::Rocm5`], rocm-4.5.2 for [`Numbering::Legacy`]).
    pub const fn attributes(self) -> Attributes {
        match self {
            Numbering::Rocm5 => Attributes {
                max_threads_per_block: 56,
                max_block: [26, 27, 28],
                max_grid: [29, 30, 31],
                max_shared_per_block: 74,
                warp_size: 87,
                multiprocessor_count: 63,
                memory_pools: Some(88),
            },
            Numbering::Legacy => Attributes {
                max_threads_per_block: 0,
                max_block: [1, 2, 3],
                max_grid: [4, 5, 6],
                max_shared_per_block: 7,
                warp_size: 9,
                multiprocessor_count: 14,
                memory_pools: None,
            },
        }
    }

    /// Chooses the numbering from the answers to the warp-size query in each numbering
    /// (`Err(code)` when the runtime refused it): a warp size must be 32 or 64. The ROCm 5
    /// answer is trusted first; the legacy one only when the ROCm 5 query failed or gave a value
    /// no warp size has (in the legacy numbering, 87 is out of range or another attribute).
    ///
    /// # Errors
    /// A message naming both answers when neither is a warp size.
    pub fn choose(rocm5: Result<i32, i32>, legacy: Result<i32, i32>) -> Result<Numbering, String> {
        let warp = |r: &Result<i32, i32>| matches!(r, Ok(32) | Ok(64));
        if warp(&rocm5) {
            Ok(Numbering::Rocm5)
        } else if warp(&legacy) {
            Ok(Numbering::Legacy)
        } else {
            Err(format!(
                "cannot tell the runtime's hipDeviceAttribute_t numbering: the warp-size query \
                 answered {rocm5:?} as attribute 87 (ROCm >= 5.0) and {legacy:?} as attribute 9 \
                 (ROCm <= 4.5, Hygon DTK); a warp size is 32 or 64"
            ))
        }
    }
}

/// The architecture of a `gcnArchName` without its feature suffixes
/// (`"gfx90a:sramecc+:xnack-"` is `gfx90a`).
///
/// # Errors
/// The name when it is not a gfx architecture.
pub fn arch_of(gcn_arch_name: &str) -> Result<String, String> {
    let arch = gcn_arch_name.split(':').next().unwrap_or("").trim();
    let ok = arch.len() > 3
        && arch.starts_with("gfx")
        && arch[3..].chars().all(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(arch.to_string())
    } else {
        Err(format!("{gcn_arch_name:?} is not a gfx architecture name"))
    }
}

/// The vendor of a device: Hygon for the DCU architectures (gfx92x and gfx93x) or when the
/// runtime is Hygon DTK's, AMD otherwise.
pub fn vendor_of(arch: &str, dtk: bool) -> &'static str {
    let dcu = arch.starts_with("gfx92") || arch.starts_with("gfx93");
    if dtk || dcu {
        "Hygon"
    } else {
        "AMD"
    }
}

/// The HIP version of an `hipRuntimeGetVersion` code (`major*10^7 + minor*10^5 + patch`).
pub fn version_string(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, v / 100_000 % 100, v % 100_000)
}

/// A rocBLAS status as a [`HalError::Vendor`] naming `call` (success is `Ok`).
pub(crate) fn blas_status(call: &str, st: ffi::rocblas_status) -> Result<()> {
    if st == 0 {
        return Ok(());
    }
    let name = crate::loader::rocblas()
        .ok()
        .and_then(|(api, _)| api.status_to_string)
        // SAFETY: returns a static string for any status.
        .map(|f| unsafe { unihal_dynlib::c_str(f(st)) })
        .unwrap_or_else(|| format!("rocblas_status {st}"));
    Err(HalError::Vendor {
        library: "rocBLAS".into(),
        call: call.into(),
        code: st as i64,
        name,
        message: String::new(),
    })
}

/// rocBLAS's value of a BLAS operation.
pub(crate) fn blas_op(o: Op) -> i32 {
    match o {
        Op::N => ffi::ROCBLAS_OP_N,
        Op::T => ffi::ROCBLAS_OP_T,
    }
}

/// `hipStreamCaptureMode` of a HAL capture mode (`hipStreamCaptureModeGlobal` = 0,
/// `ThreadLocal` = 1, `Relaxed` = 2).
pub fn capture_mode(m: unihal_hal::CaptureMode) -> i32 {
    match m {
        unihal_hal::CaptureMode::Global => 0,
        unihal_hal::CaptureMode::ThreadLocal => 1,
        unihal_hal::CaptureMode::Relaxed => 2,
    }
}

/// The HAL capture mode of a `hipStreamCaptureMode` (None for an undocumented value).
pub fn capture_mode_of(v: i32) -> Option<unihal_hal::CaptureMode> {
    unihal_hal::CaptureMode::ALL
        .into_iter()
        .find(|m| capture_mode(*m) == v)
}

/// `hipStreamCaptureStatus`: `hipStreamCaptureStatusNone` = 0, `Active` = 1, `Invalidated` =
/// 2, with the capture's id (read only when not none).
///
/// # Errors
/// [`HalError::Internal`] for an undocumented status.
pub fn capture_status(status: i32, id: u64) -> Result<unihal_gpu::runtime::RawCaptureStatus> {
    use unihal_gpu::runtime::RawCaptureStatus as S;
    match status {
        0 => Ok(S::None),
        1 => Ok(S::Active(id)),
        2 => Ok(S::Invalidated(id)),
        other => Err(HalError::Internal(format!(
            "the HIP runtime reports an undocumented hipStreamCaptureStatus {other}"
        ))),
    }
}

/// `hipErrorStreamCaptureUnsupported` (900) to `hipErrorStreamCaptureWrongThread` (908), the
/// capture error codes.
pub const CAPTURE_CODES: std::ops::RangeInclusive<i32> = 900..=908;

/// A HIP error with one of the capture codes as [`unihal_hal::Invalid::Capture`] naming
/// `capture()`; other errors unchanged.
pub fn capture_error(
    e: HalError,
    arg: &'static str,
    capture: &dyn Fn() -> Option<unihal_hal::CaptureId>,
) -> HalError {
    unihal_gpu::graph::vendor_capture_error(LIBRARY, e, arg, capture)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numbering_is_chosen_by_a_valid_warp_size() {
        assert_eq!(Numbering::choose(Ok(64), Err(1)), Ok(Numbering::Rocm5));
        assert_eq!(Numbering::choose(Ok(32), Ok(7)), Ok(Numbering::Rocm5));
        // DTK: 87 refused, 9 answers 64.
        assert_eq!(Numbering::choose(Err(1), Ok(64)), Ok(Numbering::Legacy));
        // An answer that no warp size has is not trusted.
        assert_eq!(Numbering::choose(Ok(1), Ok(64)), Ok(Numbering::Legacy));
        assert!(Numbering::choose(Ok(48), Ok(0)).unwrap_err().contains("87"));
    }

    #[test]
    fn architecture_names_lose_their_features() {
        assert_eq!(arch_of("gfx90a:sramecc+:xnack-").unwrap(), "gfx90a");
        assert_eq!(arch_of("gfx936").unwrap(), "gfx936");
        assert!(arch_of("").is_err());
        assert!(arch_of("sm_80").is_err());
        assert!(arch_of("gfx9/0").is_err());
    }

    #[test]
    fn dcu_architectures_are_hygon() {
        assert_eq!(vendor_of("gfx928", false), "Hygon");
        assert_eq!(vendor_of("gfx906", true), "Hygon");
        assert_eq!(vendor_of("gfx906", false), "AMD");
        assert_eq!(vendor_of("gfx1100", false), "AMD");
    }

    #[test]
    fn versions_decode() {
        assert_eq!(version_string(50221153), "5.2.21153");
        assert_eq!(version_string(60325422), "6.3.25422");
    }
}
