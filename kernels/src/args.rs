//! The argument block of every elementwise kernel, shared with `device/uh_ops.h` (`uh_args`).

/// Most dims after collapsing.
pub const MAX_DIMS: usize = 8;
/// Most operands of one kernel.
pub const MAX_OPERANDS: usize = 4;

/// `#[repr(C)]` mirror of `uh_args`; layout checked against the C compiler's in a test.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UhArgs {
    pub ndim: i64,
    pub n: i64,
    pub contiguous: i64,
    pub size: [i64; MAX_DIMS],
    pub ptr: [u64; MAX_OPERANDS],
    pub stride: [[i64; MAX_DIMS]; MAX_OPERANDS],
    pub s: [f64; 2],
    pub i: [i64; 2],
    pub u: [u64; 2],
}

impl Default for UhArgs {
    fn default() -> Self {
        UhArgs {
            ndim: 0,
            n: 0,
            contiguous: 0,
            size: [1; MAX_DIMS],
            ptr: [0; MAX_OPERANDS],
            stride: [[0; MAX_DIMS]; MAX_OPERANDS],
            s: [0.0; 2],
            i: [0; 2],
            u: [0; 2],
        }
    }
}

/// Parameter sizes of every library kernel (one `uh_args` by value).
pub static PARAM_SIZES: [usize; 1] = [std::mem::size_of::<UhArgs>()];
