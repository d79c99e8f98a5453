//! Conversions between the HAL's types and the C ABI's numbers and structs, used by both
//! directions (the exporter and the host): dtypes, op ids, collectives, reductions, module
//! formats, errors, strings, capabilities.
//!
//! The ABI's numbers are listed here explicitly, never derived from a Rust enum's order, so that
//! reordering the HAL's enums cannot renumber the ABI (`tests/numbers.rs` checks them against the
//! header).

use std::collections::{BTreeMap, HashSet};
use std::ffi::{c_char, CStr};
use unihal_hal::ccl::Accumulation;
use unihal_hal::{
    CclCaps, CollectiveOp, DType, DeviceId, HalError, Invalid, ModuleFormat, NativeHandle, OpId,
    ReduceOp,
};
use unihal_plugin_abi::*;

/// The ABI's dtype numbers.
pub const DTYPES: [(DType, u32); 12] = [
    (DType::F64, UH_DTYPE_F64),
    (DType::F32, UH_DTYPE_F32),
    (DType::F16, UH_DTYPE_F16),
    (DType::Bf16, UH_DTYPE_BF16),
    (DType::I8, UH_DTYPE_I8),
    (DType::U8, UH_DTYPE_U8),
    (DType::I16, UH_DTYPE_I16),
    (DType::I32, UH_DTYPE_I32),
    (DType::I64, UH_DTYPE_I64),
    (DType::U32, UH_DTYPE_U32),
    (DType::U64, UH_DTYPE_U64),
    (DType::Bool, UH_DTYPE_BOOL),
];

/// The ABI's op numbers (ABI 1.0: the HAL's first 65 ops; 1.1 appends the six transformer-block ops).
pub const OPS: [(OpId, u32); 71] = [
    (OpId::Fill, UH_OP_FILL),
    (OpId::Copy, UH_OP_COPY),
    (OpId::Cast, UH_OP_CAST),
    (OpId::Neg, UH_OP_NEG),
    (OpId::Abs, UH_OP_ABS),
    (OpId::Exp, UH_OP_EXP),
    (OpId::Log, UH_OP_LOG),
    (OpId::Sqrt, UH_OP_SQRT),
    (OpId::Rsqrt, UH_OP_RSQRT),
    (OpId::Tanh, UH_OP_TANH),
    (OpId::Sigmoid, UH_OP_SIGMOID),
    (OpId::Relu, UH_OP_RELU),
    (OpId::GeluTanh, UH_OP_GELU_TANH),
    (OpId::GeluErf, UH_OP_GELU_ERF),
    (OpId::Silu, UH_OP_SILU),
    (OpId::ReluBackward, UH_OP_RELU_BACKWARD),
    (OpId::GeluTanhBackward, UH_OP_GELU_TANH_BACKWARD),
    (OpId::GeluErfBackward, UH_OP_GELU_ERF_BACKWARD),
    (OpId::SiluBackward, UH_OP_SILU_BACKWARD),
    (OpId::Add, UH_OP_ADD),
    (OpId::Sub, UH_OP_SUB),
    (OpId::Mul, UH_OP_MUL),
    (OpId::Div, UH_OP_DIV),
    (OpId::Maximum, UH_OP_MAXIMUM),
    (OpId::Minimum, UH_OP_MINIMUM),
    (OpId::Pow, UH_OP_POW),
    (OpId::AddScalar, UH_OP_ADD_SCALAR),
    (OpId::SubScalar, UH_OP_SUB_SCALAR),
    (OpId::MulScalar, UH_OP_MUL_SCALAR),
    (OpId::DivScalar, UH_OP_DIV_SCALAR),
    (OpId::MaximumScalar, UH_OP_MAXIMUM_SCALAR),
    (OpId::MinimumScalar, UH_OP_MINIMUM_SCALAR),
    (OpId::PowScalar, UH_OP_POW_SCALAR),
    (OpId::Axpy, UH_OP_AXPY),
    (OpId::Where, UH_OP_WHERE),
    (OpId::RandomUniform, UH_OP_RANDOM_UNIFORM),
    (OpId::RandomNormal, UH_OP_RANDOM_NORMAL),
    (OpId::DropoutForward, UH_OP_DROPOUT_FORWARD),
    (OpId::DropoutBackward, UH_OP_DROPOUT_BACKWARD),
    (OpId::ReduceSum, UH_OP_REDUCE_SUM),
    (OpId::ReduceMean, UH_OP_REDUCE_MEAN),
    (OpId::ReduceMax, UH_OP_REDUCE_MAX),
    (OpId::ReduceMin, UH_OP_REDUCE_MIN),
    (OpId::Argmax, UH_OP_ARGMAX),
    (OpId::Argmin, UH_OP_ARGMIN),
    (OpId::Softmax, UH_OP_SOFTMAX),
    (OpId::LogSoftmax, UH_OP_LOG_SOFTMAX),
    (OpId::SoftmaxMasked, UH_OP_SOFTMAX_MASKED),
    (OpId::LogSoftmaxMasked, UH_OP_LOG_SOFTMAX_MASKED),
    (OpId::SoftmaxBackward, UH_OP_SOFTMAX_BACKWARD),
    (OpId::LogSoftmaxBackward, UH_OP_LOG_SOFTMAX_BACKWARD),
    (OpId::CrossEntropy, UH_OP_CROSS_ENTROPY),
    (OpId::CrossEntropyBackward, UH_OP_CROSS_ENTROPY_BACKWARD),
    (OpId::LayerNorm, UH_OP_LAYER_NORM),
    (OpId::LayerNormBackward, UH_OP_LAYER_NORM_BACKWARD),
    (OpId::RmsNorm, UH_OP_RMS_NORM),
    (OpId::RmsNormBackward, UH_OP_RMS_NORM_BACKWARD),
    (OpId::Matmul, UH_OP_MATMUL),
    (OpId::IndexSelect, UH_OP_INDEX_SELECT),
    (OpId::IndexAdd, UH_OP_INDEX_ADD),
    (OpId::SgdMomentum, UH_OP_SGD_MOMENTUM),
    (OpId::AdamW, UH_OP_ADAMW),
    (OpId::AmpUnscale, UH_OP_AMP_UNSCALE),
    (OpId::AmpUpdateScale, UH_OP_AMP_UPDATE_SCALE),
    (OpId::ClipGradNorm, UH_OP_CLIP_GRAD_NORM),
    (OpId::Attention, UH_OP_ATTENTION),
    (OpId::AttentionBackward, UH_OP_ATTENTION_BACKWARD),
    (OpId::Rope, UH_OP_ROPE),
    (OpId::RopeBackward, UH_OP_ROPE_BACKWARD),
    (OpId::AddLayerNorm, UH_OP_ADD_LAYER_NORM),
    (OpId::AddRmsNorm, UH_OP_ADD_RMS_NORM),
];

/// The ABI's collective numbers.
pub const COLLECTIVES: [(CollectiveOp, u32); 7] = [
    (CollectiveOp::AllReduce, UH_COLL_ALL_REDUCE),
    (CollectiveOp::Broadcast, UH_COLL_BROADCAST),
    (CollectiveOp::Reduce, UH_COLL_REDUCE),
    (CollectiveOp::AllGather, UH_COLL_ALL_GATHER),
    (CollectiveOp::ReduceScatter, UH_COLL_REDUCE_SCATTER),
    (CollectiveOp::SendRecv, UH_COLL_SENDRECV),
    (CollectiveOp::AllToAll, UH_COLL_ALL_TO_ALL),
];

/// The ABI's reduction numbers.
pub const REDUCTIONS: [(ReduceOp, u32); 5] = [
    (ReduceOp::Sum, UH_RED_SUM),
    (ReduceOp::Prod, UH_RED_PROD),
    (ReduceOp::Min, UH_RED_MIN),
    (ReduceOp::Max, UH_RED_MAX),
    (ReduceOp::Avg, UH_RED_AVG),
];

/// The ABI's module format numbers.
pub const MODULE_FORMATS: [(ModuleFormat, u32); 5] = [
    (ModuleFormat::HostSymbols, UH_MODULE_HOST_SYMBOLS),
    (ModuleFormat::Ptx, UH_MODULE_PTX),
    (ModuleFormat::Cubin, UH_MODULE_CUBIN),
    (ModuleFormat::HipCodeObject, UH_MODULE_HIP_CODE_OBJECT),
    (ModuleFormat::AscendBinary, UH_MODULE_ASCEND_BINARY),
];

fn to_num<T: PartialEq + Copy>(table: &[(T, u32)], v: T) -> u32 {
    table
        .iter()
        .find(|(t, _)| *t == v)
        .map(|e| e.1)
        .unwrap_or(u32::MAX)
}

fn from_num<T: Copy>(table: &[(T, u32)], what: &'static str, n: u32) -> Result<T, HalError> {
    table
        .iter()
        .find(|(_, m)| *m == n)
        .map(|e| e.0)
        .ok_or_else(|| {
            HalError::invalid(
                what,
                Invalid::Value {
                    value: n.to_string(),
                    accepted: format!("one of the ABI's {} numbers", table.len()),
                },
            )
        })
}

/// A dtype's ABI number.
pub fn dtype_num(d: DType) -> u32 {
    to_num(&DTYPES, d)
}
/// The dtype of an ABI number. Errors: `InvalidArgument` for an unknown number.
pub fn dtype_of(n: u32) -> Result<DType, HalError> {
    from_num(&DTYPES, "dtype", n)
}
/// An op's ABI number (`u32::MAX` for an op newer than this ABI).
pub fn op_num(o: OpId) -> u32 {
    to_num(&OPS, o)
}
/// The op of an ABI number. Errors: `InvalidArgument` for an unknown number.
pub fn op_of(n: u32) -> Result<OpId, HalError> {
    from_num(&OPS, "op", n)
}
/// A collective's ABI number.
pub fn coll_num(c: CollectiveOp) -> u32 {
    to_num(&COLLECTIVES, c)
}
/// The collective of an ABI number.
pub fn coll_of(n: u32) -> Result<CollectiveOp, HalError> {
    from_num(&COLLECTIVES, "op", n)
}
/// A reduction's ABI number.
pub fn red_num(r: ReduceOp) -> u32 {
    to_num(&REDUCTIONS, r)
}
/// The reduction of an ABI number.
pub fn red_of(n: u32) -> Result<ReduceOp, HalError> {
    from_num(&REDUCTIONS, "red", n)
}
/// A module format's ABI number.
pub fn format_num(f: ModuleFormat) -> u32 {
    to_num(&MODULE_FORMATS, f)
}
/// The module format of an ABI number.
pub fn format_of(n: u32) -> Result<ModuleFormat, HalError> {
    from_num(&MODULE_FORMATS, "format", n)
}

/// A bit mask of dtypes.
pub fn dtype_mask(ds: &[DType]) -> u32 {
    ds.iter().fold(0, |m, d| m | (1 << dtype_num(*d)))
}
/// The dtypes of a bit mask, in ABI order (unknown bits ignored: a newer plugin's dtypes).
pub fn dtypes_of_mask(mask: u32) -> Vec<DType> {
    DTYPES
        .iter()
        .filter(|(_, n)| mask & (1 << n) != 0)
        .map(|e| e.0)
        .collect()
}
/// A bit mask of reductions.
pub fn red_mask(rs: &[ReduceOp]) -> u32 {
    rs.iter().fold(0, |m, r| m | (1 << red_num(*r)))
}
/// The reductions of a bit mask.
pub fn reds_of_mask(mask: u32) -> Vec<ReduceOp> {
    REDUCTIONS
        .iter()
        .filter(|(_, n)| mask & (1 << n) != 0)
        .map(|e| e.0)
        .collect()
}

/// A `&'static str` equal to `s`, one allocation per distinct string for the process (the HAL
/// names arguments and backends with `&'static str`; the set of names is small and bounded).
pub fn intern(s: &str) -> &'static str {
    static SET: parking_lot::Mutex<Option<HashSet<&'static str>>> = parking_lot::Mutex::new(None);
    let mut set = SET.lock();
    let set = set.get_or_insert_with(HashSet::new);
    if let Some(&t) = set.get(s) {
        return t;
    }
    let t: &'static str = Box::leak(s.to_string().into_boxed_str());
    set.insert(t);
    t
}

/// Copies `s` into a C string array, truncated at a character boundary, NUL-terminated.
pub fn put_str(dst: &mut [c_char], s: &str) {
    let Some(cap) = dst.len().checked_sub(1) else {
        return;
    };
    let mut n = s.len().min(cap);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// The text of a C string array (up to its first NUL; lossy for invalid UTF-8).
pub fn get_str(src: &[c_char]) -> String {
    let bytes: Vec<u8> = src
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The text of a NUL-terminated C string, or None for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid during the call.
pub unsafe fn opt_cstr(p: *const c_char) -> Option<String> {
    if p.is_null() {
        None
    } else {
        // SAFETY: non-null and NUL-terminated by the caller's promise.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// Writes `e` into the ABI's error record; returns its status code.
pub fn put_error(out: &mut UhError, e: &HalError) -> UhStatus {
    out.num = [0; 3];
    out.vendor_code = 0;
    out.invalid = UH_INVALID_OTHER;
    out.arg[0] = 0;
    out.str_[0][0] = 0;
    out.str_[1][0] = 0;
    out.message[0] = 0;
    let (code, message) = match e {
        HalError::Unavailable { what, reason } => {
            put_str(&mut out.str_[0], what);
            (UH_ERR_UNAVAILABLE, reason.clone())
        }
        HalError::Unsupported { what } => (UH_ERR_UNSUPPORTED, what.clone()),
        HalError::InvalidArgument { arg, reason } => {
            put_str(&mut out.arg, arg);
            let (kind, message) = match reason {
                Invalid::OutOfRange { offset, len, size } => {
                    out.num = [*offset, *len, *size];
                    (UH_INVALID_OUT_OF_RANGE, String::new())
                }
                Invalid::WrongDevice { expected, found } => {
                    out.num = [expected.ordinal as u64, found.ordinal as u64, 0];
                    put_str(&mut out.str_[0], expected.backend);
                    put_str(&mut out.str_[1], found.backend);
                    (UH_INVALID_WRONG_DEVICE, String::new())
                }
                Invalid::FreeEnqueued { addr, len } => {
                    out.num = [*addr, *len, 0];
                    (UH_INVALID_FREE_ENQUEUED, String::new())
                }
                Invalid::ForeignHandle { expected, found } => {
                    put_str(&mut out.str_[0], expected);
                    put_str(&mut out.str_[1], found);
                    (UH_INVALID_FOREIGN_HANDLE, String::new())
                }
                Invalid::Overlap { src, dst, len } => {
                    out.num = [*src, *dst, *len];
                    (UH_INVALID_OVERLAP, String::new())
                }
                Invalid::Busy(m) => (UH_INVALID_BUSY, m.clone()),
                Invalid::Value { value, accepted } => {
                    put_str(&mut out.str_[0], value);
                    put_str(&mut out.str_[1], accepted);
                    (UH_INVALID_VALUE, String::new())
                }
                other => (UH_INVALID_OTHER, other.to_string()),
            };
            out.invalid = kind;
            (UH_ERR_INVALID_ARGUMENT, message)
        }
        HalError::OutOfMemory { requested, free } => {
            out.num = [*requested, *free, 0];
            (UH_ERR_OUT_OF_MEMORY, String::new())
        }
        HalError::AllocatorOutOfMemory(r) => {
            out.num = [r.requested, r.free, 0];
            (UH_ERR_OUT_OF_MEMORY, r.to_string())
        }
        HalError::Timeout { what, millis } => {
            out.num = [*millis, 0, 0];
            (UH_ERR_TIMEOUT, what.clone())
        }
        HalError::Aborted { what } => (UH_ERR_ABORTED, what.clone()),
        HalError::DeviceLost { what } => (UH_ERR_DEVICE_LOST, what.clone()),
        HalError::AbiMismatch { what } => (UH_ERR_ABI_MISMATCH, what.clone()),
        HalError::Vendor {
            library,
            call,
            code,
            name,
            message,
        } => {
            put_str(&mut out.str_[0], library);
            put_str(&mut out.str_[1], call);
            put_str(&mut out.arg, name);
            out.vendor_code = *code;
            (UH_ERR_VENDOR, message.clone())
        }
        HalError::Internal(m) => (UH_ERR_INTERNAL, m.clone()),
        other => (UH_ERR_INTERNAL, other.to_string()),
    };
    out.code = code;
    put_str(&mut out.message, &message);
    code
}

/// The HAL error an ABI error record describes (`status` is the call's return value). A code
/// this ABI does not know becomes `Internal` naming it.
pub fn get_error(status: UhStatus, e: &UhError) -> HalError {
    let message = get_str(&e.message);
    let s0 = get_str(&e.str_[0]);
    let s1 = get_str(&e.str_[1]);
    let [n0, n1, n2] = e.num;
    let code = if e.code == UH_OK { status } else { e.code };
    match code {
        UH_ERR_UNAVAILABLE => HalError::Unavailable {
            what: s0,
            reason: message,
        },
        UH_ERR_UNSUPPORTED => HalError::Unsupported { what: message },
        UH_ERR_INVALID_ARGUMENT => {
            let reason = match e.invalid {
                UH_INVALID_OUT_OF_RANGE => Invalid::OutOfRange {
                    offset: n0,
                    len: n1,
                    size: n2,
                },
                UH_INVALID_WRONG_DEVICE => Invalid::WrongDevice {
                    expected: DeviceId {
                        backend: intern(&s0),
                        ordinal: n0 as u32,
                    },
                    found: DeviceId {
                        backend: intern(&s1),
                        ordinal: n1 as u32,
                    },
                },
                UH_INVALID_FREE_ENQUEUED => Invalid::FreeEnqueued { addr: n0, len: n1 },
                UH_INVALID_FOREIGN_HANDLE => Invalid::ForeignHandle {
                    expected: s0,
                    found: s1,
                },
                UH_INVALID_OVERLAP => Invalid::Overlap {
                    src: n0,
                    dst: n1,
                    len: n2,
                },
                UH_INVALID_BUSY => Invalid::Busy(message),
                UH_INVALID_VALUE => Invalid::Value {
                    value: s0,
                    accepted: s1,
                },
                _ => Invalid::Other(message),
            };
            HalError::InvalidArgument {
                arg: intern(&get_str(&e.arg)),
                reason,
            }
        }
        UH_ERR_OUT_OF_MEMORY => HalError::OutOfMemory {
            requested: n0,
            free: n1,
        },
        UH_ERR_TIMEOUT => HalError::Timeout {
            what: message,
            millis: n0,
        },
        UH_ERR_ABORTED => HalError::Aborted { what: message },
        UH_ERR_DEVICE_LOST => HalError::DeviceLost { what: message },
        UH_ERR_ABI_MISMATCH => HalError::AbiMismatch { what: message },
        UH_ERR_VENDOR => HalError::Vendor {
            library: s0,
            call: s1,
            code: e.vendor_code,
            name: get_str(&e.arg),
            message,
        },
        UH_ERR_INTERNAL => HalError::Internal(message),
        other => HalError::Internal(format!("plugin returned unknown status {other}: {message}")),
    }
}

/// A native handle in the ABI's form.
pub fn put_native(h: NativeHandle) -> UhNative {
    let mut n = UhNative {
        kind: UH_NATIVE_NONE,
        reserved: 0,
        ptr: std::ptr::null_mut(),
        value: 0,
    };
    match h {
        NativeHandle::None => {}
        NativeHandle::Ptr(p) => {
            n.kind = UH_NATIVE_PTR;
            n.ptr = p;
        }
        NativeHandle::Int(v) => {
            n.kind = UH_NATIVE_INT;
            n.value = v;
        }
    }
    n
}

/// The native handle of the ABI's form.
pub fn get_native(n: &UhNative) -> NativeHandle {
    match n.kind {
        UH_NATIVE_PTR => NativeHandle::Ptr(n.ptr),
        UH_NATIVE_INT => NativeHandle::Int(n.value),
        _ => NativeHandle::None,
    }
}

/// The optional capability flags of the ABI, with the HAL field each stands for.
pub fn cap_flags(o: &unihal_hal::OptionalCaps) -> u32 {
    [
        (o.event_timing, UH_CAP_EVENT_TIMING),
        (o.pinned_host_memory, UH_CAP_PINNED_HOST_MEMORY),
        (o.wide_fill, UH_CAP_WIDE_FILL),
        (o.host_callbacks, UH_CAP_HOST_CALLBACKS),
        (o.stream_ordered_alloc, UH_CAP_STREAM_ORDERED_ALLOC),
        (o.fault_poisons_device, UH_CAP_FAULT_POISONS_DEVICE),
        (o.bitwise_rng, UH_CAP_BITWISE_RNG),
        (o.negative_strides_copied, UH_CAP_NEGATIVE_STRIDES_COPIED),
    ]
    .iter()
    .fold(0, |m, (on, bit)| if *on { m | bit } else { m })
}

/// Collective capabilities as the ABI's data (`engine` and `accumulation` point into `keep`,
/// which must outlive the result).
pub fn put_ccl_caps(c: &CclCaps, keep: &mut CclCapsStore) -> UhCclCaps {
    keep.engine = std::ffi::CString::new(c.engine.replace('\0', " ")).unwrap_or_default();
    keep.accumulation = c
        .accumulation
        .iter()
        .map(|(d, a)| UhAccumulation {
            dtype: dtype_num(*d),
            accumulate_in: dtype_num(a.accumulate_in),
            emulated_mask: red_mask(&a.emulated),
            reserved: 0,
        })
        .collect();
    let mut op_dtypes = [0u32; UH_COLL_COUNT];
    for (op, ds) in &c.ops {
        if let Some(slot) = op_dtypes.get_mut(coll_num(*op) as usize) {
            *slot = dtype_mask(ds);
        }
    }
    let mut reductions = [0u32; UH_DTYPE_COUNT];
    for (d, rs) in &c.reductions {
        if let Some(slot) = reductions.get_mut(dtype_num(*d) as usize) {
            *slot = red_mask(rs);
        }
    }
    let flags = [
        (c.groups, UH_CCL_GROUPS),
        (c.split, UH_CCL_SPLIT),
        (c.survives_dead_rank, UH_CCL_SURVIVES_DEAD_RANK),
        (c.names_missing_ranks, UH_CCL_NAMES_MISSING_RANKS),
        (c.timeout_aborts_peers, UH_CCL_TIMEOUT_ABORTS_PEERS),
        (c.crosses_processes, UH_CCL_CROSSES_PROCESSES),
    ]
    .iter()
    .fold(0, |m, (on, bit)| if *on { m | bit } else { m });
    UhCclCaps {
        size: std::mem::size_of::<UhCclCaps>() as u32,
        flags,
        engine: keep.engine.as_ptr(),
        op_dtypes,
        reductions,
        n_accumulation: keep.accumulation.len() as u32,
        reserved: 0,
        accumulation: keep.accumulation.as_ptr(),
    }
}

/// What the pointers of a [`UhCclCaps`] made by [`put_ccl_caps`] point into.
#[derive(Default)]
pub struct CclCapsStore {
    engine: std::ffi::CString,
    accumulation: Vec<UhAccumulation>,
}

/// The collective capabilities the ABI's data describes.
///
/// # Safety
/// `c`'s pointers are valid as the header documents (`engine` a string, `accumulation` an array
/// of `n_accumulation`).
pub unsafe fn get_ccl_caps(c: &UhCclCaps) -> CclCaps {
    let mut ops = BTreeMap::new();
    for (op, n) in COLLECTIVES {
        let ds = dtypes_of_mask(c.op_dtypes[n as usize]);
        if !ds.is_empty() {
            ops.insert(op, ds);
        }
    }
    let mut reductions = BTreeMap::new();
    for (d, n) in DTYPES {
        let rs = reds_of_mask(c.reductions[n as usize]);
        if !rs.is_empty() {
            reductions.insert(d, rs);
        }
    }
    let acc: &[UhAccumulation] = if c.accumulation.is_null() {
        &[]
    } else {
        // SAFETY: the caller's promise: `n_accumulation` entries.
        unsafe { std::slice::from_raw_parts(c.accumulation, c.n_accumulation as usize) }
    };
    let accumulation = acc
        .iter()
        .filter_map(|a| {
            Some((
                dtype_of(a.dtype).ok()?,
                Accumulation {
                    accumulate_in: dtype_of(a.accumulate_in).ok()?,
                    emulated: reds_of_mask(a.emulated_mask),
                },
            ))
        })
        .collect();
    CclCaps {
        // SAFETY: the caller's promise.
        engine: unsafe { opt_cstr(c.engine) }.unwrap_or_default(),
        ops,
        reductions,
        accumulation,
        groups: c.flags & UH_CCL_GROUPS != 0,
        split: c.flags & UH_CCL_SPLIT != 0,
        survives_dead_rank: c.flags & UH_CCL_SURVIVES_DEAD_RANK != 0,
        names_missing_ranks: c.flags & UH_CCL_NAMES_MISSING_RANKS != 0,
        timeout_aborts_peers: c.flags & UH_CCL_TIMEOUT_ABORTS_PEERS != 0,
        crosses_processes: c.flags & UH_CCL_CROSSES_PROCESSES != 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hal_op_and_dtype_has_an_abi_number_and_back() {
        for op in OpId::ALL {
            let n = op_num(op);
            assert_ne!(n, u32::MAX, "{op} has no ABI number");
            assert_eq!(op_of(n).unwrap(), op);
        }
        for d in DType::ALL {
            assert_eq!(dtype_of(dtype_num(d)).unwrap(), d);
        }
        assert!(op_of(UH_OP_COUNT).is_err());
        assert!(dtype_of(99).is_err());
    }

    #[test]
    fn errors_cross_with_their_typed_details() {
        let cases = [
            HalError::invalid(
                "dst",
                Invalid::OutOfRange {
                    offset: 1,
                    len: 2,
                    size: 3,
                },
            ),
            HalError::invalid(
                "event",
                Invalid::WrongDevice {
                    expected: DeviceId {
                        backend: "cpu",
                        ordinal: 0,
                    },
                    found: DeviceId {
                        backend: "cpu",
                        ordinal: 1,
                    },
                },
            ),
            HalError::invalid("buffer", Invalid::FreeEnqueued { addr: 64, len: 8 }),
            HalError::invalid(
                "src",
                Invalid::Overlap {
                    src: 1,
                    dst: 2,
                    len: 3,
                },
            ),
            HalError::invalid("host", Invalid::Busy("mapped".into())),
            HalError::invalid(
                "n",
                Invalid::Value {
                    value: "7".into(),
                    accepted: "0..4".into(),
                },
            ),
            HalError::OutOfMemory {
                requested: 10,
                free: 5,
            },
            HalError::Timeout {
                what: "all_reduce".into(),
                millis: 100,
            },
            HalError::Vendor {
                library: "CUDA driver".into(),
                call: "cuMemAlloc".into(),
                code: 2,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into(),
                message: "out of memory".into(),
            },
            HalError::Aborted {
                what: "communicator".into(),
            },
            HalError::unsupported("wide fills"),
        ];
        for e in cases {
            let mut rec = UhError::new();
            put_error(&mut rec, &e);
            assert_eq!(get_error(rec.code, &rec), e);
        }
    }

    #[test]
    fn long_strings_are_truncated_at_a_character_boundary() {
        let mut a = [0 as c_char; 8];
        put_str(&mut a, "ééééé");
        assert_eq!(get_str(&a), "ééé");
    }
}

/// What the pointers of a [`UhDeviceProps`] made by [`put_props`] point into.
#[derive(Default)]
pub struct PropsStore {
    name: std::ffi::CString,
    vendor: std::ffi::CString,
    arch: Option<std::ffi::CString>,
    peers: Vec<u32>,
    ops: Vec<UhOpSupport>,
}

fn cstring(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// A device's name, vendor and capabilities as the ABI's data, pointing into `keep`.
pub fn put_props(
    info: &unihal_hal::DeviceInfo,
    caps: &unihal_hal::Capabilities,
    keep: &mut PropsStore,
) -> UhDeviceProps {
    let m = &caps.mandatory;
    let o = &caps.optional;
    keep.name = cstring(&info.name);
    keep.vendor = cstring(&info.vendor);
    keep.arch = o.arch.as_deref().map(cstring);
    keep.peers = o.peer_devices.clone();
    keep.ops = o
        .ops
        .iter()
        .filter(|(op, _)| op_num(**op) != u32::MAX)
        .map(|(op, ds)| UhOpSupport {
            op: op_num(*op),
            dtype_mask: dtype_mask(ds),
        })
        .collect();
    UhDeviceProps {
        size: std::mem::size_of::<UhDeviceProps>() as u32,
        reserved: 0,
        name: keep.name.as_ptr(),
        vendor: keep.vendor.as_ptr(),
        memory_bytes: m.memory_bytes,
        alloc_alignment: m.alloc_alignment,
        compute_units: m.compute_units,
        warp_size: m.warp_size,
        max_grid: m.max_grid,
        max_block: m.max_block,
        max_threads_per_block: m.max_threads_per_block,
        max_shared_mem_per_block: m.max_shared_mem_per_block,
        module_formats: m
            .module_formats
            .iter()
            .fold(0, |acc, f| acc | (1 << format_num(*f))),
        flags: cap_flags(o),
        arch: keep.arch.as_ref().map_or(std::ptr::null(), |a| a.as_ptr()),
        timer_resolution_ns: o.timer_resolution_ns.unwrap_or(0),
        n_peers: keep.peers.len() as u32,
        n_ops: keep.ops.len() as u32,
        peers: keep.peers.as_ptr(),
        ops: keep.ops.as_ptr(),
    }
}

/// A slice from a C array (empty for NULL or a zero count).
///
/// # Safety
/// `p` is NULL or points to `n` valid elements that outlive the result.
pub unsafe fn slice<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// The device name, vendor and capabilities the ABI's data describes. Ops and dtypes this ABI
/// does not know (a newer plugin's) are left out; fields past `p.size` count as absent.
///
/// # Safety
/// `p`'s pointers are valid as the header documents.
pub unsafe fn get_props(p: &UhDeviceProps) -> (String, String, unihal_hal::Capabilities) {
    // SAFETY: the caller's promise: `p`'s pointers are valid as the header documents.
    let name = unsafe { opt_cstr(p.name) }.unwrap_or_default();
    // SAFETY: the caller's promise: `p`'s pointers are valid as the header documents.
    let vendor = unsafe { opt_cstr(p.vendor) }.unwrap_or_default();
    let f = |bit: u32| p.flags & bit != 0;
    let mut ops = BTreeMap::new();
    // SAFETY: the caller's promise: `p`'s pointers are valid as the header documents.
    for s in unsafe { slice(p.ops, p.n_ops as usize) } {
        if let Ok(op) = op_of(s.op) {
            ops.insert(op, dtypes_of_mask(s.dtype_mask));
        }
    }
    let caps = unihal_hal::Capabilities {
        mandatory: unihal_hal::MandatoryCaps {
            memory_bytes: p.memory_bytes,
            alloc_alignment: p.alloc_alignment,
            compute_units: p.compute_units,
            warp_size: p.warp_size,
            max_grid: p.max_grid,
            max_block: p.max_block,
            max_threads_per_block: p.max_threads_per_block,
            max_shared_mem_per_block: p.max_shared_mem_per_block,
            module_formats: MODULE_FORMATS
                .iter()
                .filter(|(_, n)| p.module_formats & (1 << n) != 0)
                .map(|e| e.0)
                .collect(),
        },
        optional: unihal_hal::OptionalCaps {
            // SAFETY: the caller's promise: `p`'s pointers are valid as the header documents.
            arch: unsafe { opt_cstr(p.arch) },
            event_timing: f(UH_CAP_EVENT_TIMING),
            pinned_host_memory: f(UH_CAP_PINNED_HOST_MEMORY),
            wide_fill: f(UH_CAP_WIDE_FILL),
            host_callbacks: f(UH_CAP_HOST_CALLBACKS),
            stream_ordered_alloc: f(UH_CAP_STREAM_ORDERED_ALLOC),
            // SAFETY: the caller's promise: `p`'s pointers are valid as the header documents.
            peer_devices: unsafe { slice(p.peers, p.n_peers as usize) }.to_vec(),
            fault_poisons_device: f(UH_CAP_FAULT_POISONS_DEVICE),
            timer_resolution_ns: Some(p.timer_resolution_ns).filter(|&n| n != 0),
            bitwise_rng: f(UH_CAP_BITWISE_RNG),
            negative_strides_copied: f(UH_CAP_NEGATIVE_STRIDES_COPIED),
            ops,
            graphs: unihal_hal::GraphCaps::unsupported(
                "the plugin ABI has no stream capture entries yet",
            ),
        },
    };
    (name, vendor, caps)
}

/// A `&'static [usize]` equal to `s`, one allocation per distinct list for the process (the
/// HAL's host kernels name their parameter sizes with `&'static [usize]`).
pub fn intern_sizes(s: &[usize]) -> &'static [usize] {
    static SET: parking_lot::Mutex<Option<HashSet<&'static [usize]>>> =
        parking_lot::Mutex::new(None);
    let mut set = SET.lock();
    let set = set.get_or_insert_with(HashSet::new);
    if let Some(&t) = set.get(s) {
        return t;
    }
    let t: &'static [usize] = Box::leak(s.to_vec().into_boxed_slice());
    set.insert(t);
    t
}

/// What the pointers of a [`UhModuleSource`] made by [`put_module_source`] point into.
#[derive(Default)]
pub struct SourceStore {
    bytes: Vec<u8>,
    names: Vec<std::ffi::CString>,
    sizes: Vec<Vec<u64>>,
    symbols: Vec<UhHostSymbol>,
}

/// A module source as the ABI's data, pointing into `keep`.
///
/// # Errors
/// `Unsupported` for a format this ABI does not carry.
pub fn put_module_source(
    src: &unihal_hal::ModuleSource,
    keep: &mut SourceStore,
) -> Result<UhModuleSource, HalError> {
    use unihal_hal::ModuleSource as S;
    match src {
        S::HostSymbols(table) => {
            for name in table.names() {
                let k = table.get(name).expect("a listed name");
                keep.names.push(cstring(name));
                keep.sizes
                    .push(k.param_sizes.iter().map(|&s| s as u64).collect());
                // SAFETY: HostKernelFn and UhHostKernelFn are the same C signature: the HAL's
                // HostLaunchCtx and the ABI's UhHostLaunchCtx have the same layout (both
                // repr(C): nine u32, four bytes of padding made explicit, a pointer, a u64).
                let func: UhHostKernelFn = unsafe { std::mem::transmute(k.func) };
                keep.symbols.push(UhHostSymbol {
                    name: std::ptr::null(),
                    func: Some(func),
                    n_params: 0,
                    param_sizes: std::ptr::null(),
                });
            }
            for ((sym, name), sizes) in keep.symbols.iter_mut().zip(&keep.names).zip(&keep.sizes) {
                sym.name = name.as_ptr();
                sym.n_params = sizes.len() as u64;
                sym.param_sizes = sizes.as_ptr();
            }
        }
        S::Ptx(text) => keep.bytes = text.as_bytes().to_vec(),
        S::Cubin(b) | S::HipCodeObject(b) | S::AscendBinary(b) => keep.bytes = b.clone(),
        other => {
            return Err(HalError::unsupported(format!(
                "module format {:?} through the plugin ABI",
                other.format()
            )))
        }
    }
    Ok(UhModuleSource {
        size: std::mem::size_of::<UhModuleSource>() as u32,
        format: format_num(src.format()),
        bytes: keep.bytes.as_ptr(),
        len: keep.bytes.len() as u64,
        n_symbols: keep.symbols.len() as u64,
        symbols: keep.symbols.as_ptr(),
    })
}

/// The module source the ABI's data describes (bytes copied; host kernels keep pointing at the
/// functions, which live as long as their library: plugins are never unloaded).
///
/// # Safety
/// `s`'s pointers are valid as the header documents.
///
/// # Errors
/// `InvalidArgument` for an unknown format, a NULL kernel or non-UTF-8 PTX.
pub unsafe fn get_module_source(s: &UhModuleSource) -> Result<unihal_hal::ModuleSource, HalError> {
    use unihal_hal::ModuleSource as S;
    // SAFETY: the caller's promise.
    let bytes = unsafe { slice(s.bytes, s.len as usize) }.to_vec();
    Ok(match format_of(s.format)? {
        ModuleFormat::HostSymbols => {
            let mut table = unihal_hal::HostSymbolTable::new();
            // SAFETY: the caller's promise.
            for sym in unsafe { slice(s.symbols, s.n_symbols as usize) } {
                // SAFETY: the caller's promise.
                let name = unsafe { opt_cstr(sym.name) }.unwrap_or_default();
                let Some(func) = sym.func else {
                    return Err(HalError::invalid(
                        "source",
                        Invalid::Other(format!("host kernel {name:?} has a NULL function")),
                    ));
                };
                // SAFETY: the caller's promise.
                let sizes: Vec<usize> = unsafe { slice(sym.param_sizes, sym.n_params as usize) }
                    .iter()
                    .map(|&n| n as usize)
                    .collect();
                table.insert(
                    name,
                    unihal_hal::HostKernel {
                        // SAFETY: the same C signature (see put_module_source).
                        func: unsafe {
                            std::mem::transmute::<UhHostKernelFn, unihal_hal::HostKernelFn>(func)
                        },
                        param_sizes: intern_sizes(&sizes),
                    },
                );
            }
            S::HostSymbols(std::sync::Arc::new(table))
        }
        ModuleFormat::Ptx => S::Ptx(String::from_utf8(bytes).map_err(|_| {
            HalError::invalid("source", Invalid::Other("PTX that is not UTF-8".into()))
        })?),
        ModuleFormat::Cubin => S::Cubin(bytes),
        ModuleFormat::HipCodeObject => S::HipCodeObject(bytes),
        ModuleFormat::AscendBinary => S::AscendBinary(bytes),
        other => {
            return Err(HalError::unsupported(format!(
                "module format {other:?} through the plugin ABI"
            )))
        }
    })
}

/// A tensor view as the ABI's data; `mem` names the view's allocation and range.
pub fn put_tensor(v: &unihal_hal::TensorView, mem: (*mut UhMem, u64, u64)) -> UhTensor {
    let mut t = UhTensor {
        mem: mem.0,
        mem_offset: mem.1,
        mem_len: mem.2,
        offset: v.offset,
        dtype: dtype_num(v.dtype),
        ndim: v.shape.len().min(UH_MAX_DIMS) as u32,
        shape: [0; UH_MAX_DIMS],
        strides: [0; UH_MAX_DIMS],
    };
    for (d, s) in t.shape.iter_mut().zip(&v.shape) {
        *d = *s;
    }
    for (d, s) in t.strides.iter_mut().zip(&v.strides) {
        *d = *s;
    }
    t
}

/// A scalar as the ABI's data.
pub fn put_scalar(s: &unihal_hal::Scalar) -> UhScalar {
    match *s {
        unihal_hal::Scalar::F64(v) => UhScalar {
            kind: UH_SCALAR_F64,
            reserved: 0,
            value: UhScalarValue { f64_: v },
        },
        unihal_hal::Scalar::I64(v) => UhScalar {
            kind: UH_SCALAR_I64,
            reserved: 0,
            value: UhScalarValue { i64_: v },
        },
    }
}

/// The op call the ABI's data describes; `buffer` turns a tensor's (allocation, offset, length)
/// into a buffer.
///
/// # Safety
/// `c`'s pointers are valid as the header documents.
///
/// # Errors
/// `InvalidArgument` for unknown numbers, too many dimensions, or what `buffer` refuses.
pub unsafe fn get_op_call(
    c: &UhOpCall,
    buffer: impl Fn(*mut UhMem, u64, u64) -> Result<unihal_hal::Buffer, HalError>,
) -> Result<unihal_hal::OpCall, HalError> {
    let op = op_of(c.op)?;
    // SAFETY: the caller's promise.
    let ts = unsafe { slice(c.tensors, c.n_tensors as usize) };
    let mut tensors = Vec::with_capacity(ts.len());
    for t in ts {
        let n = t.ndim as usize;
        if n > UH_MAX_DIMS {
            return Err(HalError::invalid(
                "tensors",
                Invalid::Value {
                    value: format!("{n} dimensions"),
                    accepted: format!("at most {UH_MAX_DIMS}"),
                },
            ));
        }
        tensors.push(unihal_hal::TensorView {
            buffer: buffer(t.mem, t.mem_offset, t.mem_len)?,
            offset: t.offset,
            dtype: dtype_of(t.dtype)?,
            shape: t.shape[..n].to_vec(),
            strides: t.strides[..n].to_vec(),
        });
    }
    // SAFETY: the caller's promise.
    let scalars = unsafe { slice(c.scalars, c.n_scalars as usize) }
        .iter()
        .map(|s| match s.kind {
            // SAFETY: the kind says which member is set.
            UH_SCALAR_F64 => Ok(unihal_hal::Scalar::F64(unsafe { s.value.f64_ })),
            // SAFETY: as above.
            UH_SCALAR_I64 => Ok(unihal_hal::Scalar::I64(unsafe { s.value.i64_ })),
            k => Err(HalError::invalid(
                "scalars",
                Invalid::Value {
                    value: format!("scalar kind {k}"),
                    accepted: "UH_SCALAR_F64 or UH_SCALAR_I64".into(),
                },
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(unihal_hal::OpCall {
        op,
        tensors,
        scalars,
        rng: (c.has_rng != 0).then_some(unihal_hal::RngState {
            seed: c.rng_seed,
            offset: c.rng_offset,
        }),
    })
}
