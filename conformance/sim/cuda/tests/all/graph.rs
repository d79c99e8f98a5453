//! Stream capture and graphs on the simulated CUDA driver (deferred mode): replay, fork and join,
//! memory nodes, and every rule of capture with its documented code, each illegal call
//! invalidating the capture so that its end fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.

use crate::cases;

use cases::*;
use std::ffi::c_void;
use std::ptr::null_mut;
use unihal_sim_cuda::conv::*;
use unihal_sim_cuda::driver::*;

#[test]
fn deferred_capture_and_replay() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    capture_and_replay("deferred");
}

#[test]
fn deferred_fork_and_join() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    fork_and_join("deferred");
}

#[test]
fn deferred_memory_nodes() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    memory_nodes("deferred");
}

/// Begins a capture on a fresh stream, makes `illegal` (which must return `code`), and checks
/// that the capture is then invalidated and its end fails.
fn invalidates(code: i32, illegal: impl FnOnce(S) -> i32) {
    let s = stream();
    let p = alloc(16);
    begin(s, 0);
    fill(p, 1, 16, s);
    assert_eq!(illegal(s), code);
    assert_eq!(status(s), 2, "invalidated");
    assert_eq!(
        cuMemsetD8Async(alloc_relaxed(), 0, 1, s),
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        "work on an invalidated capture"
    );
    assert_eq!(end(s), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
    assert_eq!(status(s), 0, "the failed end leaves capture");
    ok(cuStreamDestroy_v2(s));
}

/// An allocation that no capture refuses (this thread relaxed for the call).
fn alloc_relaxed() -> u64 {
    let mut m = 2;
    // SAFETY: out-pointers to locals.
    unsafe {
        ok(cuThreadExchangeStreamCaptureMode(&mut m));
        let p = alloc(16);
        ok(cuThreadExchangeStreamCaptureMode(&mut m));
        assert_eq!(m, 2);
        p
    }
}

#[test]
fn illegal_calls_fail_and_invalidate_the_capture() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    init("deferred");
    invalidates(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, |s| {
        cuStreamSynchronize(s)
    });
    invalidates(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, |s| cuStreamQuery(s));
    invalidates(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, |_| {
        cuCtxSynchronize()
    });
    invalidates(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, |_| {
        let mut p = 0;
        // SAFETY: an out-pointer to a local.
        unsafe { cuMemAlloc_v2(&mut p, 16) }
    });
    invalidates(CUDA_ERROR_CAPTURED_EVENT, |s| {
        let e = event();
        ok(cuEventRecord(e, s));
        cuEventQuery(e)
    });
    invalidates(CUDA_ERROR_CAPTURED_EVENT, |s| {
        let e = event();
        ok(cuEventRecord(e, s));
        cuEventSynchronize(e)
    });
    invalidates(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, |s| {
        let p = alloc_relaxed();
        let mut host = [0u8; 16];
        // SAFETY: 16 writable bytes (pageable: a synchronous copy).
        unsafe { cuMemcpyDtoHAsync_v2(host.as_mut_ptr() as *mut c_void, p, 16, s) }
    });
    invalidates(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, |s| {
        let p = alloc_relaxed();
        let host = [0u8; 16];
        // SAFETY: 16 readable bytes (pageable).
        unsafe { cuMemcpyHtoDAsync_v2(p, host.as_ptr() as *const c_void, 16, s) }
    });
    invalidates(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, |s| {
        let (other, e) = (stream(), event());
        fill(alloc_relaxed(), 0, 16, other);
        ok(cuEventRecord(e, other));
        cuStreamWaitEvent(s, e, 0)
    });
    invalidates(CUDA_ERROR_STREAM_CAPTURE_MERGE, |s| {
        let (other, e) = (stream(), event());
        begin(other, 2);
        ok(cuEventRecord(e, other));
        let r = cuStreamWaitEvent(s, e, 0);
        assert_eq!(end(other), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        r
    });
    // The legacy stream while a blocking stream captures.
    let s = blocking_stream();
    begin(s, 0);
    assert_eq!(
        cuMemsetD8Async(alloc_relaxed(), 0, 16, null_mut()),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    );
    let mut st = 0;
    // SAFETY: an out-pointer to a local.
    unsafe {
        assert_eq!(
            cuStreamIsCapturing(null_mut(), &mut st),
            CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
        )
    };
    assert_eq!(end(s), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
    // An event recorded in an ended capture stays captured.
    let (s, e) = (stream(), event());
    begin(s, 0);
    ok(cuEventRecord(e, s));
    let g = end(s).unwrap();
    assert_eq!(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
    ok(cuEventRecord(e, s));
    ok(cuEventSynchronize(e));
    ok(cuGraphDestroy(g));
}

#[test]
fn begin_and_end_misuse_give_the_documented_codes() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    init("deferred");
    assert_eq!(
        cuStreamBeginCapture_v2(null_mut(), 0),
        CUDA_ERROR_INVALID_VALUE
    );
    assert_eq!(
        cuStreamBeginCapture_v2(stream(), 3),
        CUDA_ERROR_INVALID_VALUE
    );
    let s = stream();
    assert_eq!(end(s), Err(CUDA_ERROR_ILLEGAL_STATE), "not capturing");
    begin(s, 0);
    assert_eq!(cuStreamBeginCapture_v2(s, 0), CUDA_ERROR_ILLEGAL_STATE);
    // From another thread: a global capture cannot be ended there.
    let sh = s as usize;
    let r = std::thread::spawn(move || {
        init("deferred");
        end(sh as S).map(|g| g as usize)
    })
    .join()
    .unwrap();
    assert_eq!(r, Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD));
    assert_eq!(status(s), 1, "still capturing");
    // Ending on a stream that joined.
    let (s2, e) = (stream(), event());
    ok(cuEventRecord(e, s));
    ok(cuStreamWaitEvent(s2, e, 0));
    assert_eq!(end(s2), Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED));
    assert_eq!(end(s), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
    // A stream that joined and never rejoined the origin.
    begin(s, 0);
    ok(cuEventRecord(e, s));
    ok(cuStreamWaitEvent(s2, e, 0));
    fill(alloc_relaxed(), 1, 16, s2);
    assert_eq!(end(s), Err(CUDA_ERROR_STREAM_CAPTURE_UNJOINED));
    assert_eq!(status(s2), 0);
    // A relaxed capture may be ended from another thread.
    begin(s, 2);
    let r = std::thread::spawn(move || {
        init("deferred");
        end(sh as S).map(|g| g as usize)
    })
    .join()
    .unwrap();
    ok(cuGraphDestroy(r.unwrap() as S));
    let mut name = std::ptr::null();
    // SAFETY: an out-pointer to a local.
    unsafe {
        ok(cuGetErrorName(
            CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
            &mut name,
        ))
    };
}

#[test]
fn capture_modes_decide_which_unsafe_calls_are_refused() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    init("deferred");
    let alloc_on_thread = |mode: i32| {
        std::thread::spawn(move || {
            init("deferred");
            let mut m = mode;
            let mut p = 0;
            // SAFETY: out-pointers to locals.
            unsafe {
                ok(cuThreadExchangeStreamCaptureMode(&mut m));
                assert_eq!(m, 0, "threads start in global mode");
                cuMemAlloc_v2(&mut p, 16)
            }
        })
        .join()
        .unwrap()
    };
    // Thread-local: other threads allocate; the capturing thread may not.
    let s = stream();
    begin(s, 1);
    assert_eq!(alloc_on_thread(0), CUDA_SUCCESS);
    assert_eq!(status(s), 1);
    let mut p = 0;
    // SAFETY: an out-pointer to a local.
    let r = unsafe { cuMemAlloc_v2(&mut p, 16) };
    assert_eq!(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(end(s), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
    // Relaxed: nobody is refused.
    begin(s, 2);
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuMemAlloc_v2(&mut p, 16)) };
    assert_eq!(alloc_on_thread(0), CUDA_SUCCESS);
    ok(cuGraphDestroy(end(s).unwrap()));
    // Global: a thread in relaxed mode may; one in global mode may not (and invalidates).
    begin(s, 0);
    assert_eq!(alloc_on_thread(2), CUDA_SUCCESS);
    assert_eq!(
        alloc_on_thread(1),
        CUDA_SUCCESS,
        "thread-local: only its own captures count"
    );
    assert_eq!(status(s), 1);
    assert_eq!(alloc_on_thread(0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_eq!(end(s), Err(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
}

#[test]
fn independent_branches_replay_latest_captured_first() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    init("deferred");
    // Node 0 fills `a`; a forked branch copies `a` to `b` without waiting for the fill (a bug of
    // the capturing code): the replay runs the later-captured branch first, so `b` misses it.
    let (a, b) = (alloc_relaxed(), alloc_relaxed());
    fill(a, 0, 16, null_mut());
    fill(b, 0, 16, null_mut());
    let (s1, s2) = (stream(), stream());
    let (fork, join) = (event(), event());
    begin(s1, 0);
    ok(cuEventRecord(fork, s1));
    fill(a, 4, 16, s1);
    ok(cuStreamWaitEvent(s2, fork, 0));
    ok(cuMemcpyDtoDAsync_v2(b, a, 16, s2));
    ok(cuEventRecord(join, s2));
    ok(cuStreamWaitEvent(s1, join, 0));
    let g = end(s1).unwrap();
    let e = instantiate(g, 0).unwrap();
    ok(cuGraphLaunch(e, s1));
    assert_eq!(read(b, 16), vec![0; 16], "the missing dependency shows");
    assert_eq!(read(a, 16), vec![4; 16]);
    // A second instantiation is independent of the first.
    let e2 = instantiate(g, 0).unwrap();
    ok(cuGraphLaunch(e2, s2));
    ok(cuStreamSynchronize(s2));
    for h in [e, e2] {
        ok(cuGraphExecDestroy(h));
    }
    ok(cuGraphDestroy(g));
}
