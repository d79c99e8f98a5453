//! Host computation for the aclnn semantics the kernel library has no kernel for: element
//! access through a descriptor's view (the simulated device's memory is host memory).

use crate::nnopbase::Tensor;
use unihal_hal::DType;

/// Every element address of `t`'s view, in row-major order of the view.
pub fn addrs(t: &Tensor) -> Vec<u64> {
    let esize = t.dt().map_or(1, |d| d.size() as u64);
    let n = t.numel().max(0) as usize;
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0i64; t.view.len()];
    for _ in 0..n {
        let e: i64 = t.offset + idx.iter().zip(&t.strides).map(|(i, s)| i * s).sum::<i64>();
        out.push(t.data + e as u64 * esize);
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < t.view[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Reads one element as f64.
///
/// # Safety
/// `a` is a live element of dtype `d` (checked against the allocation table at enqueue).
#[inline]
pub unsafe fn read(a: u64, d: DType) -> f64 {
    // SAFETY: the caller's contract; unaligned reads are allowed.
    unsafe {
        match d {
            DType::F64 => (a as *const f64).read_unaligned(),
            DType::F32 => (a as *const f32).read_unaligned() as f64,
            DType::F16 => half::f16::from_bits((a as *const u16).read_unaligned()).to_f64(),
            DType::Bf16 => half::bf16::from_bits((a as *const u16).read_unaligned()).to_f64(),
            DType::I8 => (a as *const i8).read() as f64,
            DType::U8 | DType::Bool => (a as *const u8).read() as f64,
            DType::I16 => (a as *const i16).read_unaligned() as f64,
            DType::I32 => (a as *const i32).read_unaligned() as f64,
            DType::U32 => (a as *const u32).read_unaligned() as f64,
            DType::I64 => (a as *const i64).read_unaligned() as f64,
            DType::U64 => (a as *const u64).read_unaligned() as f64,
        }
    }
}

/// Writes one element from f64 (integers truncate and saturate, as Rust's `as`).
///
/// # Safety
/// As [`read`], for a write.
#[inline]
pub unsafe fn write(a: u64, d: DType, v: f64) {
    // SAFETY: the caller's contract; unaligned writes are allowed.
    unsafe {
        match d {
            DType::F64 => (a as *mut f64).write_unaligned(v),
            DType::F32 => (a as *mut f32).write_unaligned(v as f32),
            DType::F16 => (a as *mut u16).write_unaligned(half::f16::from_f64(v).to_bits()),
            DType::Bf16 => (a as *mut u16).write_unaligned(half::bf16::from_f64(v).to_bits()),
            DType::I8 => (a as *mut i8).write(v as i8),
            DType::U8 => (a as *mut u8).write(v as u8),
            DType::Bool => (a as *mut u8).write((v != 0.0) as u8),
            DType::I16 => (a as *mut i16).write_unaligned(v as i16),
            DType::I32 => (a as *mut i32).write_unaligned(v as i32),
            DType::U32 => (a as *mut u32).write_unaligned(v as u32),
            DType::I64 => (a as *mut i64).write_unaligned(v as i64),
            DType::U64 => (a as *mut u64).write_unaligned(v as u64),
        }
    }
}
