//! The portable kernel library on a device: compiled once per architecture through the shared
//! kernel cache ([`compiled`]: memory, then disk under `UNIHAL_KERNEL_CACHE`, then the vendor's
//! runtime compiler, timed and logged), and as loaded on one device ([`Library`]: its module and
//! the entries resolved so far). A backend says only how it compiles (its compiler, the cache key,
//! the parts it keeps) and how it loads the parts (a cubin with a PTX fallback, a code object).

use crate::kernel_cache::{CacheKey, KernelCache, Parts};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use unihal_hal::{Device, Function, Module, Result};

/// The compiled parts of `key` (named images, e.g. "ptx" and "cubin"), from the cache or from
/// `compile`; `what` names the compiler and source in the log ("NVRTC 13.0 compiled
/// unihal_kernels.cu for sm_90 in 1.2s").
///
/// # Errors
/// `compile`'s (nothing is cached then).
pub fn compiled(
    key: &CacheKey,
    what: &str,
    compile: impl FnOnce() -> Result<Parts>,
) -> Result<Arc<Parts>> {
    let (parts, from) = KernelCache::global().get_or_compile(key, || {
        let t = std::time::Instant::now();
        let parts = compile()?;
        tracing::info!(target: "unihal::kernel", "{what} for {} in {:?}", key.target, t.elapsed());
        Ok(parts)
    })?;
    tracing::debug!(target: "unihal::kernel", "{what} for {}: {from:?}", key.target);
    Ok(parts)
}

/// The part `name` of `parts` (empty when absent).
pub fn part(parts: &Parts, name: &str) -> Vec<u8> {
    parts
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b.clone())
        .unwrap_or_default()
}

/// The architecture `dev` reports (`sm_90`, `gfx90a`; empty when it reports none), which the
/// library is compiled for.
pub fn device_arch(dev: &dyn Device) -> String {
    dev.capabilities().optional.arch.clone().unwrap_or_default()
}

/// Deletes the kernel cache on disk (and forgets the compiled images of this process).
///
/// # Errors
/// The I/O error, except when there is nothing to delete.
pub fn clear_cache() -> std::io::Result<()> {
    KernelCache::global().clear()
}

/// The library loaded on one device. Thread-safe; entries are resolved once.
pub struct Library {
    module: Arc<dyn Module>,
    /// Which image loaded and why (e.g. "cubin", "PTX (cubin refused: ...)", "code object").
    pub loaded: String,
    functions: Mutex<HashMap<String, Arc<dyn Function>>>,
}

impl Library {
    /// The library in `module`, described by `loaded`.
    pub fn new(module: Arc<dyn Module>, loaded: impl Into<String>) -> Library {
        Library {
            module,
            loaded: loaded.into(),
            functions: Mutex::new(HashMap::new()),
        }
    }

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
