//! Stream capture and graphs through the simulated HIP runtime's entry points (the rules are the
//! core's, tested in full through the CUDA face; here HIP's signatures, enums and codes).

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use unihal_sim_hip::conv::*;
use unihal_sim_hip::runtime::*;

fn ok(r: i32) {
    assert_eq!(r, HIP_SUCCESS, "hipError_t {r}");
}

#[test]
fn hip_capture_instantiate_launch_and_invalidate() {
    if crate::own_process() {
        return;
    }
    ok(hipInit(0));
    // SAFETY: the simulated HIP API with out-pointers to locals and handles made here.
    unsafe {
        let (mut a, mut b) = (null_mut(), null_mut());
        ok(hipMalloc(&mut a, 64));
        ok(hipMalloc(&mut b, 64));
        let mut s = null_mut();
        ok(hipStreamCreate(&mut s));
        ok(hipStreamBeginCapture(s, 0));
        let (mut st, mut id) = (-1, 0u64);
        ok(hipStreamGetCaptureInfo(s, &mut st, &mut id));
        assert!(st == 1 && id != 0);
        ok(hipMemsetD8Async(a, 6, 64, s));
        ok(hipMemcpyDtoDAsync(b, a, 64, s));
        let mut g = null_mut();
        ok(hipStreamEndCapture(s, &mut g));
        ok(hipStreamIsCapturing(s, &mut st));
        assert_eq!(st, 0);
        let mut nodes = [null_mut::<c_void>(); 4];
        let mut n = 4usize;
        ok(hipGraphGetNodes(g, nodes.as_mut_ptr(), &mut n));
        assert_eq!(n, 2);
        assert!(!nodes[0].is_null() && !nodes[1].is_null() && nodes[2].is_null());
        let mut e = null_mut();
        ok(hipGraphInstantiate(&mut e, g, null_mut(), null_mut(), 0));
        ok(hipGraphDestroy(g));
        ok(hipGraphLaunch(e, s));
        ok(hipGraphLaunch(e, s));
        ok(hipStreamSynchronize(s));
        let mut host = [0u8; 64];
        ok(hipMemcpyDtoHAsync(
            host.as_mut_ptr() as *mut c_void,
            b,
            64,
            s,
        ));
        assert_eq!(host, [6u8; 64]);
        ok(hipGraphExecDestroy(e));

        // An illegal call invalidates; the end fails with a null graph and leaves capture.
        ok(hipStreamBeginCapture(s, 1));
        assert_eq!(
            hipStreamSynchronize(s),
            HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED
        );
        ok(hipStreamIsCapturing(s, &mut st));
        assert_eq!(st, 2);
        let mut g = std::ptr::dangling_mut::<c_void>();
        assert_eq!(
            hipStreamEndCapture(s, &mut g),
            HIP_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        assert!(g.is_null());
        assert_eq!(hipStreamEndCapture(s, &mut g), HIP_ERROR_ILLEGAL_STATE);
        let name = CStr::from_ptr(hipGetErrorName(HIP_ERROR_STREAM_CAPTURE_INVALIDATED));
        assert_eq!(name.to_str().unwrap(), "hipErrorStreamCaptureInvalidated");

        // The thread's mode; a thread-local capture refuses this thread's hipMalloc.
        let mut m = 2;
        ok(hipThreadExchangeStreamCaptureMode(&mut m));
        assert_eq!(m, 0);
        ok(hipThreadExchangeStreamCaptureMode(&mut m));
        assert_eq!(m, 2);
        ok(hipStreamBeginCapture(s, 1));
        let mut p = null_mut();
        assert_eq!(hipMalloc(&mut p, 16), HIP_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        assert_eq!(
            hipStreamEndCapture(s, &mut g),
            HIP_ERROR_STREAM_CAPTURE_INVALIDATED
        );
        let mut e = null_mut();
        assert_eq!(
            hipGraphInstantiateWithFlags(&mut e, null_mut(), 0),
            HIP_ERROR_INVALID_HANDLE
        );
        ok(hipStreamDestroy(s));
    }
}
