//! # The template backend: where a new chip's unihal plugin starts
//!
//! Copy this crate beside a unihal checkout, rename the package in Cargo.toml (the backend's
//! `NAME` follows it), and replace each `not_yet(..)` with the vendor call it describes. Built as
//! it is, it loads, opens one device, and answers every operation `Unsupported`; its manifest
//! (`conformance.manifest`) declares every conformance case unsupported, so `unihal conformance`
//! reports 0 failures and every case skipped with the template's reason. docs/PORTING.md walks from here to a full conformance report: implement an
//! area, narrow the manifest, run the suite, read the report.
//!
//! Each method's comment says what it must do (the HAL trait's doc comment is the contract) and
//! which conformance cases check it (`unihal conformance --backend <name> --filter <prefix>`).
//! A backend written in C or C++ implements the same entries of `unihal_plugin.h` instead; the
//! C plugins in `plugin/tests/c/` show memory, streams and events that way (`minimal_plugin.c`,
//! synchronous) and with host callbacks on a queue thread per stream (`async_plugin.c`).

use std::any::Any;
use std::sync::Arc;
use unihal_hal::{
    Backend, BackendInfo, Buffer, Capabilities, Device, DeviceId, DeviceInfo, Event, EventFlags,
    FillValue, Function, HalError, HostBuffer, KernelArgs, LaunchConfig, MandatoryCaps, MemoryInfo,
    Module, ModuleSource, NativeHandle, OptionalCaps, Result, Stream, StreamId,
};

/// The backend's registry name: `[a-z0-9_-]+`, unique among backends (a built-in name, `cpu`,
/// `cuda`, `hip` or `ascend`, is refused unless the user sets `UNIHAL_PLUGIN_REPLACE`).
///
/// It follows the package name in Cargo.toml, without a leading `unihal-` and a trailing
/// `-plugin` (`mychip-plugin` → `mychip`), so renaming the package renames the backend, its
/// devices and its manifest's skip reasons. A literal (`"mychip"`) works as well.
pub const NAME: &str = backend_name(env!("CARGO_PKG_NAME"));

/// `package` without a leading `unihal-` and a trailing `-plugin` (each only where a name is left).
const fn backend_name(package: &str) -> &str {
    const fn has_at(s: &[u8], at: usize, part: &[u8]) -> bool {
        let mut i = 0;
        while i < part.len() {
            if s[at + i] != part[i] {
                return false;
            }
            i += 1;
        }
        true
    }
    let (prefix, suffix) = (b"unihal-", b"-plugin");
    let s = package.as_bytes();
    let mut start = 0;
    if s.len() > prefix.len() && has_at(s, 0, prefix) {
        start = prefix.len();
    }
    let mut end = s.len();
    if end - start > suffix.len() && has_at(s, end - suffix.len(), suffix) {
        end -= suffix.len();
    }
    let (_, tail) = s.split_at(start);
    let (name, _) = tail.split_at(end - start);
    match std::str::from_utf8(name) {
        Ok(name) => name,
        Err(_) => panic!("a package name is UTF-8"),
    }
}

unihal_plugin::export_backend!(|| Arc::new(TemplateBackend::default()));

/// What every unimplemented operation returns: `Unsupported`, which the suite reports as a skip
/// when the manifest declares the case unsupported, and as a failure otherwise.
fn not_yet(what: &str) -> HalError {
    HalError::unsupported(format!("{what}: not implemented yet in the {NAME} backend"))
}

/// The backend: opens the vendor runtime lazily and hands out devices.
#[derive(Default)]
pub struct TemplateBackend {
    device: std::sync::OnceLock<Arc<TemplateDevice>>,
}

impl Backend for TemplateBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Report the plugin's version and every vendor library it opens (found: path and version;
    /// missing: every path tried and why). Shown by `unihal devices` and in every report.
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            libraries: Vec::new(),
            simulated: false,
            concurrent: true,
        }
    }

    /// Open the vendor runtime (dlopen, never link) and count devices; `Unavailable` listing
    /// every path tried when the runtime is missing, never "0 devices". Checked by every case
    /// (nothing runs without a device) and by `unihal devices`.
    fn probe(&self) -> Result<usize> {
        Ok(1)
    }

    /// Return the same device object for every call with one ordinal; `InvalidArgument` past
    /// the count. Checked by `memory.*` (device identity in errors) and `ccl.*` (one device per
    /// rank).
    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        if ordinal != 0 {
            return Err(HalError::invalid(
                "ordinal",
                unihal_hal::Invalid::Value {
                    value: ordinal.to_string(),
                    accepted: "0".into(),
                },
            ));
        }
        Ok(self
            .device
            .get_or_init(|| Arc::new_cyclic(TemplateDevice::new))
            .clone())
    }

    /// The manifest shipped with the backend (`conformance.manifest`, with `{backend}` standing
    /// for `NAME`): narrow it as areas are implemented.
    fn conformance_manifest(&self) -> &'static str {
        static MANIFEST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        MANIFEST.get_or_init(|| include_str!("../conformance.manifest").replace("{backend}", NAME))
    }

    /// Return the conformance test kernels (`unihal_kernels::testing`) compiled for the device,
    /// in a format `load_module` accepts; None skips the `kernels.*` cases and makes the
    /// stream-ordering cases hold streams with host callbacks instead.
    fn test_kernels(&self, _device: &dyn Device) -> Option<ModuleSource> {
        None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One device.
pub struct TemplateDevice {
    info: DeviceInfo,
    caps: Capabilities,
    me: std::sync::Weak<TemplateDevice>,
}

impl TemplateDevice {
    fn new(me: &std::sync::Weak<TemplateDevice>) -> TemplateDevice {
        TemplateDevice {
            info: DeviceInfo {
                id: DeviceId {
                    backend: NAME,
                    ordinal: 0,
                },
                name: format!("{NAME} device 0"),
                vendor: NAME.into(),
            },
            // Report the device's real limits and features: the suite decides what to run from
            // them, and a backend that answers Unsupported for what it claims fails.
            caps: Capabilities {
                mandatory: MandatoryCaps {
                    memory_bytes: 0,
                    alloc_alignment: 256,
                    compute_units: 1,
                    warp_size: 1,
                    max_grid: [1, 1, 1],
                    max_block: [1, 1, 1],
                    max_threads_per_block: 1,
                    max_shared_mem_per_block: 0,
                    module_formats: Vec::new(),
                },
                optional: OptionalCaps {
                    arch: None,
                    event_timing: false,
                    pinned_host_memory: false,
                    wide_fill: false,
                    host_callbacks: false,
                    stream_ordered_alloc: false,
                    peer_devices: Vec::new(),
                    fault_poisons_device: false,
                    timer_resolution_ns: None,
                    bitwise_rng: false,
                    negative_strides_copied: false,
                    ops: Default::default(),
                    graphs: unihal_hal::GraphCaps::unsupported(
                        "the plugin ABI has no stream capture entries yet",
                    ),
                },
            },
            me: me.clone(),
        }
    }
}

impl Device for TemplateDevice {
    fn id(&self) -> DeviceId {
        self.info.id
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// Total and free device memory (`cuMemGetInfo`). Checked by `alloc.*` (the caching
    /// allocator's out-of-memory report) and `memory.info`.
    fn memory_info(&self) -> Result<MemoryInfo> {
        Err(not_yet("memory info"))
    }

    /// Allocate device memory (`cuMemAlloc`, `aclrtMalloc`) wrapped in a `DeviceAllocation`
    /// whose drop frees it; `OutOfMemory` with the free bytes when it fails. Checked by
    /// `memory.*`, `alloc.*` and every case that moves data.
    fn alloc(&self, _len: usize) -> Result<Buffer> {
        Err(not_yet("device memory"))
    }

    /// Allocate zeroed, pinned host memory (`cuMemHostAlloc` + memset) as a `HostAllocation`.
    /// Checked by `memory.copy.*` and `memory.host.*`.
    fn alloc_host(&self, _len: usize) -> Result<HostBuffer> {
        Err(not_yet("host memory"))
    }

    /// Create an in-order queue (`cuStreamCreate`, `aclrtCreateStream`). Checked by
    /// `streams.*`, `events.*` and every case that enqueues work.
    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        let _ = &self.me;
        Err(not_yet("streams"))
    }

    /// Create an event (`cuEventCreate`; `CU_EVENT_DISABLE_TIMING` when asked). Checked by
    /// `events.*` and the cross-stream ordering cases in `streams.*`.
    fn create_event(&self, _flags: EventFlags) -> Result<Arc<dyn Event>> {
        Err(not_yet("events"))
    }

    /// Load a module in one of `module_formats` (`cuModuleLoadData`, `aclrtBinaryLoad`).
    /// Checked by `kernels.*`.
    fn load_module(&self, _source: &ModuleSource) -> Result<Arc<dyn Module>> {
        Err(not_yet("modules"))
    }

    /// Wait for every stream of the device; return the first sticky error. Checked by
    /// `streams.device_synchronize*` and the fault cases.
    fn synchronize(&self) -> Result<()> {
        Err(not_yet("device synchronize"))
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The stream a port implements next: every method's contract is the HAL's `Stream` trait.
/// Kept here, unused by the template's device, so that the skeleton of the whole surface is in
/// one place to fill in.
pub struct TemplateStream {
    device: Arc<dyn Device>,
    id: StreamId,
}

impl TemplateStream {
    /// A stream on `device` (what `create_stream` returns once implemented).
    pub fn new(device: Arc<dyn Device>) -> TemplateStream {
        TemplateStream {
            device,
            id: StreamId::fresh(),
        }
    }
}

impl Stream for TemplateStream {
    fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    fn stream_id(&self) -> StreamId {
        self.id
    }

    /// Asynchronous host-to-device copy (`cuMemcpyHtoDAsync`): check the buffers (device, range,
    /// not freed), begin the host buffer's use (`HostBuffer::begin_use`) and keep it and the
    /// buffer (`Buffer::use_on`) until the copy ran. Checked by `memory.copy.*`.
    fn copy_h2d(&self, _: &HostBuffer, _: u64, _: &Buffer, _: u64, _: u64) -> Result<()> {
        Err(not_yet("copy h2d"))
    }

    /// As `copy_h2d`, staging `src` into host memory first. Checked by `memory.copy.staged*`.
    fn copy_h2d_staged(&self, _: &[u8], _: &Buffer, _: u64) -> Result<()> {
        Err(not_yet("staged copy h2d"))
    }

    /// Asynchronous device-to-host copy (`cuMemcpyDtoHAsync`). Checked by `memory.copy.*`.
    fn copy_d2h(&self, _: &Buffer, _: u64, _: &HostBuffer, _: u64, _: u64) -> Result<()> {
        Err(not_yet("copy d2h"))
    }

    /// Device-to-device copy; overlapping ranges are `Invalid::Overlap`. Checked by
    /// `memory.copy.d2d*` and `misuse.*`.
    fn copy_d2d(&self, _: &Buffer, _: u64, _: &Buffer, _: u64, _: u64) -> Result<()> {
        Err(not_yet("copy d2d"))
    }

    /// Copy between devices listed in `peer_devices` (`cuMemcpyPeerAsync`). Checked by
    /// `memory.copy.peer*`.
    fn copy_peer(&self, _: &Buffer, _: u64, _: &Buffer, _: u64, _: u64) -> Result<()> {
        Err(not_yet("copy peer"))
    }

    /// Byte fill always; 16/32-bit fills with `wide_fill` (`cuMemsetD8/16/32Async`). Checked by
    /// `memory.fill.*`.
    fn fill(&self, _: &Buffer, _: u64, _: u64, _: FillValue) -> Result<()> {
        Err(not_yet("fill"))
    }

    /// Launch a kernel (`cuLaunchKernel`) after checking the shape against the device limits and
    /// the argument sizes against the function's. Checked by `kernels.*`.
    unsafe fn launch(&self, _: &Arc<dyn Function>, _: &LaunchConfig, _: &KernelArgs) -> Result<()> {
        Err(not_yet("kernel launch"))
    }

    /// Run a library op (`OpCall`: an op id, views, scalars); list each op and dtype in
    /// `OptionalCaps::ops`. Checked by `ops.<op>.<dtype>.*`.
    fn run_op(&self, call: &unihal_hal::OpCall) -> Result<()> {
        Err(not_yet(&format!("op {}", call.op)))
    }

    /// Run `f` once the work before it completed (`cuLaunchHostFunc`); set `host_callbacks`.
    /// Checked by `streams.host_callback*`.
    fn host_callback(&self, _: Box<dyn FnOnce() + Send>) -> Result<()> {
        Err(not_yet("host callbacks"))
    }

    /// Record an event (`cuEventRecord`). Checked by `events.*`.
    fn record_event(&self, _: &Arc<dyn Event>) -> Result<()> {
        Err(not_yet("event record"))
    }

    /// Make later work wait for an event (`cuStreamWaitEvent`). Checked by `events.*` and
    /// `streams.cross*`.
    fn wait_event(&self, _: &Arc<dyn Event>) -> Result<()> {
        Err(not_yet("event wait"))
    }

    /// Stream-ordered allocation (`cuMemAllocAsync`), or `Device::alloc`. Checked by
    /// `memory.async*` and `alloc.*`.
    fn alloc_async(&self, _: usize) -> Result<Buffer> {
        Err(not_yet("alloc async"))
    }

    /// Mark every handle freed (`Buffer::mark_free_enqueued`) and free in stream order. Checked
    /// by `memory.async*` and `misuse.*`.
    fn free_async(&self, _: &Buffer) -> Result<()> {
        Err(not_yet("free async"))
    }

    /// Wait for the stream; return the sticky error. Checked by every case.
    fn synchronize(&self) -> Result<()> {
        Err(not_yet("stream synchronize"))
    }

    /// True when the queued work completed. Checked by `streams.query*`.
    fn query(&self) -> Result<bool> {
        Err(not_yet("stream query"))
    }

    /// The sticky error, if any. Checked by the fault cases in `streams.*` and `kernels.*`.
    fn async_error(&self) -> Option<HalError> {
        None
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_backend_name_follows_the_package_name() {
        assert_eq!(super::backend_name("unihal-template-plugin"), "template");
        assert_eq!(super::backend_name("mychip-plugin"), "mychip");
        assert_eq!(super::backend_name("unihal-npu"), "npu");
        assert_eq!(super::backend_name("mychip"), "mychip");
        assert_eq!(super::backend_name("-plugin"), "-plugin");
    }
}
