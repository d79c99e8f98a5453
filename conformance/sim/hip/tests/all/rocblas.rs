//! The simulated rocBLAS checks its arguments as rocBLAS documents and computes column-major
//! GEMMs in stream order (called in process).

use std::ffi::c_void;
use unihal_sim_hip::rocblas::*;
use unihal_sim_hip::runtime::*;

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn gemm_checks_and_computes() {
    if crate::own_process() {
        return;
    }
    assert_eq!(hipInit(0), 0);
    let mut h = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { rocblas_create_handle(&mut h) }, SUCCESS);
    let mut d = [std::ptr::null_mut::<c_void>(); 4];
    for p in d.iter_mut() {
        // SAFETY: an out-pointer to a local.
        assert_eq!(unsafe { hipMalloc(p, 64) }, 0);
    }
    let (a, b, c, out) = (d[0], d[1], d[2], d[3]);
    // Column-major A = [1 3; 2 4], B = [5 7; 6 8]; C holds NaN (beta = 0: never read).
    let up = |p: *mut c_void, bytes: Vec<u8>| {
        // SAFETY: 64-byte device buffers, pageable sources of at most 16 bytes.
        let rc = unsafe {
            hipMemcpyHtoDAsync(
                p,
                bytes.as_ptr() as *mut c_void,
                bytes.len(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, 0);
    };
    up(a, f32s(&[1.0, 2.0, 3.0, 4.0]));
    up(b, f32s(&[5.0, 6.0, 7.0, 8.0]));
    up(c, f32s(&[f32::NAN; 4]));
    let (alpha, beta) = (1.0f32, 0.0f32);
    let gemm = |h: *mut c_void, ta: i32, lda: i32, ty: i32, cty: i32| {
        // SAFETY: live 2x2 matrices of this device and host scalars.
        unsafe {
            rocblas_gemm_strided_batched_ex(
                h,
                ta,
                111,
                2,
                2,
                2,
                &alpha as *const f32 as *const c_void,
                a,
                ty,
                lda,
                0,
                b,
                ty,
                2,
                0,
                &beta as *const f32 as *const c_void,
                c,
                ty,
                2,
                0,
                out,
                ty,
                2,
                0,
                1,
                cty,
                0,
                0,
                0,
            )
        }
    };
    assert_eq!(gemm(std::ptr::null_mut(), 111, 2, 151, 151), INVALID_HANDLE);
    assert_eq!(gemm(h, 111, 1, 151, 151), INVALID_SIZE, "lda < m");
    assert_eq!(gemm(h, 99, 2, 151, 151), INVALID_VALUE, "not an operation");
    assert_eq!(
        gemm(h, 111, 2, 151, 152),
        NOT_IMPLEMENTED,
        "f32 data, f64 compute"
    );
    assert_eq!(gemm(h, 111, 2, 151, 151), SUCCESS);
    let mut got = [0u8; 16];
    // SAFETY: a 16-byte host buffer; the null stream's copy returns once it produced the data.
    let rc = unsafe {
        hipMemcpyDtoHAsync(
            got.as_mut_ptr() as *mut c_void,
            out,
            16,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0);
    let got: Vec<f32> = got
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // A·B = [1*5+3*6, 1*7+3*8; 2*5+4*6, 2*7+4*8] = [23 31; 34 46], column-major.
    assert_eq!(got, vec![23.0, 34.0, 31.0, 46.0]);
    // SAFETY: a live handle, destroyed once.
    assert_eq!(unsafe { rocblas_destroy_handle(h) }, SUCCESS);
    // SAFETY: a static string for any status.
    let name = unsafe { std::ffi::CStr::from_ptr(rocblas_status_to_string(INVALID_SIZE)) };
    assert_eq!(name.to_str().unwrap(), "rocblas_status_invalid_size");
}
