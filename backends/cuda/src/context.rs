//! A device's primary context, bound to the calling thread before every driver call.

use crate::conv::vendor;
use crate::drv::result;
use cudarc::driver::sys;
use unihal_hal::{DeviceId, Result};

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
                tracing::warn!(target: "unihal::cuda", "{}", vendor("cuDevicePrimaryCtxRelease", e));
            }
        });
    }
}
