//! # unihal-plugin-abi: the C ABI of unihal backend plugins
//!
//! Rust declarations of `include/unihal_plugin.h`, the normative text of the ABI (read its rules
//! there and in docs/PLUGIN_ABI.md). This crate has no dependency and no logic: it is the one
//! place where the ABI's numbers and layouts are written in Rust, used by both directions of
//! `unihal-plugin` (a Rust backend exported as a plugin, a plugin loaded into the HAL traits).
//! `tests/header.rs` compiles the header with the system C compiler and checks every number,
//! size and field offset against these declarations.
//!
//! Everything here is `#[repr(C)]` and plain data; the function-pointer fields are `Option` so
//! that a NULL entry (an unsupported operation) is representable.

use std::ffi::{c_char, c_void};

/// The ABI's major version: another major is refused before any other call.
pub const UH_ABI_MAJOR: u32 = 1;
/// The ABI's minor version: grows when something is appended.
pub const UH_ABI_MINOR: u32 = 2;
/// The one symbol a plugin exports (a [`UhPluginEntryFn`]).
pub const UH_PLUGIN_ENTRY_SYMBOL: &str = "unihal_plugin_entry";

/// A call's outcome: [`UH_OK`] or one of `UH_ERR_*`.
pub type UhStatus = i32;
pub const UH_OK: UhStatus = 0;
pub const UH_ERR_UNAVAILABLE: UhStatus = 1;
pub const UH_ERR_UNSUPPORTED: UhStatus = 2;
pub const UH_ERR_INVALID_ARGUMENT: UhStatus = 3;
pub const UH_ERR_OUT_OF_MEMORY: UhStatus = 4;
pub const UH_ERR_TIMEOUT: UhStatus = 5;
pub const UH_ERR_ABORTED: UhStatus = 6;
pub const UH_ERR_DEVICE_LOST: UhStatus = 7;
pub const UH_ERR_ABI_MISMATCH: UhStatus = 8;
pub const UH_ERR_VENDOR: UhStatus = 9;
pub const UH_ERR_INTERNAL: UhStatus = 10;

pub const UH_INVALID_OTHER: i32 = 0;
pub const UH_INVALID_OUT_OF_RANGE: i32 = 1;
pub const UH_INVALID_WRONG_DEVICE: i32 = 2;
pub const UH_INVALID_FREE_ENQUEUED: i32 = 3;
pub const UH_INVALID_FOREIGN_HANDLE: i32 = 4;
pub const UH_INVALID_OVERLAP: i32 = 5;
pub const UH_INVALID_BUSY: i32 = 6;
pub const UH_INVALID_VALUE: i32 = 7;

/// An error crossing the boundary: a code, typed details and a message (see the header for
/// which fields each code uses).
#[repr(C)]
#[derive(Clone)]
pub struct UhError {
    pub size: u32,
    pub code: i32,
    pub invalid: i32,
    pub reserved: u32,
    pub num: [u64; 3],
    pub vendor_code: i64,
    pub arg: [c_char; 64],
    pub str_: [[c_char; 256]; 2],
    pub message: [c_char; 1024],
}

impl UhError {
    /// An empty error record of this ABI's size, for the host to pass.
    pub fn new() -> UhError {
        UhError {
            size: std::mem::size_of::<UhError>() as u32,
            code: UH_OK,
            invalid: UH_INVALID_OTHER,
            reserved: 0,
            num: [0; 3],
            vendor_code: 0,
            arg: [0; 64],
            str_: [[0; 256]; 2],
            message: [0; 1024],
        }
    }
}

impl Default for UhError {
    fn default() -> Self {
        UhError::new()
    }
}

pub const UH_DTYPE_F64: u32 = 0;
pub const UH_DTYPE_F32: u32 = 1;
pub const UH_DTYPE_F16: u32 = 2;
pub const UH_DTYPE_BF16: u32 = 3;
pub const UH_DTYPE_I8: u32 = 4;
pub const UH_DTYPE_U8: u32 = 5;
pub const UH_DTYPE_I16: u32 = 6;
pub const UH_DTYPE_I32: u32 = 7;
pub const UH_DTYPE_I64: u32 = 8;
pub const UH_DTYPE_U32: u32 = 9;
pub const UH_DTYPE_U64: u32 = 10;
pub const UH_DTYPE_BOOL: u32 = 11;
pub const UH_DTYPE_COUNT: usize = 12;

pub const UH_OP_FILL: u32 = 0;
pub const UH_OP_COPY: u32 = 1;
pub const UH_OP_CAST: u32 = 2;
pub const UH_OP_NEG: u32 = 3;
pub const UH_OP_ABS: u32 = 4;
pub const UH_OP_EXP: u32 = 5;
pub const UH_OP_LOG: u32 = 6;
pub const UH_OP_SQRT: u32 = 7;
pub const UH_OP_RSQRT: u32 = 8;
pub const UH_OP_TANH: u32 = 9;
pub const UH_OP_SIGMOID: u32 = 10;
pub const UH_OP_RELU: u32 = 11;
pub const UH_OP_GELU_TANH: u32 = 12;
pub const UH_OP_GELU_ERF: u32 = 13;
pub const UH_OP_SILU: u32 = 14;
pub const UH_OP_RELU_BACKWARD: u32 = 15;
pub const UH_OP_GELU_TANH_BACKWARD: u32 = 16;
pub const UH_OP_GELU_ERF_BACKWARD: u32 = 17;
pub const UH_OP_SILU_BACKWARD: u32 = 18;
pub const UH_OP_ADD: u32 = 19;
pub const UH_OP_SUB: u32 = 20;
pub const UH_OP_MUL: u32 = 21;
pub const UH_OP_DIV: u32 = 22;
pub const UH_OP_MAXIMUM: u32 = 23;
pub const UH_OP_MINIMUM: u32 = 24;
pub const UH_OP_POW: u32 = 25;
pub const UH_OP_ADD_SCALAR: u32 = 26;
pub const UH_OP_SUB_SCALAR: u32 = 27;
pub const UH_OP_MUL_SCALAR: u32 = 28;
pub const UH_OP_DIV_SCALAR: u32 = 29;
pub const UH_OP_MAXIMUM_SCALAR: u32 = 30;
pub const UH_OP_MINIMUM_SCALAR: u32 = 31;
pub const UH_OP_POW_SCALAR: u32 = 32;
pub const UH_OP_AXPY: u32 = 33;
pub const UH_OP_WHERE: u32 = 34;
pub const UH_OP_RANDOM_UNIFORM: u32 = 35;
pub const UH_OP_RANDOM_NORMAL: u32 = 36;
pub const UH_OP_DROPOUT_FORWARD: u32 = 37;
pub const UH_OP_DROPOUT_BACKWARD: u32 = 38;
pub const UH_OP_REDUCE_SUM: u32 = 39;
pub const UH_OP_REDUCE_MEAN: u32 = 40;
pub const UH_OP_REDUCE_MAX: u32 = 41;
pub const UH_OP_REDUCE_MIN: u32 = 42;
pub const UH_OP_ARGMAX: u32 = 43;
pub const UH_OP_ARGMIN: u32 = 44;
pub const UH_OP_SOFTMAX: u32 = 45;
pub const UH_OP_LOG_SOFTMAX: u32 = 46;
pub const UH_OP_SOFTMAX_MASKED: u32 = 47;
pub const UH_OP_LOG_SOFTMAX_MASKED: u32 = 48;
pub const UH_OP_SOFTMAX_BACKWARD: u32 = 49;
pub const UH_OP_LOG_SOFTMAX_BACKWARD: u32 = 50;
pub const UH_OP_CROSS_ENTROPY: u32 = 51;
pub const UH_OP_CROSS_ENTROPY_BACKWARD: u32 = 52;
pub const UH_OP_LAYER_NORM: u32 = 53;
pub const UH_OP_LAYER_NORM_BACKWARD: u32 = 54;
pub const UH_OP_RMS_NORM: u32 = 55;
pub const UH_OP_RMS_NORM_BACKWARD: u32 = 56;
pub const UH_OP_MATMUL: u32 = 57;
pub const UH_OP_INDEX_SELECT: u32 = 58;
pub const UH_OP_INDEX_ADD: u32 = 59;
pub const UH_OP_SGD_MOMENTUM: u32 = 60;
pub const UH_OP_ADAMW: u32 = 61;
pub const UH_OP_AMP_UNSCALE: u32 = 62;
pub const UH_OP_AMP_UPDATE_SCALE: u32 = 63;
pub const UH_OP_CLIP_GRAD_NORM: u32 = 64;
// ABI 1.1: the transformer-block ops.
pub const UH_OP_ATTENTION: u32 = 65;
pub const UH_OP_ATTENTION_BACKWARD: u32 = 66;
pub const UH_OP_ROPE: u32 = 67;
pub const UH_OP_ROPE_BACKWARD: u32 = 68;
pub const UH_OP_ADD_LAYER_NORM: u32 = 69;
pub const UH_OP_ADD_RMS_NORM: u32 = 70;
pub const UH_OP_COUNT: u32 = 71;

pub const UH_COLL_ALL_REDUCE: u32 = 0;
pub const UH_COLL_BROADCAST: u32 = 1;
pub const UH_COLL_REDUCE: u32 = 2;
pub const UH_COLL_ALL_GATHER: u32 = 3;
pub const UH_COLL_REDUCE_SCATTER: u32 = 4;
pub const UH_COLL_SENDRECV: u32 = 5;
pub const UH_COLL_ALL_TO_ALL: u32 = 6;
pub const UH_COLL_COUNT: usize = 7;

pub const UH_RED_SUM: u32 = 0;
pub const UH_RED_PROD: u32 = 1;
pub const UH_RED_MIN: u32 = 2;
pub const UH_RED_MAX: u32 = 3;
pub const UH_RED_AVG: u32 = 4;
pub const UH_RED_COUNT: usize = 5;

pub const UH_MODULE_HOST_SYMBOLS: u32 = 0;
pub const UH_MODULE_PTX: u32 = 1;
pub const UH_MODULE_CUBIN: u32 = 2;
pub const UH_MODULE_HIP_CODE_OBJECT: u32 = 3;
pub const UH_MODULE_ASCEND_BINARY: u32 = 4;

pub const UH_CAP_EVENT_TIMING: u32 = 1 << 0;
pub const UH_CAP_PINNED_HOST_MEMORY: u32 = 1 << 1;
pub const UH_CAP_WIDE_FILL: u32 = 1 << 2;
pub const UH_CAP_HOST_CALLBACKS: u32 = 1 << 3;
pub const UH_CAP_STREAM_ORDERED_ALLOC: u32 = 1 << 4;
pub const UH_CAP_FAULT_POISONS_DEVICE: u32 = 1 << 5;
pub const UH_CAP_BITWISE_RNG: u32 = 1 << 6;
pub const UH_CAP_NEGATIVE_STRIDES_COPIED: u32 = 1 << 7;

pub const UH_NATIVE_NONE: i32 = 0;
pub const UH_NATIVE_PTR: i32 = 1;
pub const UH_NATIVE_INT: i32 = 2;

/// A native handle (`CUstream`, an ordinal, nothing).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhNative {
    pub kind: i32,
    pub reserved: i32,
    pub ptr: *mut c_void,
    pub value: i64,
}

pub const UH_LOG_ERROR: i32 = 1;
pub const UH_LOG_WARN: i32 = 2;
pub const UH_LOG_INFO: i32 = 3;
pub const UH_LOG_DEBUG: i32 = 4;
pub const UH_LOG_TRACE: i32 = 5;

/// Opaque plugin objects (only ever behind pointers).
macro_rules! opaque {
    ($($(#[$m:meta])* $name:ident),*) => {$(
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    /// An opened device.
    UhDevice,
    /// One device allocation.
    UhMem,
    /// One host allocation.
    UhHostMem,
    /// An in-order queue.
    UhStream,
    /// An event.
    UhEvent,
    /// A loaded module.
    UhModule,
    /// A kernel of a module.
    UhFunction,
    /// A communicator (one rank).
    UhComm
);

/// What the host gives the plugin.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhHostApi {
    pub size: u32,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub reserved: u32,
    pub log:
        Option<unsafe extern "C" fn(level: i32, target: *const c_char, message: *const c_char)>,
}

/// A host function queued on a stream, called exactly once (see the header).
pub type UhHostFn = unsafe extern "C" fn(user: *mut c_void, status: UhStatus);
/// The function of a [`UhHostNode`], called exactly once per `host_callback_node` call (see the
/// header).
pub type UhNodeFn = unsafe extern "C" fn(node: *mut UhHostNode, status: UhStatus);

/// A host callback in a node the host owns and recycles (ABI 1.2, see the header): the host
/// embeds it at the start of its own node; `plugin` is the plugin's from the enqueue until it
/// calls `run`.
#[repr(C)]
pub struct UhHostNode {
    pub size: u32,
    pub reserved: u32,
    pub run: Option<UhNodeFn>,
    pub plugin: [*mut c_void; 2],
}

/// Called exactly once when imported memory is no longer used.
pub type UhReleaseFn = unsafe extern "C" fn(user: *mut c_void);

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhLibraryInfo {
    pub size: u32,
    pub reserved: u32,
    pub role: *const c_char,
    pub name: *const c_char,
    pub path: *const c_char,
    pub version: *const c_char,
    pub error: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhPluginInfo {
    pub size: u32,
    pub reserved: u32,
    pub name: *const c_char,
    pub version: *const c_char,
    pub simulated: u32,
    pub concurrent: u32,
    pub n_libraries: u32,
    pub reserved2: u32,
    pub libraries: *const UhLibraryInfo,
    pub manifest: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UhOpSupport {
    pub op: u32,
    pub dtype_mask: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhDeviceProps {
    pub size: u32,
    pub reserved: u32,
    pub name: *const c_char,
    pub vendor: *const c_char,
    pub memory_bytes: u64,
    pub alloc_alignment: u64,
    pub compute_units: u32,
    pub warp_size: u32,
    pub max_grid: [u32; 3],
    pub max_block: [u32; 3],
    pub max_threads_per_block: u32,
    pub max_shared_mem_per_block: u32,
    pub module_formats: u32,
    pub flags: u32,
    pub arch: *const c_char,
    pub timer_resolution_ns: u64,
    pub n_peers: u32,
    pub n_ops: u32,
    pub peers: *const u32,
    pub ops: *const UhOpSupport,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UhAccumulation {
    pub dtype: u32,
    pub accumulate_in: u32,
    pub emulated_mask: u32,
    pub reserved: u32,
}

pub const UH_CCL_GROUPS: u32 = 1 << 0;
pub const UH_CCL_SPLIT: u32 = 1 << 1;
pub const UH_CCL_SURVIVES_DEAD_RANK: u32 = 1 << 2;
pub const UH_CCL_NAMES_MISSING_RANKS: u32 = 1 << 3;
pub const UH_CCL_TIMEOUT_ABORTS_PEERS: u32 = 1 << 4;
/// The engine's communicators may span processes (`CclCaps::crosses_processes`).
pub const UH_CCL_CROSSES_PROCESSES: u32 = 1 << 5;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhCclCaps {
    pub size: u32,
    pub flags: u32,
    pub engine: *const c_char,
    pub op_dtypes: [u32; UH_COLL_COUNT],
    pub reductions: [u32; UH_DTYPE_COUNT],
    pub n_accumulation: u32,
    pub reserved: u32,
    pub accumulation: *const UhAccumulation,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhLaunchConfig {
    pub size: u32,
    pub shared_mem_bytes: u32,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

/// The host-kernel launch context (the HAL's `HostLaunchCtx`, same layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhHostLaunchCtx {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub block_idx: [u32; 3],
    pub reserved: u32,
    pub shared: *mut u8,
    pub shared_bytes: u64,
}

pub type UhHostKernelFn =
    unsafe extern "C" fn(ctx: *const UhHostLaunchCtx, params: *const *mut c_void) -> i32;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhHostSymbol {
    pub name: *const c_char,
    pub func: Option<UhHostKernelFn>,
    pub n_params: u64,
    pub param_sizes: *const u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhModuleSource {
    pub size: u32,
    pub format: u32,
    pub bytes: *const u8,
    pub len: u64,
    pub n_symbols: u64,
    pub symbols: *const UhHostSymbol,
}

pub const UH_MAX_DIMS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhTensor {
    pub mem: *mut UhMem,
    pub mem_offset: u64,
    pub mem_len: u64,
    pub offset: u64,
    pub dtype: u32,
    pub ndim: u32,
    pub shape: [u64; UH_MAX_DIMS],
    pub strides: [i64; UH_MAX_DIMS],
}

pub const UH_SCALAR_F64: u32 = 0;
pub const UH_SCALAR_I64: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
pub union UhScalarValue {
    pub f64_: f64,
    pub i64_: i64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhScalar {
    pub kind: u32,
    pub reserved: u32,
    pub value: UhScalarValue,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhOpCall {
    pub size: u32,
    pub op: u32,
    pub n_tensors: u32,
    pub n_scalars: u32,
    pub tensors: *const UhTensor,
    pub scalars: *const UhScalar,
    pub has_rng: u32,
    pub reserved: u32,
    pub rng_seed: u64,
    pub rng_offset: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhCollective {
    pub size: u32,
    pub op: u32,
    pub send: *mut UhMem,
    pub send_offset: u64,
    pub send_len: u64,
    pub recv: *mut UhMem,
    pub recv_offset: u64,
    pub recv_len: u64,
    pub count: u64,
    pub dtype: u32,
    pub red: u32,
    pub root: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhP2p {
    pub recv: u32,
    pub dtype: u32,
    pub mem: *mut UhMem,
    pub offset: u64,
    pub len: u64,
    pub count: u64,
    pub peer: u64,
}

type E = *mut UhError;

/// The function table (see the header for each entry's contract).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhPluginApi {
    pub size: u32,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub reserved: u32,

    pub info: Option<unsafe extern "C" fn() -> *const UhPluginInfo>,
    pub probe: Option<unsafe extern "C" fn(count: *mut u32, err: E) -> UhStatus>,
    pub device_open:
        Option<unsafe extern "C" fn(ordinal: u32, out: *mut *mut UhDevice, err: E) -> UhStatus>,
    pub device_release: Option<unsafe extern "C" fn(dev: *mut UhDevice)>,
    pub device_props: Option<
        unsafe extern "C" fn(dev: *mut UhDevice, out: *mut UhDeviceProps, err: E) -> UhStatus,
    >,
    pub device_memory_info: Option<
        unsafe extern "C" fn(
            dev: *mut UhDevice,
            total: *mut u64,
            free: *mut u64,
            err: E,
        ) -> UhStatus,
    >,
    pub device_synchronize: Option<unsafe extern "C" fn(dev: *mut UhDevice, err: E) -> UhStatus>,
    pub device_native:
        Option<unsafe extern "C" fn(dev: *mut UhDevice, out: *mut UhNative) -> UhStatus>,

    pub mem_alloc: Option<
        unsafe extern "C" fn(
            dev: *mut UhDevice,
            len: u64,
            out: *mut *mut UhMem,
            addr: *mut u64,
            err: E,
        ) -> UhStatus,
    >,
    pub mem_release: Option<unsafe extern "C" fn(mem: *mut UhMem)>,
    pub host_alloc: Option<
        unsafe extern "C" fn(
            dev: *mut UhDevice,
            len: u64,
            out: *mut *mut UhHostMem,
            ptr: *mut *mut c_void,
            err: E,
        ) -> UhStatus,
    >,
    pub host_release: Option<unsafe extern "C" fn(mem: *mut UhHostMem)>,
    pub mem_import: Option<
        unsafe extern "C" fn(
            dev: *mut UhDevice,
            addr: u64,
            len: u64,
            release: Option<UhReleaseFn>,
            user: *mut c_void,
            out: *mut *mut UhMem,
            err: E,
        ) -> UhStatus,
    >,

    pub stream_create: Option<
        unsafe extern "C" fn(dev: *mut UhDevice, out: *mut *mut UhStream, err: E) -> UhStatus,
    >,
    pub stream_release: Option<unsafe extern "C" fn(s: *mut UhStream)>,
    pub copy_h2d: Option<
        unsafe extern "C" fn(
            s: *mut UhStream,
            src: *mut UhHostMem,
            src_offset: u64,
            dst: *mut UhMem,
            dst_offset: u64,
            len: u64,
            err: E,
        ) -> UhStatus,
    >,
    pub copy_d2h: Option<
        unsafe extern "C" fn(
            s: *mut UhStream,
            src: *mut UhMem,
            src_offset: u64,
            dst: *mut UhHostMem,
            dst_offset: u64,
            len: u64,
            err: E,
        ) -> UhStatus,
    >,
    pub copy_d2d: Option<
        unsafe extern "C" fn(
            s: *mut UhStream,
            src: *mut UhMem,
            src_offset: u64,
            dst: *mut UhMem,
            dst_offset: u64,
            len: u64,
            err: E,
        ) -> UhStatus,
    >,
    pub copy_peer: Option<
        unsafe extern "C" fn(
            s: *mut UhStream,
            src: *mut UhMem,
            src_offset: u64,
            dst: *mut UhMem,
            dst_offset: u64,
            len: u64,
            err: E,
        ) -> UhStatus,
    >,
    pub fill: Option<
        unsafe extern "C" fn(
            s: *mut UhStream,
            dst: *mut UhMem,
            offset: u64,
            len: u64,
            width: u32,
            value: u32,
            err: E,
        ) -> UhStatus,
    >,
    pub launch: Option<
        unsafe extern "C" fn(
            s: *mut UhStream,
            f: *mut UhFunction,
            config: *const UhLaunchConfig,
            n_args: u64,
            args: *const *mut c_void,
            sizes: *const u64,
            err: E,
        ) -> UhStatus,
    >,
    pub run_op:
        Option<unsafe extern "C" fn(s: *mut UhStream, call: *const UhOpCall, err: E) -> UhStatus>,
    pub host_callback: Option<
        unsafe extern "C" fn(
            s: *mut UhStream,
            f: Option<UhHostFn>,
            user: *mut c_void,
            err: E,
        ) -> UhStatus,
    >,
    pub stream_synchronize: Option<unsafe extern "C" fn(s: *mut UhStream, err: E) -> UhStatus>,
    pub stream_query:
        Option<unsafe extern "C" fn(s: *mut UhStream, done: *mut u32, err: E) -> UhStatus>,
    pub stream_async_error: Option<unsafe extern "C" fn(s: *mut UhStream, err: E) -> UhStatus>,
    pub stream_native:
        Option<unsafe extern "C" fn(s: *mut UhStream, out: *mut UhNative) -> UhStatus>,

    pub event_create: Option<
        unsafe extern "C" fn(
            dev: *mut UhDevice,
            flags: u32,
            out: *mut *mut UhEvent,
            err: E,
        ) -> UhStatus,
    >,
    pub event_release: Option<unsafe extern "C" fn(e: *mut UhEvent)>,
    pub event_record:
        Option<unsafe extern "C" fn(s: *mut UhStream, e: *mut UhEvent, err: E) -> UhStatus>,
    pub stream_wait_event:
        Option<unsafe extern "C" fn(s: *mut UhStream, e: *mut UhEvent, err: E) -> UhStatus>,
    pub event_query:
        Option<unsafe extern "C" fn(e: *mut UhEvent, done: *mut u32, err: E) -> UhStatus>,
    pub event_synchronize: Option<unsafe extern "C" fn(e: *mut UhEvent, err: E) -> UhStatus>,
    pub event_elapsed: Option<
        unsafe extern "C" fn(
            start: *mut UhEvent,
            end: *mut UhEvent,
            ms: *mut f32,
            err: E,
        ) -> UhStatus,
    >,
    pub event_native: Option<unsafe extern "C" fn(e: *mut UhEvent, out: *mut UhNative) -> UhStatus>,

    pub module_load: Option<
        unsafe extern "C" fn(
            dev: *mut UhDevice,
            src: *const UhModuleSource,
            out: *mut *mut UhModule,
            err: E,
        ) -> UhStatus,
    >,
    pub module_release: Option<unsafe extern "C" fn(m: *mut UhModule)>,
    pub module_function: Option<
        unsafe extern "C" fn(
            m: *mut UhModule,
            name: *const c_char,
            out: *mut *mut UhFunction,
            has_sizes: *mut u32,
            n_params: *mut u64,
            param_sizes: *mut *const u64,
            err: E,
        ) -> UhStatus,
    >,
    pub function_release: Option<unsafe extern "C" fn(f: *mut UhFunction)>,
    pub test_kernels: Option<
        unsafe extern "C" fn(dev: *mut UhDevice, out: *mut UhModuleSource, err: E) -> UhStatus,
    >,

    pub ccl_caps: Option<unsafe extern "C" fn() -> *const UhCclCaps>,
    pub ccl_unique_id:
        Option<unsafe extern "C" fn(buf: *mut u8, cap: u64, len: *mut u64, err: E) -> UhStatus>,
    pub ccl_init_rank: Option<
        unsafe extern "C" fn(
            id: *const u8,
            id_len: u64,
            nranks: u32,
            rank: u32,
            dev: *mut UhDevice,
            timeout_ms: u64,
            out: *mut *mut UhComm,
            err: E,
        ) -> UhStatus,
    >,
    pub ccl_init_all: Option<
        unsafe extern "C" fn(
            devs: *const *mut UhDevice,
            n: u32,
            timeout_ms: u64,
            out: *mut *mut UhComm,
            err: E,
        ) -> UhStatus,
    >,
    pub comm_release: Option<unsafe extern "C" fn(c: *mut UhComm)>,
    pub comm_rank_size:
        Option<unsafe extern "C" fn(c: *mut UhComm, rank: *mut u32, size: *mut u32)>,
    pub comm_collective: Option<
        unsafe extern "C" fn(
            c: *mut UhComm,
            call: *const UhCollective,
            s: *mut UhStream,
            err: E,
        ) -> UhStatus,
    >,
    pub comm_group: Option<
        unsafe extern "C" fn(
            c: *mut UhComm,
            calls: *const UhP2p,
            n: u64,
            s: *mut UhStream,
            err: E,
        ) -> UhStatus,
    >,
    pub comm_split: Option<
        unsafe extern "C" fn(
            c: *mut UhComm,
            color: i64,
            key: i32,
            timeout_ms: u64,
            out: *mut *mut UhComm,
            err: E,
        ) -> UhStatus,
    >,
    pub comm_abort: Option<unsafe extern "C" fn(c: *mut UhComm)>,
    pub comm_async_error: Option<unsafe extern "C" fn(c: *mut UhComm, err: E) -> UhStatus>,

    /// ABI 1.2.
    pub host_callback_node:
        Option<unsafe extern "C" fn(s: *mut UhStream, node: *mut UhHostNode, err: E) -> UhStatus>,
}

/// The type of [`UH_PLUGIN_ENTRY_SYMBOL`].
pub type UhPluginEntryFn =
    unsafe extern "C" fn(host: *const UhHostApi, err: *mut UhError) -> *const UhPluginApi;

/// The prefix every table keeps across majors: what a host reads of a table of another major.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UhTableHead {
    pub size: u32,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub reserved: u32,
}
