//! A plugin as a HAL [`Backend`].

use super::ccl::PluginCollectives;
use super::device::PluginDevice;
use super::module::check_source;
use super::Plugin;
use crate::conv;
use std::any::Any;
use std::sync::Arc;
use unihal_hal::{
    Backend, BackendInfo, Collectives, Device, HalError, Invalid, ModuleSource, Result,
};
use unihal_plugin_abi::*;

/// A loaded plugin's backend: devices opened once each, the plugin's collectives and manifest.
///
/// Ownership: `Arc<dyn Backend>` in the registry; the plugin it wraps lives for the process.
/// Thread safety: any thread.
pub struct PluginBackend {
    p: &'static Plugin,
    devices: parking_lot::Mutex<Vec<(u32, Arc<PluginDevice>)>>,
    ccl: Option<PluginCollectives>,
}

impl PluginBackend {
    /// The backend of a loaded plugin (see [`super::load`]).
    pub fn new(p: &'static Plugin) -> PluginBackend {
        // `ccl_caps` was read and checked at load.
        let ccl = p.ccl.clone().map(|c| PluginCollectives::new(p, c));
        PluginBackend {
            p,
            devices: parking_lot::Mutex::new(Vec::new()),
            ccl,
        }
    }

    /// The plugin behind this backend.
    pub fn plugin(&self) -> &'static Plugin {
        self.p
    }
}

impl Backend for PluginBackend {
    fn name(&self) -> &'static str {
        self.p.name
    }

    fn info(&self) -> BackendInfo {
        self.p.info.clone()
    }

    fn probe(&self) -> Result<usize> {
        let mut n = 0u32;
        self.p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(self.p.api.probe, "probe", "probe", |f, e| unsafe {
                f(&mut n, e)
            })?;
        if n == 0 {
            return Err(HalError::Unavailable {
                what: format!("backend {}", self.p.name),
                reason: format!("the plugin {} reports no device", self.p.path),
            });
        }
        Ok(n as usize)
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        let n = self.probe()?;
        let ord = u32::try_from(ordinal)
            .ok()
            .filter(|_| ordinal < n)
            .ok_or_else(|| {
                HalError::invalid(
                    "ordinal",
                    Invalid::Value {
                        value: ordinal.to_string(),
                        accepted: format!("0..{n}"),
                    },
                )
            })?;
        let mut devices = self.devices.lock();
        if let Some((_, d)) = devices.iter().find(|(o, _)| *o == ord) {
            return Ok(d.clone() as Arc<dyn Device>);
        }
        let d = PluginDevice::open(self.p, ord, n)?;
        devices.push((ord, d.clone()));
        Ok(d as Arc<dyn Device>)
    }

    fn collectives(&self) -> Option<&dyn Collectives> {
        self.ccl.as_ref().map(|c| c as &dyn Collectives)
    }

    fn conformance_manifest(&self) -> &'static str {
        self.p.manifest
    }

    fn test_kernels(&self, device: &dyn Device) -> Option<ModuleSource> {
        let d = device.as_any().downcast_ref::<PluginDevice>()?;
        let mut src = std::mem::MaybeUninit::<UhModuleSource>::zeroed();
        let r = self
            .p
            // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
            .call(
                self.p.api.test_kernels,
                "test_kernels",
                "test kernels",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                |f, e| unsafe { f(d.raw(), src.as_mut_ptr(), e) },
            );
        // SAFETY: filled by the plugin, or left all zero (a valid source: no bytes, no symbols).
        let src = unsafe { src.assume_init() };
        let r = r.and_then(|()| check_source(self.p, "test_kernels", &src));
        match r {
            // SAFETY: filled by the plugin, its arrays checked (valid forever, header).
            Ok(()) => match unsafe { conv::get_module_source(&src) } {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(target: "unihal::plugin", "{}: test kernels refused: {e}", self.p.path);
                    None
                }
            },
            Err(e) => {
                if !matches!(e, HalError::Unsupported { .. }) {
                    tracing::warn!(target: "unihal::plugin", "{}: test kernels refused: {e}", self.p.path);
                }
                None
            }
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
