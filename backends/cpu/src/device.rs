//! A virtual CPU device: memory budget, compute pool, streams, events and modules.

use crate::event::CpuEvent;
use crate::fault::FaultSwitch;
use crate::graph::Capture;
use crate::memory::{CpuAllocation, CpuHostAllocation, MemAccount, ALLOC_ALIGN};
use crate::module::CpuModule;
use crate::stream::CpuStream;
use crate::worker::WorkerShared;
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use unihal_hal::{
    Buffer, Capabilities, Device, DeviceId, DeviceInfo, Event, EventFlags, GraphCaps, GraphSupport,
    HalError, HostBuffer, HostSymbolTable, MandatoryCaps, MemoryInfo, Module, ModuleFormat,
    ModuleSource, NativeHandle, OptionalCaps, Result, Stream,
};

/// One virtual CPU device.
pub struct CpuDevice {
    me: Weak<CpuDevice>,
    info: DeviceInfo,
    caps: Capabilities,
    account: Arc<MemAccount>,
    host_account: Arc<MemAccount>,
    pool: Option<Arc<crate::compute::ComputePool>>,
    streams: Mutex<Vec<Weak<WorkerShared>>>,
    /// Stream captures begun on this device and not yet ended (`crate::graph`).
    captures: Mutex<Vec<Arc<Capture>>>,
    /// `captures` is not empty (the fast check of `alloc`).
    capturing: std::sync::atomic::AtomicBool,
    next_stream: AtomicU64,
    fault: FaultSwitch,
    kernels: Arc<HostSymbolTable>,
    matmul: crate::MatmulEngine,
}

/// The host's widest vector ISA level, reported as the device architecture.
fn host_arch() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let level = if std::arch::is_x86_feature_detected!("avx512f") {
            "avx512"
        } else if std::arch::is_x86_feature_detected!("avx2") {
            "avx2"
        } else {
            "sse2"
        };
        format!("x86_64-{level}")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

impl CpuDevice {
    /// Allocates device memory without the capture rules (for `Stream::alloc_async`, which a
    /// capture records).
    pub(crate) fn alloc_unchecked(&self, len: usize) -> Result<Buffer> {
        let a = CpuAllocation::new(len, self.id(), self.account.clone())?;
        Ok(Buffer::from_allocation(a))
    }

    /// Registers a capture begun on one of this device's streams.
    pub(crate) fn capture_begun(&self, c: Arc<Capture>) {
        let mut g = self.captures.lock();
        g.push(c);
        self.capturing.store(true, Ordering::Release);
    }

    /// Forgets an ended capture.
    pub(crate) fn capture_ended(&self, c: &Arc<Capture>) {
        let mut g = self.captures.lock();
        g.retain(|x| !Arc::ptr_eq(x, c));
        self.capturing.store(!g.is_empty(), Ordering::Release);
    }

    pub(crate) fn new(
        ordinal: u32,
        devices: u32,
        memory: u64,
        host_account: Arc<MemAccount>,
        threads: usize,
        matmul: crate::MatmulEngine,
        fault: FaultSwitch,
    ) -> Result<Arc<CpuDevice>> {
        let id = DeviceId {
            backend: crate::NAME,
            ordinal,
        };
        let pool = if threads > 1 {
            let p = crate::compute::ComputePool::new(threads, &format!("unihal-cpu{ordinal}-pool"))
                .map_err(|e| HalError::Internal(format!("cannot start the compute pool: {e}")))?;
            Some(Arc::new(p))
        } else {
            None
        };
        let caps = Capabilities {
            mandatory: MandatoryCaps {
                memory_bytes: memory,
                alloc_alignment: ALLOC_ALIGN as u64,
                compute_units: threads as u32,
                warp_size: 1,
                max_grid: [i32::MAX as u32, 65535, 65535],
                max_block: [1024, 1024, 64],
                max_threads_per_block: 1024,
                max_shared_mem_per_block: 48 * 1024,
                module_formats: vec![ModuleFormat::HostSymbols],
            },
            optional: OptionalCaps {
                arch: Some(host_arch()),
                event_timing: true,
                pinned_host_memory: true,
                wide_fill: true,
                host_callbacks: true,
                stream_ordered_alloc: true,
                peer_devices: (0..devices).filter(|&d| d != ordinal).collect(),
                fault_poisons_device: false,
                timer_resolution_ns: Some(1),
                bitwise_rng: true,
                negative_strides_copied: false,
                ops: unihal_kernels::support(),
                graphs: GraphCaps {
                    support: GraphSupport::Emulated,
                    note: "not captured: host callbacks (FnOnce), grouped sends/receives, and the \
                           MPI and gloo engines' calls (collectives: the in-process engine's)"
                        .into(),
                    copies: true,
                    fills: true,
                    kernels: true,
                    ops: true,
                    collectives: true,
                    host_callbacks: false,
                    stream_alloc: true,
                },
            },
        };
        Ok(Arc::new_cyclic(|me| CpuDevice {
            me: me.clone(),
            info: DeviceInfo {
                id,
                name: format!("unihal virtual CPU device {ordinal}"),
                vendor: "host".into(),
            },
            caps,
            account: Arc::new(MemAccount::new(memory)),
            host_account,
            pool,
            streams: Mutex::new(Vec::new()),
            captures: Mutex::new(Vec::new()),
            capturing: std::sync::atomic::AtomicBool::new(false),
            next_stream: AtomicU64::new(0),
            fault,
            kernels: unihal_kernels::cpu::host_symbols(),
            matmul,
        }))
    }

    pub(crate) fn capabilities_ref(&self) -> &Capabilities {
        &self.caps
    }

    pub(crate) fn pool(&self) -> Option<Arc<crate::compute::ComputePool>> {
        self.pool.clone()
    }

    /// The portable kernel library for this CPU's ISA level.
    pub(crate) fn kernels(&self) -> &HostSymbolTable {
        &self.kernels
    }

    /// The engine that runs `matmul`.
    pub(crate) fn matmul_engine(&self) -> crate::MatmulEngine {
        self.matmul
    }

    pub(crate) fn fault(&self) -> FaultSwitch {
        self.fault
    }

    fn arc(&self) -> Result<Arc<CpuDevice>> {
        self.me
            .upgrade()
            .ok_or_else(|| HalError::Internal("device is being dropped".into()))
    }
}

impl Device for CpuDevice {
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
        Ok(MemoryInfo {
            total: self.account.capacity(),
            free: self.account.free(),
        })
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        crate::fault::point("alloc")?;
        if self.capturing.load(Ordering::Acquire) {
            let refusing = self
                .captures
                .lock()
                .iter()
                .find(|c| c.refuses_unsafe_calls())
                .cloned();
            if let Some(c) = refusing {
                return Err(c.illegal("len", "Device::alloc (capture-unsafe)"));
            }
        }
        self.alloc_unchecked(len)
    }

    unsafe fn import_memory(&self, addr: u64, len: u64, owner: unihal_hal::Keep) -> Result<Buffer> {
        if addr == 0 && len > 0 {
            return Err(HalError::null_import(len));
        }
        let len = usize::try_from(len).map_err(|_| HalError::null_import(len))?;
        let a = CpuAllocation::foreign(addr as *mut u8, len, self.id(), owner);
        Ok(Buffer::from_allocation(a))
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        crate::fault::point("host_alloc")?;
        let a = CpuHostAllocation::new(len, self.id(), self.host_account.clone())?;
        Ok(HostBuffer::from_allocation(Box::new(a)))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        crate::fault::point("stream_create")?;
        let dev = self.arc()?;
        let n = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let worker =
            WorkerShared::spawn(format!("unihal-cpu{}-s{n}", self.id().ordinal), self.fault)?;
        {
            let mut streams = self.streams.lock();
            streams.retain(|w| w.strong_count() > 0);
            streams.push(Arc::downgrade(&worker));
        }
        tracing::debug!(device = %self.id(), stream = n, "stream created");
        let dyn_dev: Arc<dyn Device> = dev.clone();
        Ok(Arc::new(CpuStream {
            dev,
            dyn_dev,
            worker,
            sid: unihal_hal::StreamId::fresh(),
            cap: Arc::default(),
        }))
    }

    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>> {
        crate::fault::point("event_create")?;
        Ok(CpuEvent::new(self.id(), flags))
    }

    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>> {
        crate::fault::point("module_load")?;
        match source {
            ModuleSource::HostSymbols(table) => Ok(Arc::new(CpuModule::new(self.id(), table))),
            other => Err(HalError::unsupported(format!(
                "the CPU backend loads host symbol tables, not {:?} modules",
                other.format()
            ))),
        }
    }

    fn synchronize(&self) -> Result<()> {
        if self.capturing.load(Ordering::Acquire) {
            let active: Vec<_> = self.captures.lock().clone();
            if let Some(first) = active.first() {
                // Waiting for every stream includes the capturing ones: illegal for each capture.
                for c in &active[1..] {
                    c.invalidate("Device::synchronize");
                }
                return Err(first.illegal("device", "Device::synchronize"));
            }
        }
        let workers: Vec<_> = self
            .streams
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        // From a host callback of one of this device's streams, the wait includes the callback
        // itself: it could never complete.
        if workers.iter().any(|w| w.is_current()) {
            return Err(crate::worker::WorkerShared::self_wait());
        }
        let mut first = Ok(());
        for w in workers {
            if let Err(e) = w.synchronize() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::Int(self.id().ordinal as i64)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
