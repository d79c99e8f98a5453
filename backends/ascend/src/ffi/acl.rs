//! The ACL runtime (`libascendcl.so`, or `libacl_rt.so` in the split layout of recent CANN):
//! the one place its symbols are declared, written from the CANN runtime documentation
//! (`acl_rt.h`, `acl_base.h`; the facts sheet's sections 1.2 to 1.6). The ABI test
//! (`tests/abi.rs`) compares every declaration here with bindgen's reading of Huawei's headers.

use std::ffi::{c_char, c_void};
use unihal_dynlib::Library;
use unihal_hal::Result;

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

/// The resolved entry points (valid for the process: the library is never unloaded).
#[allow(clippy::type_complexity)]
pub struct AclApi {
    pub init: unsafe extern "C" fn(*const c_char) -> AclError,
    pub get_recent_err_msg: Option<unsafe extern "C" fn() -> *const c_char>,
    pub get_device_count: unsafe extern "C" fn(*mut u32) -> AclError,
    pub set_device: unsafe extern "C" fn(i32) -> AclError,
    pub get_soc_name: unsafe extern "C" fn() -> *const c_char,
    pub get_current_context: unsafe extern "C" fn(*mut Handle) -> AclError,
    pub set_current_context: unsafe extern "C" fn(Handle) -> AclError,
    pub synchronize_device: unsafe extern "C" fn() -> AclError,
    pub get_mem_info: unsafe extern "C" fn(i32, *mut usize, *mut usize) -> AclError,
    pub get_device_info: Option<unsafe extern "C" fn(u32, i32, *mut i64) -> AclError>,
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize, i32) -> AclError,
    pub free: unsafe extern "C" fn(*mut c_void) -> AclError,
    pub malloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> AclError,
    pub free_host: unsafe extern "C" fn(*mut c_void) -> AclError,
    pub memcpy_async:
        unsafe extern "C" fn(*mut c_void, usize, *const c_void, usize, i32, Handle) -> AclError,
    pub memset_async: unsafe extern "C" fn(*mut c_void, usize, i32, usize, Handle) -> AclError,
    pub create_stream: unsafe extern "C" fn(*mut Handle) -> AclError,
    pub destroy_stream: unsafe extern "C" fn(Handle) -> AclError,
    pub synchronize_stream: unsafe extern "C" fn(Handle) -> AclError,
    pub stream_query: unsafe extern "C" fn(Handle, *mut i32) -> AclError,
    pub stream_wait_event: unsafe extern "C" fn(Handle, Handle) -> AclError,
    pub create_event_with_flag: unsafe extern "C" fn(*mut Handle, u32) -> AclError,
    pub destroy_event: unsafe extern "C" fn(Handle) -> AclError,
    pub record_event: unsafe extern "C" fn(Handle, Handle) -> AclError,
    pub synchronize_event: unsafe extern "C" fn(Handle) -> AclError,
    pub query_event_status: unsafe extern "C" fn(Handle, *mut i32) -> AclError,
    pub event_elapsed_time: unsafe extern "C" fn(*mut f32, Handle, Handle) -> AclError,
    pub can_access_peer: Option<unsafe extern "C" fn(*mut i32, i32, i32) -> AclError>,
    pub enable_peer_access: Option<unsafe extern "C" fn(i32, u32) -> AclError>,
    pub subscribe_report: unsafe extern "C" fn(u64, Handle) -> AclError,
    pub unsubscribe_report: unsafe extern "C" fn(u64, Handle) -> AclError,
    pub process_report: unsafe extern "C" fn(i32) -> AclError,
    pub launch_callback: unsafe extern "C" fn(Callback, *mut c_void, i32, Handle) -> AclError,
    /// Kernel loading (section 1.6), where the installed CANN has it.
    pub binary_load_from_data:
        Option<unsafe extern "C" fn(*const c_void, usize, *const c_void, *mut Handle) -> AclError>,
    /// Not CANN's: the simulated runtime's device name (present only in unihal's simulator).
    pub sim_device_name: Option<unsafe extern "C" fn(i32, *mut c_char, usize) -> AclError>,
}

impl AclApi {
    /// Resolves the table from the runtime library.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] naming a missing required symbol.
    pub fn resolve(lib: &Library) -> Result<AclApi> {
        // SAFETY: each type is the C signature of the symbol of that name in acl_rt.h /
        // acl_base.h (checked against the headers by tests/abi.rs).
        unsafe {
            Ok(AclApi {
                init: lib.get("aclInit")?,
                get_recent_err_msg: lib.optional("aclGetRecentErrMsg"),
                get_device_count: lib.get("aclrtGetDeviceCount")?,
                set_device: lib.get("aclrtSetDevice")?,
                get_soc_name: lib.get("aclrtGetSocName")?,
                get_current_context: lib.get("aclrtGetCurrentContext")?,
                set_current_context: lib.get("aclrtSetCurrentContext")?,
                synchronize_device: lib.get("aclrtSynchronizeDevice")?,
                get_mem_info: lib.get("aclrtGetMemInfo")?,
                get_device_info: lib.optional("aclrtGetDeviceInfo"),
                malloc: lib.get("aclrtMalloc")?,
                free: lib.get("aclrtFree")?,
                malloc_host: lib.get("aclrtMallocHost")?,
                free_host: lib.get("aclrtFreeHost")?,
                memcpy_async: lib.get("aclrtMemcpyAsync")?,
                memset_async: lib.get("aclrtMemsetAsync")?,
                create_stream: lib.get("aclrtCreateStream")?,
                destroy_stream: lib.get("aclrtDestroyStream")?,
                synchronize_stream: lib.get("aclrtSynchronizeStream")?,
                stream_query: lib.get("aclrtStreamQuery")?,
                stream_wait_event: lib.get("aclrtStreamWaitEvent")?,
                create_event_with_flag: lib.get("aclrtCreateEventWithFlag")?,
                destroy_event: lib.get("aclrtDestroyEvent")?,
                record_event: lib.get("aclrtRecordEvent")?,
                synchronize_event: lib.get("aclrtSynchronizeEvent")?,
                query_event_status: lib.get("aclrtQueryEventStatus")?,
                event_elapsed_time: lib.get("aclrtEventElapsedTime")?,
                can_access_peer: lib.optional("aclrtDeviceCanAccessPeer"),
                enable_peer_access: lib.optional("aclrtDeviceEnablePeerAccess"),
                subscribe_report: lib.get("aclrtSubscribeReport")?,
                unsubscribe_report: lib.get("aclrtUnSubscribeReport")?,
                process_report: lib.get("aclrtProcessReport")?,
                launch_callback: lib.get("aclrtLaunchCallback")?,
                binary_load_from_data: lib.optional("aclrtBinaryLoadFromData"),
                sim_device_name: lib.optional("unihal_sim_cann_device_name"),
            })
        }
    }
}
