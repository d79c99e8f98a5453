//! Test fixture for `tests/numpy_dlpack.py` (a shared library): a few C functions (called through Python's ctypes)
//! that open a CPU device with a caching allocator, make tensors, export them to DLPack and
//! import DLPack tensors, so that numpy, a real DLPack consumer and producer, can be checked
//! against unihal in both directions. Not part of unihal's API.
//!
//! Every function takes the pointers the previous ones returned; a null or foreign pointer is
//! the caller's mistake (these are `unsafe extern "C"` functions for one test script).

use std::ffi::c_void;
use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use unihal_dlpack::{export, import_legacy, import_versioned, ConsumerStream, Imported};
use unihal_hal::{Backend, DType, Device, OpCall, Stream, TensorView};

/// A CPU device, one stream and a caching allocator.
pub struct Fixture {
    device: Arc<dyn Device>,
    stream: Arc<dyn Stream>,
    alloc: CachingAllocator,
}

/// Opens the fixture (a 256 MiB CPU device). Null on failure (printed).
#[no_mangle]
pub extern "C" fn uh_fx_new() -> *mut Fixture {
    let open = || -> unihal_hal::Result<Fixture> {
        let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("256M"), Some("1"))?;
        let device = unihal_cpu::CpuBackend::with_config(cfg).open(0)?;
        let stream = device.create_stream()?;
        let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::default())?;
        Ok(Fixture {
            device,
            stream,
            alloc,
        })
    };
    match open() {
        Ok(f) => Box::into_raw(Box::new(f)),
        Err(e) => {
            eprintln!("uh_fx_new: {e}");
            std::ptr::null_mut()
        }
    }
}

/// Closes the fixture.
///
/// # Safety
/// `fx` from [`uh_fx_new`], closed once.
#[no_mangle]
pub unsafe extern "C" fn uh_fx_free(fx: *mut Fixture) {
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(fx) });
}

/// Bytes the allocator has handed out and not yet got back (`allocated_bytes.all.current`).
///
/// # Safety
/// `fx` from [`uh_fx_new`].
#[no_mangle]
pub unsafe extern "C" fn uh_fx_allocated_bytes(fx: *const Fixture) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { &*fx }.alloc.stats().allocated_bytes.all.current
}

/// A `[rows, cols]` f32 tensor from the caching allocator holding `i * 0.5 + 1` at flat index
/// `i`, written by queued work on the fixture's stream (not yet synchronised). Null on failure.
///
/// # Safety
/// `fx` from [`uh_fx_new`].
#[no_mangle]
pub unsafe extern "C" fn uh_fx_tensor_f32(
    fx: *const Fixture,
    rows: u64,
    cols: u64,
) -> *mut TensorView {
    // SAFETY: the caller's contract.
    let fx = unsafe { &*fx };
    let make = || -> unihal_hal::Result<TensorView> {
        let n = rows * cols;
        let b = fx.alloc.alloc(&fx.stream, (n * 4) as usize)?;
        let v = TensorView::contiguous(&b, DType::F32, &[rows, cols]);
        let bytes: Vec<u8> = (0..n)
            .flat_map(|i| (i as f32 * 0.5 + 1.0).to_le_bytes())
            .collect();
        fx.stream.copy_h2d_staged(&bytes, &b, 0)?;
        Ok(v)
    };
    match make() {
        Ok(v) => Box::into_raw(Box::new(v)),
        Err(e) => {
            eprintln!("uh_fx_tensor_f32: {e}");
            std::ptr::null_mut()
        }
    }
}

/// Drops the producer's handle of a tensor.
///
/// # Safety
/// `t` from [`uh_fx_tensor_f32`], dropped once.
#[no_mangle]
pub unsafe extern "C" fn uh_fx_tensor_drop(t: *mut TensorView) {
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(t) });
}

/// Exports a tensor as `__dlpack__` does: versioned (`DLManagedTensorVersioned*`) or legacy
/// (`DLManagedTensor*`); `stream` is the Python protocol's value (`-1`: no synchronisation,
/// anything else: a stream unihal cannot order, so the producer is synchronised). Null on
/// failure.
///
/// # Safety
/// `fx` and `t` from this fixture.
#[no_mangle]
pub unsafe extern "C" fn uh_fx_export(
    fx: *const Fixture,
    t: *const TensorView,
    versioned: i32,
    stream: i64,
) -> *mut c_void {
    // SAFETY: the caller's contract.
    let (fx, t) = unsafe { (&*fx, &*t) };
    let consumer = if stream == -1 {
        ConsumerStream::NoSync
    } else {
        ConsumerStream::Foreign
    };
    match export(t, &fx.stream, consumer) {
        Ok(e) if versioned != 0 => e.into_versioned().cast(),
        Ok(e) => e.into_legacy().cast(),
        Err(e) => {
            eprintln!("uh_fx_export: {e}");
            std::ptr::null_mut()
        }
    }
}

/// Runs a managed tensor's deleter (a capsule destructor for an unconsumed capsule).
///
/// # Safety
/// `m` a managed tensor of the given kind, deleted once.
#[no_mangle]
pub unsafe extern "C" fn uh_fx_delete(m: *mut c_void, versioned: i32) {
    // SAFETY: the caller's contract; the deleter is the producer's own.
    unsafe {
        if versioned != 0 {
            let m = m as *mut DLManagedTensorVersioned;
            if let Some(d) = (*m).deleter {
                d(m);
            }
        } else {
            let m = m as *mut DLManagedTensor;
            if let Some(d) = (*m).deleter {
                d(m);
            }
        }
    }
}

/// Imports a managed tensor (ownership passes in every case). Null on failure (printed).
///
/// # Safety
/// `fx` from [`uh_fx_new`]; `m` a consumed capsule's managed tensor of the given kind.
#[no_mangle]
pub unsafe extern "C" fn uh_fx_import(
    fx: *const Fixture,
    m: *mut c_void,
    versioned: i32,
) -> *mut Imported {
    // SAFETY: the caller's contract.
    let fx = unsafe { &*fx };
    // SAFETY: the caller's contract: a handed-over tensor of that kind.
    let r = unsafe {
        if versioned != 0 {
            import_versioned(&fx.device, m.cast())
        } else {
            import_legacy(&fx.device, m.cast())
        }
    };
    match r {
        Ok(i) => Box::into_raw(Box::new(i)),
        Err(e) => {
            eprintln!("uh_fx_import: {e}");
            std::ptr::null_mut()
        }
    }
}

/// 1 when the imported data was 256-byte aligned.
///
/// # Safety
/// `i` from [`uh_fx_import`].
#[no_mangle]
pub unsafe extern "C" fn uh_fx_imported_aligned(i: *const Imported) -> i32 {
    // SAFETY: the caller's contract.
    i32::from(unsafe { &*i }.is_aligned())
}

/// Copies the imported tensor, in its logical (row-major) element order, through a unihal op
/// on the fixture's stream, then reads the bytes into `out` (`len` bytes). Returns the number
/// of bytes, or -1 on failure (printed).
///
/// # Safety
/// `fx` and `i` from this fixture; `out` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn uh_fx_imported_read(
    fx: *const Fixture,
    i: *const Imported,
    out: *mut u8,
    len: u64,
) -> i64 {
    // SAFETY: the caller's contract.
    let (fx, i) = unsafe { (&*fx, &*i) };
    let run = || -> unihal_hal::Result<Vec<u8>> {
        let v = i.view();
        let bytes = v.numel() * v.dtype.size() as u64;
        let b = fx.alloc.alloc(&fx.stream, bytes as usize)?;
        let dst = TensorView::contiguous(&b, v.dtype, &v.shape);
        fx.stream.run_op(&OpCall::copy(v.clone(), dst))?;
        let mut host = vec![0u8; bytes as usize];
        fx.stream.read(&b, 0, &mut host)?;
        Ok(host)
    };
    match run() {
        Ok(host) if host.len() as u64 <= len => {
            // SAFETY: `out` holds `len` bytes (the caller's contract), at least host.len().
            unsafe { std::ptr::copy_nonoverlapping(host.as_ptr(), out, host.len()) };
            host.len() as i64
        }
        Ok(host) => {
            eprintln!("uh_fx_imported_read: {} bytes do not fit {len}", host.len());
            -1
        }
        Err(e) => {
            eprintln!("uh_fx_imported_read: {e}");
            -1
        }
    }
}

/// Drops the imported tensor: the producer's deleter runs (no queued work uses it after a read).
///
/// # Safety
/// `i` from [`uh_fx_import`], dropped once.
#[no_mangle]
pub unsafe extern "C" fn uh_fx_imported_drop(i: *mut Imported) {
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(i) });
}
