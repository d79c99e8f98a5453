//! A CUDA device: its primary context, capabilities from the driver's attributes, memory, and the
//! factories for streams, events and modules.

use crate::context::Context;
use crate::conv::{already_enabled, attr, out_of_memory, vendor};
use crate::drv::result;
use crate::event::CudaEvent;
use crate::loader::guard;
use crate::memory::{CudaAllocation, PinnedHost};
use crate::module::CudaModule;
use crate::stream::CudaStream;
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::any::Any;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, OnceLock, Weak};
use unihal_hal::{
    Buffer, Capabilities, Device, DeviceId, DeviceInfo, Event, EventFlags, HalError, HostBuffer,
    MandatoryCaps, MemoryInfo, Module, ModuleFormat, ModuleSource, NativeHandle, OptionalCaps,
    Result, Stream,
};

/// One CUDA device. Thread-safe: every call binds the device's primary context first.
pub struct CudaDevice {
    me: Weak<CudaDevice>,
    pub(crate) ctx: Arc<Context>,
    info: DeviceInfo,
    caps: Capabilities,
    /// The portable kernel library, compiled and loaded on first use (it lives as long as the
    /// device, which the backend keeps for the process).
    library: OnceLock<Result<Arc<crate::library::Library>>>,
    /// Peers this device's context has been given access to (`cuCtxEnablePeerAccess`).
    peers_enabled: Mutex<HashSet<u32>>,
    /// cuBLAS handles no stream holds (see [`crate::cublas::Handle`]).
    pub(crate) blas_pool: Mutex<Vec<crate::cublas::Handle>>,
}

fn attribute(ctx: &Context, a: sys::CUdevice_attribute) -> Result<i32> {
    // SAFETY: a valid device and attribute.
    unsafe { result::device::get_attribute(ctx.dev, a) }
        .map_err(|e| vendor("cuDeviceGetAttribute", e))
}

/// The ordinals of the other devices `ctx`'s device can access directly (`cuDeviceCanAccessPeer`).
fn peers(ctx: &Context) -> Result<Vec<u32>> {
    let count = result::device::get_count().map_err(|e| vendor("cuDeviceGetCount", e))?;
    let mut peers = Vec::new();
    for o in (0..count).filter(|&o| o as u32 != ctx.id.ordinal) {
        let other = result::device::get(o).map_err(|e| vendor("cuDeviceGet", e))?;
        let mut can = 0;
        // SAFETY: two valid devices and an out-pointer to a local.
        unsafe { crate::drv::cuDeviceCanAccessPeer(&mut can, ctx.dev, other) }
            .result()
            .map_err(|e| vendor("cuDeviceCanAccessPeer", e))?;
        if can != 0 {
            peers.push(o as u32);
        }
    }
    Ok(peers)
}

impl CudaDevice {
    /// Opens device `ordinal` (its primary context, name and capabilities).
    ///
    /// # Errors
    /// Vendor errors of the driver queries; [`HalError::Unavailable`] if a symbol is missing.
    pub(crate) fn open(id: DeviceId) -> Result<Arc<CudaDevice>> {
        guard("open device", || {
            let ctx = Arc::new(Context::retain(id)?);
            ctx.bind()?;
            let name =
                result::device::get_name(ctx.dev).map_err(|e| vendor("cuDeviceGetName", e))?;
            // SAFETY: a valid device.
            let total = unsafe { result::device::total_mem(ctx.dev) }
                .map_err(|e| vendor("cuDeviceTotalMem", e))? as u64;
            let a = |x| attribute(&ctx, x);
            let dims = |xs: [sys::CUdevice_attribute; 3]| -> Result<[u32; 3]> {
                Ok([a(xs[0])? as u32, a(xs[1])? as u32, a(xs[2])? as u32])
            };
            let (major, minor) = (a(attr::CC_MAJOR)?, a(attr::CC_MINOR)?);
            let caps = Capabilities {
                mandatory: MandatoryCaps {
                    memory_bytes: total,
                    alloc_alignment: 256,
                    compute_units: a(attr::SM_COUNT)? as u32,
                    warp_size: a(attr::WARP_SIZE)? as u32,
                    max_grid: dims(attr::MAX_GRID)?,
                    max_block: dims(attr::MAX_BLOCK)?,
                    max_threads_per_block: a(attr::MAX_THREADS_PER_BLOCK)? as u32,
                    max_shared_mem_per_block: a(attr::SHARED_PER_BLOCK)? as u32,
                    // A cubin for the exact architecture first; PTX (JIT-compiled by the driver)
                    // otherwise.
                    module_formats: vec![ModuleFormat::Cubin, ModuleFormat::Ptx],
                },
                optional: OptionalCaps {
                    arch: Some(format!("sm_{major}{minor}")),
                    event_timing: true,
                    pinned_host_memory: true,
                    wide_fill: true,
                    host_callbacks: true,
                    stream_ordered_alloc: a(attr::MEMORY_POOLS)? != 0,
                    peer_devices: peers(&ctx)?,
                    fault_poisons_device: true,
                    timer_resolution_ns: Some(500),
                    // The portable library, when NVRTC is there to compile it.
                    ops: match crate::library::nvrtc() {
                        Ok(_) => unihal_kernels::support(),
                        Err(e) => {
                            tracing::info!(target: "unihal::cuda", "no kernel library ops: {e}");
                            BTreeMap::new()
                        }
                    },
                },
            };
            let info = DeviceInfo {
                id,
                name,
                vendor: "NVIDIA".into(),
            };
            Ok(Arc::new_cyclic(|me| CudaDevice {
                me: me.clone(),
                ctx,
                info,
                caps,
                library: OnceLock::new(),
                peers_enabled: Mutex::new(HashSet::new()),
                blas_pool: Mutex::new(Vec::new()),
            }))
        })
    }

    /// This device as an `Arc`.
    pub(crate) fn arc(&self) -> Result<Arc<CudaDevice>> {
        self.me
            .upgrade()
            .ok_or_else(|| HalError::Internal("CUDA device used while being dropped".into()))
    }

    /// Runs a driver call with this device's context current, panics turned into errors.
    ///
    /// # Errors
    /// `f`'s; [`HalError::InvalidArgument`] from a host callback, where CUDA forbids driver
    /// calls (a wait there would wait for the callback itself).
    pub(crate) fn call<T>(&self, what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        crate::deferred::refuse_in_callback(what)?;
        guard(what, || {
            self.ctx.bind()?;
            f()
        })
    }

    /// The portable kernel library on this device (compiled or read from the cache on first use).
    ///
    /// # Errors
    /// As [`crate::library::load`] (the first outcome is kept).
    pub(crate) fn library(&self) -> Result<Arc<crate::library::Library>> {
        self.library
            .get_or_init(|| {
                let arch = self.caps.optional.arch.clone().unwrap_or_default();
                crate::library::load(&self.arc()?, &arch).map(Arc::new)
            })
            .clone()
    }

    /// A buffer of `len` bytes from `alloc` (`cuMemAlloc`, or `cuMemAllocAsync` on a stream),
    /// named `call` in errors; none for zero bytes.
    ///
    /// # Errors
    /// [`HalError::OutOfMemory`]; other vendor errors.
    pub(crate) fn alloc_with(
        &self,
        call: &str,
        len: usize,
        alloc: impl FnOnce() -> std::result::Result<sys::CUdeviceptr, crate::drv::DriverError>,
    ) -> Result<Buffer> {
        let ptr = if len == 0 {
            0
        } else {
            self.call(call, || {
                alloc().map_err(|e| {
                    if out_of_memory(&e) {
                        self.oom(len as u64)
                    } else {
                        vendor(call, e)
                    }
                })
            })?
        };
        Ok(Buffer::from_allocation(Box::new(CudaAllocation {
            ctx: self.ctx.clone(),
            ptr,
            len: len as u64,
        })))
    }

    /// Gives this device's context access to `peer`'s memory (once per peer), so copies between
    /// them go device to device.
    ///
    /// # Errors
    /// Vendor errors of `cuCtxEnablePeerAccess` other than "already enabled".
    pub(crate) fn enable_peer(&self, peer: &Context) -> Result<()> {
        let mut enabled = self.peers_enabled.lock();
        if enabled.contains(&peer.id.ordinal) {
            return Ok(());
        }
        self.call("cuCtxEnablePeerAccess", || {
            // SAFETY: a retained primary context of another device; flags must be 0.
            match unsafe { crate::drv::cuCtxEnablePeerAccess(peer.raw, 0) }.result() {
                Ok(()) => Ok(()),
                Err(e) if already_enabled(&e) => Ok(()),
                Err(e) => Err(vendor("cuCtxEnablePeerAccess", e)),
            }
        })?;
        enabled.insert(peer.id.ordinal);
        Ok(())
    }

    fn oom(&self, requested: u64) -> HalError {
        let free = result::mem_get_info().map(|(f, _)| f as u64).unwrap_or(0);
        HalError::OutOfMemory { requested, free }
    }
}

impl Device for CudaDevice {
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
        self.call("cuMemGetInfo", || {
            let (free, total) = result::mem_get_info().map_err(|e| vendor("cuMemGetInfo", e))?;
            Ok(MemoryInfo {
                total: total as u64,
                free: free as u64,
            })
        })
    }

    fn alloc(&self, len: usize) -> Result<Buffer> {
        self.alloc_with("cuMemAlloc", len, || {
            // SAFETY: a non-zero size in the current context.
            unsafe { result::malloc_sync(len) }
        })
    }

    fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        let ptr = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr()
        } else {
            self.call("cuMemHostAlloc", || {
                // SAFETY: a non-zero size; flags 0 = page-locked, portable to this context.
                unsafe { result::malloc_host(len, 0) }
                    .map(|p| {
                        let p = p as *mut u8;
                        // cuMemHostAlloc leaves the memory uninitialised; `HostBuffer::map` shows
                        // it to safe code as `&[u8]`, so every backend's host memory is zeroed.
                        // SAFETY: `p` is `len` bytes of host-accessible memory just allocated,
                        // not yet shared with anything.
                        unsafe { std::ptr::write_bytes(p, 0, len) };
                        p
                    })
                    .map_err(|e| {
                        if out_of_memory(&e) {
                            HalError::OutOfMemory {
                                requested: len as u64,
                                free: 0,
                            }
                        } else {
                            vendor("cuMemHostAlloc", e)
                        }
                    })
            })?
        };
        Ok(HostBuffer::from_allocation(Box::new(PinnedHost {
            ctx: self.ctx.clone(),
            ptr,
            len,
        })))
    }

    fn create_stream(&self) -> Result<Arc<dyn Stream>> {
        Ok(CudaStream::new(self.arc()?)?)
    }

    fn create_event(&self, flags: EventFlags) -> Result<Arc<dyn Event>> {
        Ok(CudaEvent::new(self.arc()?, flags)?)
    }

    fn load_module(&self, source: &ModuleSource) -> Result<Arc<dyn Module>> {
        Ok(CudaModule::load(self.arc()?, source)?)
    }

    fn synchronize(&self) -> Result<()> {
        self.call("cuCtxSynchronize", || {
            result::ctx::synchronize().map_err(|e| vendor("cuCtxSynchronize", e))
        })
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::Ptr(self.ctx.raw as *mut std::ffi::c_void)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
