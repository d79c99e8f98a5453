//! The portable kernel library on a CUDA device: compiled by NVRTC from the same sources as the
//! CPU build, for the device's exact architecture, loaded as a cubin (PTX only as a fallback: the
//! driver JIT-compiles it, and a driver older than NVRTC rejects its PTX), cached in memory per
//! device and on disk.
//!
//! Disk cache: `UNIHAL_KERNEL_CACHE` names the directory (default `$XDG_CACHE_HOME/unihal/kernels`
//! or `~/.cache/unihal/kernels`; `off` disables it). An entry is keyed on the source hash, the
//! architecture and the NVRTC version; clear it with [`clear_cache`] or by deleting the directory.

use crate::device::CudaDevice;
use crate::module::CudaModule;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use unihal_hal::{Function, Module, ModuleSource, Result};
use unihal_kernels::rtc::nvrtc::Nvrtc;
use unihal_kernels::source::{fnv1a, library_source, GpuTarget};

/// The library loaded on one device.
pub struct Library {
    module: Arc<CudaModule>,
    /// Which image loaded: "cubin" or "PTX" (and why PTX).
    pub loaded: String,
    functions: Mutex<HashMap<String, Arc<dyn Function>>>,
}

impl Library {
    /// The entry `name`, resolved once.
    ///
    /// # Errors
    /// As [`Module::function`].
    pub fn function(&self, name: &str) -> Result<Arc<dyn Function>> {
        if let Some(f) = self.functions.lock().get(name) {
            return Ok(f.clone());
        }
        let f = self.module.function(name)?;
        self.functions.lock().insert(name.to_string(), f.clone());
        Ok(f)
    }
}

/// The cache directory, or None when disabled.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var("UNIHAL_KERNEL_CACHE") {
        Ok(v) if v.trim() == "off" => None,
        Ok(v) if !v.trim().is_empty() => Some(PathBuf::from(v.trim())),
        _ => {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("unihal").join("kernels"))
        }
    }
}

/// Deletes the disk cache.
///
/// # Errors
/// The I/O error, except when there is nothing to delete.
pub fn clear_cache() -> std::io::Result<()> {
    match cache_dir() {
        Some(d) if d.exists() => std::fs::remove_dir_all(d),
        _ => Ok(()),
    }
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

/// PTX and cubin for `arch`, from the disk cache or NVRTC.
fn compiled(arch: &str) -> Result<(String, Vec<u8>)> {
    let nvrtc = nvrtc()?;
    let src = library_source(GpuTarget::Cuda);
    let (major, minor) = nvrtc.version();
    let key = format!("{:016x}-{arch}-nvrtc{major}.{minor}", fnv1a(&src));
    let dir = cache_dir();
    if let Some(d) = &dir {
        let (ptx, cubin) = (d.join(format!("{key}.ptx")), d.join(format!("{key}.cubin")));
        if let (Ok(p), Ok(c)) = (std::fs::read_to_string(&ptx), std::fs::read(&cubin)) {
            return Ok((p, c));
        }
    }
    let t = std::time::Instant::now();
    let out = nvrtc.compile(&src, "unihal_kernels.cu", arch)?;
    tracing::info!(target: "unihal::cuda", "NVRTC {major}.{minor} compiled the kernel library for {arch} in {:?}", t.elapsed());
    if let Some(d) = &dir {
        // Best effort, written atomically (rename), so concurrent processes never read halves.
        let write = |ext: &str, bytes: &[u8]| -> std::io::Result<()> {
            std::fs::create_dir_all(d)?;
            let tmp = d.join(format!("{key}.{ext}.{}", std::process::id()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(tmp, d.join(format!("{key}.{ext}")))
        };
        if let Err(e) = write("cubin", &out.cubin).and_then(|()| write("ptx", out.ptx.as_bytes())) {
            tracing::warn!(target: "unihal::cuda", "kernel cache {}: {e}", d.display());
        }
    }
    Ok((out.ptx, out.cubin))
}

/// Compiles (or reads from the cache) and loads the library on `dev`: cubin first, PTX if the
/// driver rejects the cubin.
///
/// # Errors
/// [`unihal_hal::HalError::Unavailable`] without NVRTC; NVRTC's log; the driver's error for the
/// PTX.
pub(crate) fn load(dev: &Arc<CudaDevice>, arch: &str) -> Result<Library> {
    let (ptx, cubin) = compiled(arch)?;
    // The cubin carries no parameter sizes: they come from the PTX of the same build.
    let cubin_err =
        match CudaModule::load_with(dev.clone(), &ModuleSource::Cubin(cubin), Some(&ptx)) {
            Ok(module) => {
                return Ok(Library {
                    module,
                    loaded: "cubin".into(),
                    functions: Mutex::new(HashMap::new()),
                });
            }
            Err(e) => e,
        };
    let module = CudaModule::load(dev.clone(), &ModuleSource::Ptx(ptx)).inspect_err(|e| {
        tracing::error!(target: "unihal::cuda", "the kernel library loads neither as cubin ({cubin_err}) nor as PTX ({e})");
    })?;
    tracing::info!(target: "unihal::cuda", "kernel library loaded from PTX (cubin refused: {cubin_err})");
    Ok(Library {
        module,
        loaded: format!("PTX (cubin refused: {cubin_err})"),
        functions: Mutex::new(HashMap::new()),
    })
}
