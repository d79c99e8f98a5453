//! The ACL runtime (`libascendcl.so`, or `libacl_rt.so` in the split layout of recent CANN):
//! the one place its symbols are declared, written from the CANN runtime documentation
//! (`acl_rt.h`, `acl_base.h`; the facts sheet's sections 1.2 to 1.6). The ABI test
//! (`tests/abi.rs`) compares every declaration here with bindgen's reading of Huawei's headers.

use std::ffi::{c_char, c_void};

/// `aclError`.
pub type AclError = i32;
/// `aclrtStream`, `aclrtEvent`, `aclrtContext`, `aclrtBinHandle`, `aclrtFuncHandle`: opaque.
pub type Handle = *mut c_void;
/// `aclrtCallback`: `void (*)(void *userData)`.
pub type Callback = unsafe extern "C" fn(*mut c_void);

/// `aclrtMemMallocPolicy::ACL_MEM_MALLOC_HUGE_FIRST`.
pub const MEM_MALLOC_HUGE_FIRST: i32 = 0;
/// `aclrtMemcpyKind` values.
pub mod memcpy {
    pub const HOST_TO_DEVICE: i32 = 1;
    pub const DEVICE_TO_HOST: i32 = 2;
    pub const DEVICE_TO_DEVICE: i32 = 3;
}
/// `aclrtEventRecordedStatus` (`aclrtQueryEventStatus`): `NOT_READY=0, COMPLETE=1`.
pub const EVENT_RECORDED_STATUS_COMPLETE: i32 = 1;
/// `aclrtStreamStatus` (`aclrtStreamQuery`): `COMPLETE=0, NOT_READY=1`.
pub const STREAM_STATUS_COMPLETE: i32 = 0;
/// `aclrtCreateEventWithFlag` flags: `ACL_EVENT_SYNC` (waits, queries), `ACL_EVENT_TIME_LINE`
/// (timestamps).
pub const EVENT_SYNC: u32 = 0x1;
pub const EVENT_TIME_LINE: u32 = 0x8;
/// `aclrtCallbackBlockType::ACL_CALLBACK_BLOCK`: the stream waits for the callback.
pub const CALLBACK_BLOCK: i32 = 1;
/// `aclrtMemAttr::ACL_HBM_MEM`.
pub const HBM_MEM: i32 = 1;
/// `aclrtDevAttr` values (`aclrtGetDeviceInfo`, recent CANN).
pub mod dev_attr {
    pub const AICORE_CORE_NUM: i32 = 101;
    pub const VECTOR_CORE_NUM: i32 = 201;
    pub const TOTAL_GLOBAL_MEM_SIZE: i32 = 301;
}

unihal_dynlib::symbol_table! {
    /// The resolved entry points (valid for the process: the library is never unloaded).
    pub struct AclApi;
    required {
        init = "aclInit": unsafe extern "C" fn(*const c_char) -> AclError;
        get_device_count = "aclrtGetDeviceCount": unsafe extern "C" fn(*mut u32) -> AclError;
        set_device = "aclrtSetDevice": unsafe extern "C" fn(i32) -> AclError;
        get_soc_name = "aclrtGetSocName": unsafe extern "C" fn() -> *const c_char;
        get_current_context = "aclrtGetCurrentContext": unsafe extern "C" fn(*mut Handle) -> AclError;
        set_current_context = "aclrtSetCurrentContext": unsafe extern "C" fn(Handle) -> AclError;
        synchronize_device = "aclrtSynchronizeDevice": unsafe extern "C" fn() -> AclError;
        get_mem_info = "aclrtGetMemInfo": unsafe extern "C" fn(i32, *mut usize, *mut usize) -> AclError;
        malloc = "aclrtMalloc": unsafe extern "C" fn(*mut *mut c_void, usize, i32) -> AclError;
        free = "aclrtFree": unsafe extern "C" fn(*mut c_void) -> AclError;
        malloc_host = "aclrtMallocHost": unsafe extern "C" fn(*mut *mut c_void, usize) -> AclError;
        free_host = "aclrtFreeHost": unsafe extern "C" fn(*mut c_void) -> AclError;
        memcpy_async = "aclrtMemcpyAsync": unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, i32, Handle) -> AclError;
        memset_async = "aclrtMemsetAsync": unsafe extern "C" fn(*mut c_void, usize, i32, usize, Handle) -> AclError;
        create_stream = "aclrtCreateStream": unsafe extern "C" fn(*mut Handle) -> AclError;
        destroy_stream = "aclrtDestroyStream": unsafe extern "C" fn(Handle) -> AclError;
        synchronize_stream = "aclrtSynchronizeStream": unsafe extern "C" fn(Handle) -> AclError;
        stream_query = "aclrtStreamQuery": unsafe extern "C" fn(Handle, *mut i32) -> AclError;
        stream_wait_event = "aclrtStreamWaitEvent": unsafe extern "C" fn(Handle, Handle) -> AclError;
        create_event_with_flag = "aclrtCreateEventWithFlag": unsafe extern "C" fn(*mut Handle, u32) -> AclError;
        destroy_event = "aclrtDestroyEvent": unsafe extern "C" fn(Handle) -> AclError;
        record_event = "aclrtRecordEvent": unsafe extern "C" fn(Handle, Handle) -> AclError;
        synchronize_event = "aclrtSynchronizeEvent": unsafe extern "C" fn(Handle) -> AclError;
        query_event_status = "aclrtQueryEventStatus": unsafe extern "C" fn(Handle, *mut i32) -> AclError;
        event_elapsed_time = "aclrtEventElapsedTime": unsafe extern "C" fn(*mut f32, Handle, Handle) -> AclError;
        subscribe_report = "aclrtSubscribeReport": unsafe extern "C" fn(u64, Handle) -> AclError;
        unsubscribe_report = "aclrtUnSubscribeReport": unsafe extern "C" fn(u64, Handle) -> AclError;
        process_report = "aclrtProcessReport": unsafe extern "C" fn(i32) -> AclError;
        launch_callback = "aclrtLaunchCallback": unsafe extern "C" fn(Callback, *mut c_void, i32, Handle) -> AclError;
    }
    optional {
        get_recent_err_msg = "aclGetRecentErrMsg": unsafe extern "C" fn() -> *const c_char;
        get_device_info = "aclrtGetDeviceInfo": unsafe extern "C" fn(u32, i32, *mut i64) -> AclError;
        can_access_peer = "aclrtDeviceCanAccessPeer": unsafe extern "C" fn(*mut i32, i32, i32) -> AclError;
        enable_peer_access = "aclrtDeviceEnablePeerAccess": unsafe extern "C" fn(i32, u32) -> AclError;
        /// Kernel loading (section 1.6), where the installed CANN has it.
        binary_load_from_data = "aclrtBinaryLoadFromData": unsafe extern "C" fn(*const c_void, usize, *const c_void, *mut Handle) -> AclError;
        /// Not CANN's: the simulated runtime's device name (present only in unihal's simulator).
        sim_device_name = "unihal_sim_cann_device_name": unsafe extern "C" fn(i32, *mut c_char, usize) -> AclError;
    }
}
