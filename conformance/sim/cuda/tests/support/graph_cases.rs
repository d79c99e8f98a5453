//! Stream capture and graphs through the simulated CUDA driver's C entry points, shared by the
//! deferred-mode (`tests/all/graph.rs`) and concurrent-mode (`tests/all/graph_concurrent.rs`)
//! binaries. Tests of one binary run one at a time: a global-mode capture refuses other threads'
//! unsafe calls, as on CUDA.
#![allow(dead_code)]

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};
use unihal_sim_cuda::conv::*;
use unihal_sim_cuda::driver::*;

pub type S = *mut c_void;

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn ok(r: i32) {
    assert_eq!(r, CUDA_SUCCESS, "CUresult {r}");
}

/// Initialises the driver (in `mode`) and makes device 0 current on this thread.
pub fn init(mode: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("UNIHAL_SIM_MODE", mode));
    ok(cuInit(0));
    let mut ctx = null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuDevicePrimaryCtxRetain(&mut ctx, 0)) };
    ok(cuCtxSetCurrent(ctx));
}

pub fn stream() -> S {
    let mut s = null_mut();
    // SAFETY: an out-pointer to a local; CU_STREAM_NON_BLOCKING.
    unsafe { ok(cuStreamCreate(&mut s, 1)) };
    s
}

pub fn blocking_stream() -> S {
    let mut s = null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuStreamCreate(&mut s, 0)) };
    s
}

pub fn event() -> S {
    let mut e = null_mut();
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuEventCreate(&mut e, 0)) };
    e
}

pub fn alloc(n: usize) -> u64 {
    let mut p = 0;
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuMemAlloc_v2(&mut p, n)) };
    p
}

/// The bytes at `p` once all work ran (the null stream, legacy: after blocking streams; the
/// others are synchronised first).
pub fn read(p: u64, n: usize) -> Vec<u8> {
    ok(cuCtxSynchronize());
    let mut v = vec![0u8; n];
    // SAFETY: `n` writable bytes.
    unsafe {
        ok(cuMemcpyDtoHAsync_v2(
            v.as_mut_ptr() as *mut c_void,
            p,
            n,
            null_mut(),
        ))
    };
    v
}

pub fn fill(p: u64, v: u8, n: usize, s: S) {
    ok(cuMemsetD8Async(p, v, n, s));
}

pub fn status(s: S) -> i32 {
    let mut st = -1;
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuStreamIsCapturing(s, &mut st)) };
    st
}

pub fn begin(s: S, mode: i32) {
    ok(cuStreamBeginCapture_v2(s, mode));
}

/// Ends the capture: the graph, or the error (with the graph then null).
pub fn end(s: S) -> Result<S, i32> {
    let mut g = std::ptr::dangling_mut::<c_void>();
    // SAFETY: an out-pointer to a local.
    let r = unsafe { cuStreamEndCapture(s, &mut g) };
    if r == 0 {
        assert!(!g.is_null());
        Ok(g)
    } else {
        assert!(g.is_null(), "a failed capture gives a null graph");
        Err(r)
    }
}

pub fn instantiate(g: S, flags: u64) -> Result<S, i32> {
    let mut e = null_mut();
    // SAFETY: an out-pointer to a local.
    match unsafe { cuGraphInstantiateWithFlags(&mut e, g, flags) } {
        0 => Ok(e),
        r => Err(r),
    }
}

pub fn nodes(g: S) -> usize {
    let mut n = 0usize;
    // SAFETY: a null array asks for the count.
    unsafe { ok(cuGraphGetNodes(g, null_mut(), &mut n)) };
    n
}

extern "C" fn bump(data: *mut c_void) {
    // SAFETY: the tests pass a live `AtomicUsize`.
    unsafe { &*(data as *const AtomicUsize) }.fetch_add(1, Ordering::SeqCst);
}

pub fn host_bump(counter: &'static AtomicUsize, s: S) {
    ok(cuLaunchHostFunc(
        s,
        Some(bump),
        counter as *const AtomicUsize as *mut c_void,
    ));
}

/// Capture records, replays run what was captured on the buffers' current contents; replays of
/// one executable are ordered; the graph may be destroyed before its executable.
pub fn capture_and_replay(mode: &str) {
    init(mode);
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let (a, b) = (alloc(64), alloc(64));
    fill(a, 1, 64, null_mut());
    fill(b, 0, 64, null_mut());
    // Blocking streams: ordered after the legacy stream's fills.
    let s = blocking_stream();
    begin(s, 0);
    assert_eq!(status(s), 1);
    let (mut st, mut id) = (-1, 0u64);
    // SAFETY: out-pointers to locals.
    unsafe { ok(cuStreamGetCaptureInfo(s, &mut st, &mut id)) };
    assert!(st == 1 && id != 0);
    ok(cuMemcpyDtoDAsync_v2(b, a, 64, s));
    host_bump(&RUNS, s);
    let g = end(s).unwrap();
    assert_eq!(status(s), 0, "ending leaves capture");
    assert_eq!(nodes(g), 2);
    assert_eq!(read(b, 64), vec![0; 64], "captured work does not run");
    assert_eq!(RUNS.load(Ordering::SeqCst), 0);
    let e = instantiate(g, 0).unwrap();
    ok(cuGraphDestroy(g));
    assert_eq!(cuGraphDestroy(g), CUDA_ERROR_INVALID_HANDLE);
    fill(a, 5, 64, null_mut());
    ok(cuGraphLaunch(e, s));
    assert_eq!(
        read(b, 64),
        vec![5; 64],
        "a replay reads the buffers' current contents"
    );
    fill(a, 7, 64, null_mut());
    // Launches of one executable on two streams: the second waits for the first.
    let s2 = blocking_stream();
    ok(cuGraphLaunch(e, s));
    ok(cuGraphLaunch(e, s2));
    ok(cuStreamSynchronize(s2));
    assert_eq!(
        RUNS.load(Ordering::SeqCst),
        3,
        "the launch on s ran before the one on s2"
    );
    assert_eq!(read(b, 64), vec![7; 64]);
    // Destroying an executable with a launch queued: the launch still runs.
    ok(cuGraphLaunch(e, s));
    ok(cuGraphExecDestroy(e));
    assert_eq!(cuGraphLaunch(e, s), CUDA_ERROR_INVALID_HANDLE);
    ok(cuStreamSynchronize(s));
    assert_eq!(RUNS.load(Ordering::SeqCst), 4);
}

/// A fork and join across streams through events; the joined stream reports the capture.
pub fn fork_and_join(mode: &str) {
    init(mode);
    let (a, b, c) = (alloc(32), alloc(32), alloc(32));
    fill(c, 0, 32, null_mut());
    let (s1, s2) = (stream(), stream());
    let (e1, e2) = (event(), event());
    begin(s1, 0);
    fill(a, 2, 32, s1);
    ok(cuEventRecord(e1, s1));
    ok(cuStreamWaitEvent(s2, e1, 0));
    assert_eq!(status(s2), 1, "s2 joined");
    let (mut st, mut i1, mut i2) = (0, 0u64, 0u64);
    // SAFETY: out-pointers to locals.
    unsafe {
        ok(cuStreamGetCaptureInfo(s1, &mut st, &mut i1));
        ok(cuStreamGetCaptureInfo_v2(
            s2,
            &mut st,
            &mut i2,
            null_mut(),
            null_mut(),
            null_mut(),
        ));
    }
    assert_eq!(i1, i2, "one capture");
    ok(cuMemcpyDtoDAsync_v2(b, a, 32, s2));
    ok(cuEventRecord(e2, s2));
    ok(cuStreamWaitEvent(s1, e2, 0));
    ok(cuMemcpyDtoDAsync_v2(c, b, 32, s1));
    let g = end(s1).unwrap();
    assert_eq!(status(s2), 0, "every stream leaves capture at the end");
    assert_eq!(nodes(g), 3);
    let e = instantiate(g, 0).unwrap();
    let s3 = stream();
    ok(cuGraphLaunch(e, s3));
    assert_eq!(read(c, 32), vec![2; 32]);
    ok(cuGraphExecDestroy(e));
    ok(cuGraphDestroy(g));
}

/// Stream-ordered allocation in a capture: allocation and free nodes; an allocation that escapes
/// the graph must be freed before the next launch (or auto-freed); one executable at a time.
pub fn memory_nodes(mode: &str) {
    init(mode);
    let out = alloc(64);
    let s = stream();
    begin(s, 0);
    let mut p = 0u64;
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuMemAllocAsync(&mut p, 64, s)) };
    fill(p, 3, 64, s);
    ok(cuMemcpyDtoDAsync_v2(out, p, 64, s));
    ok(cuMemFreeAsync(p, s));
    let g = end(s).unwrap();
    assert_eq!(nodes(g), 4);
    let e = instantiate(g, 0).unwrap();
    assert_eq!(
        instantiate(g, 0),
        Err(CUDA_ERROR_INVALID_VALUE),
        "one executable at a time"
    );
    for _ in 0..2 {
        fill(out, 0, 64, null_mut());
        ok(cuGraphLaunch(e, s));
        assert_eq!(read(out, 64), vec![3; 64]);
    }
    ok(cuGraphExecDestroy(e));
    ok(cuGraphDestroy(g));

    // Escaping: the caller frees it.
    begin(s, 0);
    let mut q = 0u64;
    // SAFETY: an out-pointer to a local.
    unsafe { ok(cuMemAllocAsync(&mut q, 16, s)) };
    fill(q, 9, 16, s);
    let g = end(s).unwrap();
    let e = instantiate(g, 0).unwrap();
    ok(cuGraphLaunch(e, s));
    assert_eq!(
        read(q, 16),
        vec![9; 16],
        "the replay's allocation is the caller's"
    );
    assert_eq!(
        cuGraphLaunch(e, s),
        CUDA_ERROR_INVALID_VALUE,
        "not freed yet"
    );
    ok(cuMemFreeAsync(q, s));
    ok(cuGraphLaunch(e, s));
    ok(cuStreamSynchronize(s));
    ok(cuGraphExecDestroy(e));
    let e = instantiate(g, 1).unwrap();
    ok(cuGraphLaunch(e, s));
    ok(cuGraphLaunch(e, s));
    ok(cuStreamSynchronize(s));
    ok(cuGraphExecDestroy(e));
    ok(cuGraphDestroy(g));
}
