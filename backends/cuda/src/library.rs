//! The portable kernel library on a CUDA device: compiled by NVRTC from the same sources as the
//! CPU build, for the device's exact architecture, loaded as a cubin (PTX only as a fallback: the
//! driver JIT-compiles it, and a driver older than NVRTC rejects its PTX), cached in memory per
//! device and on disk.
//!
//! The cache is the shared one of `unihal_gpu::kernel_cache` (`UNIHAL_KERNEL_CACHE`), keyed on
//! the source hash, the architecture, the NVRTC version, its options and the driver version;
//! clear it with [`clear_cache`] or by deleting the directory.

use crate::runtime::{prepare_ptx, Cuda, CudaDevice};
use std::sync::{Arc, OnceLock};
use unihal_gpu::kernel_cache::{CacheKey, KernelCache};
use unihal_gpu::library::Library;
use unihal_gpu::module::GpuModule;
use unihal_gpu::runtime::PreparedModule;
use unihal_hal::{ModuleFormat, Result};
use unihal_kernels::rtc::nvrtc::Nvrtc;
use unihal_kernels::source::{fnv1a, library_source, GpuTarget};

/// Deletes the disk cache (and forgets the compiled images of this process).
///
/// # Errors
/// The I/O error, except when there is nothing to delete.
pub fn clear_cache() -> std::io::Result<()> {
    KernelCache::global().clear()
}

/// NVRTC, opened once per process (devices ask whether it is there; libraries compile with it).
///
/// # Errors
/// [`unihal_hal::HalError::Unavailable`] with the names tried (the first outcome is kept).
pub fn nvrtc() -> Result<&'static Nvrtc> {
    static NVRTC: OnceLock<Result<Nvrtc>> = OnceLock::new();
    NVRTC
        .get_or_init(Nvrtc::load)
        .as_ref()
        .map_err(Clone::clone)
}

/// PTX and cubin for `arch`, from the cache or NVRTC.
fn compiled(arch: &str) -> Result<(String, Vec<u8>)> {
    let nvrtc = nvrtc()?;
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
    let (parts, from) = KernelCache::global().get_or_compile(&key, || {
        let t = std::time::Instant::now();
        let out = nvrtc.compile(&src, "unihal_kernels.cu", arch)?;
        tracing::info!(target: "unihal::cuda", "NVRTC {major}.{minor} compiled the kernel library for {arch} in {:?}", t.elapsed());
        Ok(vec![
            ("ptx".to_string(), out.ptx.into_bytes()),
            ("cubin".to_string(), out.cubin),
        ])
    })?;
    tracing::debug!(target: "unihal::cuda", "kernel library for {arch}: {from:?}");
    let part = |name: &str| {
        parts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
            .unwrap_or_default()
    };
    Ok((
        String::from_utf8_lossy(&part("ptx")).into_owned(),
        part("cubin"),
    ))
}

/// Compiles (or reads from the cache) and loads the library on `dev`: cubin first, PTX if the
/// driver rejects the cubin.
///
/// # Errors
/// [`unihal_hal::HalError::Unavailable`] without NVRTC; NVRTC's log; the driver's error for the
/// PTX.
pub(crate) fn load(dev: &Arc<CudaDevice>) -> Result<Library> {
    let arch = unihal_hal::Device::capabilities(dev.as_ref())
        .optional
        .arch
        .clone()
        .unwrap_or_default();
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
            tracing::error!(target: "unihal::cuda", "the kernel library loads neither as cubin ({cubin_err}) nor as PTX ({e})");
        })?;
    tracing::info!(target: "unihal::cuda", "kernel library loaded from PTX (cubin refused: {cubin_err})");
    Ok(Library::new(
        module,
        format!("PTX (cubin refused: {cubin_err})"),
    ))
}
