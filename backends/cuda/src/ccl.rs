//! The CUDA side of the collective engine: [`CudaPlatform`], the `unihal-nccl-api` platform that
//! runs NCCL (or any library of the NCCL API) on CUDA devices and streams.

use crate::device::CudaDevice;
use crate::stream::{cuda_addr, CudaStream};
use std::ffi::c_void;
use std::sync::Arc;
use unihal_hal::{Buffer, Device, DeviceId, HalError, Invalid, Keep, Result, Stream};
use unihal_nccl_api::Platform;

/// CUDA devices and streams for the NCCL-API engine. Stateless; `Send + Sync`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CudaPlatform;

fn cuda_device(device: &Arc<dyn Device>) -> Result<&CudaDevice> {
    device.as_any().downcast_ref::<CudaDevice>().ok_or_else(|| {
        HalError::invalid(
            "device",
            Invalid::ForeignHandle {
                expected: "CUDA device".into(),
                found: format!("device {}", device.id()),
            },
        )
    })
}

fn cuda_stream(stream: &Arc<dyn Stream>) -> Result<&CudaStream> {
    stream.as_any().downcast_ref::<CudaStream>().ok_or_else(|| {
        HalError::invalid(
            "stream",
            Invalid::ForeignHandle {
                expected: "CUDA stream".into(),
                found: format!("stream of {}", stream.device_id()),
            },
        )
    })
}

impl Platform for CudaPlatform {
    fn name(&self) -> &'static str {
        "CUDA"
    }

    fn device_ordinal(&self, device: &Arc<dyn Device>) -> Result<i32> {
        cuda_device(device).map(|_| device.id().ordinal as i32)
    }

    fn with_current(
        &self,
        device: &Arc<dyn Device>,
        what: &str,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        cuda_device(device)?.call(what, f)
    }

    fn buffer_addr(
        &self,
        buf: &Buffer,
        arg: &'static str,
        device: DeviceId,
        len: u64,
    ) -> Result<u64> {
        cuda_addr(buf, arg, device, 0, len)
    }

    fn check_stream(&self, stream: &Arc<dyn Stream>) -> Result<()> {
        cuda_stream(stream).map(drop)
    }

    fn submit(
        &self,
        stream: &Arc<dyn Stream>,
        what: &str,
        keep: Vec<Keep>,
        f: &mut dyn FnMut(*mut c_void) -> Result<()>,
    ) -> Result<()> {
        cuda_stream(stream)?.submit_with(what, keep, |raw| f(raw as *mut c_void))
    }

    fn fail_stream(&self, stream: &Arc<dyn Stream>, e: HalError) {
        if let Ok(s) = cuda_stream(stream) {
            s.fail(e);
        }
    }

    fn release(&self, release: Box<dyn FnOnce() + Send>) {
        crate::deferred::release(release);
    }
}
