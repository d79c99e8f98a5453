//! The simulated HIP runtime's own rules, called in process (default settings: ROCm 5
//! numbering, gfx90a, deferred mode).

use std::ffi::{c_int, c_void};
use unihal_sim_hip::conv::*;
use unihal_sim_hip::runtime::*;

/// A minimal AMDGPU ELF header (no sections) for the architecture `mach` (`EF_AMDGPU_MACH`).
fn elf_header(mach: u32) -> Vec<u8> {
    let mut h = vec![0u8; 64];
    h[..4].copy_from_slice(b"\x7fELF");
    h[4] = 2; // 64-bit
    h[5] = 1; // little-endian
    h[6] = 1; // version
    h[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    h[18..20].copy_from_slice(&224u16.to_le_bytes()); // EM_AMDGPU
    h[20..24].copy_from_slice(&1u32.to_le_bytes());
    h[48..52].copy_from_slice(&mach.to_le_bytes()); // e_flags
    h[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    h
}

#[test]
fn hip_rules() {
    if crate::own_process() {
        return;
    }
    // Nothing works before hipInit, but the version does.
    let mut v = 0;
    // SAFETY: out-pointers to locals.
    unsafe {
        assert_eq!(hipGetDeviceCount(&mut v), HIP_ERROR_NOT_INITIALIZED);
        assert_eq!(hipRuntimeGetVersion(&mut v), HIP_SUCCESS);
    }
    assert_eq!(v, 60_241_134);
    assert_eq!(hipInit(1), HIP_ERROR_INVALID_VALUE, "flags must be 0");
    assert_eq!(hipInit(0), HIP_SUCCESS);

    // The current device is 0 until set; a bad ordinal is hipErrorInvalidDevice.
    let mut d: c_int = -1;
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { hipGetDevice(&mut d) }, HIP_SUCCESS);
    assert_eq!(d, 0);
    assert_eq!(hipSetDevice(99), HIP_ERROR_INVALID_DEVICE);

    // Attributes in ROCm 5's numbering: wave64; 9 is not a warp size here.
    let mut w = 0;
    // SAFETY: an out-pointer to a local.
    unsafe {
        assert_eq!(hipDeviceGetAttribute(&mut w, 87, 0), HIP_SUCCESS);
        assert_eq!(w, 64);
        assert_eq!(
            hipDeviceGetAttribute(&mut w, 9999, 0),
            HIP_ERROR_INVALID_VALUE
        );
    }

    // hipMalloc(0) gives a null pointer; hipFree(null) is fine.
    let mut p: *mut c_void = std::ptr::dangling_mut::<c_void>();
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { hipMalloc(&mut p, 0) }, HIP_SUCCESS);
    assert!(p.is_null());
    assert_eq!(hipFree(std::ptr::null_mut()), HIP_SUCCESS);

    // Events created without timing refuse elapsed time.
    let (mut e1, mut e2) = (std::ptr::null_mut(), std::ptr::null_mut());
    let mut ms = 0.0f32;
    // SAFETY: out-pointers to locals; live events.
    unsafe {
        assert_eq!(hipEventCreateWithFlags(&mut e1, 2), HIP_SUCCESS);
        assert_eq!(hipEventCreateWithFlags(&mut e2, 0), HIP_SUCCESS);
        assert_eq!(
            hipEventCreateWithFlags(&mut e2, 4),
            HIP_ERROR_INVALID_VALUE,
            "interprocess needs disable-timing"
        );
        assert_eq!(hipEventRecord(e1, std::ptr::null_mut()), HIP_SUCCESS);
        assert_eq!(hipEventSynchronize(e1), HIP_SUCCESS);
        assert_eq!(
            hipEventElapsedTime(&mut ms, e1, e1),
            HIP_ERROR_INVALID_HANDLE
        );
        assert_eq!(hipEventDestroy(e1), HIP_SUCCESS);
    }

    // Code objects: not AMDGPU, another architecture, the device's own.
    let mut m = std::ptr::null_mut();
    let garbage = b"definitely not an ELF file".to_vec();
    let gfx906 = elf_header(0x02f);
    let gfx90a = elf_header(0x03f);
    // SAFETY: complete images (their headers say 64 bytes, or not an image at all).
    unsafe {
        assert_eq!(
            hipModuleLoadData(&mut m, garbage.as_ptr() as *const c_void),
            HIP_ERROR_INVALID_IMAGE
        );
        assert_eq!(
            hipModuleLoadData(&mut m, gfx906.as_ptr() as *const c_void),
            HIP_ERROR_NO_BINARY_FOR_GPU
        );
        assert_eq!(
            hipModuleLoadData(&mut m, gfx90a.as_ptr() as *const c_void),
            HIP_SUCCESS
        );
        let mut f = std::ptr::null_mut();
        assert_eq!(
            hipModuleGetFunction(&mut f, m, c"absent".as_ptr()),
            HIP_ERROR_NOT_FOUND
        );
        assert_eq!(hipModuleUnload(m), HIP_SUCCESS);
    }

    // The properties: R0600 layout in ROCm 5 mode, gcnArchName with its features.
    let mut props = vec![0u8; 4096];
    // SAFETY: a buffer larger than either layout.
    let rc = unsafe { hipGetDevicePropertiesR0600(props.as_mut_ptr() as *mut c_void, 0) };
    assert_eq!(rc, HIP_SUCCESS);
    assert!(props[1160..].starts_with(b"gfx90a:sramecc+:xnack-"));
    assert_eq!(&props[308..312], &64i32.to_le_bytes(), "warpSize");

    // A runtime call from a callback is refused (and recorded), never run.
    let mut s = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { hipStreamCreateWithFlags(&mut s, 1) }, HIP_SUCCESS);
    static SEEN: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
    unsafe extern "C" fn cb(_s: *mut c_void, status: c_int, _d: *mut c_void) {
        assert_eq!(status, 0);
        SEEN.store(hipDeviceSynchronize(), std::sync::atomic::Ordering::SeqCst);
    }
    assert_eq!(
        hipStreamAddCallback(s, Some(cb), std::ptr::null_mut(), 1),
        HIP_ERROR_INVALID_VALUE,
        "flags must be 0"
    );
    assert_eq!(
        hipStreamAddCallback(s, Some(cb), std::ptr::null_mut(), 0),
        HIP_SUCCESS
    );
    assert_eq!(hipStreamSynchronize(s), HIP_SUCCESS);
    assert_eq!(
        SEEN.load(std::sync::atomic::Ordering::SeqCst),
        HIP_ERROR_NOT_SUPPORTED
    );
    assert!(unihal_sim::fault::violations() >= 1);
    assert_eq!(hipStreamDestroy(s), HIP_SUCCESS);
}
