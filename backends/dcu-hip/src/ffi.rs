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

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

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

unihal_dynlib::symbol_table! {
    /// The HIP runtime's entry points. Function pointers stay valid for the process (the
    /// library is never unloaded: Hygon DTK's runtime crashes at exit if it is).
    pub struct HipApi;
    required {
        init = "hipInit": unsafe extern "C" fn(c_uint) -> hipError_t;
        driver_get_version = "hipDriverGetVersion": unsafe extern "C" fn(*mut c_int) -> hipError_t;
        runtime_get_version = "hipRuntimeGetVersion": unsafe extern "C" fn(*mut c_int) -> hipError_t;
        get_error_name = "hipGetErrorName": unsafe extern "C" fn(hipError_t) -> *const c_char;
        get_error_string = "hipGetErrorString": unsafe extern "C" fn(hipError_t) -> *const c_char;
        get_device_count = "hipGetDeviceCount": unsafe extern "C" fn(*mut c_int) -> hipError_t;
        set_device = "hipSetDevice": unsafe extern "C" fn(c_int) -> hipError_t;
        device_get_name = "hipDeviceGetName": unsafe extern "C" fn(*mut c_char, c_int, c_int) -> hipError_t;
        device_total_mem = "hipDeviceTotalMem": unsafe extern "C" fn(*mut usize, c_int) -> hipError_t;
        device_get_attribute = "hipDeviceGetAttribute": unsafe extern "C" fn(*mut c_int, c_int, c_int) -> hipError_t;
        device_synchronize = "hipDeviceSynchronize": unsafe extern "C" fn() -> hipError_t;
        device_can_access_peer = "hipDeviceCanAccessPeer": unsafe extern "C" fn(*mut c_int, c_int, c_int) -> hipError_t;
        device_enable_peer_access = "hipDeviceEnablePeerAccess": unsafe extern "C" fn(c_int, c_uint) -> hipError_t;
        mem_get_info = "hipMemGetInfo": unsafe extern "C" fn(*mut usize, *mut usize) -> hipError_t;
        malloc = "hipMalloc": unsafe extern "C" fn(*mut *mut c_void, usize) -> hipError_t;
        free = "hipFree": unsafe extern "C" fn(*mut c_void) -> hipError_t;
        host_malloc = "hipHostMalloc": unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> hipError_t;
        host_free = "hipHostFree": unsafe extern "C" fn(*mut c_void) -> hipError_t;
        memcpy_htod_async = "hipMemcpyHtoDAsync": unsafe extern "C" fn(Handle, *mut c_void, usize, Handle) -> hipError_t;
        memcpy_dtoh_async = "hipMemcpyDtoHAsync": unsafe extern "C" fn(*mut c_void, Handle, usize, Handle) -> hipError_t;
        memcpy_dtod_async = "hipMemcpyDtoDAsync": unsafe extern "C" fn(Handle, Handle, usize, Handle) -> hipError_t;
        memcpy_peer_async = "hipMemcpyPeerAsync": unsafe extern "C" fn(*mut c_void, c_int, *const c_void, c_int, usize, Handle) -> hipError_t;
        memset_d8_async = "hipMemsetD8Async": unsafe extern "C" fn(Handle, u8, usize, Handle) -> hipError_t;
        memset_d16_async = "hipMemsetD16Async": unsafe extern "C" fn(Handle, u16, usize, Handle) -> hipError_t;
        memset_d32_async = "hipMemsetD32Async": unsafe extern "C" fn(Handle, c_int, usize, Handle) -> hipError_t;
        stream_create_with_flags = "hipStreamCreateWithFlags": unsafe extern "C" fn(*mut Handle, c_uint) -> hipError_t;
        stream_destroy = "hipStreamDestroy": unsafe extern "C" fn(Handle) -> hipError_t;
        stream_synchronize = "hipStreamSynchronize": unsafe extern "C" fn(Handle) -> hipError_t;
        stream_query = "hipStreamQuery": unsafe extern "C" fn(Handle) -> hipError_t;
        stream_wait_event = "hipStreamWaitEvent": unsafe extern "C" fn(Handle, Handle, c_uint) -> hipError_t;
        stream_add_callback = "hipStreamAddCallback": unsafe extern "C" fn(Handle, StreamCallback, *mut c_void, c_uint) -> hipError_t;
        event_create_with_flags = "hipEventCreateWithFlags": unsafe extern "C" fn(*mut Handle, c_uint) -> hipError_t;
        event_destroy = "hipEventDestroy": unsafe extern "C" fn(Handle) -> hipError_t;
        event_record = "hipEventRecord": unsafe extern "C" fn(Handle, Handle) -> hipError_t;
        event_query = "hipEventQuery": unsafe extern "C" fn(Handle) -> hipError_t;
        event_synchronize = "hipEventSynchronize": unsafe extern "C" fn(Handle) -> hipError_t;
        event_elapsed_time = "hipEventElapsedTime": unsafe extern "C" fn(*mut f32, Handle, Handle) -> hipError_t;
        module_load_data = "hipModuleLoadData": unsafe extern "C" fn(*mut Handle, *const c_void) -> hipError_t;
        module_get_function = "hipModuleGetFunction": unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> hipError_t;
        module_unload = "hipModuleUnload": unsafe extern "C" fn(Handle) -> hipError_t;
        module_launch_kernel = "hipModuleLaunchKernel": unsafe extern "C" fn(
            Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle,
            *mut *mut c_void, *mut *mut c_void,
        ) -> hipError_t;
    }
    optional {
        /// `hipLaunchHostFunc`: declared by ROCm 5.2's header but not exported by its library;
        /// `hipStreamAddCallback` is the fallback.
        launch_host_func = "hipLaunchHostFunc": unsafe extern "C" fn(Handle, HostFn, *mut c_void) -> hipError_t;
        /// `hipMallocAsync` / `hipFreeAsync` (stream-ordered allocation, ROCm >= 5.2).
        malloc_async = "hipMallocAsync": unsafe extern "C" fn(*mut *mut c_void, usize, Handle) -> hipError_t;
        free_async = "hipFreeAsync": unsafe extern "C" fn(*mut c_void, Handle) -> hipError_t;
        /// `hipGetDevicePropertiesR0600` (ROCm >= 6.0 layout, 1472 bytes).
        get_device_properties_r0600 = "hipGetDevicePropertiesR0600": unsafe extern "C" fn(*mut c_void, c_int) -> hipError_t;
        /// `hipGetDeviceProperties` (the ROCm 5 layout, 792 bytes, whatever the header says).
        get_device_properties = "hipGetDeviceProperties": unsafe extern "C" fn(*mut c_void, c_int) -> hipError_t;
        // Stream capture and graphs (ROCm 4.3 to 5.0 and later; every one is needed for
        // graphs, and their absence leaves the devices without them). Handles (`hipGraph_t`,
        // `hipGraphExec_t`, `hipGraphNode_t`) are opaque pointers; the mode and status enums
        // are `int`s (see `conv`).
        /// `hipStreamBeginCapture(stream, hipStreamCaptureMode mode)`.
        stream_begin_capture = "hipStreamBeginCapture": unsafe extern "C" fn(Handle, c_int) -> hipError_t;
        /// `hipStreamEndCapture(stream, hipGraph_t* pGraph)`.
        stream_end_capture = "hipStreamEndCapture": unsafe extern "C" fn(Handle, *mut Handle) -> hipError_t;
        /// `hipStreamIsCapturing(stream, hipStreamCaptureStatus* pCaptureStatus)`.
        stream_is_capturing = "hipStreamIsCapturing": unsafe extern "C" fn(Handle, *mut c_int) -> hipError_t;
        /// `hipStreamGetCaptureInfo(stream, hipStreamCaptureStatus* pCaptureStatus,
        /// unsigned long long* pId)`.
        stream_get_capture_info = "hipStreamGetCaptureInfo": unsafe extern "C" fn(Handle, *mut c_int, *mut c_ulonglong) -> hipError_t;
        /// `hipThreadExchangeStreamCaptureMode(hipStreamCaptureMode* mode)`.
        thread_exchange_stream_capture_mode = "hipThreadExchangeStreamCaptureMode": unsafe extern "C" fn(*mut c_int) -> hipError_t;
        /// `hipGraphInstantiate(hipGraphExec_t* pGraphExec, hipGraph_t graph, hipGraphNode_t*
        /// pErrorNode, char* pLogBuffer, size_t bufferSize)`.
        graph_instantiate = "hipGraphInstantiate": unsafe extern "C" fn(*mut Handle, Handle, *mut Handle, *mut c_char, usize) -> hipError_t;
        /// `hipGraphLaunch(hipGraphExec_t graphExec, hipStream_t stream)`.
        graph_launch = "hipGraphLaunch": unsafe extern "C" fn(Handle, Handle) -> hipError_t;
        /// `hipGraphDestroy(hipGraph_t graph)`.
        graph_destroy = "hipGraphDestroy": unsafe extern "C" fn(Handle) -> hipError_t;
        /// `hipGraphExecDestroy(hipGraphExec_t graphExec)`.
        graph_exec_destroy = "hipGraphExecDestroy": unsafe extern "C" fn(Handle) -> hipError_t;
        /// `hipGraphGetNodes(hipGraph_t graph, hipGraphNode_t* nodes, size_t* numNodes)`.
        graph_get_nodes = "hipGraphGetNodes": unsafe extern "C" fn(Handle, *mut Handle, *mut usize) -> hipError_t;
    }
}

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

unihal_dynlib::symbol_table! {
    /// rocBLAS's entry points (the library stays loaded for the process).
    pub struct RocblasApi;
    required {
        create_handle = "rocblas_create_handle": unsafe extern "C" fn(*mut Handle) -> rocblas_status;
        set_stream = "rocblas_set_stream": unsafe extern "C" fn(Handle, Handle) -> rocblas_status;
        /// `rocblas_gemm_strided_batched_ex(handle, transA, transB, m, n, k, alpha, A, a_type,
        /// lda, stride_a, B, b_type, ldb, stride_b, beta, C, c_type, ldc, stride_c, D, d_type,
        /// ldd, stride_d, batch_count, compute_type, algo, solution_index, flags)`.
        gemm_strided_batched_ex = "rocblas_gemm_strided_batched_ex": unsafe extern "C" fn(
            Handle, c_int, c_int, c_int, c_int, c_int, *const c_void, *const c_void, c_int,
            c_int, i64, *const c_void, c_int, c_int, i64, *const c_void, *const c_void, c_int,
            c_int, i64, *mut c_void, c_int, c_int, i64, c_int, c_int, c_int, i32, u32,
        ) -> rocblas_status;
    }
    optional {
        status_to_string = "rocblas_status_to_string": unsafe extern "C" fn(rocblas_status) -> *const c_char;
        /// `rocblas_get_version_string(buf, len)`.
        get_version_string = "rocblas_get_version_string": unsafe extern "C" fn(*mut c_char, usize) -> rocblas_status;
    }
}
