//! DLPack on the CPU backend without Python: unihal's own export read back through its own
//! import (as a consumer would), lifetimes, both structs, host buffers, unaligned and malformed
//! tensors. The numpy proof is `tests/numpy_dlpack.py`, run by `tests/all/numpy.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_dlpack::ffi::{self, DLManagedTensorVersioned, DLTensor};
use unihal_dlpack::{export, export_host, import_legacy, import_versioned, ConsumerStream};
use unihal_hal::{Backend, DType, Device, HalError, Stream, TensorView};

fn device() -> Arc<dyn Device> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("64M"), Some("1")).unwrap();
    unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap()
}

fn read(s: &Arc<dyn Stream>, v: &TensorView) -> Vec<u8> {
    let mut out = vec![0u8; v.buffer.len() as usize];
    s.read(&v.buffer, 0, &mut out).unwrap();
    out
}

#[test]
fn an_export_outlives_the_producers_handles_until_the_deleter_runs() {
    let dev = device();
    let s = dev.create_stream().unwrap();
    let a = CachingAllocator::new(dev.clone(), AllocatorConfig::default()).unwrap();
    let b = a.alloc(&s, 64).unwrap();
    let bytes: Vec<u8> = (0..64).collect();
    s.copy_h2d_staged(&bytes, &b, 0).unwrap();
    // A [4, 4] f32 view, transposed through strides, exported with the producer's copy queued.
    let v = TensorView::contiguous(&b, DType::F32, &[4, 4]).strided(0, &[1, 4]);
    let e = export(&v, &s, ConsumerStream::Foreign).unwrap();
    let m = e.into_versioned();
    drop((v, b));
    assert_eq!(
        a.stats().allocated_bytes.all.current,
        512,
        "kept by the export"
    );
    // SAFETY: `m` was just made by `into_versioned`.
    let t: &DLManagedTensorVersioned = unsafe { &*m };
    assert_eq!(t.version, ffi::VERSION);
    assert_eq!(t.dl_tensor.device.device_type, ffi::device_type::CPU);
    assert_eq!(t.dl_tensor.ndim, 2);
    // SAFETY: shape and strides point to ndim values owned by the export.
    let (shape, strides) = unsafe {
        (
            std::slice::from_raw_parts(t.dl_tensor.shape, 2),
            std::slice::from_raw_parts(t.dl_tensor.strides, 2),
        )
    };
    assert_eq!((shape, strides), (&[4i64, 4][..], &[1i64, 4][..]));
    // The synchronised producer: the host may read the bytes at once.
    // SAFETY: 64 bytes of CPU device memory kept alive by the export.
    let host = unsafe { std::slice::from_raw_parts(t.dl_tensor.data as *const u8, 64) };
    assert_eq!(host, &bytes[..]);
    // Back through import (unihal as the consumer): same bytes, same strides.
    // SAFETY: a valid export handed over once.
    let imp = unsafe { import_versioned(&dev, m) }.unwrap();
    assert!(imp.is_aligned());
    assert_eq!(imp.view().strides, vec![1, 4]);
    assert_eq!(read(&s, imp.view()), bytes);
    assert_eq!(a.stats().allocated_bytes.all.current, 512);
    drop(imp);
    assert_eq!(a.stats().allocated_bytes.all.current, 0, "deleter ran");
}

#[test]
fn a_hal_consumer_stream_waits_through_an_event() {
    let dev = device();
    let (p, c) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let b = dev.alloc(1 << 20).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    p.host_callback(Box::new(move || {
        let _ = rx.recv();
    }))
    .unwrap();
    p.fill(&b, 0, 1 << 20, unihal_hal::FillValue::U8(5))
        .unwrap();
    let v = TensorView::contiguous(&b, DType::U8, &[1 << 20]);
    // Returns at once although the producer is blocked: the consumer stream waits instead.
    let e = export(&v, &p, ConsumerStream::Hal(&c)).unwrap();
    assert!(!p.query().unwrap());
    let m = e.into_legacy();
    // SAFETY: a valid legacy export handed over once.
    let imp = unsafe { import_legacy(&dev, m) }.unwrap();
    let out = dev.alloc_host(16).unwrap();
    c.copy_d2h(imp.buffer(), (1 << 20) - 16, &out, 0, 16)
        .unwrap();
    drop(tx);
    c.synchronize().unwrap();
    assert_eq!(&*out.map().unwrap(), &[5u8; 16]);
}

#[test]
fn a_host_buffer_is_lent_while_exported() {
    let dev = device();
    let s = dev.create_stream().unwrap();
    let h = dev.alloc_host(24).unwrap();
    h.map().unwrap().copy_from_slice(&[1u8; 24]);
    assert!(export_host(&h, DType::F32, &[5]).is_err(), "20 bytes != 24");
    let e = export_host(&h, DType::I16, &[3, 4]).unwrap();
    assert!(h.map().is_err(), "lent");
    let b = dev.alloc(24).unwrap();
    assert!(
        s.copy_h2d(&h, 0, &b, 0, 24).is_err(),
        "queued work refuses it"
    );
    let m = e.read_only().into_versioned();
    // SAFETY: the export just made.
    let t = unsafe { &*m };
    assert_eq!(t.flags & ffi::FLAG_READ_ONLY, ffi::FLAG_READ_ONLY);
    assert_eq!(t.dl_tensor.dtype.bits, 16);
    // SAFETY: the deleter of the export, called once.
    unsafe { (t.deleter.unwrap())(m) };
    assert!(h.map().is_ok(), "the loan ended with the deleter");
}

/// A foreign producer's tensor with a counting deleter.
struct Foreign {
    data: Vec<u8>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    deleted: Arc<AtomicUsize>,
}

unsafe extern "C" fn foreign_deleter(m: *mut DLManagedTensorVersioned) {
    // SAFETY: made by `foreign` below with these boxes.
    unsafe {
        let m = Box::from_raw(m);
        let f = Box::from_raw(m.manager_ctx as *mut Foreign);
        f.deleted.fetch_add(1, Ordering::SeqCst);
    }
}

fn foreign(
    offset: u64,
    shape: &[i64],
    strides: Option<&[i64]>,
    major: u32,
    deleted: &Arc<AtomicUsize>,
) -> *mut DLManagedTensorVersioned {
    let mut f = Box::new(Foreign {
        data: (0..=255u8).collect(),
        shape: shape.to_vec(),
        strides: strides.map(<[i64]>::to_vec).unwrap_or_default(),
        deleted: deleted.clone(),
    });
    // A data pointer one byte into the heap block: never 256-byte aligned.
    let (data, byte_offset) = match offset {
        0 => (f.data.as_mut_ptr(), 0),
        o => (f.data.as_mut_ptr().wrapping_add(1), o - 1),
    };
    let t = DLTensor {
        data: data.cast(),
        device: ffi::DLDevice {
            device_type: ffi::device_type::CPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype: unihal_dlpack::conv::dl_dtype(DType::U8),
        shape: f.shape.as_mut_ptr(),
        strides: if strides.is_some() {
            f.strides.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        byte_offset,
    };
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: ffi::DLPackVersion { major, minor: 0 },
        manager_ctx: Box::into_raw(f).cast(),
        deleter: Some(foreign_deleter),
        flags: 0,
        dl_tensor: t,
    }))
}

#[test]
fn unaligned_and_negatively_strided_imports_are_accepted_and_said_so() {
    let dev = device();
    let s = dev.create_stream().unwrap();
    let deleted = Arc::new(AtomicUsize::new(0));
    // Elements 200, 199, ..., 101 (stride -1 from byte offset 200): origin not 256-aligned.
    let m = foreign(200, &[100], Some(&[-1]), 1, &deleted);
    // SAFETY: a valid foreign tensor handed over once.
    let imp = unsafe { import_versioned(&dev, m) }.unwrap();
    assert!(!imp.is_aligned());
    assert_eq!(imp.buffer().len(), 100);
    assert_eq!(imp.view().offset, 99);
    let got = read(&s, imp.view());
    assert_eq!(got, (101..=200u8).collect::<Vec<_>>());
    // A copy through the view's own strides (an op reading the negative stride).
    let out = dev.alloc(100).unwrap();
    let dst = TensorView::contiguous(&out, DType::U8, &[100]);
    s.run_op(&unihal_hal::OpCall::copy(imp.view().clone(), dst.clone()))
        .unwrap();
    assert_eq!(read(&s, &dst), (101..=200u8).rev().collect::<Vec<_>>());
    assert_eq!(deleted.load(Ordering::SeqCst), 0);
    drop(imp);
    assert_eq!(deleted.load(Ordering::SeqCst), 1);
}

#[test]
fn bad_tensors_are_errors_and_still_deleted() {
    let dev = device();
    let deleted = Arc::new(AtomicUsize::new(0));
    let cases: Vec<(*mut DLManagedTensorVersioned, &str)> = vec![
        (foreign(0, &[4], None, 2, &deleted), "major version 2"),
        (foreign(0, &[-4], None, 1, &deleted), "negative dim"),
        (foreign(0, &[1; 9], None, 1, &deleted), "9 dims"),
    ];
    for (m, what) in cases {
        // SAFETY: valid tensors handed over once.
        let r = unsafe { import_versioned(&dev, m) };
        assert!(r.is_err(), "{what}");
    }
    // SAFETY: a null pointer is refused before any access.
    let r = unsafe { import_versioned(&dev, std::ptr::null_mut()) };
    assert!(matches!(r, Err(HalError::InvalidArgument { .. })));
    // A CUDA tensor offered to the CPU device.
    let m = foreign(0, &[4], None, 1, &deleted);
    // SAFETY: the struct was just made and is not yet handed over.
    unsafe { (*m).dl_tensor.device.device_type = ffi::device_type::CUDA };
    // SAFETY: handed over once.
    assert!(unsafe { import_versioned(&dev, m) }.is_err());
    assert_eq!(deleted.load(Ordering::SeqCst), 4);
}
