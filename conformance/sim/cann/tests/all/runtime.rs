//! The simulated ACL runtime through its C entry points: contexts, memory, copies, streams,
//! events, callbacks, and the error codes of misuse.

use crate::support;

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::report::*;
use unihal_sim_cann::runtime::*;

#[test]
fn init_twice_is_refused_and_the_soc_is_named() {
    if crate::own_process() {
        return;
    }
    init();
    assert_eq!(aclInit(std::ptr::null()), 100_002);
    assert!(msg().contains("twice"), "{}", msg());
    // SAFETY: a NUL-terminated string owned by the simulator.
    let soc = unsafe { CStr::from_ptr(aclrtGetSocName()) };
    assert_eq!(soc.to_str().unwrap(), "Ascend910B2");
    let mut n = 0u32;
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtGetDeviceCount(&mut n)) };
    assert_eq!(n, 4);
    assert_eq!(aclrtSetDevice(9), 107_001, "an invalid device id");
}

#[test]
fn calls_need_a_current_context_on_the_calling_thread() {
    if crate::own_process() {
        return;
    }
    init();
    std::thread::spawn(|| {
        let mut p = null_mut();
        // SAFETY: a live out-pointer.
        assert_eq!(unsafe { aclrtMalloc(&mut p, 64, 0) }, 107_002);
        assert!(msg().contains("no current context"), "{}", msg());
        let mut s = null_mut();
        // SAFETY: a live out-pointer.
        assert_eq!(unsafe { aclrtCreateStream(&mut s) }, 107_002);
        assert_eq!(aclrtSetDevice(1), 0);
        // SAFETY: a live out-pointer.
        unsafe { ok(aclrtMalloc(&mut p, 64, 0)) };
        ok(aclrtFree(p));
        ok(aclrtResetDevice(1));
    })
    .join()
    .unwrap();
}

#[test]
fn a_stream_of_another_context_is_refused() {
    if crate::own_process() {
        return;
    }
    init();
    let mut s = null_mut();
    // SAFETY: live out-pointers.
    unsafe { ok(aclrtCreateStream(&mut s)) };
    let (mut ctx, mut back) = (null_mut(), null_mut());
    // SAFETY: live out-pointers.
    unsafe {
        ok(aclrtGetCurrentContext(&mut back));
        ok(aclrtCreateContext(&mut ctx, 0));
    }
    assert_eq!(aclrtSynchronizeStream(s), 107_003);
    ok(aclrtSetCurrentContext(back));
    ok(aclrtSynchronizeStream(s));
    ok(aclrtDestroyStream(s));
    ok(aclrtDestroyContext(ctx));
    assert_eq!(aclrtSetCurrentContext(ctx), 107_017, "a destroyed context");
    ok(aclrtSetCurrentContext(back));
}

#[test]
fn memory_rules() {
    if crate::own_process() {
        return;
    }
    init();
    let mut p = null_mut();
    // SAFETY: live out-pointers.
    unsafe {
        assert_eq!(aclrtMalloc(&mut p, 0, 0), 100_000, "size 0");
        assert_eq!(aclrtMalloc(&mut p, 64, 9), 100_000, "an unknown policy");
        assert_eq!(
            aclrtMalloc(&mut p, 1 << 50, 0),
            207_001,
            "beyond the capacity"
        );
        ok(aclrtMalloc(&mut p, 64, 3));
    }
    ok(aclrtFree(p));
    assert_eq!(aclrtFree(p), 207_002, "a double free");
    let mut h = null_mut();
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtMallocHost(&mut h, 256)) };
    ok(aclrtFreeHost(h));
    let mut free = 0usize;
    let mut total = 0usize;
    // SAFETY: live out-pointers.
    unsafe { ok(aclrtGetMemInfo(1, &mut free, &mut total)) };
    assert!(total > 0 && free <= total);
}

#[test]
fn copies_check_their_kind_and_sizes() {
    if crate::own_process() {
        return;
    }
    init();
    let d = dev(&[1.0f32, 2.0, 3.0, 4.0]);
    let mut out = [0f32; 4];
    let o = out.as_mut_ptr() as *mut c_void;
    // SAFETY: live buffers of the sizes passed.
    unsafe {
        assert_eq!(
            aclrtMemcpy(o, 16, d, 16, 1),
            100_000,
            "H2D with a device source"
        );
        assert_eq!(aclrtMemcpy(o, 8, d, 16, 2), 100_000, "destMax below count");
        ok(aclrtMemcpy(o, 16, d, 16, 4));
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
        let mut h2 = [0f32; 4];
        assert_eq!(
            aclrtMemcpyAsync(h2.as_mut_ptr() as *mut c_void, 16, o, 16, 0, null_mut()),
            207_000,
            "asynchronous host-to-host"
        );
        ok(aclrtMemsetAsync(d, 16, 0, 16, null_mut()));
        ok(aclrtSynchronizeStream(null_mut()));
    }
    assert_eq!(host::<f32>(d, 4), [0.0; 4]);
    ok(aclrtFree(d));
}

#[test]
fn copies_between_devices_need_peer_access() {
    if crate::own_process() {
        return;
    }
    init();
    let a = dev(&[7u8; 64]);
    ok(aclrtSetDevice(1));
    let b = dev(&[0u8; 64]);
    ok(aclrtSetDevice(0));
    // SAFETY: device buffers of 64 bytes.
    unsafe {
        assert_eq!(aclrtMemcpy(b, 64, a, 64, 3), 100_000);
        assert!(msg().contains("aclrtDeviceEnablePeerAccess"), "{}", msg());
        let r = aclrtDeviceEnablePeerAccess(1, 0);
        assert!(r == 0 || r == 100_000, "{r}");
        ok(aclrtMemcpy(b, 64, a, 64, 7));
    }
    ok(aclrtSetDevice(1));
    assert_eq!(host::<u8>(b, 64), vec![7u8; 64]);
    ok(aclrtFree(b));
    ok(aclrtSetDevice(0));
    ok(aclrtFree(a));
}

#[test]
fn events_query_time_and_wait_as_their_flags_say() {
    if crate::own_process() {
        return;
    }
    init();
    let (mut s1, mut s2) = (null_mut(), null_mut());
    let (mut timed, mut untimed_sync, mut timeline_only) = (null_mut(), null_mut(), null_mut());
    // SAFETY: live out-pointers.
    unsafe {
        ok(aclrtCreateStream(&mut s1));
        ok(aclrtCreateStream(&mut s2));
        ok(aclrtCreateEvent(&mut timed));
        ok(aclrtCreateEventWithFlag(&mut untimed_sync, 0x1));
        ok(aclrtCreateEventWithFlag(&mut timeline_only, 0x8));
        assert_eq!(aclrtCreateEventWithFlag(&mut null_mut(), 0x400), 100_000);
    }
    let d = dev(&[0u8; 1024]);
    ok(aclrtRecordEvent(timed, s1));
    ok(aclrtMemsetAsync(d, 1024, 1, 1024, s1));
    ok(aclrtRecordEvent(timeline_only, s1));
    ok(aclrtRecordEvent(untimed_sync, s1));
    // Deferred mode: nothing ran yet; each query says so with its own number.
    let (mut st, mut old) = (-1, -1);
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtQueryEventStatus(untimed_sync, &mut st)) };
    assert_eq!(st, 0, "ACL_EVENT_RECORDED_STATUS_NOT_READY");
    assert_eq!(
        aclrtStreamWaitEvent(s2, timeline_only),
        100_000,
        "TIME_LINE only: no waits"
    );
    ok(aclrtStreamWaitEvent(s2, untimed_sync));
    ok(aclrtSynchronizeStream(s2));
    // SAFETY: live out-pointers.
    unsafe {
        ok(aclrtQueryEventStatus(untimed_sync, &mut st));
        ok(aclrtQueryEvent(untimed_sync, &mut old));
        assert_eq!((st, old), (1, 0));
        let mut ms = -1f32;
        assert_eq!(
            aclrtEventElapsedTime(&mut ms, timed, untimed_sync),
            100_000,
            "SYNC only: no timing"
        );
        ok(aclrtEventElapsedTime(&mut ms, timed, timeline_only));
        assert!(ms >= 0.0);
    }
    ok(aclrtMemsetAsync(d, 1024, 2, 1024, s1));
    ok(aclrtRecordEvent(untimed_sync, s1));
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtQueryEvent(untimed_sync, &mut old)) };
    assert_eq!(old, 1, "ACL_EVENT_STATUS_NOT_READY of the deprecated query");
    ok(aclrtSynchronizeEvent(untimed_sync));
    for e in [timed, untimed_sync, timeline_only] {
        ok(aclrtDestroyEvent(e));
    }
    assert_eq!(aclrtDestroyEvent(timed), 107_017, "a destroyed event");
    ok(aclrtDestroyStream(s1));
    ok(aclrtDestroyStream(s2));
    ok(aclrtFree(d));
}

unsafe extern "C" fn bump(data: *mut c_void) {
    // SAFETY: the test's static AtomicU32.
    unsafe { &*(data as *const std::sync::atomic::AtomicU32) }
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

extern "C" {
    fn pthread_self() -> u64;
}

#[test]
fn callbacks_run_only_on_the_subscribed_thread() {
    if crate::own_process() {
        return;
    }
    init();
    let mut s = null_mut();
    // SAFETY: a live out-pointer.
    unsafe { ok(aclrtCreateStream(&mut s)) };
    static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let count = &COUNT;
    let data = count as *const _ as *mut c_void;
    assert_eq!(
        aclrtLaunchCallback(Some(bump), data, 1, s),
        107_015,
        "no subscriber"
    );
    assert_eq!(
        aclrtProcessReport(10),
        107_012,
        "this thread subscribed to nothing"
    );
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let worker = std::thread::spawn(move || {
        ok(aclrtSetDevice(0));
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { pthread_self() }).unwrap();
        go_rx.recv().unwrap();
        while !stop2.load(std::sync::atomic::Ordering::SeqCst) {
            let r = aclrtProcessReport(20);
            assert!(r == 0 || r == 507_012, "aclrtProcessReport: {r}");
        }
    });
    let tid = rx.recv().unwrap();
    ok(aclrtSubscribeReport(tid, s));
    assert_eq!(aclrtSubscribeReport(tid, s), 107_011, "subscribed twice");
    go_tx.send(()).unwrap();
    ok(aclrtLaunchCallback(Some(bump), data, 1, s));
    ok(aclrtLaunchCallback(Some(bump), data, 0, s));
    ok(aclrtSynchronizeStream(s));
    // The blocking callback ran before the synchronisation returned; the other may follow.
    assert!(count.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    worker.join().unwrap();
    ok(aclrtUnSubscribeReport(tid, s));
    ok(aclrtDestroyStream(s));
}

#[test]
fn kernel_binaries_are_refused_with_a_message() {
    if crate::own_process() {
        return;
    }
    init();
    let mut h = null_mut();
    assert_eq!(
        unihal_sim_cann::kernel::aclrtBinaryLoadFromFile(c"/k.o".as_ptr(), null_mut(), &mut h),
        207_000
    );
    assert!(
        msg().contains("cannot run on the simulated CANN runtime"),
        "{}",
        msg()
    );
    assert!(unihal_sim_cann::aclGetRecentErrMsg().is_null(), "read once");
}

#[test]
fn a_synchronize_with_timeout_ends() {
    if crate::own_process() {
        return;
    }
    init();
    ok(aclrtSynchronizeStreamWithTimeout(null_mut(), 100));
    assert_eq!(aclrtSynchronizeStreamWithTimeout(null_mut(), -5), 100_000);
}

#[test]
fn the_device_name_export_says_simulated() {
    if crate::own_process() {
        return;
    }
    init();
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: a 64-byte buffer.
    unsafe { ok(unihal_sim_cann_device_name(1, buf.as_mut_ptr(), buf.len())) };
    // SAFETY: NUL-terminated by the call.
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(name, "unihal simulated Ascend910B NPU 1 (not an NPU)");
    assert_eq!(
        // SAFETY: as above.
        unsafe { unihal_sim_cann_device_name(9, buf.as_mut_ptr(), buf.len()) },
        107_001
    );
}

#[test]
fn device_names_say_simulated() {
    if crate::own_process() {
        return;
    }
    assert_eq!(
        device_name("Ascend910B2", 3, unihal_sim::Mode::Deferred),
        "unihal simulated Ascend910B NPU 3 (not an NPU)"
    );
}
