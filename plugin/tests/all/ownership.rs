//! The HAL's ownership rules across the boundary, where the host and the plugin each hold half:
//! memory that queued plugin work uses lives until that work ran, whoever dropped its handles.
//! (Found by AddressSanitizer on the suite's blocker: a launch's buffers cross as bare
//! addresses, so the plugin cannot keep them; the host must.)

use crate::support;

use std::sync::{Arc, Condvar, Mutex};
use unihal_hal::{Device, KernelArgs, LaunchConfig, Registry, Stream};
use unihal_plugin::host;

/// A host callback that holds `s` until the returned function opens it.
fn hold(s: &Arc<dyn Stream>) -> impl FnOnce() {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    s.host_callback(Box::new(move || {
        let mut open = g.0.lock().unwrap();
        while !*open {
            open = g.1.wait(open).unwrap();
        }
    }))
    .unwrap();
    move || {
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    }
}

/// Device `ordinal` of the CPU plugin (one device per test: they read its free memory).
fn cpu_plugin(ordinal: usize) -> (Arc<dyn unihal_hal::Backend>, Arc<dyn Device>) {
    let r = Registry::new();
    host::register(&r, &support::built("libunihal_cpu_plugin.so"), &[], &[]).unwrap();
    let b = r.get("cpu").unwrap();
    let d = b.open(ordinal).unwrap();
    (b, d)
}

#[test]
fn a_launchs_buffers_live_until_it_ran_though_the_host_dropped_them() {
    let (b, dev) = cpu_plugin(0);
    let s = dev.create_stream().unwrap();
    let module = dev
        .load_module(&b.test_kernels(dev.as_ref()).unwrap())
        .unwrap();
    let iota = module.function("unihal_test_iota_u32").unwrap();
    let n: u32 = 1 << 20;
    let before = dev.memory_info().unwrap().free;
    let buf = dev.alloc(4 * n as usize).unwrap();
    let open = hold(&s);
    let mut args = KernelArgs::new();
    args.push_buffer(&buf).push(n);
    // SAFETY: iota_u32(out: *mut u32, n: u32) with a buffer of n u32s, kept by the launch.
    unsafe { s.launch(&iota, &LaunchConfig::linear(n / 256, 256), &args) }.unwrap();
    drop((args, buf));
    assert_eq!(
        dev.memory_info().unwrap().free,
        before - 4 * n as u64,
        "the launch's buffer was freed while the launch is queued"
    );
    open();
    s.synchronize().unwrap();
    assert_eq!(
        dev.memory_info().unwrap().free,
        before,
        "released once the launch ran"
    );
}

#[test]
fn copies_keep_their_memory_through_the_plugins_own_handles() {
    let (_, dev) = cpu_plugin(1);
    let s = dev.create_stream().unwrap();
    let before = dev.memory_info().unwrap().free;
    let (a, c) = (dev.alloc(1 << 20).unwrap(), dev.alloc(1 << 20).unwrap());
    let open = hold(&s);
    s.copy_d2d(&a, 0, &c, 0, 1 << 20).unwrap();
    drop((a, c));
    assert_eq!(dev.memory_info().unwrap().free, before - (2 << 20));
    open();
    s.synchronize().unwrap();
    assert_eq!(dev.memory_info().unwrap().free, before);
}

/// Drops count, to see an import's owner released exactly once.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn a_refused_import_releases_its_owner_exactly_once() {
    let (_, dev) = cpu_plugin(2);
    let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // SAFETY: a null address with a length: the import is refused before any memory is used.
    let r = unsafe { dev.import_memory(0, 8, Box::new(Counted(drops.clone()))) };
    assert!(
        matches!(r, Err(unihal_hal::HalError::InvalidArgument { .. })),
        "{r:?}"
    );
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
}
