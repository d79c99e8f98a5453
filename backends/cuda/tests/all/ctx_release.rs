//! The last handle to a device dropped inside a host function (here: the stream release that
//! runs as a host function behind the stream's work) does not release the primary context there:
//! a host function must not call the driver, which the simulated driver refuses and records.

use crate::support;

use std::sync::Arc;
use support::{controls, simulated_driver};
use unihal_cuda::CudaBackend;
use unihal_hal::Backend;

#[test]
fn the_context_is_not_released_from_a_host_function() {
    if crate::own_process() {
        return;
    }
    std::env::set_var("UNIHAL_CUDA_LIB", simulated_driver());
    std::env::set_var("UNIHAL_SIM_MODE", "deferred");
    let before = controls::violations().0;
    let backend = CudaBackend::new();
    let dev = backend.open(0).unwrap();
    let s = dev.create_stream().unwrap();
    // The stream is now the device's last holder; its release, queued as a host function,
    // drops the device.
    drop(backend);
    drop(dev);
    drop(s);
    // Another handle of the device runs the queued host function (deferred mode).
    let other = Arc::new(CudaBackend::new());
    let d = other.open(0).unwrap();
    d.synchronize().unwrap();
    d.create_stream().unwrap().synchronize().unwrap();
    let (after, last) = controls::violations();
    assert_eq!(after, before, "{last}");
}
