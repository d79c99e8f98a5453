//! The generic GPU backend: [`RuntimeBackend`] implements `unihal_hal::Backend` once over any
//! [`VendorRuntime`], so a vendor backend's `lib.rs` is registration (its name, its runtime's
//! loader and report lines, its collective engine) and nothing else. Also the table of opened
//! devices and the report lines every such backend prints (runtime compiler, collectives).

use crate::device::GpuDevice;
use crate::runtime::Runtime;
use parking_lot::Mutex;
use std::any::Any;
use std::sync::Arc;
use unihal_hal::{
    Backend, BackendInfo, Collectives, Device, DeviceId, HalError, Invalid, LibraryInfo,
    ModuleSource, Result,
};

/// A vendor runtime, loaded: the instance the devices run on and what the backend reports of it.
pub struct Loaded<R: 'static> {
    /// The runtime (one per process).
    pub rt: &'static R,
    /// How many devices it reports (at least one: no device is `Unavailable`).
    pub devices: usize,
    /// The runtime's report line (its kind, name, path and version).
    pub line: LibraryInfo,
    /// What the runtime says of itself through `unihal_dynlib::simulated`.
    pub identity: unihal_dynlib::Identity,
}

/// A collective engine as a backend holds it: opened on first use, reported either way.
/// Thread-safe.
pub trait CollectiveEngine: Send + Sync + 'static {
    /// The engine's report line (the library's path and version, or why it is missing).
    fn info(&self) -> LibraryInfo;
    /// The engine as the backend's collectives, when its library opens (else `None`, logged).
    fn available(&self) -> Option<&dyn Collectives>;
}

impl<L: unihal_ccl::CollectiveLib> CollectiveEngine for unihal_ccl::Engine<L> {
    fn info(&self) -> LibraryInfo {
        match self.lib() {
            Ok(l) => LibraryInfo::found("collectives", self.label(), l.path().into(), l.version()),
            Err(e) => LibraryInfo::missing("collectives", self.label(), e.to_string()),
        }
    }

    fn available(&self) -> Option<&dyn Collectives> {
        match self.lib() {
            Ok(_) => Some(self),
            Err(e) => {
                tracing::info!(target: "unihal::init", "{}: no collectives: {e}", self.label());
                None
            }
        }
    }
}

/// The engine of a backend without a collective library (yet): reported missing with its
/// reason; the backend has no collectives and the suite skips the `ccl.*` cases.
pub struct NoCollectives {
    why: &'static str,
}

impl NoCollectives {
    /// No collectives, for the reason `why` (shown by `unihal devices` and the report).
    pub const fn new(why: &'static str) -> NoCollectives {
        NoCollectives { why }
    }
}

impl CollectiveEngine for NoCollectives {
    fn info(&self) -> LibraryInfo {
        LibraryInfo::missing("collectives", "none", self.why.to_string())
    }

    fn available(&self) -> Option<&dyn Collectives> {
        None
    }
}

/// What a vendor adds to its [`Runtime`] to be a backend: a name, a loader, report lines and a
/// collective engine. Everything else of `unihal_hal::Backend` is [`RuntimeBackend`]'s.
pub trait VendorRuntime: Runtime {
    /// The registry name (`cuda`, `hip`, `ascend`).
    const NAME: &'static str;
    /// The backend's conformance manifest (its `conformance.manifest`).
    const MANIFEST: &'static str;
    /// The collective engine (NCCL-API, HCCL).
    type Ccl: CollectiveEngine;

    /// A collective engine whose library is opened on first use.
    fn collective_engine() -> Self::Ccl;
    /// The runtime, loaded once per process.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] naming every path tried, or the runtime's refusal (no device).
    fn load() -> Result<Loaded<Self>>;
    /// The runtime's report line when [`VendorRuntime::load`] failed with `error` (with the
    /// library that answered, where one did).
    fn missing_line(error: &HalError) -> LibraryInfo;
    /// The report lines of the libraries beside the runtime (compiler, BLAS, operators).
    fn library_lines(loaded: &Loaded<Self>) -> Vec<LibraryInfo>;
    /// Opens device `id`.
    ///
    /// # Errors
    /// The runtime's errors of the device queries.
    fn open_device(loaded: &Loaded<Self>, id: DeviceId) -> Result<Arc<GpuDevice<Self>>>;
    /// The conformance suite's test kernels for `device`, in a format it loads (`None`: the
    /// device loads no module, or they cannot be built here).
    fn test_kernels(device: &GpuDevice<Self>) -> Option<ModuleSource>;
}

/// The `unihal_hal::Backend` of a vendor runtime: devices opened on first use and kept for the
/// backend's life, collectives through the vendor's engine. Thread-safe.
pub struct RuntimeBackend<R: VendorRuntime> {
    devices: Devices<R>,
    ccl: R::Ccl,
}

impl<R: VendorRuntime> Default for RuntimeBackend<R> {
    fn default() -> Self {
        RuntimeBackend {
            devices: Devices::default(),
            ccl: R::collective_engine(),
        }
    }
}

impl<R: VendorRuntime> RuntimeBackend<R> {
    /// A backend that loads the runtime on first probe (and the collective library on first use
    /// of collectives).
    pub fn new() -> Self {
        Self::default()
    }

    /// The collective engine (whether or not its library opened).
    pub fn ccl(&self) -> &R::Ccl {
        &self.ccl
    }
}

impl<R: VendorRuntime> Backend for RuntimeBackend<R> {
    fn name(&self) -> &'static str {
        R::NAME
    }

    fn info(&self) -> BackendInfo {
        let (libraries, identity) = match R::load() {
            Ok(l) => {
                let mut lines = vec![l.line.clone()];
                lines.extend(R::library_lines(&l));
                lines.push(self.ccl.info());
                (lines, l.identity)
            }
            Err(e) => (
                vec![R::missing_line(&e)],
                unihal_dynlib::Identity::default(),
            ),
        };
        BackendInfo {
            name: R::NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            libraries,
            simulated: identity.simulated,
            concurrent: identity.concurrent,
        }
    }

    fn probe(&self) -> Result<usize> {
        Ok(R::load()?.devices)
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        let l = R::load()?;
        self.devices
            .get(R::NAME, ordinal, l.devices, |id| R::open_device(&l, id))
    }

    fn collectives(&self) -> Option<&dyn Collectives> {
        self.ccl.available()
    }

    fn conformance_manifest(&self) -> &'static str {
        R::MANIFEST
    }

    fn test_kernels(&self, device: &dyn Device) -> Option<ModuleSource> {
        R::test_kernels(device.as_any().downcast_ref::<GpuDevice<R>>()?)
    }

    fn as_any(&self) -> &dyn Any {
        self
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
