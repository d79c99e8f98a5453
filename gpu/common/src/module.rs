//! Kernel modules of a GPU runtime and their functions. The runtime says which formats it loads
//! and where parameter sizes come from ([`Runtime::prepare_module`]); launches of entries with
//! known sizes are size-checked.

use crate::device::{Core, GpuDevice};
use crate::runtime::{Raw, Runtime};
use std::any::Any;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;
use unihal_hal::{
    DeviceId, Function, HalError, Invalid, Module, ModuleFormat, ModuleSource, Result,
};

/// A loaded module. Unloaded when the module and all its functions are dropped. Keeps the
/// device's [`Core`] (runtime and context), not the device: the device keeps its kernel
/// library's modules, and a module keeping the device would make a cycle that never unloads.
pub struct GpuModule<R: Runtime> {
    core: Arc<Core<R>>,
    raw: Raw,
    format: ModuleFormat,
    /// Parameter sizes per entry, where the format carries them.
    params: HashMap<String, Vec<usize>>,
    me: std::sync::Weak<GpuModule<R>>,
}

impl<R: Runtime> GpuModule<R> {
    /// Loads `source` into the device.
    ///
    /// # Errors
    /// [`HalError::Unsupported`] for formats the runtime does not load;
    /// [`HalError::InvalidArgument`] for an image it cannot read; the runtime's load error as a
    /// vendor error.
    pub fn load(dev: Arc<GpuDevice<R>>, source: &ModuleSource) -> Result<Arc<GpuModule<R>>> {
        let rt = dev.rt();
        let prepared = rt.prepare_module(source)?;
        GpuModule::load_prepared(dev, source.format(), prepared)
    }

    /// Loads an image already prepared (the kernel library's, whose parameter sizes come from
    /// another part of the same compilation).
    ///
    /// # Errors
    /// The runtime's load error as a vendor error.
    pub fn load_prepared(
        dev: Arc<GpuDevice<R>>,
        format: ModuleFormat,
        prepared: crate::runtime::PreparedModule,
    ) -> Result<Arc<GpuModule<R>>> {
        let rt = dev.rt();
        let raw = dev.call("module load", || rt.module_load(&prepared.image))?;
        Ok(Arc::new_cyclic(|me| GpuModule {
            core: dev.core.clone(),
            raw,
            format,
            params: prepared.params,
            me: me.clone(),
        }))
    }
}

impl<R: Runtime> Module for GpuModule<R> {
    fn device_id(&self) -> DeviceId {
        self.core.id
    }

    fn format(&self) -> ModuleFormat {
        self.format
    }

    fn function(&self, name: &str) -> Result<Arc<dyn Function>> {
        let not_entry = || {
            HalError::invalid(
                "name",
                Invalid::Value {
                    value: format!("kernel {name:?}"),
                    accepted: "an entry of the module".into(),
                },
            )
        };
        let cname = CString::new(name).map_err(|_| {
            HalError::invalid(
                "name",
                Invalid::Value {
                    value: format!("{name:?}"),
                    accepted: "an entry name without NUL".into(),
                },
            )
        })?;
        let rt = self.core.rt;
        let raw = self
            .core
            .call("module function", || rt.module_function(self.raw, &cname))?
            .ok_or_else(not_entry)?;
        let module = self
            .me
            .upgrade()
            .ok_or_else(|| HalError::Internal("module used while being dropped".into()))?;
        Ok(Arc::new(GpuFunction {
            params: self.params.get(name).cloned(),
            name: name.to_string(),
            raw,
            module,
        }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<R: Runtime> Drop for GpuModule<R> {
    fn drop(&mut self) {
        let (core, raw) = (self.core.clone(), self.raw);
        crate::deferred::release(move || {
            let rt = core.rt;
            core.release("module unload", move || {
                // SAFETY: loaded in `load_prepared`, unloaded once (a retried release runs only
                // when the earlier attempt did not); functions (which queued launches keep) hold
                // the module alive, so no launch of it is pending.
                unsafe { rt.module_unload(raw) }
            });
        });
    }
}

/// A kernel of a loaded module; keeps the module loaded.
pub struct GpuFunction<R: Runtime> {
    pub(crate) module: Arc<GpuModule<R>>,
    pub(crate) raw: Raw,
    name: String,
    params: Option<Vec<usize>>,
}

impl<R: Runtime> Function for GpuFunction<R> {
    fn device_id(&self) -> DeviceId {
        self.module.core.id
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn param_sizes(&self) -> Option<&[usize]> {
        self.params.as_deref()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
