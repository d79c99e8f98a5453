//! The wrapped backend and its devices.

use crate::ccl::ValidatingCollectives;
use crate::finding::Finding;
use crate::layer::Layer;
use crate::stream::{ValidatingEvent, ValidatingStream};
use crate::tracker::Space;
use crate::Mode;
use std::any::Any;
use std::sync::{Arc, Weak};
use unihal_hal::{
    Backend, BackendInfo, Buffer, Capabilities, Collectives, Device, DeviceId, DeviceInfo, Event,
    EventFlags, HostBuffer, Keep, MemoryInfo, Module, ModuleSource, NativeHandle, Result, Stream,
};

/// A new allocation through the layer: the history of the memory it reuses is over.
pub(crate) fn allocated(layer: &Layer, b: &Buffer) {
    let base = b.device_addr().wrapping_sub(b.offset());
    layer.tracker.lock().allocated(
        Space::Device(b.device()),
        base,
        b.offset().saturating_add(b.len()),
    );
}

/// A backend wrapped in the validation layer (see the crate docs).
///
/// Ownership: owns the backend. Thread safety: as the backend's.
pub struct ValidatingBackend {
    inner: Arc<dyn Backend>,
    layer: Arc<Layer>,
    ccl: ValidatingCollectives,
}

impl ValidatingBackend {
    pub(crate) fn new(inner: Arc<dyn Backend>, mode: Mode) -> Arc<ValidatingBackend> {
        let layer = Arc::new(Layer::new(mode));
        let observer: Arc<dyn unihal_hal::MapObserver> = layer.clone();
        unihal_hal::observe_maps(Arc::downgrade(&observer));
        Arc::new(ValidatingBackend {
            ccl: ValidatingCollectives::new(inner.clone(), layer.clone()),
            inner,
            layer,
        })
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// The mode findings are handled in.
    pub fn mode(&self) -> Mode {
        self.layer.mode
    }

    /// Every finding so far (kept until [`ValidatingBackend::take_findings`]).
    pub fn findings(&self) -> Vec<Finding> {
        self.layer.findings()
    }

    /// Every finding so far, forgetting them.
    pub fn take_findings(&self) -> Vec<Finding> {
        self.layer.take_findings()
    }
}

impl Backend for ValidatingBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn info(&self) -> BackendInfo {
        self.inner.info()
    }

    fn probe(&self) -> Result<usize> {
        self.inner.probe()
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        let inner = self.inner.open(ordinal)?;
        let layer = self.layer.clone();
        let device: Arc<ValidatingDevice> = Arc::new_cyclic(|me| ValidatingDevice {
            inner,
            layer,
            me: me.clone(),
        });
        Ok(device)
    }

    fn collectives(&self) -> Option<&dyn Collectives> {
        self.inner
            .collectives()
            .map(|_| &self.ccl as &dyn Collectives)
    }

    fn conformance_manifest(&self) -> &'static str {
        self.inner.conformance_manifest()
    }

    fn test_kernels(&self, device: &dyn Device) -> Option<ModuleSource> {
        self.inner.test_kernels(unwrap_device(device))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The backend's device behind `device` if the layer wrapped it.
pub(crate) fn unwrap_device(device: &dyn Device) -> &dyn Device {
    match device.as_any().downcast_ref::<ValidatingDevice>() {
        Some(v) => v.inner.as_ref(),
        None => device,
    }
}

/// A device of a [`ValidatingBackend`].
///
/// Ownership: owns the backend's device; its streams keep it alive. Thread safety: any thread.
pub struct ValidatingDevice {
    inner: Arc<dyn Device>,
    layer: Arc<Layer>,
    me: Weak<ValidatingDevice>,
}

impl ValidatingDevice {
    /// The backend's device.
    pub fn inner(&self) -> &Arc<dyn Device> {
        &self.inner
    }

    pub(crate) fn layer(&self) -> &Arc<Layer> {
        &self.layer
    }

    fn me(&self) -> Arc<dyn Device> {
        self.me
            .upgrade()
            .expect("a device method runs while a handle to it exists")
    }
}

impl Device for ValidatingDevice {
    fn id(&self) -> DeviceId {
        self.inner.id()
    }

    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    fn memory_info(&self) -> Result<MemoryInfo> {
        self.inner.memory_info()
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        let b = self.inner.alloc(len)?;
        allocated(&self.layer, &b);
        Ok(b)
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        let b = self.inner.alloc_host(len)?;
        self.layer
            .tracker
            .lock()
            .allocated(Space::Host, b.host_addr() as u64, b.len() as u64);
        Ok(b)
    }

    unsafe fn import_memory(&self, addr: u64, len: u64, owner: Keep) -> Result<Buffer> {
        // SAFETY: the caller's promise about `addr..addr+len` is passed on unchanged.
        let b = unsafe { self.inner.import_memory(addr, len, owner) }?;
        allocated(&self.layer, &b);
        Ok(b)
    }

    fn block_handed_out(&self, block: &Buffer, stream: &Arc<dyn Stream>) {
        let t = crate::stream::device_touch("block", block, 0, block.len(), true);
        self.layer.tracker.lock().handed_out(
            t.space,
            t.base,
            (t.start, t.end),
            stream.stream_id().get(),
        );
        self.inner.block_handed_out(block, stream);
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        let inner = self.inner.create_stream()?;
        Ok(Arc::new(ValidatingStream::new(
            inner,
            self.me(),
            self.layer.clone(),
        )))
    }

    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>> {
        let inner = self.inner.create_event(flags)?;
        Ok(Arc::new(ValidatingEvent::new(inner, self.layer.clone())))
    }

    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>> {
        self.inner.load_module(source)
    }

    fn synchronize(&self) -> Result<()> {
        // As a stream's: it returns once the work completed, also with a sticky error.
        let captured = self.layer.tracker.lock().device_snapshot(self.id());
        let r = self.inner.synchronize();
        self.layer.tracker.lock().host_learns(&captured);
        r
    }

    fn native_handle(&self) -> NativeHandle {
        self.inner.native_handle()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
