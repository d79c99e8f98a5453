//! The simulator's exported signatures, enum values, error codes and structs checked against
//! Huawei's real headers (feature `abi-check`): bindgen reads `acl/acl.h` and `hccl/hccl.h` from
//! the torch-npu wheel (build.rs; .ci/run pins torch-npu==2.14.0), and this test compares
//!
//! * every ACL runtime and HCCL entry point the simulator exports with the header's
//!   declaration, parameter by parameter (integer, float or pointer, and size) and the result,
//!   and loads each through the header's declaration from the built simulator;
//! * the error codes, enum values and flags the simulator answers with;
//! * the layout of `HcclRootInfo` and `HcclSendRecvItem`.
//!
//! The aclnn operators have no header in the wheel (CANN generates them at build time): their
//! declarations follow the op map, which cites each one's source.
//!
//! Fails (never skips) when the headers or libclang are missing (the build script panics).

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]

use unihal_sim_cann::header;

use unihal_dynlib::abi::{declared, ours};
use unihal_sim_cann::aclGetRecentErrMsg;
use unihal_sim_cann::conv::*;
use unihal_sim_cann::hccl::*;
use unihal_sim_cann::kernel::*;
use unihal_sim_cann::report::*;
use unihal_sim_cann::runtime::*;

fn theirs() -> header::CannHeader {
    let lib = unihal_sim_cann::built_library();
    // SAFETY: the simulator's own object; loading runs no initialiser with preconditions.
    unsafe { header::CannHeader::new(&lib) }.expect("the built simulator loads")
}

/// `_` placeholders for an arity: the cast of a fn item to its pointer type.
macro_rules! fn_ptr {
    ($f:ident, 0) => {
        $f as unsafe extern "C" fn() -> _
    };
    ($f:ident, 1) => {
        $f as unsafe extern "C" fn(_) -> _
    };
    ($f:ident, 2) => {
        $f as unsafe extern "C" fn(_, _) -> _
    };
    ($f:ident, 3) => {
        $f as unsafe extern "C" fn(_, _, _) -> _
    };
    ($f:ident, 4) => {
        $f as unsafe extern "C" fn(_, _, _, _) -> _
    };
    ($f:ident, 5) => {
        $f as unsafe extern "C" fn(_, _, _, _, _) -> _
    };
    ($f:ident, 6) => {
        $f as unsafe extern "C" fn(_, _, _, _, _, _) -> _
    };
    ($f:ident, 7) => {
        $f as unsafe extern "C" fn(_, _, _, _, _, _, _) -> _
    };
    ($f:ident, 8) => {
        $f as unsafe extern "C" fn(_, _, _, _, _, _, _, _) -> _
    };
    ($f:ident, 10) => {
        $f as unsafe extern "C" fn(_, _, _, _, _, _, _, _, _, _) -> _
    };
}

#[test]
fn every_exported_entry_matches_the_header() {
    let h = theirs();
    macro_rules! same {
        ($($f:ident / $n:tt),* $(,)?) => {{
            let mut checked = Vec::new();
            $(
                if let Err(e) = &h.$f {
                    panic!("{} is declared by the header but not exported by the simulator: {e}", stringify!($f));
                }
                assert_eq!(ours(&fn_ptr!($f, $n)), declared(&h.$f), "{} differs from the header", stringify!($f));
                checked.push(stringify!($f));
            )*
            checked
        }};
    }
    let checked = same!(
        aclInit / 1,
        aclFinalize / 0,
        aclrtGetSocName / 0,
        aclrtGetDeviceCount / 1,
        aclrtSetDevice / 1,
        aclrtResetDevice / 1,
        aclrtGetDevice / 1,
        aclrtSynchronizeDevice / 0,
        aclrtCreateContext / 2,
        aclrtDestroyContext / 1,
        aclrtSetCurrentContext / 1,
        aclrtGetCurrentContext / 1,
        aclrtGetRunMode / 1,
        aclrtGetMemInfo / 3,
        aclrtGetDeviceInfo / 3,
        aclrtMalloc / 3,
        aclrtFree / 1,
        aclrtMallocHost / 2,
        aclrtFreeHost / 1,
        aclrtMemcpy / 5,
        aclrtMemcpyAsync / 6,
        aclrtMemset / 4,
        aclrtMemsetAsync / 5,
        aclrtCreateStream / 1,
        aclrtCreateStreamWithConfig / 3,
        aclrtDestroyStream / 1,
        aclrtDestroyStreamForce / 1,
        aclrtSynchronizeStream / 1,
        aclrtSynchronizeStreamWithTimeout / 2,
        aclrtStreamQuery / 2,
        aclrtStreamWaitEvent / 2,
        aclrtCreateEvent / 1,
        aclrtCreateEventWithFlag / 2,
        aclrtCreateEventExWithFlag / 2,
        aclrtDestroyEvent / 1,
        aclrtRecordEvent / 2,
        aclrtResetEvent / 2,
        aclrtSynchronizeEvent / 1,
        aclrtSynchronizeEventWithTimeout / 2,
        aclrtQueryEventStatus / 2,
        aclrtQueryEvent / 2,
        aclrtEventElapsedTime / 3,
        aclrtDeviceCanAccessPeer / 3,
        aclrtDeviceEnablePeerAccess / 2,
        aclrtDeviceDisablePeerAccess / 1,
        aclrtSubscribeReport / 2,
        aclrtUnSubscribeReport / 2,
        aclrtLaunchCallback / 4,
        aclrtProcessReport / 1,
        aclrtBinaryLoadFromFile / 3,
        aclrtBinaryLoadFromData / 4,
        HcclGetRootInfo / 1,
        HcclCommInitRootInfo / 4,
        HcclCommDestroy / 1,
        HcclGetRankSize / 2,
        HcclGetRankId / 2,
        HcclGetCommAsyncError / 2,
        HcclGetErrorString / 1,
        HcclAllReduce / 7,
        HcclBroadcast / 6,
        HcclReduce / 8,
        HcclAllGather / 6,
        HcclReduceScatter / 7,
        HcclAlltoAll / 8,
        HcclSend / 6,
        HcclRecv / 6,
        HcclBatchSendRecv / 4,
        HcclAlltoAllV / 10,
        aclGetRecentErrMsg / 0,
    );
    // Every runtime and HCCL symbol of symbols.txt is checked here.
    let text = include_str!("../symbols.txt");
    let mut section = "";
    let mut listed = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix('[') {
            section = rest.split(']').next().unwrap_or("");
        } else if !line.is_empty()
            && !line.starts_with('#')
            && matches!(section, "runtime" | "hccl")
        {
            listed.push(line);
        }
    }
    let mut a = checked.clone();
    a.sort_unstable();
    listed.sort_unstable();
    assert_eq!(
        a, listed,
        "the checked entries are symbols.txt's runtime and HCCL sections"
    );
}

#[test]
fn error_codes_and_enum_values_match_the_header() {
    for (ours, theirs) in [
        (ACL_SUCCESS, header::ACL_SUCCESS as i32),
        (
            ACL_ERROR_INVALID_PARAM,
            header::ACL_ERROR_INVALID_PARAM as i32,
        ),
        (
            ACL_ERROR_UNINITIALIZE,
            header::ACL_ERROR_UNINITIALIZE as i32,
        ),
        (
            ACL_ERROR_REPEAT_INITIALIZE,
            header::ACL_ERROR_REPEAT_INITIALIZE as i32,
        ),
        (
            ACL_ERROR_REPEAT_FINALIZE,
            header::ACL_ERROR_REPEAT_FINALIZE as i32,
        ),
        (ACL_ERROR_BAD_ALLOC, header::ACL_ERROR_BAD_ALLOC as i32),
        (
            ACL_ERROR_INVALID_DEVICE,
            header::ACL_ERROR_INVALID_DEVICE as i32,
        ),
        (
            ACL_ERROR_FEATURE_UNSUPPORTED,
            header::ACL_ERROR_FEATURE_UNSUPPORTED as i32,
        ),
        (ACL_ERROR_FAILURE, header::ACL_ERROR_FAILURE as i32),
        (
            ACL_ERROR_RT_PARAM_INVALID,
            header::ACL_ERROR_RT_PARAM_INVALID as i32,
        ),
        (
            ACL_ERROR_RT_INVALID_DEVICEID,
            header::ACL_ERROR_RT_INVALID_DEVICEID as i32,
        ),
        (
            ACL_ERROR_RT_CONTEXT_NULL,
            header::ACL_ERROR_RT_CONTEXT_NULL as i32,
        ),
        (
            ACL_ERROR_RT_STREAM_CONTEXT,
            header::ACL_ERROR_RT_STREAM_CONTEXT as i32,
        ),
        (
            ACL_ERROR_RT_STREAM_SUBSCRIBE,
            header::ACL_ERROR_RT_STREAM_SUBSCRIBE as i32,
        ),
        (
            ACL_ERROR_RT_THREAD_SUBSCRIBE,
            header::ACL_ERROR_RT_THREAD_SUBSCRIBE as i32,
        ),
        (
            ACL_ERROR_RT_STREAM_NO_CB_REG,
            header::ACL_ERROR_RT_STREAM_NO_CB_REG as i32,
        ),
        (
            ACL_ERROR_RT_INVALID_HANDLE,
            header::ACL_ERROR_RT_INVALID_HANDLE as i32,
        ),
        (
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            header::ACL_ERROR_RT_FEATURE_NOT_SUPPORT as i32,
        ),
        (
            ACL_ERROR_RT_MEMORY_ALLOCATION,
            header::ACL_ERROR_RT_MEMORY_ALLOCATION as i32,
        ),
        (
            ACL_ERROR_RT_MEMORY_FREE,
            header::ACL_ERROR_RT_MEMORY_FREE as i32,
        ),
        (
            ACL_ERROR_RT_INTERNAL_ERROR,
            header::ACL_ERROR_RT_INTERNAL_ERROR as i32,
        ),
        (
            ACL_ERROR_RT_STREAM_NOT_COMPLETE,
            header::ACL_ERROR_RT_STREAM_NOT_COMPLETE as i32,
        ),
        (
            ACL_ERROR_RT_EVENT_NOT_COMPLETE,
            header::ACL_ERROR_RT_EVENT_NOT_COMPLETE as i32,
        ),
        (
            ACL_ERROR_RT_REPORT_TIMEOUT,
            header::ACL_ERROR_RT_REPORT_TIMEOUT as i32,
        ),
        (
            ACL_ERROR_RT_AICORE_EXCEPTION,
            header::ACL_ERROR_RT_AICORE_EXCEPTION as i32,
        ),
        (
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            header::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT as i32,
        ),
        (
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
            header::ACL_ERROR_RT_EVENT_SYNC_TIMEOUT as i32,
        ),
        (HCCL_SUCCESS, header::HCCL_SUCCESS as i32),
        (HCCL_E_PARA, header::HCCL_E_PARA as i32),
        (HCCL_E_PTR, header::HCCL_E_PTR as i32),
        (HCCL_E_MEMORY, header::HCCL_E_MEMORY as i32),
        (HCCL_E_INTERNAL, header::HCCL_E_INTERNAL as i32),
        (HCCL_E_NOT_SUPPORT, header::HCCL_E_NOT_SUPPORT as i32),
        (HCCL_E_NOT_FOUND, header::HCCL_E_NOT_FOUND as i32),
        (HCCL_E_UNAVAIL, header::HCCL_E_UNAVAIL as i32),
        (HCCL_E_TIMEOUT, header::HCCL_E_TIMEOUT as i32),
        (HCCL_E_RUNTIME, header::HCCL_E_RUNTIME as i32),
        (HCCL_E_REMOTE, header::HCCL_E_REMOTE as i32),
    ] {
        assert_eq!(ours, theirs);
    }
    // Event flags, memcpy kinds, the two event-status enums, stream status, callback blocking.
    assert_eq!(ACL_EVENT_SYNC, header::ACL_EVENT_SYNC as u32);
    assert_eq!(ACL_EVENT_TIME_LINE, header::ACL_EVENT_TIME_LINE as u32);
    assert_eq!(
        ACL_EVENT_CAPTURE_STREAM_PROGRESS,
        header::ACL_EVENT_CAPTURE_STREAM_PROGRESS as u32
    );
    for (ours, theirs) in [
        (memcpy::H2H, header::ACL_MEMCPY_HOST_TO_HOST),
        (memcpy::H2D, header::ACL_MEMCPY_HOST_TO_DEVICE),
        (memcpy::D2H, header::ACL_MEMCPY_DEVICE_TO_HOST),
        (memcpy::D2D, header::ACL_MEMCPY_DEVICE_TO_DEVICE),
        (memcpy::DEFAULT, header::ACL_MEMCPY_DEFAULT),
        (memcpy::H2BUF2D, header::ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE),
        (memcpy::INNER_D2D, header::ACL_MEMCPY_INNER_DEVICE_TO_DEVICE),
        (memcpy::INTER_D2D, header::ACL_MEMCPY_INTER_DEVICE_TO_DEVICE),
    ] {
        assert_eq!(ours as i64, theirs as i64);
    }
    assert_eq!(header::ACL_EVENT_RECORDED_STATUS_NOT_READY, 0);
    assert_eq!(header::ACL_EVENT_RECORDED_STATUS_COMPLETE, 1);
    assert_eq!(header::ACL_EVENT_STATUS_COMPLETE, 0);
    assert_eq!(header::ACL_EVENT_STATUS_NOT_READY, 1);
    assert_eq!(header::ACL_STREAM_STATUS_COMPLETE, 0);
    assert_eq!(header::ACL_STREAM_STATUS_NOT_READY, 1);
    assert_eq!(header::ACL_CALLBACK_NO_BLOCK, 0);
    assert_eq!(header::ACL_CALLBACK_BLOCK, 1);
    // Data types: ours map to the header's numbers.
    for (name, v) in [
        ("float", header::ACL_FLOAT as i32),
        ("f16", header::ACL_FLOAT16 as i32),
        ("bf16", header::ACL_BF16 as i32),
        ("f64", header::ACL_DOUBLE as i32),
        ("i32", header::ACL_INT32 as i32),
        ("i64", header::ACL_INT64 as i32),
        ("i8", header::ACL_INT8 as i32),
        ("u8", header::ACL_UINT8 as i32),
        ("bool", header::ACL_BOOL as i32),
    ] {
        assert!(dtype_of_acl(v).is_some(), "{name} = {v}");
        assert_eq!(acl_of_dtype(dtype_of_acl(v).unwrap()), v, "{name}");
    }
    for (v, ok) in [
        (header::HCCL_DATA_TYPE_FP32, true),
        (header::HCCL_DATA_TYPE_BFP16, true),
        (header::HCCL_DATA_TYPE_INT64, true),
        (header::HCCL_DATA_TYPE_INT128, false),
    ] {
        assert_eq!(dtype_of_hccl(v as i32).is_some(), ok, "HcclDataType {v}");
    }
    assert_eq!(
        dtype_of_hccl(header::HCCL_DATA_TYPE_FP16 as i32),
        Some(unihal_hal::DType::F16)
    );
    assert_eq!(
        reduce_of_hccl(header::HCCL_REDUCE_SUM as i32),
        Some(unihal_hal::ReduceOp::Sum)
    );
    assert_eq!(
        reduce_of_hccl(header::HCCL_REDUCE_MAX as i32),
        Some(unihal_hal::ReduceOp::Max)
    );
}

#[test]
fn hccl_structs_have_the_headers_layout() {
    assert_eq!(
        std::mem::size_of::<HcclRootInfo>(),
        std::mem::size_of::<header::HcclRootInfo>()
    );
    assert_eq!(ROOT_INFO_BYTES as u32, header::HCCL_ROOT_INFO_BYTES);
    assert_eq!(
        std::mem::size_of::<HcclSendRecvItem>(),
        std::mem::size_of::<header::HcclSendRecvItem>()
    );
    assert_eq!(
        std::mem::offset_of!(HcclSendRecvItem, buf),
        std::mem::offset_of!(header::HcclSendRecvItem, buf)
    );
    assert_eq!(
        std::mem::offset_of!(HcclSendRecvItem, count),
        std::mem::offset_of!(header::HcclSendRecvItem, count)
    );
    assert_eq!(
        std::mem::offset_of!(HcclSendRecvItem, data_type),
        std::mem::offset_of!(header::HcclSendRecvItem, dataType)
    );
    assert_eq!(
        std::mem::offset_of!(HcclSendRecvItem, remote_rank),
        std::mem::offset_of!(header::HcclSendRecvItem, remoteRank)
    );
}
