//! Opening the HIP runtime at run time: AMD ROCm's `libamdhip64` or Hygon DTK's
//! `libgalaxyhip`, never unloaded.
//!
//! Where ([`candidates`]): `UNIHAL_HIP_LIB` alone when set; else `libamdhip64.so.6`, `.so.5`,
//! `.so` and `libgalaxyhip.so.5` through the system loader, then the same under `ROCM_PATH` or
//! `HIP_PATH` (default `/opt/rocm`: `lib/`, `hip/lib/`) and under `DTKROOT` (default `/opt/dtk`:
//! `hip/lib/libgalaxyhip.so.5`, `lib/libgalaxyhip.so.5`). Which runtime it is comes from the
//! file `hipInit` really lives in (a `libamdhip64.so` name on DTK may be a link to
//! libgalaxyhip). `hipInit` failing with `hipErrorInvalidDevice` (101, what ROCm does on a
//! machine without a GPU) or `hipErrorNoDevice` (100), or no device counted, is
//! [`HalError::Unavailable`] "no device", naming the library found.
//!
//! The attribute numbering ([`crate::conv::Numbering`]) is chosen by probing device 0, never by
//! the version (DTK reports HIP 6.x and keeps the older numbering).

use crate::conv::{codes, error_name, vendor, version_string, Numbering};
use crate::ffi::{HipApi, RocblasApi};
use std::sync::OnceLock;
use unihal_dynlib::{mapped_file, Candidates, Library};
use unihal_hal::{HalError, Result};

/// Library names of the HIP runtime, in order (ROCm, then Hygon DTK's).
pub const NAMES: [&str; 5] = [
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
    "libgalaxyhip.so.5",
    "libgalaxyhip.so",
];

/// Where the HIP runtime is looked for.
pub fn candidates() -> Candidates {
    Candidates::new("HIP runtime", "UNIHAL_HIP_LIB", &NAMES)
        .under_root(
            &["ROCM_PATH", "HIP_PATH"],
            Some("/opt/rocm"),
            "lib",
            &NAMES[..3],
        )
        .under_root(
            &["ROCM_PATH", "HIP_PATH"],
            Some("/opt/rocm"),
            "hip/lib",
            &NAMES[..3],
        )
        .under_root(
            &["DTKROOT"],
            Some("/opt/dtk"),
            "hip/lib",
            &["libgalaxyhip.so.5"],
        )
        .under_root(
            &["DTKROOT"],
            Some("/opt/dtk"),
            "lib",
            &["libgalaxyhip.so.5"],
        )
}

/// The opened HIP runtime: its symbol table and what the probe found. One per process
/// ([`runtime`]); `Send + Sync` (function pointers and plain values).
pub struct Hip {
    /// The symbol table.
    pub api: HipApi,
    /// The name or path it was opened from.
    pub path: String,
    /// The file `hipInit` lives in, when the process maps it (what the path really is).
    pub file: Option<String>,
    /// `hipRuntimeGetVersion`.
    pub version: i32,
    /// Devices reported by `hipGetDeviceCount`.
    pub devices: usize,
    /// True for Hygon DTK's runtime.
    pub dtk: bool,
    /// The attribute numbering this runtime speaks.
    pub numbering: Numbering,
    /// Whether it is unihal's simulated runtime ([`unihal_dynlib::Library::identity`]).
    pub identity: unihal_dynlib::Identity,
}

impl Hip {
    /// "HIP 5.2.21153 (libamdhip64.so.5)" for messages.
    pub fn describe(&self) -> String {
        format!("HIP {} ({})", version_string(self.version), self.path)
    }
}

fn unavailable(reason: String) -> HalError {
    HalError::Unavailable {
        what: "HIP runtime".into(),
        reason,
    }
}

/// True when `file` is Hygon DTK's runtime.
pub fn is_dtk(file: &str) -> bool {
    file.contains("galaxyhip") || file.contains("/dtk")
}

fn open() -> Result<Hip> {
    let lib = Library::open(&candidates())?;
    let api = HipApi::new(&lib)?;
    let path = lib.path().to_string();
    let file = mapped_file(api.init as usize);
    let dtk = is_dtk(&path) || file.as_deref().is_some_and(is_dtk);
    let mut version = 0;
    // SAFETY: an out-pointer to a local.
    let rc = unsafe { (api.runtime_get_version)(&mut version) };
    if rc != 0 {
        let name = error_name(&api, rc);
        return Err(unavailable(format!(
            "hipRuntimeGetVersion failed with {name} ({rc}) ({path})"
        )));
    }
    let _ = FOUND.set((file.clone().unwrap_or_else(|| path.clone()), version));
    let at = format!("HIP {} from {path}", version_string(version));
    let no_device = |call: &str, rc: i32| {
        let name = error_name(&api, rc);
        unavailable(format!(
            "no device: {call} failed with {name} ({rc}) ({at})"
        ))
    };
    // SAFETY: flags must be 0.
    let rc = unsafe { (api.init)(0) };
    if rc == codes::NO_DEVICE || rc == codes::INVALID_DEVICE {
        return Err(no_device("hipInit", rc));
    }
    if rc != 0 {
        let name = error_name(&api, rc);
        return Err(unavailable(format!(
            "hipInit failed with {name} ({rc}) ({at})"
        )));
    }
    let mut count = 0;
    // SAFETY: an out-pointer to a local.
    let rc = unsafe { (api.get_device_count)(&mut count) };
    if rc == codes::NO_DEVICE || rc == codes::INVALID_DEVICE {
        return Err(no_device("hipGetDeviceCount", rc));
    }
    if rc != 0 {
        return Err(vendor(&api, "hipGetDeviceCount", rc));
    }
    if count <= 0 {
        return Err(unavailable(format!(
            "no device: the runtime counts none ({at})"
        )));
    }
    let attribute = |a: i32| {
        let mut v = 0;
        // SAFETY: an out-pointer to a local and a valid device.
        match unsafe { (api.device_get_attribute)(&mut v, a, 0) } {
            0 => Ok(v),
            rc => Err(rc),
        }
    };
    let numbering = Numbering::choose(
        attribute(Numbering::Rocm5.attributes().warp_size),
        attribute(Numbering::Legacy.attributes().warp_size),
    )
    .map_err(|e| unavailable(format!("{e} ({at})")))?;
    tracing::info!(target: "unihal::init", "{at}: {count} device(s), {numbering:?} attribute numbering{}", if dtk { ", Hygon DTK" } else { "" });
    Ok(Hip {
        api,
        path,
        file,
        version,
        devices: count as usize,
        dtk,
        numbering,
        identity: lib.identity(),
    })
}

/// The name of device `ordinal` (`hipDeviceGetName`).
///
/// # Errors
/// The runtime's error.
pub fn device_name(api: &HipApi, ordinal: i32) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: a buffer of the length passed.
    let rc = unsafe { (api.device_get_name)(buf.as_mut_ptr(), buf.len() as i32, ordinal) };
    if rc != 0 {
        return Err(vendor(api, "hipDeviceGetName", rc));
    }
    buf[255] = 0;
    // SAFETY: NUL-terminated within the buffer (the last byte was forced to NUL).
    Ok(unsafe { unihal_dynlib::c_str(buf.as_ptr()) })
}

/// The runtime library that loaded (its file and `hipRuntimeGetVersion`), whether or not it has
/// a device.
static FOUND: OnceLock<(String, i32)> = OnceLock::new();

/// The runtime library found by [`runtime`], also when it reported no device.
pub fn found() -> Option<&'static (String, i32)> {
    let _ = runtime();
    FOUND.get()
}

/// The runtime, opened once per process.
///
/// # Errors
/// [`HalError::Unavailable`] with what was tried and why it failed (also on later calls).
pub fn runtime() -> Result<&'static Hip> {
    static RUNTIME: OnceLock<Result<Hip>> = OnceLock::new();
    RUNTIME.get_or_init(open).as_ref().map_err(Clone::clone)
}

/// Where rocBLAS is looked for.
pub fn rocblas_candidates() -> Candidates {
    const NAMES: [&str; 3] = ["librocblas.so.4", "librocblas.so.0", "librocblas.so"];
    Candidates::new("rocBLAS", "UNIHAL_ROCBLAS_LIB", &NAMES)
        .under_root(&["ROCM_PATH"], Some("/opt/rocm"), "lib", &NAMES)
        .under_root(&["DTKROOT"], Some("/opt/dtk"), "lib", &NAMES)
        .under_root(&["DTKROOT"], Some("/opt/dtk"), "rocblas/lib", &NAMES)
}

/// rocBLAS, opened once per process.
///
/// # Errors
/// [`HalError::Unavailable`] with the names tried (the first outcome is kept).
pub fn rocblas() -> Result<&'static (RocblasApi, String)> {
    static ROCBLAS: OnceLock<Result<(RocblasApi, String)>> = OnceLock::new();
    ROCBLAS
        .get_or_init(|| {
            let lib = Library::open(&rocblas_candidates())?;
            Ok((RocblasApi::new(&lib)?, lib.path().to_string()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// rocBLAS's version string (`rocblas_get_version_string`), when it has one.
pub fn rocblas_version(api: &RocblasApi) -> Option<String> {
    let f = api.get_version_string?;
    let mut buf = [0 as std::ffi::c_char; 128];
    // SAFETY: a buffer of the length passed.
    if unsafe { f(buf.as_mut_ptr(), buf.len()) } != 0 {
        return None;
    }
    buf[127] = 0;
    // SAFETY: NUL-terminated within the buffer (the last byte was forced to NUL).
    Some(unsafe { unihal_dynlib::c_str(buf.as_ptr()) })
}

/// hiprtc, opened once per process (devices ask whether it is there; the kernel library and the
/// suite's test kernels compile with it).
///
/// # Errors
/// [`HalError::Unavailable`] with the names tried (the first outcome is kept).
pub fn hiprtc() -> Result<&'static unihal_kernels::rtc::hiprtc::Hiprtc> {
    static HIPRTC: OnceLock<Result<unihal_kernels::rtc::hiprtc::Hiprtc>> = OnceLock::new();
    HIPRTC
        .get_or_init(unihal_kernels::rtc::hiprtc::Hiprtc::load)
        .as_ref()
        .map_err(Clone::clone)
}
