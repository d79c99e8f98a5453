//! The GPU side of the collective engine: [`GpuPlatform`], the `unihal-ccl` platform that
//! runs a library of the NCCL API (NCCL, RCCL) on the devices and streams of one GPU runtime.

use crate::device::GpuDevice;
use crate::runtime::Runtime;
use crate::stream::{device_addr, GpuStream};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;
use unihal_ccl::Platform;
use unihal_hal::{Buffer, Device, DeviceId, HalError, Invalid, Keep, Result, Stream};

/// Devices and streams of runtime `R` for the NCCL-API engine. Stateless; `Send + Sync`.
pub struct GpuPlatform<R>(PhantomData<fn() -> R>);

impl<R> Default for GpuPlatform<R> {
    fn default() -> Self {
        GpuPlatform(PhantomData)
    }
}

impl<R> std::fmt::Debug for GpuPlatform<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GpuPlatform")
    }
}

/// The NCCL-API engine of `flavor` (NCCL, RCCL) on runtime `R`'s devices and streams; the
/// library is opened on first use.
pub fn nccl_api_engine<R: Runtime>(flavor: unihal_ccl::Flavor) -> unihal_ccl::NcclEngine {
    unihal_ccl::Engine::new(flavor, Arc::new(GpuPlatform::<R>::default()))
}

fn gpu_device<R: Runtime>(device: &Arc<dyn Device>) -> Result<&GpuDevice<R>> {
    device
        .as_any()
        .downcast_ref::<GpuDevice<R>>()
        .ok_or_else(|| {
            HalError::invalid(
                "device",
                Invalid::ForeignHandle {
                    expected: format!("{} device", R::VENDOR),
                    found: format!("device {}", device.id()),
                },
            )
        })
}

impl<R: Runtime> Platform for GpuPlatform<R> {
    fn name(&self) -> &'static str {
        R::VENDOR
    }

    fn device_ordinal(&self, device: &Arc<dyn Device>) -> Result<i32> {
        gpu_device::<R>(device).map(|_| device.id().ordinal as i32)
    }

    fn with_current(
        &self,
        device: &Arc<dyn Device>,
        what: &str,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        gpu_device::<R>(device)?.call(what, f)
    }

    fn buffer_addr(
        &self,
        buf: &Buffer,
        arg: &'static str,
        device: DeviceId,
        len: u64,
    ) -> Result<u64> {
        device_addr::<R>(buf, arg, device, 0, len)
    }

    fn on_replay(&self, stream: &Arc<dyn Stream>, hook: unihal_ccl::platform::ReplayHook) -> bool {
        GpuStream::<R>::of(stream).is_ok_and(|s| s.on_replay(hook))
    }

    fn check_stream(&self, stream: &Arc<dyn Stream>) -> Result<()> {
        GpuStream::<R>::of(stream).map(drop)
    }

    fn submit(
        &self,
        stream: &Arc<dyn Stream>,
        what: &str,
        keep: Vec<Keep>,
        f: &mut dyn FnMut(*mut c_void) -> Result<()>,
    ) -> Result<()> {
        GpuStream::<R>::of(stream)?.submit(what, keep, |raw| f(raw.0))
    }

    fn fail_stream(&self, stream: &Arc<dyn Stream>, e: HalError) {
        if let Ok(s) = GpuStream::<R>::of(stream) {
            s.fail(e);
        }
    }

    fn release(&self, release: Box<dyn FnOnce() + Send>) {
        crate::deferred::release(release);
    }
}
