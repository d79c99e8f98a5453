//! Element-wise reductions on host memory, per dtype, shared by every engine that reduces with the
//! host's CPU (the CPU backend's collective engines, the simulated vendor runtimes). Blocks keep
//! every pass over one rank's data vectorised. f16 and bf16 accumulate in f32 and round once; integers wrap;
//! min/max propagate NaN; avg divides the sum by the rank count (integers truncate toward zero).

use crate::{DType, ReduceOp};
use half::{bf16, f16};

/// A value type and the type it accumulates in.
trait Acc: Copy {
    type A: Copy + Default;
    fn load(self) -> Self::A;
    fn store(a: Self::A) -> Self;
    fn op(op: ReduceOp, a: Self::A, b: Self::A) -> Self::A;
    fn div(a: Self::A, n: usize) -> Self::A;
}

macro_rules! float_acc {
    ($t:ty, $a:ty, $load:expr, $store:expr) => {
        impl Acc for $t {
            type A = $a;
            #[inline(always)]
            fn load(self) -> $a {
                $load(self)
            }
            #[inline(always)]
            fn store(a: $a) -> $t {
                $store(a)
            }
            #[inline(always)]
            fn op(op: ReduceOp, a: $a, b: $a) -> $a {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Max => {
                        if a.is_nan() || b.is_nan() {
                            <$a>::NAN
                        } else if a > b {
                            a
                        } else {
                            b
                        }
                    }
                    ReduceOp::Min => {
                        if a.is_nan() || b.is_nan() {
                            <$a>::NAN
                        } else if a < b {
                            a
                        } else {
                            b
                        }
                    }
                }
            }
            #[inline(always)]
            fn div(a: $a, n: usize) -> $a {
                a / n as $a
            }
        }
    };
}
float_acc!(f32, f32, |x| x, |a| a);
float_acc!(f64, f64, |x| x, |a| a);
float_acc!(f16, f32, |x: f16| x.to_f32(), f16::from_f32);
float_acc!(bf16, f32, |x: bf16| x.to_f32(), bf16::from_f32);

macro_rules! int_acc {
    ($($t:ty),*) => {$(
        impl Acc for $t {
            type A = $t;
            #[inline(always)]
            fn load(self) -> $t { self }
            #[inline(always)]
            fn store(a: $t) -> $t { a }
            #[inline(always)]
            fn op(op: ReduceOp, a: $t, b: $t) -> $t {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t { a.wrapping_div(n as $t) }
        }
    )*};
}
int_acc!(i8, u8, i16, i32, i64, u32, u64);

const BLOCK: usize = 2048;

/// `dst[i] = reduce over s in srcs of s[i]` for `n` elements.
///
/// # Safety
/// Every `srcs[k]` must be valid for reads and `dst` for writes of `n` elements of `T`; `dst` may
/// equal one of the sources (element-wise in place) but must not partially overlap any.
unsafe fn reduce_typed<T: Acc>(op: ReduceOp, srcs: &[*const u8], dst: *mut u8, n: usize) {
    let nr = srcs.len();
    let mut acc = [T::A::default(); BLOCK];
    let mut base = 0;
    while base < n {
        let len = BLOCK.min(n - base);
        let a = &mut acc[..len];
        let s0 = (srcs[0] as *const T).add(base);
        for (i, x) in a.iter_mut().enumerate() {
            *x = s0.add(i).read_unaligned().load();
        }
        for s in &srcs[1..] {
            let p = (*s as *const T).add(base);
            for (i, x) in a.iter_mut().enumerate() {
                *x = T::op(op, *x, p.add(i).read_unaligned().load());
            }
        }
        let d = (dst as *mut T).add(base);
        for (i, x) in a.iter().enumerate() {
            let v = if op == ReduceOp::Avg {
                T::div(*x, nr)
            } else {
                *x
            };
            d.add(i).write_unaligned(T::store(v));
        }
        base += len;
    }
}

/// `data[i] = data[i] / nranks` for `n` elements (avg as sum then scale, for engines without avg).
///
/// # Safety
/// `data` must be valid for reads and writes of `n` elements of `T`.
unsafe fn divide_typed<T: Acc>(data: *mut u8, n: usize, nranks: usize) {
    let p = data as *mut T;
    for i in 0..n {
        let v = p.add(i).read_unaligned().load();
        p.add(i).write_unaligned(T::store(T::div(v, nranks)));
    }
}

/// True for dtypes the engine reduces.
pub fn reducible(d: DType) -> bool {
    d != DType::Bool
}

/// Reduces `n` elements of `dtype` from every source into `dst`.
///
/// # Safety
/// As `reduce_typed`.
pub unsafe fn reduce(dtype: DType, op: ReduceOp, srcs: &[*const u8], dst: *mut u8, n: usize) {
    match dtype {
        DType::F32 => reduce_typed::<f32>(op, srcs, dst, n),
        DType::F64 => reduce_typed::<f64>(op, srcs, dst, n),
        DType::F16 => reduce_typed::<f16>(op, srcs, dst, n),
        DType::Bf16 => reduce_typed::<bf16>(op, srcs, dst, n),
        DType::I8 => reduce_typed::<i8>(op, srcs, dst, n),
        DType::U8 => reduce_typed::<u8>(op, srcs, dst, n),
        DType::I16 => reduce_typed::<i16>(op, srcs, dst, n),
        DType::I32 => reduce_typed::<i32>(op, srcs, dst, n),
        DType::I64 => reduce_typed::<i64>(op, srcs, dst, n),
        DType::U32 => reduce_typed::<u32>(op, srcs, dst, n),
        DType::U64 => reduce_typed::<u64>(op, srcs, dst, n),
        DType::Bool => unreachable!("bool is not reducible"),
    }
}

/// Divides `n` elements of `dtype` at `data` by `nranks` in place, as avg does.
///
/// # Safety
/// As `divide_typed`.
pub unsafe fn divide(dtype: DType, data: *mut u8, n: usize, nranks: usize) {
    match dtype {
        DType::F32 => divide_typed::<f32>(data, n, nranks),
        DType::F64 => divide_typed::<f64>(data, n, nranks),
        DType::F16 => divide_typed::<f16>(data, n, nranks),
        DType::Bf16 => divide_typed::<bf16>(data, n, nranks),
        DType::I8 => divide_typed::<i8>(data, n, nranks),
        DType::U8 => divide_typed::<u8>(data, n, nranks),
        DType::I16 => divide_typed::<i16>(data, n, nranks),
        DType::I32 => divide_typed::<i32>(data, n, nranks),
        DType::I64 => divide_typed::<i64>(data, n, nranks),
        DType::U32 => divide_typed::<u32>(data, n, nranks),
        DType::U64 => divide_typed::<u64>(data, n, nranks),
        DType::Bool => unreachable!("bool is not reducible"),
    }
}
