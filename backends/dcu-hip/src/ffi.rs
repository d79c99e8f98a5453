//! The HIP runtime's C API as this backend resolves it: one symbol table ([`HipApi`]) with
//! required and optional entries, and rocBLAS's ([`RocblasApi`]). Declarations written from AMD's
//! documented API (`hip_runtime_api.h`, `rocblas-functions.h`); the ABI test
//! (`tests/abi.rs`, feature `abi-check`) compares every entry with bindgen's reading of Debian's
//! real headers.
//!
//! Every HIP function returns a `hipError_t` (`c_int`, 0 = success); codes the header does not
//! list stay numbers. All handle types (`hipStream_t`, `hipEvent_t`, `hipModule_t`,
//! `hipFunction_t`, `rocblas_handle`) are opaque pointers; `hipDevice_t` is an `int`.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use unihal_dynlib::Library;
use unihal_hal::Result;

/// `hipError_t`.
pub type hipError_t = c_int;
/// `hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`: opaque pointers.
pub type Handle = *mut c_void;
/// A host function queued by `hipLaunchHostFunc`.
pub type HostFn = unsafe extern "C" fn(*mut c_void);
/// A stream callback of `hipStreamAddCallback`: `(stream, status, user data)`.
pub type StreamCallback = unsafe extern "C" fn(Handle, hipError_t, *mut c_void);

/// `hipStreamNonBlocking`.
pub const STREAM_NON_BLOCKING: c_uint = 1;
/// `hipEventDefault`.
pub const EVENT_DEFAULT: c_uint = 0;
/// `hipEventDisableTiming`.
pub const EVENT_DISABLE_TIMING: c_uint = 2;
/// `hipHostMallocDefault`.
pub const HOST_MALLOC_DEFAULT: c_uint = 0;

/// The HIP runtime's entry points. Function pointers stay valid for the process (the library is
/// never unloaded: Hygon DTK's runtime crashes at exit if it is).
pub struct HipApi {
    pub init: unsafe extern "C" fn(c_uint) -> hipError_t,
    pub driver_get_version: unsafe extern "C" fn(*mut c_int) -> hipError_t,
    pub runtime_get_version: unsafe extern "C" fn(*mut c_int) -> hipError_t,
    pub get_error_name: unsafe extern "C" fn(hipError_t) -> *const c_char,
    pub get_error_string: unsafe extern "C" fn(hipError_t) -> *const c_char,
    pub get_device_count: unsafe extern "C" fn(*mut c_int) -> hipError_t,
    pub set_device: unsafe extern "C" fn(c_int) -> hipError_t,
    pub device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> hipError_t,
    pub device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> hipError_t,
    pub device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> hipError_t,
    pub device_synchronize: unsafe extern "C" fn() -> hipError_t,
    pub device_can_access_peer: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> hipError_t,
    pub device_enable_peer_access: unsafe extern "C" fn(c_int, c_uint) -> hipError_t,
    pub mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> hipError_t,
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> hipError_t,
    pub free: unsafe extern "C" fn(*mut c_void) -> hipError_t,
    pub host_malloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> hipError_t,
    pub host_free: unsafe extern "C" fn(*mut c_void) -> hipError_t,
    pub memcpy_htod_async: unsafe extern "C" fn(Handle, *mut c_void, usize, Handle) -> hipError_t,
    pub memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, Handle, usize, Handle) -> hipError_t,
    pub memcpy_dtod_async: unsafe extern "C" fn(Handle, Handle, usize, Handle) -> hipError_t,
    pub memcpy_peer_async:
        unsafe extern "C" fn(*mut c_void, c_int, *const c_void, c_int, usize, Handle) -> hipError_t,
    pub memset_d8_async: unsafe extern "C" fn(Handle, u8, usize, Handle) -> hipError_t,
    pub memset_d16_async: unsafe extern "C" fn(Handle, u16, usize, Handle) -> hipError_t,
    pub memset_d32_async: unsafe extern "C" fn(Handle, c_int, usize, Handle) -> hipError_t,
    pub stream_create_with_flags: unsafe extern "C" fn(*mut Handle, c_uint) -> hipError_t,
    pub stream_destroy: unsafe extern "C" fn(Handle) -> hipError_t,
    pub stream_synchronize: unsafe extern "C" fn(Handle) -> hipError_t,
    pub stream_query: unsafe extern "C" fn(Handle) -> hipError_t,
    pub stream_wait_event: unsafe extern "C" fn(Handle, Handle, c_uint) -> hipError_t,
    pub stream_add_callback:
        unsafe extern "C" fn(Handle, StreamCallback, *mut c_void, c_uint) -> hipError_t,
    pub event_create_with_flags: unsafe extern "C" fn(*mut Handle, c_uint) -> hipError_t,
    pub event_destroy: unsafe extern "C" fn(Handle) -> hipError_t,
    pub event_record: unsafe extern "C" fn(Handle, Handle) -> hipError_t,
    pub event_query: unsafe extern "C" fn(Handle) -> hipError_t,
    pub event_synchronize: unsafe extern "C" fn(Handle) -> hipError_t,
    pub event_elapsed_time: unsafe extern "C" fn(*mut f32, Handle, Handle) -> hipError_t,
    pub module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> hipError_t,
    pub module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> hipError_t,
    pub module_unload: unsafe extern "C" fn(Handle) -> hipError_t,
    #[allow(clippy::type_complexity)]
    pub module_launch_kernel: unsafe extern "C" fn(
        Handle,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Handle,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> hipError_t,

    // Optional entries.
    /// `hipLaunchHostFunc`: declared by ROCm 5.2's header but not exported by its library;
    /// `hipStreamAddCallback` is the fallback.
    pub launch_host_func: Option<unsafe extern "C" fn(Handle, HostFn, *mut c_void) -> hipError_t>,
    /// `hipMallocAsync` / `hipFreeAsync` (stream-ordered allocation, ROCm >= 5.2).
    pub malloc_async: Option<unsafe extern "C" fn(*mut *mut c_void, usize, Handle) -> hipError_t>,
    pub free_async: Option<unsafe extern "C" fn(*mut c_void, Handle) -> hipError_t>,
    /// `hipGetDevicePropertiesR0600` (ROCm >= 6.0 layout, 1472 bytes).
    pub get_device_properties_r0600: Option<unsafe extern "C" fn(*mut c_void, c_int) -> hipError_t>,
    /// `hipGetDeviceProperties` (the ROCm 5 layout, 792 bytes, whatever the header says).
    pub get_device_properties: Option<unsafe extern "C" fn(*mut c_void, c_int) -> hipError_t>,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's C signature is the one declared in the field it fills.
        unsafe { $lib.get($name) }?
    };
}

macro_rules! opt {
    ($lib:expr, $name:literal) => {
        // SAFETY: as `sym!`.
        unsafe { $lib.optional($name) }
    };
}

impl HipApi {
    /// Resolves every entry from `lib`.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] naming a missing required symbol and the library.
    pub fn new(lib: &Library) -> Result<HipApi> {
        Ok(HipApi {
            init: sym!(lib, "hipInit"),
            driver_get_version: sym!(lib, "hipDriverGetVersion"),
            runtime_get_version: sym!(lib, "hipRuntimeGetVersion"),
            get_error_name: sym!(lib, "hipGetErrorName"),
            get_error_string: sym!(lib, "hipGetErrorString"),
            get_device_count: sym!(lib, "hipGetDeviceCount"),
            set_device: sym!(lib, "hipSetDevice"),
            device_get_name: sym!(lib, "hipDeviceGetName"),
            device_total_mem: sym!(lib, "hipDeviceTotalMem"),
            device_get_attribute: sym!(lib, "hipDeviceGetAttribute"),
            device_synchronize: sym!(lib, "hipDeviceSynchronize"),
            device_can_access_peer: sym!(lib, "hipDeviceCanAccessPeer"),
            device_enable_peer_access: sym!(lib, "hipDeviceEnablePeerAccess"),
            mem_get_info: sym!(lib, "hipMemGetInfo"),
            malloc: sym!(lib, "hipMalloc"),
            free: sym!(lib, "hipFree"),
            host_malloc: sym!(lib, "hipHostMalloc"),
            host_free: sym!(lib, "hipHostFree"),
            memcpy_htod_async: sym!(lib, "hipMemcpyHtoDAsync"),
            memcpy_dtoh_async: sym!(lib, "hipMemcpyDtoHAsync"),
            memcpy_dtod_async: sym!(lib, "hipMemcpyDtoDAsync"),
            memcpy_peer_async: sym!(lib, "hipMemcpyPeerAsync"),
            memset_d8_async: sym!(lib, "hipMemsetD8Async"),
            memset_d16_async: sym!(lib, "hipMemsetD16Async"),
            memset_d32_async: sym!(lib, "hipMemsetD32Async"),
            stream_create_with_flags: sym!(lib, "hipStreamCreateWithFlags"),
            stream_destroy: sym!(lib, "hipStreamDestroy"),
            stream_synchronize: sym!(lib, "hipStreamSynchronize"),
            stream_query: sym!(lib, "hipStreamQuery"),
            stream_wait_event: sym!(lib, "hipStreamWaitEvent"),
            stream_add_callback: sym!(lib, "hipStreamAddCallback"),
            event_create_with_flags: sym!(lib, "hipEventCreateWithFlags"),
            event_destroy: sym!(lib, "hipEventDestroy"),
            event_record: sym!(lib, "hipEventRecord"),
            event_query: sym!(lib, "hipEventQuery"),
            event_synchronize: sym!(lib, "hipEventSynchronize"),
            event_elapsed_time: sym!(lib, "hipEventElapsedTime"),
            module_load_data: sym!(lib, "hipModuleLoadData"),
            module_get_function: sym!(lib, "hipModuleGetFunction"),
            module_unload: sym!(lib, "hipModuleUnload"),
            module_launch_kernel: sym!(lib, "hipModuleLaunchKernel"),
            launch_host_func: opt!(lib, "hipLaunchHostFunc"),
            malloc_async: opt!(lib, "hipMallocAsync"),
            free_async: opt!(lib, "hipFreeAsync"),
            get_device_properties_r0600: opt!(lib, "hipGetDevicePropertiesR0600"),
            get_device_properties: opt!(lib, "hipGetDeviceProperties"),
        })
    }
}

/// The symbol names of [`HipApi`], required then optional (the ABI test checks each against the
/// header and the required ones against Debian's library).
pub const REQUIRED_SYMBOLS: &[&str] = &[
    "hipInit",
    "hipDriverGetVersion",
    "hipRuntimeGetVersion",
    "hipGetErrorName",
    "hipGetErrorString",
    "hipGetDeviceCount",
    "hipSetDevice",
    "hipDeviceGetName",
    "hipDeviceTotalMem",
    "hipDeviceGetAttribute",
    "hipDeviceSynchronize",
    "hipDeviceCanAccessPeer",
    "hipDeviceEnablePeerAccess",
    "hipMemGetInfo",
    "hipMalloc",
    "hipFree",
    "hipHostMalloc",
    "hipHostFree",
    "hipMemcpyHtoDAsync",
    "hipMemcpyDtoHAsync",
    "hipMemcpyDtoDAsync",
    "hipMemcpyPeerAsync",
    "hipMemsetD8Async",
    "hipMemsetD16Async",
    "hipMemsetD32Async",
    "hipStreamCreateWithFlags",
    "hipStreamDestroy",
    "hipStreamSynchronize",
    "hipStreamQuery",
    "hipStreamWaitEvent",
    "hipStreamAddCallback",
    "hipEventCreateWithFlags",
    "hipEventDestroy",
    "hipEventRecord",
    "hipEventQuery",
    "hipEventSynchronize",
    "hipEventElapsedTime",
    "hipModuleLoadData",
    "hipModuleGetFunction",
    "hipModuleUnload",
    "hipModuleLaunchKernel",
];

/// The optional entries of [`HipApi`].
pub const OPTIONAL_SYMBOLS: &[&str] = &[
    "hipLaunchHostFunc",
    "hipMallocAsync",
    "hipFreeAsync",
    "hipGetDevicePropertiesR0600",
    "hipGetDeviceProperties",
];

/// `rocblas_status`.
pub type rocblas_status = c_int;

/// `rocblas_operation_none`, `rocblas_operation_transpose`.
pub const ROCBLAS_OP_N: c_int = 111;
pub const ROCBLAS_OP_T: c_int = 112;
/// `rocblas_datatype_*_r`.
pub const ROCBLAS_F16: c_int = 150;
pub const ROCBLAS_F32: c_int = 151;
pub const ROCBLAS_F64: c_int = 152;
pub const ROCBLAS_BF16: c_int = 168;
/// `rocblas_gemm_algo_standard`.
pub const ROCBLAS_GEMM_ALGO_STANDARD: c_int = 0;

/// rocBLAS's entry points (the library stays loaded for the process).
pub struct RocblasApi {
    pub create_handle: unsafe extern "C" fn(*mut Handle) -> rocblas_status,
    pub set_stream: unsafe extern "C" fn(Handle, Handle) -> rocblas_status,
    pub status_to_string: Option<unsafe extern "C" fn(rocblas_status) -> *const c_char>,
    /// `rocblas_get_version_string(buf, len)`.
    pub get_version_string: Option<unsafe extern "C" fn(*mut c_char, usize) -> rocblas_status>,
    #[allow(clippy::type_complexity)]
    pub gemm_strided_batched_ex: unsafe extern "C" fn(
        Handle,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
        *const c_void,
        *const c_void,
        c_int,
        c_int,
        i64,
        *const c_void,
        c_int,
        c_int,
        i64,
        *const c_void,
        *const c_void,
        c_int,
        c_int,
        i64,
        *mut c_void,
        c_int,
        c_int,
        i64,
        c_int,
        c_int,
        c_int,
        i32,
        u32,
    ) -> rocblas_status,
}

impl RocblasApi {
    /// Resolves every entry from `lib`.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] naming a missing symbol.
    pub fn new(lib: &Library) -> Result<RocblasApi> {
        Ok(RocblasApi {
            create_handle: sym!(lib, "rocblas_create_handle"),
            set_stream: sym!(lib, "rocblas_set_stream"),
            status_to_string: opt!(lib, "rocblas_status_to_string"),
            get_version_string: opt!(lib, "rocblas_get_version_string"),
            gemm_strided_batched_ex: sym!(lib, "rocblas_gemm_strided_batched_ex"),
        })
    }
}
