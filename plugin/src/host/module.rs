//! A plugin's modules and functions as HAL objects.

use super::device::PluginDevice;
use super::{check_array, Plugin, MAX_ARRAY_ENTRIES};
use crate::conv::{self, SourceStore};
use std::any::Any;
use std::ffi::CString;
use std::sync::Arc;
use unihal_hal::{
    DeviceId, Function, HalError, Invalid, Module, ModuleFormat, ModuleSource, Result,
};
use unihal_plugin_abi::*;

/// A loaded plugin module.
///
/// Thread safety: any thread.
pub struct PluginModule {
    p: &'static Plugin,
    raw: *mut UhModule,
    id: DeviceId,
    format: ModuleFormat,
    dev: Arc<PluginDevice>,
}

// SAFETY: the raw handle is an opaque token the plugin accepts from any thread (header rule 6).
unsafe impl Send for PluginModule {}
// SAFETY: as above.
unsafe impl Sync for PluginModule {}

impl PluginModule {
    pub(super) fn load(dev: Arc<PluginDevice>, source: &ModuleSource) -> Result<PluginModule> {
        let p = dev.plugin();
        let mut keep = SourceStore::default();
        let src = conv::put_module_source(source, &mut keep)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the entry's contract; `src` points into `keep`, alive for the call.
        p.call(
            p.api.module_load,
            "module_load",
            "module load",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe { f(dev.raw(), &src, &mut raw, e) },
        )?;
        if raw.is_null() {
            return Err(p.broke("module_load", "returned UH_OK with a NULL module"));
        }
        Ok(PluginModule {
            p,
            raw,
            id: unihal_hal::Device::id(&*dev),
            format: source.format(),
            dev,
        })
    }
}

impl Drop for PluginModule {
    fn drop(&mut self) {
        if let Some(f) = self.p.api.module_release {
            // SAFETY: our handle, released once (functions hold their own on the plugin's side).
            unsafe { f(self.raw) }
        }
    }
}

impl Module for PluginModule {
    fn device_id(&self) -> DeviceId {
        self.id
    }

    fn format(&self) -> ModuleFormat {
        self.format
    }

    fn function(&self, name: &str) -> Result<Arc<dyn Function>> {
        let c = CString::new(name).map_err(|_| {
            HalError::invalid(
                "name",
                Invalid::Other("a kernel name with a NUL byte".into()),
            )
        })?;
        let (mut raw, mut has, mut n, mut sizes) =
            (std::ptr::null_mut(), 0u32, 0u64, std::ptr::null());
        // SAFETY: the entry's contract.
        self.p.call(
            self.p.api.module_function,
            "module_function",
            "module function",
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            |f, e| unsafe {
                f(
                    self.raw,
                    c.as_ptr(),
                    &mut raw,
                    &mut has,
                    &mut n,
                    &mut sizes,
                    e,
                )
            },
        )?;
        let checked = if raw.is_null() {
            Err("returned UH_OK with a NULL function".to_string())
        } else if has != 0 {
            check_array(sizes, n, MAX_ARRAY_ENTRIES, "parameter sizes")
        } else {
            Ok(())
        };
        if let Err(what) = checked {
            if !raw.is_null() {
                if let Some(f) = self.p.api.function_release {
                    // SAFETY: the handle the plugin just returned, released once, never kept.
                    unsafe { f(raw) }
                }
            }
            return Err(self
                .p
                .broke("module_function", format!("{what} for {name:?}")));
        }
        let param_sizes = (has != 0).then(|| {
            // SAFETY: `n` sizes (checked above) valid while the function lives (header);
            // copied here.
            unsafe { conv::slice(sizes, n as usize) }
                .iter()
                .map(|&s| s as usize)
                .collect()
        });
        Ok(Arc::new(PluginFunction {
            p: self.p,
            raw,
            id: self.id,
            name: name.to_string(),
            param_sizes,
            _dev: self.dev.clone(),
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A kernel of a plugin module.
pub struct PluginFunction {
    p: &'static Plugin,
    raw: *mut UhFunction,
    id: DeviceId,
    name: String,
    param_sizes: Option<Vec<usize>>,
    _dev: Arc<PluginDevice>,
}

// SAFETY: as PluginModule.
unsafe impl Send for PluginFunction {}
// SAFETY: as PluginModule.
unsafe impl Sync for PluginFunction {}

impl PluginFunction {
    pub(crate) fn plugin(&self) -> &'static Plugin {
        self.p
    }
    pub(crate) fn raw(&self) -> *mut UhFunction {
        self.raw
    }
}

impl Drop for PluginFunction {
    fn drop(&mut self) {
        if let Some(f) = self.p.api.function_release {
            // SAFETY: our handle, released once.
            unsafe { f(self.raw) }
        }
    }
}

impl Function for PluginFunction {
    fn device_id(&self) -> DeviceId {
        self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn param_sizes(&self) -> Option<&[usize]> {
        self.param_sizes.as_deref()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Checks a module source a plugin returned (`entry` names the entry): its bytes, host kernels
/// and their parameter sizes in range and not at NULL, before any of them is read.
///
/// # Errors
/// [`HalError::AbiMismatch`] naming the entry and the plugin.
pub(super) fn check_source(p: &Plugin, entry: &str, s: &UhModuleSource) -> Result<()> {
    let broke = |what: String| p.broke(entry, what);
    check_array(s.bytes, s.len, isize::MAX as u64, "bytes of module image").map_err(broke)?;
    check_array(s.symbols, s.n_symbols, MAX_ARRAY_ENTRIES, "host kernels").map_err(broke)?;
    // SAFETY: `n_symbols` entries (checked above), valid forever (header rule 5).
    for sym in unsafe { conv::slice(s.symbols, s.n_symbols as usize) } {
        check_array(
            sym.param_sizes,
            sym.n_params,
            MAX_ARRAY_ENTRIES,
            "parameter sizes of a host kernel",
        )
        .map_err(broke)?;
    }
    Ok(())
}
