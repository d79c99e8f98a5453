//! The backend's ACL declarations checked against Huawei's real headers (feature `abi-check`):
//! bindgen's reading of `acl/acl.h` and `hccl/hccl.h` from the torch-npu wheel (generated once,
//! by the simulated CANN crate's build script; .ci/run pins torch-npu==2.14.0).
//!
//! * every entry point of the runtime's symbol table ([`unihal_ascend::ffi::acl::AclApi`]) has
//!   the header's parameter and result classes (integer, float or pointer, and size);
//! * every enum value, flag and error code the backend uses equals the header's;
//! * HCCL's table likewise ([`unihal_ascend::ffi::hccl`]), with `HcclRootInfo`'s size.
//!
//! The aclnn operators and the descriptor API have no header in the wheel (CANN generates the
//! operator headers at build time): their declarations cite the op map's sources instead.
//!
//! Fails (never skips) when the headers or libclang are missing (the build script panics).

// The header's enum types differ between CANN versions (int or unsigned): every value is cast to
// the type of the backend's constant, whatever the header's is.
#![allow(clippy::unnecessary_cast)]

use unihal_ascend::conv::hccl as hconv;
use unihal_ascend::conv::{self, codes, dt};
use unihal_ascend::ffi::acl::{self, dev_attr, memcpy, AclApi};
use unihal_ascend::ffi::hccl as hffi;
use unihal_dynlib::abi::{declared, ours, ours_opt};
use unihal_hal::{DType, ReduceOp};
use unihal_sim_cann::header as h;

fn tables() -> (AclApi, h::CannHeader) {
    let path = unihal_sim_cann::built_library();
    let lib = unihal_dynlib::Library::open(&unihal_dynlib::Candidates::new(
        "simulated CANN",
        "UNIHAL_ABI_TEST_UNUSED",
        &[path.to_str().expect("a UTF-8 path")],
    ))
    .expect("the built simulator loads");
    let api = AclApi::new(&lib).expect("every symbol the backend needs");
    // SAFETY: the simulator's own object; loading runs no initialiser with preconditions.
    let header = unsafe { h::CannHeader::new(&path) }.expect("the built simulator loads");
    (api, header)
}

#[test]
fn the_runtime_table_matches_the_header() {
    let (a, hd) = tables();
    macro_rules! same {
        ($($ours:ident => $theirs:ident),* $(,)?) => {
            $( assert_eq!(ours(&a.$ours), declared(&hd.$theirs), "{} differs from the header", stringify!($theirs)); )*
        };
    }
    macro_rules! same_opt {
        ($($ours:ident => $theirs:ident),* $(,)?) => {
            $( assert_eq!(ours_opt(&a.$ours), declared(&hd.$theirs), "{} differs from the header", stringify!($theirs)); )*
        };
    }
    same!(
        init => aclInit,
        get_device_count => aclrtGetDeviceCount,
        set_device => aclrtSetDevice,
        get_soc_name => aclrtGetSocName,
        get_current_context => aclrtGetCurrentContext,
        set_current_context => aclrtSetCurrentContext,
        synchronize_device => aclrtSynchronizeDevice,
        get_mem_info => aclrtGetMemInfo,
        malloc => aclrtMalloc,
        free => aclrtFree,
        malloc_host => aclrtMallocHost,
        free_host => aclrtFreeHost,
        memcpy_async => aclrtMemcpyAsync,
        memset_async => aclrtMemsetAsync,
        create_stream => aclrtCreateStream,
        destroy_stream => aclrtDestroyStream,
        synchronize_stream => aclrtSynchronizeStream,
        stream_query => aclrtStreamQuery,
        stream_wait_event => aclrtStreamWaitEvent,
        create_event_with_flag => aclrtCreateEventWithFlag,
        destroy_event => aclrtDestroyEvent,
        record_event => aclrtRecordEvent,
        synchronize_event => aclrtSynchronizeEvent,
        query_event_status => aclrtQueryEventStatus,
        event_elapsed_time => aclrtEventElapsedTime,
        subscribe_report => aclrtSubscribeReport,
        unsubscribe_report => aclrtUnSubscribeReport,
        process_report => aclrtProcessReport,
        launch_callback => aclrtLaunchCallback,
    );
    same_opt!(
        get_recent_err_msg => aclGetRecentErrMsg,
        get_device_info => aclrtGetDeviceInfo,
        can_access_peer => aclrtDeviceCanAccessPeer,
        enable_peer_access => aclrtDeviceEnablePeerAccess,
        binary_load_from_data => aclrtBinaryLoadFromData,
    );
}

#[test]
fn values_match_the_header() {
    assert_eq!(dt::FLOAT, h::ACL_FLOAT as i32);
    assert_eq!(dt::FLOAT16, h::ACL_FLOAT16 as i32);
    assert_eq!(dt::BF16, h::ACL_BF16 as i32);
    assert_eq!(dt::DOUBLE, h::ACL_DOUBLE as i32);
    assert_eq!(dt::INT8, h::ACL_INT8 as i32);
    assert_eq!(dt::INT16, h::ACL_INT16 as i32);
    assert_eq!(dt::INT32, h::ACL_INT32 as i32);
    assert_eq!(dt::INT64, h::ACL_INT64 as i32);
    assert_eq!(dt::UINT8, h::ACL_UINT8 as i32);
    assert_eq!(dt::UINT16, h::ACL_UINT16 as i32);
    assert_eq!(dt::UINT32, h::ACL_UINT32 as i32);
    assert_eq!(dt::UINT64, h::ACL_UINT64 as i32);
    assert_eq!(dt::BOOL, h::ACL_BOOL as i32);
    assert_eq!(conv::FORMAT_ND, h::ACL_FORMAT_ND as i32);
    assert_eq!(
        acl::MEM_MALLOC_HUGE_FIRST,
        h::ACL_MEM_MALLOC_HUGE_FIRST as i32
    );
    assert_eq!(memcpy::HOST_TO_DEVICE, h::ACL_MEMCPY_HOST_TO_DEVICE as i32);
    assert_eq!(memcpy::DEVICE_TO_HOST, h::ACL_MEMCPY_DEVICE_TO_HOST as i32);
    assert_eq!(
        memcpy::DEVICE_TO_DEVICE,
        h::ACL_MEMCPY_DEVICE_TO_DEVICE as i32
    );
    assert_eq!(
        acl::EVENT_RECORDED_STATUS_COMPLETE,
        h::ACL_EVENT_RECORDED_STATUS_COMPLETE as i32
    );
    assert_eq!(
        acl::STREAM_STATUS_COMPLETE,
        h::ACL_STREAM_STATUS_COMPLETE as i32
    );
    assert_eq!(acl::EVENT_SYNC, h::ACL_EVENT_SYNC);
    assert_eq!(acl::EVENT_TIME_LINE, h::ACL_EVENT_TIME_LINE);
    assert_eq!(acl::CALLBACK_BLOCK, h::ACL_CALLBACK_BLOCK as i32);
    assert_eq!(acl::HBM_MEM, h::ACL_HBM_MEM as i32);
    assert_eq!(
        dev_attr::AICORE_CORE_NUM,
        h::ACL_DEV_ATTR_AICORE_CORE_NUM as i32
    );
    assert_eq!(
        dev_attr::VECTOR_CORE_NUM,
        h::ACL_DEV_ATTR_VECTOR_CORE_NUM as i32
    );
    assert_eq!(
        dev_attr::TOTAL_GLOBAL_MEM_SIZE,
        h::ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE as i32
    );
    // The error codes the backend names and tests for.
    let named = [
        (codes::INVALID_PARAM, h::ACL_ERROR_INVALID_PARAM as i64),
        (codes::UNINITIALIZE, h::ACL_ERROR_UNINITIALIZE as i64),
        (
            codes::REPEAT_INITIALIZE,
            h::ACL_ERROR_REPEAT_INITIALIZE as i64,
        ),
        (codes::BAD_ALLOC, h::ACL_ERROR_BAD_ALLOC as i64),
        (codes::RT_CONTEXT_NULL, h::ACL_ERROR_RT_CONTEXT_NULL as i64),
        (
            codes::RT_STREAM_CONTEXT,
            h::ACL_ERROR_RT_STREAM_CONTEXT as i64,
        ),
        (
            codes::RT_THREAD_SUBSCRIBE,
            h::ACL_ERROR_RT_THREAD_SUBSCRIBE as i64,
        ),
        (
            codes::RT_REPORT_TIMEOUT,
            h::ACL_ERROR_RT_REPORT_TIMEOUT as i64,
        ),
        (
            codes::RT_MEMORY_ALLOCATION,
            h::ACL_ERROR_RT_MEMORY_ALLOCATION as i64,
        ),
        (codes::RT_NO_DEVICE, h::ACL_ERROR_RT_NO_DEVICE as i64),
        (codes::RT_DEVICE_OOM, h::ACL_ERROR_RT_DEVICE_OOM as i64),
        (
            codes::RT_AICORE_EXCEPTION,
            h::ACL_ERROR_RT_AICORE_EXCEPTION as i64,
        ),
        (
            codes::RT_VECTOR_CORE_EXCEPTION,
            h::ACL_ERROR_RT_VECTOR_CORE_EXCEPTION as i64,
        ),
        (
            codes::RT_DEVICE_MEM_ERROR,
            h::ACL_ERROR_RT_DEVICE_MEM_ERROR as i64,
        ),
    ];
    for (ours, theirs) in named {
        assert_eq!(ours as i64, theirs as i64, "{}", conv::error_name(ours));
    }
}

#[test]
fn the_hccl_table_and_values_match_the_header() {
    let path = unihal_sim_cann::built_library();
    let lib = unihal_dynlib::Library::open(&unihal_dynlib::Candidates::new(
        "simulated HCCL",
        "UNIHAL_ABI_TEST_UNUSED",
        &[path.to_str().expect("a UTF-8 path")],
    ))
    .expect("the built simulator loads");
    let a = hffi::HcclApi::new(&lib).expect("every HCCL symbol the backend needs");
    // SAFETY: the simulator's own object; loading runs no initialiser with preconditions.
    let hd = unsafe { h::CannHeader::new(&path) }.expect("the built simulator loads");
    macro_rules! same {
        ($($ours:ident => $theirs:ident),* $(,)?) => {
            $( assert_eq!(ours(&a.$ours), declared(&hd.$theirs), "{} differs from the header", stringify!($theirs)); )*
        };
    }
    macro_rules! same_opt {
        ($($ours:ident => $theirs:ident),* $(,)?) => {
            $( assert_eq!(ours_opt(&a.$ours), declared(&hd.$theirs), "{} differs from the header", stringify!($theirs)); )*
        };
    }
    same!(
        get_root_info => HcclGetRootInfo,
        comm_init_root_info => HcclCommInitRootInfo,
        comm_destroy => HcclCommDestroy,
        get_rank_size => HcclGetRankSize,
        get_rank_id => HcclGetRankId,
        get_comm_async_error => HcclGetCommAsyncError,
        all_reduce => HcclAllReduce,
        broadcast => HcclBroadcast,
        reduce => HcclReduce,
        all_gather => HcclAllGather,
        reduce_scatter => HcclReduceScatter,
        send => HcclSend,
        recv => HcclRecv,
    );
    same_opt!(
        get_error_string => HcclGetErrorString,
        all_to_all => HcclAlltoAll,
        all_to_allv => HcclAlltoAllV,
        batch_send_recv => HcclBatchSendRecv,
    );
    // Structs: the root info passed by pointer, the batch items passed as an array.
    assert_eq!(
        std::mem::size_of::<hffi::RootInfo>(),
        std::mem::size_of::<h::HcclRootInfo>()
    );
    assert_eq!(hffi::ROOT_INFO_BYTES, h::HCCL_ROOT_INFO_BYTES as usize);
    assert_eq!(
        std::mem::size_of::<hffi::SendRecvItem>(),
        std::mem::size_of::<h::HcclSendRecvItem>()
    );
    assert_eq!(
        std::mem::align_of::<hffi::SendRecvItem>(),
        std::mem::align_of::<h::HcclSendRecvItem>()
    );
    assert_eq!(
        std::mem::offset_of!(hffi::SendRecvItem, buf),
        std::mem::offset_of!(h::HcclSendRecvItem, buf)
    );
    assert_eq!(
        std::mem::offset_of!(hffi::SendRecvItem, count),
        std::mem::offset_of!(h::HcclSendRecvItem, count)
    );
    assert_eq!(
        std::mem::offset_of!(hffi::SendRecvItem, data_type),
        std::mem::offset_of!(h::HcclSendRecvItem, dataType)
    );
    assert_eq!(
        std::mem::offset_of!(hffi::SendRecvItem, remote_rank),
        std::mem::offset_of!(h::HcclSendRecvItem, remoteRank)
    );
    assert_eq!(hffi::SEND, h::HCCL_SEND as i32);
    assert_eq!(hffi::RECV, h::HCCL_RECV as i32);
    // Values.
    let dtypes = [
        (DType::I8, h::HCCL_DATA_TYPE_INT8),
        (DType::I16, h::HCCL_DATA_TYPE_INT16),
        (DType::I32, h::HCCL_DATA_TYPE_INT32),
        (DType::F16, h::HCCL_DATA_TYPE_FP16),
        (DType::F32, h::HCCL_DATA_TYPE_FP32),
        (DType::I64, h::HCCL_DATA_TYPE_INT64),
        (DType::U64, h::HCCL_DATA_TYPE_UINT64),
        (DType::U8, h::HCCL_DATA_TYPE_UINT8),
        (DType::U32, h::HCCL_DATA_TYPE_UINT32),
        (DType::F64, h::HCCL_DATA_TYPE_FP64),
        (DType::Bf16, h::HCCL_DATA_TYPE_BFP16),
    ];
    for (d, theirs) in dtypes {
        assert_eq!(hconv::dtype(d), Some(theirs as i32), "{d}");
    }
    let ops = [
        (ReduceOp::Sum, h::HCCL_REDUCE_SUM),
        (ReduceOp::Prod, h::HCCL_REDUCE_PROD),
        (ReduceOp::Max, h::HCCL_REDUCE_MAX),
        (ReduceOp::Min, h::HCCL_REDUCE_MIN),
        (ReduceOp::Avg, h::HCCL_REDUCE_SUM), // emulated: sum, then a scale
    ];
    for (r, theirs) in ops {
        assert_eq!(hconv::reduce_op(r).0, theirs as i32, "{r:?}");
    }
    assert_eq!(hconv::SUCCESS, h::HCCL_SUCCESS as i32);
    assert_eq!(hconv::E_NOT_SUPPORT, h::HCCL_E_NOT_SUPPORT as i32);
    assert_eq!(hconv::E_TIMEOUT, h::HCCL_E_TIMEOUT as i32);
    assert_eq!(hconv::E_REMOTE, h::HCCL_E_REMOTE as i32);
}
