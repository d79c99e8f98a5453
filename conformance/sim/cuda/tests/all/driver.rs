//! The simulated CUDA driver through its C entry points (in process): device queries, memory,
//! pageable copies, streams and events (a planted missing wait gives wrong results in the default
//! deferred mode), PTX modules running a library kernel through `kernelParams`, a cubin rejected
//! with CUDA_ERROR_INVALID_IMAGE, peer copies and waits across devices, and CUDA's codes for
//! misuse.

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use unihal_kernels::args::UhArgs;
use unihal_sim_cuda::conv::*;
use unihal_sim_cuda::driver::*;

fn ok(r: i32) {
    assert_eq!(r, CUDA_SUCCESS, "CUresult {r}");
}

/// Initialises the driver and makes device 0's primary context current on this thread.
fn init() {
    ok(cuInit(0));
    set_device(0);
}

fn set_device(d: i32) {
    let mut ctx = null_mut();
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe { ok(cuDevicePrimaryCtxRetain(&mut ctx, d)) };
    ok(cuCtxSetCurrent(ctx));
}

#[test]
fn device_queries_name_a_simulated_device() {
    if crate::own_process() {
        return;
    }
    init();
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe {
        let mut n = 0;
        ok(cuDeviceGetCount(&mut n));
        assert_eq!(n, 2, "two devices by default");
        let mut name = [0 as std::ffi::c_char; 128];
        ok(cuDeviceGetName(name.as_mut_ptr(), 128, 0));
        let name = CStr::from_ptr(name.as_ptr()).to_str().unwrap().to_string();
        assert!(name.contains("simulated"), "{name}");
        let (mut major, mut warp) = (0, 0);
        ok(cuDeviceGetAttribute(&mut major, 75, 0));
        ok(cuDeviceGetAttribute(&mut warp, 10, 0));
        assert_eq!((major, warp), (8, 32));
        assert_eq!(
            cuDeviceGetAttribute(&mut major, 9999, 0),
            CUDA_ERROR_INVALID_VALUE
        );
        assert_eq!(cuDeviceGet(&mut n, 2), CUDA_ERROR_INVALID_DEVICE);
        let mut other = [0 as std::ffi::c_char; 128];
        ok(cuDeviceGetName(other.as_mut_ptr(), 128, 1));
        let other = CStr::from_ptr(other.as_ptr()).to_str().unwrap();
        assert!(other.contains("device 1") && other != name, "{other}");
        let mut s: *const std::ffi::c_char = std::ptr::null();
        ok(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &mut s));
        assert_eq!(
            CStr::from_ptr(s).to_str().unwrap(),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
    }
}

#[test]
fn memory_misuse_returns_cuda_codes() {
    if crate::own_process() {
        return;
    }
    init();
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe {
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 1024));
        assert_eq!(cuMemAlloc_v2(&mut p, 0), CUDA_ERROR_INVALID_VALUE);
        let mut big = 0u64;
        assert_eq!(cuMemAlloc_v2(&mut big, 1 << 60), CUDA_ERROR_OUT_OF_MEMORY);
        // Out of bounds at enqueue.
        assert_eq!(
            cuMemsetD8Async(p + 1000, 1, 100, null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuMemFree_v2(p));
        assert_eq!(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE, "double free");
        assert_eq!(
            cuStreamSynchronize(12345 as *mut c_void),
            CUDA_ERROR_INVALID_HANDLE
        );
        let mut ms = 0f32;
        assert_eq!(
            cuEventElapsedTime(&mut ms, 777 as *mut c_void, 778 as *mut c_void),
            CUDA_ERROR_INVALID_HANDLE
        );
    }
}

/// Producer fills on s1 and records an event; consumer copies on s2, waiting or not.
unsafe fn producer_consumer(wait: bool) -> Vec<u8> {
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe {
        let (mut src, mut dst) = (0u64, 0u64);
        ok(cuMemAlloc_v2(&mut src, 256));
        ok(cuMemAlloc_v2(&mut dst, 256));
        let (mut s1, mut s2, mut ev) = (null_mut(), null_mut(), null_mut());
        ok(cuStreamCreate(&mut s1, 0));
        ok(cuStreamCreate(&mut s2, 0));
        ok(cuEventCreate(&mut ev, 0));
        ok(cuMemsetD8Async(dst, 0, 256, s2));
        ok(cuMemsetD8Async(src, 9, 256, s1));
        ok(cuEventRecord(ev, s1));
        if wait {
            ok(cuStreamWaitEvent(s2, ev, 0));
        }
        ok(cuMemcpyDtoDAsync_v2(dst, src, 256, s2));
        let mut host = vec![0u8; 256];
        ok(cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr() as *mut c_void,
            dst,
            256,
            s2,
        ));
        ok(cuCtxSynchronize());
        for s in [s1, s2] {
            ok(cuStreamDestroy_v2(s));
        }
        ok(cuEventDestroy_v2(ev));
        ok(cuMemFree_v2(src));
        ok(cuMemFree_v2(dst));
        host
    }
}

#[test]
fn a_missing_cross_stream_wait_gives_wrong_results() {
    if crate::own_process() {
        return;
    }
    init();
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe {
        assert_eq!(producer_consumer(true), vec![9; 256]);
        assert_eq!(
            producer_consumer(false),
            vec![0; 256],
            "deferred mode exposes the bug"
        );
    }
}

#[test]
fn a_library_kernel_runs_from_ptx_and_a_cubin_is_rejected() {
    if crate::own_process() {
        return;
    }
    init();
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe {
        let n = std::mem::size_of::<UhArgs>();
        let ptx = format!(
            ".version 8.8\n.target sm_80\n.address_size 64\n.visible .entry uh_fill_b4(\n\t.param .align 8 .b8 uh_fill_b4_param_0[{n}]\n)\n{{\n\tret;\n}}\n\0"
        );
        let mut m = null_mut();
        ok(cuModuleLoadData(&mut m, ptx.as_ptr() as *const c_void));
        let mut f = null_mut();
        ok(cuModuleGetFunction(&mut f, m, c"uh_fill_b4".as_ptr()));
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"nope".as_ptr()),
            CUDA_ERROR_NOT_FOUND
        );
        ok(cuModuleGetFunction(&mut f, m, c"uh_fill_b4".as_ptr()));
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 4 * 1000));
        let mut a = UhArgs {
            ndim: 1,
            n: 1000,
            contiguous: 1,
            ..UhArgs::default()
        };
        a.size[0] = 1000;
        a.ptr[0] = p;
        a.stride[0][0] = 1;
        a.u[0] = 0xdead_beef;
        let mut params = [&mut a as *mut UhArgs as *mut c_void];
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 0));
        ok(cuLaunchKernel(
            f,
            8,
            1,
            1,
            256,
            1,
            1,
            0,
            s,
            params.as_mut_ptr(),
            null_mut(),
        ));
        assert_eq!(
            cuLaunchKernel(
                f,
                1,
                1,
                1,
                2048,
                1,
                1,
                0,
                s,
                params.as_mut_ptr(),
                null_mut()
            ),
            CUDA_ERROR_INVALID_VALUE
        );
        let mut host = vec![0u8; 4000];
        ok(cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr() as *mut c_void,
            p,
            4000,
            s,
        ));
        assert!(host
            .chunks(4)
            .all(|c| u32::from_le_bytes(c.try_into().unwrap()) == 0xdead_beef));
        ok(cuStreamDestroy_v2(s));
        ok(cuModuleUnload(m));
        ok(cuMemFree_v2(p));
        let cubin = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0";
        assert_eq!(
            cuModuleLoadData(&mut m, cubin.as_ptr() as *const c_void),
            CUDA_ERROR_INVALID_IMAGE
        );
    }
}

#[test]
fn contexts_select_devices_and_handles_stay_on_theirs() {
    if crate::own_process() {
        return;
    }
    ok(cuInit(0));
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    std::thread::spawn(|| unsafe {
        let mut p = 0u64;
        assert_eq!(
            cuMemAlloc_v2(&mut p, 64),
            CUDA_ERROR_INVALID_CONTEXT,
            "no context"
        );
        set_device(1);
        let mut d = -1;
        ok(cuCtxGetDevice(&mut d));
        assert_eq!(d, 1);
        ok(cuMemAlloc_v2(&mut p, 64));
        let mut s1 = null_mut();
        ok(cuStreamCreate(&mut s1, 0));
        let mut ev = null_mut();
        ok(cuEventCreate(&mut ev, 0));
        set_device(0);
        let mut s0 = null_mut();
        ok(cuStreamCreate(&mut s0, 0));
        // Device 1's memory and streams work from a thread whose context is device 0...
        ok(cuMemsetD8Async(p, 3, 64, s1));
        let mut host = [0u8; 64];
        ok(cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr() as *mut c_void,
            p,
            64,
            s1,
        ));
        assert_eq!(host, [3; 64]);
        // ...but not mixed with device 0's.
        assert_eq!(cuMemsetD8Async(p, 3, 64, s0), CUDA_ERROR_INVALID_VALUE);
        assert_eq!(cuEventRecord(ev, s0), CUDA_ERROR_INVALID_HANDLE);
        ok(cuMemFree_v2(p));
        ok(cuStreamDestroy_v2(s0));
        ok(cuStreamDestroy_v2(s1));
        ok(cuEventDestroy_v2(ev));
    })
    .join()
    .unwrap();
}

#[test]
fn pinned_copies_happen_when_the_stream_runs() {
    if crate::own_process() {
        return;
    }
    init();
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe {
        let mut pinned = null_mut();
        ok(cuMemHostAlloc(&mut pinned, 256, 0));
        let host = std::slice::from_raw_parts_mut(pinned as *mut u8, 256);
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 256));
        let mut s = null_mut();
        ok(cuStreamCreate(&mut s, 0));
        host.fill(1);
        ok(cuMemcpyHtoDAsync_v2(p, pinned, 256, s));
        // Reusing the pinned buffer before the copy ran: the copy sees the new bytes (the bug a
        // GPU's DMA would also expose), unlike a pageable copy, which captures at the call.
        host.fill(2);
        let mut back = [0u8; 256];
        ok(cuMemcpyDtoHAsync_v2(
            back.as_mut_ptr() as *mut c_void,
            p,
            256,
            s,
        ));
        assert_eq!(back, [2; 256]);
        // Device to pinned host: returns at once, lands when the stream runs.
        ok(cuMemsetD8Async(p, 7, 256, s));
        ok(cuMemcpyDtoHAsync_v2(pinned, p, 256, s));
        assert_eq!(host[0], 2, "deferred: not copied before a synchronisation");
        // Freeing pinned memory that a queued copy still uses is refused, not raced.
        assert_eq!(cuMemFreeHost(pinned), CUDA_ERROR_INVALID_VALUE);
        ok(cuStreamSynchronize(s));
        assert!(host.iter().all(|&b| b == 7));
        ok(cuMemFreeHost(pinned));
        assert_eq!(
            cuMemFreeHost(pinned),
            CUDA_ERROR_INVALID_VALUE,
            "double free"
        );
        ok(cuStreamDestroy_v2(s));
        ok(cuMemFree_v2(p));
    }
}

#[test]
fn the_test_kernels_ptx_runs_their_host_functions_with_matching_parameters() {
    if crate::own_process() {
        return;
    }
    init();
    let host = unihal_kernels::testing::host_symbols();
    for e in unihal_sim::module::parse_ptx(unihal_kernels::testing::PTX.as_bytes()).unwrap() {
        let k = host
            .get(&e.name)
            .unwrap_or_else(|| panic!("{} has no host kernel", e.name));
        assert_eq!(k.param_sizes, &e.param_sizes[..], "{}", e.name);
    }
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    unsafe {
        let ptx = format!("{}\0", unihal_kernels::testing::PTX);
        let mut m = null_mut();
        ok(cuModuleLoadData(&mut m, ptx.as_ptr() as *const c_void));
        let mut f = null_mut();
        ok(cuModuleGetFunction(
            &mut f,
            m,
            c"unihal_test_iota_u32".as_ptr(),
        ));
        let mut p = 0u64;
        ok(cuMemAlloc_v2(&mut p, 4 * 1000));
        let mut n = 1000u32;
        let mut params = [
            &mut p as *mut u64 as *mut c_void,
            &mut n as *mut u32 as *mut c_void,
        ];
        ok(cuLaunchKernel(
            f,
            4,
            1,
            1,
            256,
            1,
            1,
            0,
            null_mut(),
            params.as_mut_ptr(),
            null_mut(),
        ));
        let mut host = vec![0u32; 1000];
        ok(cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr() as *mut c_void,
            p,
            4000,
            null_mut(),
        ));
        assert!(host.iter().enumerate().all(|(i, &v)| v == i as u32));
        ok(cuModuleUnload(m));
        ok(cuMemFree_v2(p));
    }
}

#[test]
fn peer_copies_and_cross_device_waits_follow_stream_order() {
    if crate::own_process() {
        return;
    }
    init();
    // SAFETY: calls of the simulated driver's C API with handles this test created and out-pointers to live locals.
    std::thread::spawn(|| unsafe {
        let (mut can, mut cannot) = (0, 1);
        ok(cuDeviceCanAccessPeer(&mut can, 0, 1));
        ok(cuDeviceCanAccessPeer(&mut cannot, 1, 1));
        assert_eq!(
            (can, cannot),
            (1, 0),
            "distinct devices are peers, a device is not its own"
        );
        let (mut ctx0, mut ctx1) = (null_mut(), null_mut());
        ok(cuDevicePrimaryCtxRetain(&mut ctx0, 0));
        ok(cuDevicePrimaryCtxRetain(&mut ctx1, 1));
        // Peer access per direction, with the driver's codes for misuse.
        ok(cuCtxSetCurrent(ctx0));
        assert_eq!(cuCtxEnablePeerAccess(ctx0, 0), CUDA_ERROR_INVALID_DEVICE);
        assert_eq!(
            cuCtxDisablePeerAccess(ctx1),
            CUDA_ERROR_PEER_ACCESS_NOT_ENABLED
        );
        ok(cuCtxEnablePeerAccess(ctx1, 0));
        assert_eq!(
            cuCtxEnablePeerAccess(ctx1, 0),
            CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        );
        // Device 1 produces data on its stream, device 0 copies it over.
        ok(cuCtxSetCurrent(ctx1));
        let (mut far, mut s1, mut ev) = (0u64, null_mut(), null_mut());
        ok(cuMemAlloc_v2(&mut far, 64));
        ok(cuStreamCreate(&mut s1, 1));
        ok(cuEventCreate(&mut ev, 0));
        ok(cuMemsetD8Async(far, 7, 64, s1));
        ok(cuEventRecord(ev, s1));
        ok(cuCtxSetCurrent(ctx0));
        let (mut near, mut s0) = (0u64, null_mut());
        ok(cuMemAlloc_v2(&mut near, 64));
        ok(cuStreamCreate(&mut s0, 1));
        ok(cuMemsetD8Async(near, 0, 64, s0));
        // Without a wait the copy reads what device 1 holds now: its fill is still queued.
        ok(cuMemcpyPeerAsync(near, ctx0, far, ctx1, 64, s0));
        let mut host = [9u8; 64];
        ok(cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr() as *mut c_void,
            near,
            64,
            s0,
        ));
        assert_ne!(host, [7; 64], "a copy ran device 1's unawaited work");
        // With the event of device 1 awaited, the copy sees the fill.
        ok(cuStreamWaitEvent(s0, ev, 0));
        ok(cuMemcpyPeerAsync(near, ctx0, far, ctx1, 64, s0));
        ok(cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr() as *mut c_void,
            near,
            64,
            s0,
        ));
        assert_eq!(host, [7; 64]);
        // And back: device 0's memory into device 1's, ordered on device 0's stream.
        ok(cuMemsetD8Async(near, 5, 32, s0));
        ok(cuMemcpyPeerAsync(far, ctx1, near, ctx0, 64, s0));
        ok(cuStreamSynchronize(s0));
        ok(cuCtxSetCurrent(ctx1));
        ok(cuMemcpyDtoHAsync_v2(
            host.as_mut_ptr() as *mut c_void,
            far,
            64,
            s1,
        ));
        assert_eq!(&host[..32], &[5; 32]);
        assert_eq!(&host[32..], &[7; 32]);
        // A range outside the named device's memory is refused at enqueue.
        assert_eq!(
            cuMemcpyPeerAsync(far, ctx1, far, ctx0, 64, s1),
            CUDA_ERROR_INVALID_VALUE
        );
        ok(cuCtxSetCurrent(ctx0));
        ok(cuCtxDisablePeerAccess(ctx1));
        ok(cuMemFree_v2(near));
        ok(cuMemFree_v2(far));
        ok(cuStreamDestroy_v2(s0));
        ok(cuStreamDestroy_v2(s1));
        ok(cuEventDestroy_v2(ev));
    })
    .join()
    .unwrap();
}
