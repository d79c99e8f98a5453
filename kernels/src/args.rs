//! The argument block of every library kernel, shared with `device/uh_ops.h` (`uh_args`).

/// Most dims after collapsing.
pub const MAX_DIMS: usize = 8;
/// Most operands of one kernel.
pub const MAX_OPERANDS: usize = 8;
/// Groups of a multi-tensor launch (`unihal_hal::op::nn::MT_MAX_GROUPS`).
pub const MT_GROUPS: usize = unihal_hal::op::nn::MT_MAX_GROUPS;
/// Tensors per multi-tensor group.
pub const MT_WIDTH: usize = 5;

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
    pub s: [f64; 8],
    pub i: [i64; 4],
    pub u: [u64; 2],
    /// Row length (reduced axis; K of a matmul).
    pub len: i64,
    /// Per-operand stride along the row (matmul: row/column strides of a, b, c).
    pub axis: [i64; MAX_OPERANDS],
    pub mt_count: i64,
    pub mt_len: [i64; MT_GROUPS],
    pub mt_ptr: [[u64; MT_WIDTH]; MT_GROUPS],
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
            s: [0.0; 8],
            i: [0; 4],
            u: [0; 2],
            len: 0,
            axis: [0; MAX_OPERANDS],
            mt_count: 0,
            mt_len: [0; MT_GROUPS],
            mt_ptr: [[0; MT_WIDTH]; MT_GROUPS],
        }
    }
}

/// Parameter sizes of every library kernel (one `uh_args` by value).
pub static PARAM_SIZES: [usize; 1] = [std::mem::size_of::<UhArgs>()];
