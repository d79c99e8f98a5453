//! The wrapped backend and its devices.

use crate::ccl::LayerCollectives;
use crate::layer::Layer;
use crate::stream::{LayerEvent, LayerStream};
use crate::validate::finding::Finding;
use crate::validate::tracker::Space;
use crate::{Mode, Observers};
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
pub struct LayerBackend {
    inner: Arc<dyn Backend>,
    layer: Arc<Layer>,
    ccl: LayerCollectives,
}

impl LayerBackend {
    pub(crate) fn new(inner: Arc<dyn Backend>, observers: Observers) -> Arc<LayerBackend> {
        let layer = Arc::new(Layer::new(observers.validate, observers.trace));
        if layer.mode.is_some() {
            let observer: Arc<dyn unihal_hal::MapObserver> = layer.clone();
            unihal_hal::observe_maps(Arc::downgrade(&observer));
        }
        Arc::new(LayerBackend {
            ccl: LayerCollectives::new(inner.clone(), layer.clone()),
            inner,
            layer,
        })
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }

    /// The mode findings are handled in; `None` when not validating.
    pub fn mode(&self) -> Option<Mode> {
        self.layer.mode
    }

    /// The trace recorded into, if any.
    pub fn trace(&self) -> Option<&Arc<crate::Trace>> {
        self.layer.trace.as_ref()
    }

    /// Every finding so far (kept until [`LayerBackend::take_findings`]).
    pub fn findings(&self) -> Vec<Finding> {
        self.layer.findings()
    }

    /// Every finding so far, forgetting them.
    pub fn take_findings(&self) -> Vec<Finding> {
        self.layer.take_findings()
    }
}

impl Backend for LayerBackend {
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
        let pid = layer
            .trace
            .as_ref()
            .map(|t| t.pid(inner.id(), &inner.info().name));
        let device: Arc<LayerDevice> = Arc::new_cyclic(|me| LayerDevice {
            inner,
            layer,
            pid,
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

/// The backend's device behind `device` if the layer wrapped it, as an `Arc`.
pub(crate) fn inner_device(device: &Arc<dyn Device>) -> Arc<dyn Device> {
    match device.as_any().downcast_ref::<LayerDevice>() {
        Some(v) => v.inner.clone(),
        None => device.clone(),
    }
}

/// The backend's device behind `device` if the layer wrapped it.
pub(crate) fn unwrap_device(device: &dyn Device) -> &dyn Device {
    match device.as_any().downcast_ref::<LayerDevice>() {
        Some(v) => v.inner.as_ref(),
        None => device,
    }
}

/// A device of a [`LayerBackend`].
///
/// Ownership: owns the backend's device; its streams keep it alive. Thread safety: any thread.
pub struct LayerDevice {
    inner: Arc<dyn Device>,
    layer: Arc<Layer>,
    /// The device's process in the trace, when tracing.
    pid: Option<u32>,
    me: Weak<LayerDevice>,
}

impl LayerDevice {
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

impl Device for LayerDevice {
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
        let b = self
            .layer
            .host(self.pid, "alloc", || self.inner.alloc(len))?;
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
        Ok(Arc::new(LayerStream::new(
            inner,
            self.me(),
            self.layer.clone(),
            self.pid,
        )))
    }

    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>> {
        let inner = self.inner.create_event(flags)?;
        Ok(Arc::new(LayerEvent::new(inner, self.layer.clone())))
    }

    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>> {
        self.inner.load_module(source)
    }

    fn synchronize(&self) -> Result<()> {
        // As a stream's: it returns once the work completed, also with a sticky error.
        let captured = self.layer.tracker.lock().device_snapshot(self.id());
        let r = self
            .layer
            .host(self.pid, "device synchronize", || self.inner.synchronize());
        if !crate::stream::refused_by_capture(&r) {
            self.layer.tracker.lock().host_learns(&captured);
        }
        r
    }

    fn native_handle(&self) -> NativeHandle {
        self.inner.native_handle()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
