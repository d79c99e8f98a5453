//! Shared by the engine's tests on unihal's simulated NCCL.
#![allow(dead_code)] // each test uses what it needs

use std::path::PathBuf;
use std::sync::Arc;
use unihal_ccl::Platform;
use unihal_hal::{Buffer, Device, DeviceId, HalError, Invalid, Keep, Result, Stream};

/// The simulated driver and NCCL built for these tests (one object, `libunihal_sim_cuda.so`).
pub fn simulated_library() -> PathBuf {
    unihal_sim_cuda::built_library()
}

/// A platform with no device of its own: every device and stream is foreign. Enough for what
/// the engine does before touching a device (loading, capabilities, ids, argument checks).
pub struct NoDevices;

fn foreign(arg: &'static str, found: String) -> HalError {
    HalError::invalid(
        arg,
        Invalid::ForeignHandle {
            expected: "a device of the test platform (it has none)".into(),
            found,
        },
    )
}

impl Platform for NoDevices {
    fn name(&self) -> &'static str {
        "none"
    }
    fn device_ordinal(&self, device: &Arc<dyn Device>) -> Result<i32> {
        Err(foreign("device", format!("device {}", device.id())))
    }
    fn with_current(
        &self,
        device: &Arc<dyn Device>,
        _: &str,
        _: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        Err(foreign("device", format!("device {}", device.id())))
    }
    fn buffer_addr(&self, buf: &Buffer, arg: &'static str, _: DeviceId, _: u64) -> Result<u64> {
        Err(foreign(arg, format!("buffer of {}", buf.device())))
    }
    fn check_stream(&self, stream: &Arc<dyn Stream>) -> Result<()> {
        Err(foreign(
            "stream",
            format!("stream of {}", stream.device_id()),
        ))
    }
    fn submit(
        &self,
        stream: &Arc<dyn Stream>,
        _: &str,
        _: Vec<Keep>,
        _: &mut dyn FnMut(*mut std::ffi::c_void) -> Result<()>,
    ) -> Result<()> {
        self.check_stream(stream)
    }
    fn fail_stream(&self, _: &Arc<dyn Stream>, _: HalError) {}
    fn release(&self, release: Box<dyn FnOnce() + Send>) {
        release()
    }
}
