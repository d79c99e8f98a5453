//! The CUDA stream's error paths on the simulated driver (deferred mode: queued work runs only at
//! a synchronisation, so "still queued" is certain), with failures injected into chosen driver
//! calls of the test's own thread: what queued work still uses is never released early, and a
//! panicking host callback fails its stream.

use crate::support;

use std::sync::Arc;
use support::{controls, simulated_driver};
use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, Device, HalError, HostBuffer, Stream};

fn device() -> Arc<dyn Device> {
    std::env::set_var("UNIHAL_CUDA_LIB", simulated_driver());
    std::env::set_var("UNIHAL_SIM_MODE", "deferred");
    static BACKEND: std::sync::OnceLock<CudaBackend> = std::sync::OnceLock::new();
    BACKEND.get_or_init(CudaBackend::new).open(0).unwrap()
}

/// A stream with a device-to-host copy into a fresh host buffer queued (not run yet), and the
/// device buffer (filled with 7s) it reads.
fn queued_copy(dev: &Arc<dyn Device>) -> (Arc<dyn Stream>, HostBuffer) {
    let s = dev.create_stream().unwrap();
    let d = dev.alloc(64).unwrap();
    s.write(&d, 0, &[7u8; 64]).unwrap();
    let h = dev.alloc_host(64).unwrap();
    s.copy_d2h(&d, 0, &h, 0, 64).unwrap();
    (s, h)
}

fn busy(h: &HostBuffer) -> bool {
    h.map().is_err()
}

/// The calling thread's next event queries say "not ready" (in deferred mode a query would run
/// the stream: this keeps the queued work queued, as a busy GPU would).
fn still_running() {
    for _ in 0..8 {
        controls::fail("cuEventQuery", 1, 600);
    }
}

/// A copy is one enqueue with what it keeps: the context call after it (the next enqueue's)
/// failing can no longer drop its host range and buffer under it (RELIABILITY.md, defect 24:
/// they were kept by a second enqueue, whose failure left the queued copy without them).
#[test]
fn a_copy_keeps_its_buffers_in_the_enqueue_that_queues_it() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let d = dev.alloc(64).unwrap();
    dev.create_stream()
        .unwrap()
        .write(&d, 0, &[7u8; 64])
        .unwrap();
    let s = dev.create_stream().unwrap();
    let h = dev.alloc_host(64).unwrap();
    // The copy's own call succeeds; the next one that makes the context current fails.
    controls::fail("cuCtxSetCurrent", 2, 201);
    let r = s.copy_d2h(&d, 0, &h, 0, 64);
    controls::clear();
    r.unwrap();
    assert!(
        busy(&h),
        "the host range was released under its queued copy"
    );
    drop(d);
    s.synchronize().unwrap();
    assert_eq!(&*h.map().unwrap(), &[7u8; 64]);
}

#[test]
fn a_failed_event_create_keeps_the_batch_until_a_synchronisation() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let d = dev.alloc(64).unwrap();
    dev.create_stream()
        .unwrap()
        .write(&d, 0, &[7u8; 64])
        .unwrap();
    // A fresh stream (no spare event): the copy's tracking event cannot be created; the copy is
    // queued all the same.
    let s = dev.create_stream().unwrap();
    let h = dev.alloc_host(64).unwrap();
    controls::fail("cuEventCreate", 1, 2);
    let r = s.copy_d2h(&d, 0, &h, 0, 64);
    controls::clear();
    r.unwrap();
    assert!(
        busy(&h),
        "host buffer released while its copy is still queued"
    );
    s.synchronize().unwrap();
    assert_eq!(&*h.map().unwrap(), &[7u8; 64]);
}

#[test]
fn a_failed_event_record_keeps_the_batch_without_waiting() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let s = dev.create_stream().unwrap();
    let d = dev.alloc(64).unwrap();
    let h = dev.alloc_host(64).unwrap();
    controls::fail("cuEventRecord", 1, 2);
    let r = s.copy_d2h(&d, 0, &h, 0, 64);
    controls::clear();
    r.unwrap();
    // Not synchronised meanwhile (deferred mode: the copy has not run).
    assert!(
        busy(&h),
        "host buffer released while its copy is still queued"
    );
    s.synchronize().unwrap();
    assert!(!busy(&h));
}

#[test]
fn a_host_callback_on_a_failed_stream_keeps_the_host_uses() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let (s, h) = queued_copy(&dev);
    // A fault poisons the stream (sticky): the callback is refused.
    let d = dev.alloc(64).unwrap();
    still_running();
    controls::fail("cuMemsetD8Async", 1, 700);
    let fill = s.fill(&d, 0, 64, unihal_hal::FillValue::U8(0));
    controls::clear();
    assert!(
        matches!(fill, Err(HalError::Vendor { code: 700, .. })),
        "{fill:?}"
    );
    assert!(s.host_callback(Box::new(|| {})).is_err());
    assert!(
        busy(&h),
        "host buffer released while its copy is still queued"
    );
}

#[test]
fn a_failed_host_function_launch_keeps_the_host_uses() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let (s, h) = queued_copy(&dev);
    still_running();
    controls::fail("cuLaunchHostFunc", 1, 2);
    let r = s.host_callback(Box::new(|| {}));
    controls::clear();
    assert!(r.is_err());
    assert!(
        busy(&h),
        "host buffer released while its copy is still queued"
    );
    s.synchronize().unwrap();
    assert_eq!(&*h.map().unwrap(), &[7u8; 64]);
}

#[test]
fn a_failed_release_launch_in_drop_frees_nothing_early() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let (s, h) = queued_copy(&dev);
    // The stream's release (a host function behind its work) cannot be queued.
    controls::fail("cuLaunchHostFunc", 1, 2);
    drop(s);
    controls::clear();
    assert!(
        busy(&h),
        "host buffer released while its copy is still queued"
    );
}

#[test]
fn a_panicking_host_callback_fails_its_stream() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let s = dev.create_stream().unwrap();
    s.host_callback(Box::new(|| panic!("callback panics on purpose")))
        .unwrap();
    let r = s.synchronize();
    assert!(
        matches!(&r, Err(HalError::Internal(m)) if m.contains("panicked")),
        "{r:?}"
    );
    assert!(s.async_error().is_some());
    assert!(s.host_callback(Box::new(|| {})).is_err());
}

#[test]
fn a_result_code_cuda_h_does_not_list_is_a_vendor_error_with_its_number() {
    if crate::own_process() {
        return;
    }
    let dev = device();
    let s = dev.create_stream().unwrap();
    let d = dev.alloc(64).unwrap();
    // 12345 is no CUresult: the backend must read it as the integer it is.
    controls::fail("cuMemAlloc_v2", 1, 12345);
    let a = dev.alloc(64);
    controls::fail("cuMemsetD8Async", 1, 12345);
    let f = s.fill(&d, 0, 64, unihal_hal::FillValue::U8(0));
    controls::clear();
    for r in [a.map(|_| ()), f] {
        assert!(
            matches!(&r, Err(HalError::Vendor { code: 12345, name, .. }) if name == "CUresult 12345"),
            "{r:?}"
        );
    }
    // Not a poisoning error: the stream goes on.
    s.fill(&d, 0, 64, unihal_hal::FillValue::U8(1)).unwrap();
    s.synchronize().unwrap();
}
