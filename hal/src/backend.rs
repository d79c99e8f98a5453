//! Backends: one per vendor runtime (or the CPU), found through the [`crate::Registry`].

use crate::device::Device;
use crate::error::Result;
use serde::Serialize;
use std::any::Any;
use std::sync::Arc;

/// A vendor library a backend opened, with where it was found and its version.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LibraryInfo {
    pub name: String,
    pub path: Option<String>,
    pub version: Option<String>,
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

    /// Versions of the backend and of the libraries it has opened so far.
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

    /// Downcast for backend-specific configuration.
    fn as_any(&self) -> &dyn Any;
}
