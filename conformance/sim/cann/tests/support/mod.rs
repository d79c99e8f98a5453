//! Helpers of the simulated-CANN tests: initialisation, device buffers, descriptors, and running
//! an operator through both phases.
#![allow(dead_code)]

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::Once;
use unihal_sim_cann::aclnn::Executor;
use unihal_sim_cann::nnopbase::*;
use unihal_sim_cann::runtime::*;

pub const ACL_FLOAT: i32 = 0;
pub const ACL_FLOAT16: i32 = 1;
pub const ACL_INT32: i32 = 3;
pub const ACL_INT64: i32 = 9;
pub const ACL_BF16: i32 = 27;
pub const ACL_FORMAT_ND: i32 = 2;

/// `aclInit` once for the test binary (a repeat is `ACL_ERROR_REPEAT_INITIALIZE`), with four
/// devices and a short watchdog; device 0 current on the calling thread.
pub fn init() {
    init_with(&[]);
}

/// [`init`] with more simulator settings (set before the first `aclInit` of the binary).
pub fn init_with(settings: &[(&str, &str)]) {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        std::env::set_var("UNIHAL_SIM_DEVICES", "4");
        std::env::set_var("UNIHAL_SIM_WATCHDOG_MS", "3000");
        for (k, v) in settings {
            std::env::set_var(k, v);
        }
    });
    let r = aclInit(std::ptr::null());
    assert!(r == 0 || r == 100_002, "aclInit: {r}");
    assert_eq!(aclrtSetDevice(0), 0);
}

/// The calling thread's last error message.
pub fn msg() -> String {
    let p = unihal_sim_cann::aclGetRecentErrMsg();
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string valid until this thread's next call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

pub fn ok(r: i32) {
    assert_eq!(r, 0, "code {r}: {}", msg());
}

/// Device memory holding `data`.
pub fn dev<T: Copy>(data: &[T]) -> *mut c_void {
    let bytes = std::mem::size_of_val(data).max(1);
    let mut p = null_mut();
    // SAFETY: a call of the simulated runtime's C API with live out-pointers and buffers.
    unsafe {
        ok(aclrtMalloc(&mut p, bytes, 0));
        ok(aclrtMemcpy(
            p,
            bytes,
            data.as_ptr() as *const c_void,
            std::mem::size_of_val(data),
            1,
        ));
    }
    p
}

/// `n` values read back from device memory.
pub fn host<T: Copy + Default>(p: *mut c_void, n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    let bytes = n * std::mem::size_of::<T>();
    // SAFETY: as above.
    unsafe {
        ok(aclrtMemcpy(
            v.as_mut_ptr() as *mut c_void,
            bytes,
            p,
            bytes,
            2,
        ))
    };
    v
}

/// A descriptor of `data` (storage: `storage` elements) with a view.
pub fn tensor(
    data: *mut c_void,
    dtype: i32,
    dims: &[i64],
    strides: &[i64],
    offset: i64,
    storage: i64,
) -> *mut Tensor {
    // SAFETY: arrays of the given lengths.
    let t = unsafe {
        aclCreateTensor(
            dims.as_ptr(),
            dims.len() as u64,
            dtype,
            strides.as_ptr(),
            offset,
            ACL_FORMAT_ND,
            [storage].as_ptr(),
            1,
            data,
        )
    };
    assert!(!t.is_null(), "aclCreateTensor: {}", msg());
    t
}

/// A contiguous descriptor.
pub fn contiguous(data: *mut c_void, dtype: i32, dims: &[i64]) -> *mut Tensor {
    let mut strides = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1];
    }
    tensor(
        data,
        dtype,
        dims,
        &strides,
        0,
        dims.iter().product::<i64>().max(1),
    )
}

pub fn f32_scalar(v: f32) -> *mut Scalar {
    let mut v = v;
    // SAFETY: a pointer to one f32.
    unsafe { aclCreateScalar(&mut v as *mut f32 as *mut c_void, ACL_FLOAT) }
}

/// Phase 2 with a fresh workspace of the size phase 1 asked for, then a stream synchronise and
/// the workspace's release.
pub fn run(
    ws: u64,
    ex: *mut Executor,
    phase2: extern "C" fn(*mut c_void, u64, *mut Executor, *mut c_void) -> i32,
) {
    let mut w = null_mut();
    if ws > 0 {
        // SAFETY: a live out-pointer.
        unsafe { ok(aclrtMalloc(&mut w, ws as usize, 0)) };
    }
    ok(phase2(w, ws, ex, null_mut()));
    ok(aclrtSynchronizeStream(null_mut()));
    if ws > 0 {
        ok(aclrtFree(w));
    }
}

pub const HCCL_FP32: i32 = 4;
pub const HCCL_SUM: i32 = 0;

/// A fresh HCCL root info.
pub fn root() -> unihal_sim_cann::hccl::HcclRootInfo {
    use unihal_sim_cann::hccl::*;
    let mut r = HcclRootInfo {
        internal: [0; ROOT_INFO_BYTES],
    };
    // SAFETY: a live out-pointer.
    assert_eq!(unsafe { HcclGetRootInfo(&mut r) }, 0);
    r
}

/// Runs `f(rank)` on `n` threads, each with device `rank` current; returns their results.
pub fn ranks<T: Send + 'static>(
    n: u32,
    f: impl Fn(u32) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || {
                init();
                ok(aclrtSetDevice(r as i32));
                f(r)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}
