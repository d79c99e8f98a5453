//! A GPU device over a vendor runtime: memory, the factories for streams, events and modules,
//! the kernel library, peer access and the BLAS handle pool.

use crate::event::GpuEvent;
use crate::graph::CaptureRec;
use crate::library::Library;
use crate::memory::{GpuAllocation, PinnedHost};
use crate::module::GpuModule;
use crate::runtime::{DeviceSetup, Runtime};
use crate::stream::GpuStream;
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashSet;
use std::sync::{Arc, OnceLock, Weak};
use unihal_hal::{
    Buffer, Capabilities, CaptureId, CaptureMode, Device, DeviceId, DeviceInfo, Event, EventFlags,
    HalError, HostBuffer, MemoryInfo, Module, ModuleSource, NativeHandle, Result, Stream,
};

/// The runtime and the device's context: what allocations, streams and events keep alive.
pub struct Core<R: Runtime> {
    /// The vendor runtime.
    pub rt: &'static R,
    /// What makes this device current.
    pub ctx: R::Context,
    /// The device.
    pub id: DeviceId,
}

impl<R: Runtime> Core<R> {
    /// Runs a runtime call with this device current.
    ///
    /// # Errors
    /// `f`'s; [`HalError::InvalidArgument`] from a host callback, where the runtimes forbid
    /// their own calls (a wait there would wait for the callback itself).
    pub fn call<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        crate::deferred::refuse_in_callback(R::VENDOR, what)?;
        self.rt.enter(&self.ctx, what, f)
    }

    /// Runs a release a drop requested (a destroy, unload or free, `what`): makes the device
    /// current and runs `f`. When the device cannot be made current, `f` has not run: it is
    /// queued for the backend's next call ([`crate::deferred::later`]), at most
    /// [`RELEASE_ATTEMPTS`] attempts in all, then left to the runtime with a warning; never
    /// dropped silently. `f`'s own failure is logged (the runtime keeps the object then). Call it
    /// outside host callbacks (from [`crate::deferred::release`]).
    pub fn release(
        self: &Arc<Self>,
        what: &'static str,
        f: impl FnOnce() -> Result<()> + Send + 'static,
    ) {
        release_attempt(self.clone(), what, Box::new(f), 1);
    }
}

/// How often [`Core::release`] tries to make the device current for a release.
pub const RELEASE_ATTEMPTS: u32 = 3;

type ReleaseFn = Box<dyn FnOnce() -> Result<()> + Send>;

fn release_attempt<R: Runtime>(core: Arc<Core<R>>, what: &'static str, f: ReleaseFn, attempt: u32) {
    let mut slot = Some(f);
    let r = core
        .rt
        .enter(&core.ctx, what, || (slot.take().expect("entered once"))());
    match (r, slot) {
        (Ok(()), _) => {}
        (Err(e), None) => {
            tracing::warn!(target: "unihal::device", "{what} failed: {e}; the runtime keeps the object")
        }
        (Err(e), Some(f)) if attempt < RELEASE_ATTEMPTS => {
            tracing::warn!(target: "unihal::device", "{what}: {e}; retried at the next call");
            crate::deferred::later(move || release_attempt(core, what, f, attempt + 1));
        }
        (Err(e), Some(_)) => tracing::warn!(target: "unihal::device",
            "{what}: {e}; given up after {RELEASE_ATTEMPTS} attempts: the object is leaked"),
    }
}

/// One GPU device. Thread-safe: every call makes the device current first, so any host thread
/// may use any device. Owned by its backend (for the process); streams, events, modules and
/// buffers keep what they need of it.
pub struct GpuDevice<R: Runtime> {
    me: Weak<GpuDevice<R>>,
    pub(crate) core: Arc<Core<R>>,
    info: DeviceInfo,
    caps: Capabilities,
    /// The portable kernel library, compiled and loaded on first use.
    library: OnceLock<Result<Arc<Library>>>,
    /// Peers this device has been given access to.
    peers_enabled: Mutex<HashSet<u32>>,
    /// BLAS handles no stream holds.
    pub(crate) blas_pool: Mutex<Vec<R::Blas>>,
    /// The captures begun on this device's streams and not yet ended.
    captures: Mutex<Vec<Arc<CaptureRec>>>,
}

impl<R: Runtime> GpuDevice<R> {
    /// A device from what the backend opened.
    pub fn new(rt: &'static R, setup: DeviceSetup<R::Context>) -> Arc<GpuDevice<R>> {
        let id = setup.info.id;
        Arc::new_cyclic(|me| GpuDevice {
            me: me.clone(),
            core: Arc::new(Core {
                rt,
                ctx: setup.ctx,
                id,
            }),
            info: setup.info,
            caps: setup.caps,
            library: OnceLock::new(),
            peers_enabled: Mutex::new(HashSet::new()),
            blas_pool: Mutex::new(Vec::new()),
            captures: Mutex::new(Vec::new()),
        })
    }

    /// Registers a capture begun on one of this device's streams.
    pub(crate) fn capture_begun(&self, rec: Arc<CaptureRec>) {
        self.captures.lock().push(rec);
    }

    /// Forgets a capture that ended.
    pub(crate) fn capture_ended(&self, rec: &Arc<CaptureRec>) {
        self.captures.lock().retain(|c| !Arc::ptr_eq(c, rec));
    }

    /// The active capture the runtime knows as `vendor`.
    pub(crate) fn capture_by_vendor_id(&self, vendor: u64) -> Option<Arc<CaptureRec>> {
        self.captures
            .lock()
            .iter()
            .find(|c| c.vendor == vendor && c.active())
            .cloned()
    }

    /// The capture a device-wide call concerns (a refused `alloc` or `synchronize`): one in
    /// global mode, else one this thread began, else any active one.
    pub fn active_capture(&self) -> Option<CaptureId> {
        let captures = self.captures.lock();
        let me = std::thread::current().id();
        let active = || captures.iter().filter(|c| c.active());
        active()
            .find(|c| c.mode == CaptureMode::Global)
            .or_else(|| active().find(|c| c.thread == me))
            .or_else(|| active().next())
            .map(|c| c.id)
    }

    /// A capture error of a device-wide call as [`unihal_hal::Invalid::Capture`] naming
    /// [`GpuDevice::active_capture`]; other errors unchanged.
    pub(crate) fn capture_error(&self, e: HalError) -> HalError {
        self.core
            .rt
            .capture_error(e, "device", &|| self.active_capture())
    }

    /// Device memory for the backend's own use (an op's scratch): allocated with the thread's
    /// capture mode relaxed while a capture is active (see [`crate::graph::relaxed`]).
    ///
    /// # Errors
    /// As [`Device::alloc`].
    pub fn alloc_internal(&self, len: usize) -> Result<Buffer> {
        crate::graph::relaxed(self.core.rt, || self.alloc(len))
    }

    /// Pinned host memory for the backend's own use (staging), as [`GpuDevice::alloc_internal`].
    ///
    /// # Errors
    /// As [`Device::alloc_host`].
    pub fn alloc_host_internal(&self, len: usize) -> Result<HostBuffer> {
        crate::graph::relaxed(self.core.rt, || self.alloc_host(len))
    }

    /// The runtime and context.
    pub fn core(&self) -> &Arc<Core<R>> {
        &self.core
    }

    /// The vendor runtime.
    pub fn rt(&self) -> &'static R {
        self.core.rt
    }

    /// This device as an `Arc`.
    ///
    /// # Errors
    /// [`HalError::Internal`] while the device is being dropped.
    pub fn arc(&self) -> Result<Arc<GpuDevice<R>>> {
        self.me.upgrade().ok_or_else(|| {
            HalError::Internal(format!("{} device used while being dropped", R::VENDOR))
        })
    }

    /// Runs a runtime call with this device current (see [`Core::call`]).
    ///
    /// # Errors
    /// As [`Core::call`].
    pub fn call<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.core.call(what, f)
    }

    /// The portable kernel library on this device (compiled or read from the cache on first
    /// use; the first outcome is kept).
    ///
    /// # Errors
    /// As [`Runtime::load_library`].
    pub fn library(&self) -> Result<Arc<Library>> {
        self.library
            .get_or_init(|| self.core.rt.load_library(&self.arc()?).map(Arc::new))
            .clone()
    }

    /// A buffer of `len` bytes from `alloc` (none for zero bytes); `pooled` when `alloc` takes it
    /// from a stream-ordered pool.
    ///
    /// # Errors
    /// [`HalError::OutOfMemory`]; other vendor errors.
    pub fn alloc_with(
        &self,
        what: &str,
        len: usize,
        pooled: bool,
        alloc: impl FnOnce() -> Result<u64>,
    ) -> Result<Buffer> {
        let ptr = if len == 0 { 0 } else { self.call(what, alloc)? };
        Ok(Buffer::from_allocation(GpuAllocation {
            core: self.core.clone(),
            ptr,
            len: len as u64,
            pooled,
            foreign: None,
            graph: None,
        }))
    }

    /// Gives this device access to `peer`'s memory (once per peer), so copies between them go
    /// device to device.
    ///
    /// # Errors
    /// The runtime's.
    pub fn enable_peer(&self, peer: &Core<R>) -> Result<()> {
        let mut enabled = self.peers_enabled.lock();
        if enabled.contains(&peer.id.ordinal) {
            return Ok(());
        }
        self.call("enable peer access", || self.core.rt.enable_peer(&peer.ctx))?;
        enabled.insert(peer.id.ordinal);
        Ok(())
    }
}

impl<R: Runtime> Device for GpuDevice<R> {
    fn id(&self) -> DeviceId {
        self.info.id
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        // Releases a host callback deferred (memory whose last user was a callback) are due:
        // run them first, so the free memory counts them.
        crate::deferred::flush();
        self.call("memory info", || {
            let (free, total) = self.core.rt.mem_info()?;
            Ok(MemoryInfo { total, free })
        })
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        // Capture-unsafe: the runtime refuses it under a capture its mode covers (and
        // invalidates that capture); its capture error names the capture.
        self.alloc_with("alloc", len, false, || self.core.rt.malloc(len))
            .map_err(|e| self.capture_error(e))
    }

    unsafe fn import_memory(&self, addr: u64, len: u64, owner: unihal_hal::Keep) -> Result<Buffer> {
        if addr == 0 && len > 0 {
            return Err(HalError::null_import(len));
        }
        Ok(Buffer::from_allocation(GpuAllocation {
            core: self.core.clone(),
            ptr: addr,
            len,
            pooled: false,
            foreign: Some(owner),
            graph: None,
        }))
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        let ptr = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr()
        } else {
            self.call("alloc host", || {
                let p = self.core.rt.host_alloc(len)?;
                // The runtimes leave pinned memory uninitialised; `HostBuffer::map` shows it to
                // safe code as `&[u8]`, so every backend's host memory is zeroed.
                // SAFETY: `p` is `len` bytes of host-accessible memory just allocated, not yet
                // shared with anything.
                unsafe { std::ptr::write_bytes(p, 0, len) };
                Ok(p)
            })
            // Capture-unsafe as `alloc` is.
            .map_err(|e| self.capture_error(e))?
        };
        Ok(HostBuffer::from_allocation(Box::new(PinnedHost {
            core: self.core.clone(),
            ptr,
            len,
        })))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(GpuStream::new(self.arc()?)?)
    }

    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>> {
        Ok(GpuEvent::new(self.arc()?, flags)?)
    }

    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>> {
        Ok(GpuModule::load(self.arc()?, source)?)
    }

    fn synchronize(&self) -> Result<()> {
        let r = self
            .call("device synchronize", || self.core.rt.device_synchronize())
            .map_err(|e| self.capture_error(e));
        // Every host function has run, a dropped stream's release included: what they freed
        // inside the callback (deferred there) is released now, as a stream synchronize does.
        crate::deferred::flush();
        r
    }

    fn native_handle(&self) -> NativeHandle {
        R::native_device(&self.core.ctx)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
