//! A plugin's modules and functions as HAL objects.

use super::device::PluginDevice;
use super::Plugin;
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
        p.call(p.api.module_load, "module load", |f, e| unsafe {
            f(dev.raw(), &src, &mut raw, e)
        })?;
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
        let param_sizes = (has != 0).then(|| {
            // SAFETY: `n` sizes valid while the function lives (header); copied here.
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
