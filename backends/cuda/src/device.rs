//! Opening a CUDA device: its primary context ([`Context`], bound to the calling thread before
//! every driver call), name and capabilities from the driver's attributes. The device itself is
//! the shared GPU layer's ([`crate::CudaDevice`]).

use crate::conv::{attr, vendor};
use crate::ffi::result;
use crate::loader::guard;
use crate::runtime::{prepare_ptx, Cuda, CudaDevice, CUDA};
use cudarc::driver::sys;
use std::collections::BTreeMap;
use std::sync::Arc;
use unihal_gpu::kernel_cache::CacheKey;
use unihal_gpu::library::{self, Library};
use unihal_gpu::module::GpuModule;
use unihal_gpu::runtime::{DeviceSetup, PreparedModule, Runtime};
use unihal_hal::{
    Capabilities, DeviceId, DeviceInfo, MandatoryCaps, ModuleFormat, OptionalCaps, Result,
};
use unihal_kernels::rtc::nvrtc::Nvrtc;
use unihal_kernels::source::{fnv1a, library_source, GpuTarget};

fn attribute(ctx: &Context, a: sys::CUdevice_attribute) -> Result<i32> {
    // SAFETY: a valid device and attribute.
    unsafe { result::device::get_attribute(ctx.dev, a) }
        .map_err(|e| vendor("cuDeviceGetAttribute", e))
}

/// Opens device `id` (its primary context, name and capabilities).
///
/// # Errors
/// Vendor errors of the driver queries; [`unihal_hal::HalError::Unavailable`] if a symbol is
/// missing.
pub(crate) fn open(id: DeviceId) -> Result<Arc<CudaDevice>> {
    guard("open device", || {
        let ctx = Context::retain(id)?;
        ctx.bind()?;
        let name = result::device::get_name(ctx.dev).map_err(|e| vendor("cuDeviceGetName", e))?;
        // SAFETY: a valid device.
        let total = unsafe { result::device::total_mem(ctx.dev) }
            .map_err(|e| vendor("cuDeviceTotalMem", e))? as u64;
        let a = |x| attribute(&ctx, x);
        let dims = |xs: [sys::CUdevice_attribute; 3]| -> Result<[u32; 3]> {
            Ok([a(xs[0])? as u32, a(xs[1])? as u32, a(xs[2])? as u32])
        };
        let (major, minor) = (a(attr::CC_MAJOR)?, a(attr::CC_MINOR)?);
        let mut caps = Capabilities {
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
                peer_devices: CUDA.peers(&ctx)?,
                fault_poisons_device: true,
                timer_resolution_ns: Some(500),
                // The portable library's Philox generator, as on every backend that runs it.
                bitwise_rng: true,
                negative_strides_copied: false,
                // The portable library, when NVRTC is there to compile it; cuBLAS's matmul with
                // or without it.
                ops: unihal_gpu::gemm::ops_with_blas(
                    match crate::loader::nvrtc() {
                        Ok(_) => unihal_kernels::support(),
                        Err(e) => {
                            tracing::info!(target: "unihal::kernel", "no kernel library ops: {e}");
                            BTreeMap::new()
                        }
                    },
                    crate::loader::cublas_available(),
                ),
                // The driver's graphs when it exports every entry they need.
                graphs: unihal_gpu::graph::caps(&CUDA, crate::loader::nvrtc().is_ok()),
            },
        };
        // Memory nodes come from the device's default pool: captured only where it has one.
        caps.optional.graphs.stream_alloc &= caps.optional.stream_ordered_alloc;
        let info = DeviceInfo {
            id,
            name,
            vendor: "NVIDIA".into(),
        };
        Ok(unihal_gpu::device::GpuDevice::<Cuda>::new(
            &CUDA,
            DeviceSetup { ctx, info, caps },
        ))
    })
}

/// The primary context of one device. Retained while a handle lives (released on drop).
pub struct Context {
    pub(crate) id: DeviceId,
    pub(crate) dev: sys::CUdevice,
    pub(crate) raw: sys::CUcontext,
}

// SAFETY: a CUcontext may be made current on any thread; the driver is thread-safe.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Retains device `ordinal`'s primary context.
    ///
    /// # Errors
    /// Vendor errors of cuDeviceGet / cuDevicePrimaryCtxRetain.
    pub(crate) fn retain(id: DeviceId) -> Result<Context> {
        let dev = result::device::get(id.ordinal as i32).map_err(|e| vendor("cuDeviceGet", e))?;
        // SAFETY: a valid device from cuDeviceGet.
        let raw = unsafe { result::primary_ctx::retain(dev) }
            .map_err(|e| vendor("cuDevicePrimaryCtxRetain", e))?;
        Ok(Context { id, dev, raw })
    }

    /// Makes this context current on the calling thread (cheap: a thread-local store in the
    /// driver; not cached here, since other code on the thread may switch contexts).
    ///
    /// # Errors
    /// Vendor errors of cuCtxSetCurrent.
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: a retained primary context.
        unsafe { result::ctx::set_current(self.raw) }.map_err(|e| vendor("cuCtxSetCurrent", e))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // The last handle may go in a host function (a callback's closure holding a device),
        // which must not call the driver: then the release is deferred to the next backend call
        // made outside a callback.
        let dev = self.dev;
        unihal_gpu::deferred::release(move || {
            // SAFETY: retained in `retain`, released once (this context is being dropped).
            if let Err(e) = unsafe { result::primary_ctx::release(dev) } {
                tracing::warn!(target: "unihal::device", "{}", vendor("cuDevicePrimaryCtxRelease", e));
            }
        });
    }
}

/// The kernel library's PTX and cubin for `arch`, from the shared cache or NVRTC (keyed on the
/// source hash, the architecture, NVRTC's version and options, and the driver's version).
fn compiled(arch: &str) -> Result<(String, Vec<u8>)> {
    let nvrtc = crate::loader::nvrtc()?;
    let src = library_source(GpuTarget::Cuda);
    let (major, minor) = nvrtc.version();
    let key = CacheKey {
        source_hash: fnv1a(&src),
        target: arch.to_string(),
        compiler: format!("NVRTC {major}.{minor}"),
        options: Nvrtc::options(arch),
        runtime: format!(
            "CUDA driver {}",
            crate::loader::driver().map_or(0, |d| d.version)
        ),
    };
    let what = format!("NVRTC {major}.{minor} compiled the kernel library");
    let parts = library::compiled(&key, &what, || {
        let out = nvrtc.compile(&src, "unihal_kernels.cu", arch)?;
        Ok(vec![
            ("ptx".to_string(), out.ptx.into_bytes()),
            ("cubin".to_string(), out.cubin),
        ])
    })?;
    let ptx = String::from_utf8_lossy(&library::part(&parts, "ptx")).into_owned();
    Ok((ptx, library::part(&parts, "cubin")))
}

/// The portable kernel library on `dev`: compiled by NVRTC from the same sources as the CPU build
/// for the device's exact architecture, loaded as a cubin (PTX only as a fallback: the driver
/// JIT-compiles it, and a driver older than NVRTC rejects its PTX).
///
/// # Errors
/// [`unihal_hal::HalError::Unavailable`] without NVRTC; NVRTC's log; the driver's error for the
/// PTX.
pub(crate) fn load_library(dev: &Arc<CudaDevice>) -> Result<Library> {
    let arch = library::device_arch(dev.as_ref());
    let (ptx, cubin) = compiled(&arch)?;
    // The cubin carries no parameter sizes: they come from the PTX of the same build.
    let from_ptx = prepare_ptx(&ptx)?;
    let cubin = PreparedModule {
        image: cubin,
        params: from_ptx.params.clone(),
    };
    let cubin_err = match GpuModule::<Cuda>::load_prepared(dev.clone(), ModuleFormat::Cubin, cubin)
    {
        Ok(module) => return Ok(Library::new(module, "cubin")),
        Err(e) => e,
    };
    let module = GpuModule::<Cuda>::load_prepared(dev.clone(), ModuleFormat::Ptx, from_ptx)
        .inspect_err(|e| {
            tracing::error!(target: "unihal::kernel", "the kernel library loads neither as cubin ({cubin_err}) nor as PTX ({e})");
        })?;
    tracing::info!(target: "unihal::kernel", "kernel library loaded from PTX (cubin refused: {cubin_err})");
    Ok(Library::new(
        module,
        format!("PTX (cubin refused: {cubin_err})"),
    ))
}
