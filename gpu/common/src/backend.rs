//! What every GPU backend's `Backend` implementation shares: the table of opened devices and the
//! library report lines of its runtime compiler and collective library.

use crate::device::GpuDevice;
use crate::runtime::Runtime;
use parking_lot::Mutex;
use std::sync::Arc;
use unihal_hal::{Device, DeviceId, HalError, Invalid, LibraryInfo, Result};

/// What a GPU backend holds: its devices and its collective engine (a flavor of the NCCL-API
/// engine on this runtime's devices and streams). Thread-safe.
pub struct GpuBackendState<R: Runtime> {
    /// The devices opened so far.
    pub devices: Devices<R>,
    /// The collective engine (its library opened on first use).
    pub ccl: unihal_nccl_api::Engine,
}

impl<R: Runtime> GpuBackendState<R> {
    /// No device open yet; collectives through `flavor` (NCCL, RCCL).
    pub fn new(flavor: unihal_nccl_api::Flavor) -> Self {
        GpuBackendState {
            devices: Devices::default(),
            ccl: unihal_nccl_api::Engine::new(
                flavor,
                std::sync::Arc::new(crate::platform::GpuPlatform::<R>::default()),
            ),
        }
    }
}

/// The devices a backend opened, by ordinal: each opened once, on first use, and kept for the
/// backend's life. Thread-safe.
pub struct Devices<R: Runtime>(Mutex<Vec<Option<Arc<GpuDevice<R>>>>>);

impl<R: Runtime> Default for Devices<R> {
    fn default() -> Self {
        Devices(Mutex::new(Vec::new()))
    }
}

impl<R: Runtime> Devices<R> {
    /// Device `ordinal` of `count` of backend `backend`, opened with `open` the first time.
    ///
    /// # Errors
    /// [`Invalid::Value`] (argument `ordinal`) out of range; `open`'s.
    pub fn get(
        &self,
        backend: &'static str,
        ordinal: usize,
        count: usize,
        open: impl FnOnce(DeviceId) -> Result<Arc<GpuDevice<R>>>,
    ) -> Result<Arc<dyn Device>> {
        if ordinal >= count {
            return Err(HalError::invalid(
                "ordinal",
                Invalid::Value {
                    value: ordinal.to_string(),
                    accepted: format!("0..{count}"),
                },
            ));
        }
        let mut devices = self.0.lock();
        if devices.len() < count {
            devices.resize(count, None);
        }
        if let Some(d) = &devices[ordinal] {
            return Ok(d.clone());
        }
        let d = open(DeviceId {
            backend,
            ordinal: ordinal as u32,
        })?;
        devices[ordinal] = Some(d.clone());
        Ok(d)
    }
}

/// The report line of a runtime compiler (NVRTC, hiprtc): its path and `(major, minor)`, or why
/// it is missing (then the devices run no library ops).
pub fn compiler_info(name: &str, found: Result<(String, (i32, i32))>) -> LibraryInfo {
    match found {
        Ok((path, (major, minor))) => LibraryInfo::found(
            "runtime compiler",
            name,
            path,
            Some(format!("{major}.{minor}")),
        ),
        Err(e) => LibraryInfo::missing(
            "runtime compiler",
            name,
            format!("{e} (without it the devices run no library ops)"),
        ),
    }
}

/// The report line of the collective library an NCCL-API engine opened (or why not).
pub fn collectives_info(engine: &unihal_nccl_api::Engine, name: &str) -> LibraryInfo {
    match engine.lib() {
        Ok(l) => LibraryInfo::found(
            "collectives",
            name,
            l.path.clone(),
            Some(l.version_string()),
        ),
        Err(e) => LibraryInfo::missing("collectives", name, e.to_string()),
    }
}

/// The engine as the backend's collectives when its library opens (else `None`, logged).
pub fn collectives<'a>(
    engine: &'a unihal_nccl_api::Engine,
    backend: &str,
) -> Option<&'a dyn unihal_hal::Collectives> {
    match engine.lib() {
        Ok(_) => Some(engine),
        Err(e) => {
            tracing::info!(target: "unihal::gpu", "{backend}: no collectives: {e}");
            None
        }
    }
}
