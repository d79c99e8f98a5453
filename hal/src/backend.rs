//! Backends: one per vendor runtime (or the CPU), found through the [`crate::Registry`].

use crate::device::Device;
use crate::error::Result;
use serde::Serialize;
use std::any::Any;
use std::sync::Arc;

/// A vendor library a backend uses: where it was found and its version, or why it was not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LibraryInfo {
    /// What it does for the backend: "driver", "runtime compiler", "collectives", "BLAS".
    pub role: String,
    /// The library ("CUDA driver", "NVRTC", "NCCL", "cuBLAS").
    pub name: String,
    /// Where it was found (None when not found).
    pub path: Option<String>,
    pub version: Option<String>,
    /// Why it is not usable: every path tried with the loader's message (None when found).
    pub error: Option<String>,
}

impl LibraryInfo {
    /// A library that was found.
    pub fn found(role: &str, name: &str, path: String, version: Option<String>) -> LibraryInfo {
        LibraryInfo {
            role: role.into(),
            name: name.into(),
            path: Some(path),
            version,
            error: None,
        }
    }

    /// A library that was not found or does not work, and why.
    pub fn missing(role: &str, name: &str, error: String) -> LibraryInfo {
        LibraryInfo {
            role: role.into(),
            name: name.into(),
            path: None,
            version: None,
            error: Some(error),
        }
    }
}

/// Versions of a backend and the vendor libraries behind it, for reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendInfo {
    pub name: String,
    pub version: String,
    pub libraries: Vec<LibraryInfo>,
    /// True when the backend runs on a simulated vendor runtime, not real hardware.
    pub simulated: bool,
    /// Device work runs while the host goes on (hardware, the CPU backend, a simulated runtime
    /// in its concurrent mode); false for a simulated runtime that runs work only at
    /// synchronisation points.
    pub concurrent: bool,
}

/// A device driver: opens the vendor runtime lazily and hands out devices.
///
/// Ownership: `Arc<dyn Backend>`, owned by the registry. Thread safety: any thread.
pub trait Backend: Send + Sync {
    /// Registry name (`cpu`, `cuda`, `hip`, `ascend`).
    fn name(&self) -> &'static str;

    /// Versions of the backend and of every vendor library it uses (opening them to report
    /// them; a library not found is listed with the paths tried and why).
    fn info(&self) -> BackendInfo;

    /// Loads the vendor libraries if needed and counts devices.
    ///
    /// # Errors
    /// [`crate::HalError::Unavailable`] with every library path tried and the loader's message, or
    /// when the runtime reports no device. Never panics, never "0 devices".
    fn probe(&self) -> Result<usize>;

    /// Opens device `ordinal`; every call for the same ordinal returns the same device.
    ///
    /// # Errors
    /// [`crate::HalError::Unavailable`] when the backend is unavailable;
    /// [`crate::HalError::InvalidArgument`] for an ordinal out of range.
    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>>;

    /// The backend's collective engine, if it has one.
    fn collectives(&self) -> Option<&dyn crate::ccl::Collectives> {
        None
    }

    /// The backend's conformance manifest: lines `<unsupported|xfail> <case id or prefix.*>
    /// <reason>` that the conformance suite applies to it (empty: every case must pass). The
    /// backend ships it; the suite names no backend.
    fn conformance_manifest(&self) -> &'static str {
        ""
    }

    /// The conformance suite's test kernels (`unihal_kernels::testing`) in a format `device`
    /// loads, or None when the backend has none (the kernel cases then skip with the reason).
    fn test_kernels(&self, device: &dyn Device) -> Option<crate::module::ModuleSource> {
        let _ = device;
        None
    }

    /// Downcast for backend-specific configuration.
    fn as_any(&self) -> &dyn Any;
}
