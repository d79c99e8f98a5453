//! Opening the CUDA driver at run time, without ever letting cudarc panic across unihal.
//!
//! cudarc (with `dynamic-loading`) opens `libcuda.so` on its first call and *panics* when no
//! candidate name opens, or lazily when a symbol is missing. So: an optional override
//! (`UNIHAL_CUDA_LIB=/path/to/libcuda.so*`) is `dlopen`ed first and kept open, which makes the
//! system loader hand that copy to cudarc (its SONAME matches a name cudarc asks for); then
//! `is_culib_present()` probes without panicking; then `cuInit`. Every later driver call runs under
//! `guard`, which turns a panic (a symbol missing from an old driver) into
//! [`HalError::Unavailable`].

use crate::conv::vendor;
use std::sync::OnceLock;
use unihal_dynlib::{Candidates, Library};
use unihal_hal::{HalError, Result};

/// The opened driver.
pub(crate) struct Driver {
    /// Where it came from: the override path, or the loader's search.
    pub path: String,
    /// `cuDriverGetVersion` (e.g. 13000).
    pub version: i32,
    /// Devices reported by `cuDeviceGetCount`.
    pub devices: usize,
    /// Whether it is unihal's simulated driver ([`unihal_dynlib::Library::identity`] of the file
    /// `cuInit` lives in).
    pub identity: unihal_dynlib::Identity,
}

/// Runs a cudarc call, turning a panic into `Unavailable` (cudarc panics on missing symbols).
pub(crate) fn guard<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = unihal_hal::panic_message(&*p).unwrap_or_else(|| "panic".into());
        Err(HalError::Unavailable {
            what: format!("CUDA driver ({what})"),
            reason: msg,
        })
    })
}

fn unavailable(reason: String) -> HalError {
    HalError::Unavailable {
        what: "CUDA driver".into(),
        reason,
    }
}

fn open() -> Result<Driver> {
    // The override alone (cudarc searches the loader's names itself): opened first and never
    // unloaded, so cudarc's `libcuda.so` resolves to this copy.
    let over = Candidates::new("CUDA driver", "UNIHAL_CUDA_LIB", &[]);
    let path = match over.to_try().first() {
        Some(_) => {
            let lib = Library::open(&over)?;
            // A loadable library that is no CUDA driver (another vendor's, libc) is named as
            // such, not reported as "no driver found".
            // SAFETY: the symbol's presence is checked; it is not called.
            if let Err(e) = unsafe { lib.get::<unsafe extern "C" fn(u32) -> i32>("cuInit") } {
                return Err(unavailable(format!(
                    "UNIHAL_CUDA_LIB names {}, which is not a CUDA driver ({e})",
                    lib.path()
                )));
            }
            lib.path().to_string()
        }
        None => "libcuda.so (system loader)".to_string(),
    };
    // SAFETY: probes the library names with dlopen/dlclose; no symbol is called.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(unavailable(if over.to_try().is_empty() {
            // cudarc's list repeats some names: each is tried, and reported, once.
            let mut names = cudarc::get_lib_name_candidates("cuda");
            let mut seen = std::collections::HashSet::new();
            names.retain(|n| seen.insert(n.clone()));
            format!(
                "no CUDA driver library found, tried {} (set UNIHAL_CUDA_LIB to a path to choose \
                 one)",
                names.join("; ")
            )
        } else {
            format!(
                "UNIHAL_CUDA_LIB names {path}, which exports cuInit but is not found under a \
                 driver's name ({:?}): its SONAME must be one of them",
                cudarc::get_lib_name_candidates("cuda")
            )
        }));
    }
    guard("cuInit", || {
        crate::ffi::result::init().map_err(|e| match vendor("cuInit", e) {
            HalError::Vendor { name, code, .. } => {
                unavailable(format!("cuInit failed with {name} ({code}): no usable GPU"))
            }
            other => other,
        })?;
        let mut version = 0;
        // SAFETY: an out-pointer to a local.
        unsafe { crate::ffi::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| vendor("cuDriverGetVersion", e))?;
        let count =
            crate::ffi::result::device::get_count().map_err(|e| vendor("cuDeviceGetCount", e))?;
        if count <= 0 {
            return Err(unavailable("the driver reports no CUDA device".into()));
        }
        let name = crate::ffi::result::device::get(0)
            .and_then(crate::ffi::result::device::get_name)
            .map_err(|e| vendor("cuDeviceGetName", e))?;
        let file = crate::ffi::driver_file();
        if let Some(why) = hygon_dcu(&name, file.as_deref()) {
            return Err(unavailable(why));
        }
        Ok(Driver {
            path,
            version,
            devices: count as usize,
            identity: file
                .as_deref()
                .and_then(|f| Library::of_file("CUDA driver", f).ok())
                .map(|l| l.identity())
                .unwrap_or_default(),
        })
    })
}

/// Why a "CUDA driver" is really Hygon DTK's CUDA-compatible layer over a DCU (DTK ships
/// CUDA-named libraries), which this backend must not claim: the `hip` backend runs DCUs.
/// `None` for an NVIDIA driver.
pub(crate) fn hygon_dcu(device_name: &str, driver_file: Option<&str>) -> Option<String> {
    let lower = device_name.to_ascii_lowercase();
    let by_name = lower.contains("hygon") || lower.contains("dcu");
    let by_file = driver_file.is_some_and(|f| f.contains("/dtk") || f.contains("galaxyhip"));
    (by_name || by_file).then(|| {
        format!(
            "device 0 ({device_name}) is a Hygon DCU behind DTK's CUDA-compatible library ({}): \
             the CUDA backend does not claim it; use the hip backend",
            driver_file.unwrap_or("driver file unknown")
        )
    })
}

/// The driver, opened once per process.
///
/// # Errors
/// [`HalError::Unavailable`] with what was tried and why it failed (also on later calls).
pub(crate) fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
    DRIVER.get_or_init(open).as_ref().map_err(Clone::clone)
}

/// True when cuBLAS can be opened (checked once, without panicking).
pub fn cublas_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: probes the library names with dlopen/dlclose; no symbol is called.
        std::panic::catch_unwind(|| unsafe { cudarc::cublas::sys::is_culib_present() })
            .unwrap_or(false)
    })
}

/// NVRTC, opened once per process (devices ask whether it is there; the kernel library compiles
/// with it).
///
/// # Errors
/// [`HalError::Unavailable`] with the names tried (the first outcome is kept).
pub fn nvrtc() -> Result<&'static unihal_kernels::rtc::nvrtc::Nvrtc> {
    static NVRTC: OnceLock<Result<unihal_kernels::rtc::nvrtc::Nvrtc>> = OnceLock::new();
    NVRTC
        .get_or_init(unihal_kernels::rtc::nvrtc::Nvrtc::load)
        .as_ref()
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hygon_dcu_is_not_claimed() {
        use super::hygon_dcu;
        assert!(hygon_dcu(
            "NVIDIA H200",
            Some("/usr/lib/x86_64-linux-gnu/libcuda.so.580")
        )
        .is_none());
        assert!(hygon_dcu("unihal simulated CUDA device 0 (not a GPU)", None).is_none());
        let why = hygon_dcu(
            "DCU K100_AI",
            Some("/opt/dtk/cuda/cuda-12/lib64/libcuda.so"),
        )
        .unwrap();
        assert!(
            why.contains("hip backend") && why.contains("/opt/dtk"),
            "{why}"
        );
        assert!(hygon_dcu("Some GPU", Some("/opt/dtk-24.04/lib/libcuda.so.1")).is_some());
        assert!(hygon_dcu("Hygon Z100L", None).is_some());
    }
}
