//! Kernel modules of the CUDA backend: PTX (JIT-compiled by the driver) and cubin images loaded
//! with `cuModuleLoadData`, and their functions.

use crate::conv::vendor;
use crate::device::CudaDevice;
use crate::drv::result;
use cudarc::driver::sys;
use std::any::Any;
use std::collections::HashMap;
use std::ffi::CString;
use std::sync::Arc;
use unihal_hal::{
    DeviceId, Function, HalError, Invalid, Module, ModuleFormat, ModuleSource, Result,
};

/// A loaded module. Unloaded when the module and all its functions are dropped.
pub struct CudaModule {
    dev: Arc<CudaDevice>,
    raw: sys::CUmodule,
    format: ModuleFormat,
    /// Parameter sizes per entry, read from PTX (a cubin does not carry them here).
    params: HashMap<String, Vec<usize>>,
    me: std::sync::Weak<CudaModule>,
}

// SAFETY: module handles may be used from any thread.
unsafe impl Send for CudaModule {}
// SAFETY: as above.
unsafe impl Sync for CudaModule {}

impl CudaModule {
    /// Loads PTX or a cubin into the device's context.
    ///
    /// # Errors
    /// [`HalError::Unsupported`] for other formats; [`HalError::InvalidArgument`] for PTX that
    /// cannot be read or contains NUL; the driver's error (e.g. `CUDA_ERROR_INVALID_IMAGE`,
    /// `CUDA_ERROR_INVALID_PTX`) as a vendor error.
    pub(crate) fn load(dev: Arc<CudaDevice>, source: &ModuleSource) -> Result<Arc<CudaModule>> {
        CudaModule::load_with(dev, source, None)
    }

    /// As [`CudaModule::load`]; a cubin takes its entries' parameter sizes from `ptx` (the PTX of
    /// the same compilation).
    pub(crate) fn load_with(
        dev: Arc<CudaDevice>,
        source: &ModuleSource,
        ptx: Option<&str>,
    ) -> Result<Arc<CudaModule>> {
        let bad = |why: String| {
            HalError::invalid(
                "source",
                Invalid::Value {
                    value: why,
                    accepted: "NUL-free PTX text with readable entries".into(),
                },
            )
        };
        let (image, params): (Vec<u8>, HashMap<String, Vec<usize>>) = match source {
            ModuleSource::Ptx(text) => {
                let entries = unihal_kernels::rtc::ptx_signatures(text).map_err(bad)?;
                let c = CString::new(text.as_str())
                    .map_err(|_| bad("PTX text with a NUL byte".into()))?;
                (
                    c.into_bytes_with_nul(),
                    entries
                        .into_iter()
                        .map(|e| (e.name, e.param_sizes))
                        .collect(),
                )
            }
            ModuleSource::Cubin(bytes) => {
                let params = match ptx {
                    Some(p) => unihal_kernels::rtc::ptx_signatures(p)
                        .map_err(bad)?
                        .into_iter()
                        .map(|e| (e.name, e.param_sizes))
                        .collect(),
                    None => HashMap::new(),
                };
                (bytes.clone(), params)
            }
            other => {
                return Err(HalError::unsupported(format!(
                    "the CUDA backend loads PTX and cubin, not {:?} modules",
                    other.format()
                )))
            }
        };
        let raw = dev.call("cuModuleLoadData", || {
            // SAFETY: a NUL-terminated PTX string or a complete cubin image, alive for the call.
            unsafe { result::module::load_data(image.as_ptr() as *const _) }
                .map_err(|e| vendor("cuModuleLoadData", e))
        })?;
        Ok(Arc::new_cyclic(|me| CudaModule {
            dev,
            raw,
            format: source.format(),
            params,
            me: me.clone(),
        }))
    }
}

impl Module for CudaModule {
    fn device_id(&self) -> DeviceId {
        self.dev.ctx.id
    }

    fn format(&self) -> ModuleFormat {
        self.format
    }

    fn function(&self, name: &str) -> Result<Arc<dyn Function>> {
        let cname = CString::new(name).map_err(|_| {
            HalError::invalid(
                "name",
                Invalid::Value {
                    value: format!("{name:?}"),
                    accepted: "an entry name without NUL".into(),
                },
            )
        })?;
        let raw = self.dev.call("cuModuleGetFunction", || {
            // SAFETY: a loaded module and a NUL-terminated name.
            unsafe { result::module::get_function(self.raw, &cname) }.map_err(|e| {
                if e.0 == crate::drv::codes::NOT_FOUND {
                    HalError::invalid(
                        "name",
                        Invalid::Value {
                            value: format!("kernel {name:?}"),
                            accepted: "an entry of the module".into(),
                        },
                    )
                } else {
                    vendor("cuModuleGetFunction", e)
                }
            })
        })?;
        let module = self
            .me
            .upgrade()
            .ok_or_else(|| HalError::Internal("module used while being dropped".into()))?;
        Ok(Arc::new(CudaFunction {
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

impl Drop for CudaModule {
    fn drop(&mut self) {
        let (dev, raw) = (self.dev.clone(), self.raw as usize);
        crate::deferred::release(move || {
            let _ = dev.call("cuModuleUnload", || {
                // SAFETY: loaded in `load`, unloaded once; functions hold the module alive.
                unsafe { result::module::unload(raw as sys::CUmodule) }
                    .map_err(|e| vendor("cuModuleUnload", e))
            });
        });
    }
}

/// A kernel of a loaded module; keeps the module loaded.
pub struct CudaFunction {
    pub(crate) module: Arc<CudaModule>,
    pub(crate) raw: sys::CUfunction,
    name: String,
    params: Option<Vec<usize>>,
}

// SAFETY: function handles may be used from any thread.
unsafe impl Send for CudaFunction {}
// SAFETY: as above.
unsafe impl Sync for CudaFunction {}

impl Function for CudaFunction {
    fn device_id(&self) -> DeviceId {
        self.module.dev.ctx.id
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
