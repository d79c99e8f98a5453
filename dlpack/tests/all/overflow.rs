//! Import of hostile DLPack descriptions: shapes, strides, element sizes and byte offsets whose
//! arithmetic overflows are refused with an `InvalidArgument` naming the field at fault (never
//! a panic, never a buffer shorter than the elements it is said to hold), and the producer's
//! deleter still runs exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use unihal_dlpack::ffi::{self, DLManagedTensorVersioned, DLTensor};
use unihal_dlpack::import_versioned;
use unihal_hal::{Backend, DType, Device, HalError};

fn device() -> Arc<dyn Device> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("64M"), Some("1")).unwrap();
    unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap()
}

/// A producer's tensor over 8 bytes of its own, with a counting deleter.
struct Producer {
    data: Vec<u8>,
    shape: Vec<i64>,
    strides: Vec<i64>,
    deleted: Arc<AtomicUsize>,
}

unsafe extern "C" fn deleter(m: *mut DLManagedTensorVersioned) {
    // SAFETY: made by `tensor` below with these boxes; DLPack calls the deleter once.
    unsafe {
        let m = Box::from_raw(m);
        let p = Box::from_raw(m.manager_ctx as *mut Producer);
        p.deleted.fetch_add(1, Ordering::SeqCst);
    }
}

/// A DLPack tensor of `dtype` describing `shape` and `strides` (None: a null `strides`) from
/// the producer's 8-byte buffer plus `byte_offset` (`data` replaces the data pointer when
/// given).
fn tensor(
    dtype: DType,
    shape: &[i64],
    strides: Option<&[i64]>,
    byte_offset: u64,
    data: Option<u64>,
    deleted: &Arc<AtomicUsize>,
) -> *mut DLManagedTensorVersioned {
    let mut p = Box::new(Producer {
        data: vec![0u8; 8],
        shape: shape.to_vec(),
        strides: strides.map(<[i64]>::to_vec).unwrap_or_default(),
        deleted: deleted.clone(),
    });
    let t = DLTensor {
        data: data.map_or(p.data.as_mut_ptr().cast(), |a| a as *mut _),
        device: ffi::DLDevice {
            device_type: ffi::device_type::CPU,
            device_id: 0,
        },
        ndim: shape.len() as i32,
        dtype: unihal_dlpack::conv::dl_dtype(dtype),
        shape: p.shape.as_mut_ptr(),
        strides: if strides.is_some() {
            p.strides.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        byte_offset,
    };
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: ffi::VERSION,
        manager_ctx: Box::into_raw(p).cast(),
        deleter: Some(deleter),
        flags: 0,
        dl_tensor: t,
    }))
}

/// Imports `m` and expects an `InvalidArgument` naming `field`, the deleter run once.
fn refused(dev: &Arc<dyn Device>, m: *mut DLManagedTensorVersioned, field: &str, case: &str) {
    let deleted = {
        // SAFETY: made by `tensor`, not yet handed over.
        let p = unsafe { &*((*m).manager_ctx as *const Producer) };
        p.deleted.clone()
    };
    let before = deleted.load(Ordering::SeqCst);
    // SAFETY: a tensor made by `tensor`, handed over once; its description is hostile, which
    // is what the import must refuse before touching the memory.
    let r = unsafe { import_versioned(dev, m) };
    match r {
        Err(HalError::InvalidArgument { arg, reason }) => {
            assert_eq!(arg, field, "{case}: {reason}");
        }
        Err(e) => panic!("{case}: expected an invalid `{field}`, got {e}"),
        Ok(imp) => panic!(
            "{case}: accepted as a buffer of {} bytes for shape {:?}",
            imp.buffer().len(),
            imp.view().shape
        ),
    }
    assert_eq!(
        deleted.load(Ordering::SeqCst),
        before + 1,
        "{case}: the deleter runs once"
    );
}

const P62: i64 = 1 << 62;

#[test]
fn a_span_whose_byte_size_overflows_is_refused_not_wrapped() {
    let dev = device();
    let d = Arc::new(AtomicUsize::new(0));
    // (2^62 + 1 - 1) × 2^62 = 2^124 elements of reach; × 8 bytes overflows i128 (it wrapped to a
    // buffer of 8 bytes in release builds and panicked in debug builds).
    let m = tensor(DType::F64, &[P62 + 1], Some(&[P62]), 0, None, &d);
    refused(&dev, m, "strides", "[2^62+1] stride [2^62] of f64");
    // The same reach downwards.
    let m = tensor(DType::F64, &[P62 + 1], Some(&[-P62]), 0, None, &d);
    refused(&dev, m, "strides", "[2^62+1] stride [-2^62] of f64");
}

#[test]
fn multi_dimensional_spans_that_overflow_are_refused() {
    let dev = device();
    let d = Arc::new(AtomicUsize::new(0));
    let cases: [(DType, &[i64], &[i64], &str); 4] = [
        // A reach of 2^124 elements up and one of 2^63 down: 2^127 bytes of f64.
        (
            DType::F64,
            &[P62 + 1, 3],
            &[P62, -P62],
            "reaches of 2^124 elements up and 2^63 down of f64",
        ),
        // Reaches that fit, but not their size in bytes.
        (
            DType::I32,
            &[i64::MAX, 2],
            &[i64::MAX, i64::MAX],
            "reach of 2^126 elements of i32",
        ),
        (
            DType::U8,
            &[2, 2, 2, 2],
            &[i64::MAX, i64::MAX, i64::MIN, i64::MIN],
            "four reaches of 2^63 bytes up and down",
        ),
        (
            DType::U8,
            &[3, 3],
            &[i64::MIN, i64::MIN],
            "reaches below address 0",
        ),
    ];
    for (dtype, shape, strides, case) in cases {
        let m = tensor(dtype, shape, Some(strides), 0, None, &d);
        refused(&dev, m, "strides", case);
    }
}

#[test]
fn an_element_count_that_overflows_is_refused_naming_the_shape() {
    let dev = device();
    let d = Arc::new(AtomicUsize::new(0));
    // A broadcast view (zero strides) of one byte with 2^65 elements: its span fits, its element
    // count does not.
    let m = tensor(
        DType::U8,
        &[1 << 32, 1 << 32, 2],
        Some(&[0, 0, 0]),
        0,
        None,
        &d,
    );
    refused(&dev, m, "shape", "2^65 broadcast elements");
    // Row-major strides (null `strides`) that overflow int64_t.
    let m = tensor(DType::U8, &[2, P62, 4], None, 0, None, &d);
    refused(&dev, m, "shape", "row-major strides beyond int64_t");
}

#[test]
fn byte_offsets_near_the_top_of_the_address_space_are_refused() {
    let dev = device();
    let d = Arc::new(AtomicUsize::new(0));
    let m = tensor(DType::U8, &[4], None, u64::MAX, None, &d);
    refused(&dev, m, "byte_offset", "data + u64::MAX");
    // The first element at the last address: the second lies past 2^64.
    let m = tensor(DType::U8, &[2], None, u64::MAX - 0x1000, Some(0x1000), &d);
    refused(&dev, m, "strides", "elements past 2^64");
    let m = tensor(DType::F64, &[1], None, u64::MAX - 4, Some(0), &d);
    refused(&dev, m, "strides", "one f64 across 2^64");
}

#[test]
fn well_formed_views_near_the_limits_still_import() {
    let dev = device();
    let d = Arc::new(AtomicUsize::new(0));
    // A 2 × 3 view whose rows run backwards (strides [-3, 1] from byte 3): row 0 is bytes 3..6,
    // row 1 bytes 0..3.
    let m = tensor(DType::U8, &[2, 3], Some(&[-3, 1]), 3, None, &d);
    // SAFETY: a valid tensor over the producer's 8 bytes, handed over once.
    let imp = unsafe { import_versioned(&dev, m) }.unwrap();
    assert_eq!(imp.buffer().len(), 6);
    assert_eq!(imp.view().offset, 3);
    drop(imp);
    // A broadcast view of a huge but countable shape over one element.
    let m = tensor(DType::F64, &[P62, 3], Some(&[0, 0]), 0, None, &d);
    // SAFETY: as above (every element is the first 8 bytes).
    let imp = unsafe { import_versioned(&dev, m) }.unwrap();
    assert_eq!(imp.buffer().len(), 8);
    drop(imp);
    // Zero elements: huge other dimensions span nothing.
    let m = tensor(
        DType::F64,
        &[0, i64::MAX],
        Some(&[i64::MAX, i64::MAX]),
        0,
        None,
        &d,
    );
    // SAFETY: as above (no element).
    let imp = unsafe { import_versioned(&dev, m) }.unwrap();
    assert_eq!(imp.buffer().len(), 0);
    drop(imp);
    assert_eq!(d.load(Ordering::SeqCst), 3);
}

#[test]
fn exports_refuse_offsets_and_strides_a_consumer_cannot_use() {
    let dev = device();
    let s = dev.create_stream().unwrap();
    let buf = dev.alloc(8).unwrap();
    // A view without elements spans nothing, but its offset is still the consumer's
    // `byte_offset`: past the buffer (here near 2^64, where `data + byte_offset` wraps) it is no
    // address of the buffer.
    for offset in [9, u64::MAX - 2] {
        let view = unihal_hal::TensorView {
            buffer: buf.clone(),
            offset,
            dtype: DType::U8,
            shape: vec![0],
            strides: vec![1],
        };
        match unihal_dlpack::export(&view, &s, unihal_dlpack::ConsumerStream::NoSync) {
            Err(HalError::InvalidArgument { arg, .. }) => assert_eq!(arg, "view"),
            Err(e) => panic!("offset {offset}: expected an invalid view, got {e}"),
            Ok(_) => panic!("offset {offset}: an empty view past its buffer was exported"),
        }
    }
    // A host buffer of zero elements whose row-major strides overflow int64_t.
    let host = dev.alloc_host(0).unwrap();
    match unihal_dlpack::export_host(&host, DType::U8, &[0, 1 << 62, 4]) {
        Err(HalError::InvalidArgument { arg, .. }) => assert_eq!(arg, "shape"),
        Err(e) => panic!("expected an invalid shape, got {e}"),
        Ok(_) => panic!("exported with strides beyond int64_t"),
    }
    assert!(host.map().is_ok(), "a refused export lends nothing");
}
