//! The random-op cases as a device with its own generator (`OptionalCaps::bitwise_rng` false)
//! meets them: the CPU backend's devices behind a wrapper that withdraws the claim, so only the
//! statistical checks, reproducibility and seed/offset sensitivity apply, must pass on a correct
//! generator.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use unihal_conformance::manifest::Manifest;
use unihal_conformance::report::Outcome;
use unihal_conformance::runner::{run_case, RunOptions, Target};
use unihal_cpu::{CpuBackend, CpuConfig};
use unihal_hal::{
    Backend, BackendInfo, Buffer, Capabilities, Device, DeviceId, DeviceInfo, Event, EventFlags,
    HostBuffer, Keep, MemoryInfo, Module, ModuleSource, NativeHandle, Result, Stream,
};

/// A device that delegates everything but claims no bitwise generator.
struct OwnGenerator {
    inner: Arc<dyn Device>,
    caps: Capabilities,
}

impl Device for OwnGenerator {
    fn id(&self) -> DeviceId {
        self.inner.id()
    }
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }
    fn memory_info(&self) -> Result<MemoryInfo> {
        self.inner.memory_info()
    }
    fn alloc(&self, len: usize) -> Result<Buffer> {
        self.inner.alloc(len)
    }
    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        self.inner.alloc_host(len)
    }
    unsafe fn import_memory(&self, addr: u64, len: u64, owner: Keep) -> Result<Buffer> {
        // SAFETY: the caller upholds `import_memory`'s contract, which is the inner device's.
        unsafe { self.inner.import_memory(addr, len, owner) }
    }
    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        self.inner.create_stream()
    }
    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>> {
        self.inner.create_event(flags)
    }
    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>> {
        self.inner.load_module(source)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn native_handle(&self) -> NativeHandle {
        self.inner.native_handle()
    }
    fn as_any(&self) -> &dyn Any {
        self.inner.as_any()
    }
}

struct OwnGeneratorBackend {
    inner: CpuBackend,
    devices: Mutex<HashMap<usize, Arc<dyn Device>>>,
}

impl Backend for OwnGeneratorBackend {
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
        let mut devices = self.devices.lock().unwrap();
        if let Some(d) = devices.get(&ordinal) {
            return Ok(d.clone());
        }
        let inner = self.inner.open(ordinal)?;
        let mut caps = inner.capabilities().clone();
        caps.optional.bitwise_rng = false;
        let d: Arc<dyn Device> = Arc::new(OwnGenerator { inner, caps });
        devices.insert(ordinal, d.clone());
        Ok(d)
    }
    fn test_kernels(&self, device: &dyn Device) -> Option<ModuleSource> {
        self.inner.test_kernels(device)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn random_cases_pass_on_statistics_alone() {
    let config = CpuConfig::from_values(Some("1"), Some("1G"), Some("2")).unwrap();
    let backend: Arc<dyn Backend> = Arc::new(OwnGeneratorBackend {
        inner: CpuBackend::with_config(config),
        devices: Mutex::new(HashMap::new()),
    });
    let device = backend.open(0).unwrap();
    assert!(!device.capabilities().optional.bitwise_rng);
    let t = Target {
        device,
        backend,
        manifest: Manifest::default(),
        world: None,
    };
    let cases: Vec<_> = unihal_conformance::cases::all()
        .into_iter()
        .filter(|c| c.id.starts_with("ops.random_") || c.id.starts_with("ops.dropout."))
        .collect();
    assert_eq!(cases.len(), 12);
    let mut bad = Vec::new();
    for c in &cases {
        let r = run_case(c, &t, &RunOptions::default());
        if r.outcome != Outcome::Passed {
            bad.push((c.id.clone(), r.outcome));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}
