//! The HIP symbol table checked against AMD's real headers and library (feature `abi-check`;
//! .ci/run installs Debian's libamdhip64-dev 5.2.3 and libclang): bindgen reads
//! `hip_runtime_api.h` with `-D__HIP_PLATFORM_AMD__` (build.rs), and this test compares
//!
//! * every entry of [`unihal_hip::ffi::HipApi`] with the header's declaration, parameter by
//!   parameter (integer, float or pointer, and size) and the result;
//! * every required entry against Debian's `libamdhip64.so.5` (dlsym), and the optional ones
//!   the library lacks (`hipLaunchHostFunc` is declared but not exported: the backend falls back
//!   to `hipStreamAddCallback`);
//! * every enum value and constant the backend uses, in ROCm 5's numbering;
//! * the size of `hipDeviceProp_t` and the offset of `gcnArchName` in it (the layout the plain
//!   `hipGetDeviceProperties` entry fills).
//!
//! Fails (never skips) when the header or the library is missing.

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    clippy::all
)]

// bindgen's output (generated from the header, never edited): its unsafe blocks are its own.
#[allow(clippy::undocumented_unsafe_blocks)]
mod header {
    include!(concat!(env!("OUT_DIR"), "/hip_abi.rs"));
}

use unihal_hip::conv::{self, codes, Numbering};
use unihal_hip::ffi::{self, HipApi};

use unihal_dynlib::abi::{declared, ours, ours_opt};

fn open() -> (header::HipHeader, HipApi) {
    // SAFETY: loading AMD's runtime runs its initialisers (as any HIP program does).
    let theirs = unsafe { header::HipHeader::new("libamdhip64.so.5") }
        .unwrap_or_else(|e| panic!("Debian's libamdhip64.so.5 must be installed: {e}"));
    std::env::remove_var("UNIHAL_HIP_LIB");
    let lib = unihal_dynlib::Library::open(&unihal_dynlib::Candidates::new(
        "HIP runtime",
        "UNIHAL_ABI_TEST_UNSET",
        &["libamdhip64.so.5"],
    ))
    .expect("libamdhip64.so.5 opens");
    let ours = HipApi::new(&lib).expect("every required entry resolves from Debian's library");
    (theirs, ours)
}

#[test]
fn every_entry_matches_the_header() {
    let (theirs, api) = open();
    macro_rules! same {
        ($($field:ident => $sym:ident),* $(,)?) => {{
            let mut checked = Vec::new();
            $(
                if let Err(e) = &theirs.$sym {
                    panic!("{} is not exported by Debian's library: {e}", stringify!($sym));
                }
                assert_eq!(ours(&api.$field), declared(&theirs.$sym), "{} differs from the header", stringify!($sym));
                checked.push(stringify!($sym));
            )*
            checked
        }};
    }
    let checked = same!(
        init => hipInit,
        driver_get_version => hipDriverGetVersion,
        runtime_get_version => hipRuntimeGetVersion,
        get_error_name => hipGetErrorName,
        get_error_string => hipGetErrorString,
        get_device_count => hipGetDeviceCount,
        set_device => hipSetDevice,
        device_get_name => hipDeviceGetName,
        device_total_mem => hipDeviceTotalMem,
        device_get_attribute => hipDeviceGetAttribute,
        device_synchronize => hipDeviceSynchronize,
        device_can_access_peer => hipDeviceCanAccessPeer,
        device_enable_peer_access => hipDeviceEnablePeerAccess,
        mem_get_info => hipMemGetInfo,
        malloc => hipMalloc,
        free => hipFree,
        host_malloc => hipHostMalloc,
        host_free => hipHostFree,
        memcpy_htod_async => hipMemcpyHtoDAsync,
        memcpy_dtoh_async => hipMemcpyDtoHAsync,
        memcpy_dtod_async => hipMemcpyDtoDAsync,
        memcpy_peer_async => hipMemcpyPeerAsync,
        memset_d8_async => hipMemsetD8Async,
        memset_d16_async => hipMemsetD16Async,
        memset_d32_async => hipMemsetD32Async,
        stream_create_with_flags => hipStreamCreateWithFlags,
        stream_destroy => hipStreamDestroy,
        stream_synchronize => hipStreamSynchronize,
        stream_query => hipStreamQuery,
        stream_wait_event => hipStreamWaitEvent,
        stream_add_callback => hipStreamAddCallback,
        event_create_with_flags => hipEventCreateWithFlags,
        event_destroy => hipEventDestroy,
        event_record => hipEventRecord,
        event_query => hipEventQuery,
        event_synchronize => hipEventSynchronize,
        event_elapsed_time => hipEventElapsedTime,
        module_load_data => hipModuleLoadData,
        module_get_function => hipModuleGetFunction,
        module_unload => hipModuleUnload,
        module_launch_kernel => hipModuleLaunchKernel,
    );
    assert_eq!(
        checked,
        ffi::HipApi::REQUIRED_SYMBOLS,
        "the checked list is the required symbol list"
    );

    // Optional entries: the header's declarations, whether or not the library exports them.
    assert_eq!(
        ours_opt(&api.malloc_async),
        declared(&theirs.hipMallocAsync)
    );
    assert_eq!(ours_opt(&api.free_async), declared(&theirs.hipFreeAsync));
    assert_eq!(
        ours_opt(&api.get_device_properties),
        declared(&theirs.hipGetDeviceProperties)
    );
    assert_eq!(
        ours_opt(&api.launch_host_func),
        declared(&theirs.hipLaunchHostFunc)
    );
    // The graph entries: declared as the header does, and all exported by 5.2 (so graphs are
    // native there).
    macro_rules! graph_entries {
        ($($field:ident => $sym:ident),* $(,)?) => {{
            let mut checked = Vec::new();
            $(
                assert_eq!(ours_opt(&api.$field), declared(&theirs.$sym), "{} differs from the header", stringify!($sym));
                assert!(api.$field.is_some(), "{} is exported by Debian's 5.2 library", stringify!($sym));
                checked.push(stringify!($sym));
            )*
            checked
        }};
    }
    let graphs = graph_entries!(
        stream_begin_capture => hipStreamBeginCapture,
        stream_end_capture => hipStreamEndCapture,
        stream_is_capturing => hipStreamIsCapturing,
        stream_get_capture_info => hipStreamGetCaptureInfo,
        thread_exchange_stream_capture_mode => hipThreadExchangeStreamCaptureMode,
        graph_instantiate => hipGraphInstantiate,
        graph_launch => hipGraphLaunch,
        graph_destroy => hipGraphDestroy,
        graph_exec_destroy => hipGraphExecDestroy,
        graph_get_nodes => hipGraphGetNodes,
    );
    for name in graphs {
        assert!(
            ffi::HipApi::OPTIONAL_SYMBOLS.contains(&name),
            "{name} is an optional entry"
        );
    }
    assert!(
        api.malloc_async.is_some() && api.free_async.is_some(),
        "exported by 5.2"
    );
    assert!(api.get_device_properties.is_some(), "exported by 5.2");
    // Declared by the header, not exported by the library: the fallback is needed.
    assert!(
        theirs.hipLaunchHostFunc.is_err(),
        "Debian's 5.2 library now exports hipLaunchHostFunc"
    );
    assert!(api.launch_host_func.is_none());
    assert!(
        api.get_device_properties_r0600.is_none(),
        "R0600 is ROCm 6's"
    );
    for name in ffi::HipApi::OPTIONAL_SYMBOLS {
        assert!(!ffi::HipApi::REQUIRED_SYMBOLS.contains(name));
    }
}

#[test]
fn enum_values_and_constants_match_the_header() {
    let a = Numbering::Rocm5.attributes();
    assert_eq!(
        a.max_threads_per_block,
        header::hipDeviceAttributeMaxThreadsPerBlock as i32
    );
    assert_eq!(
        a.max_block,
        [
            header::hipDeviceAttributeMaxBlockDimX as i32,
            header::hipDeviceAttributeMaxBlockDimY as i32,
            header::hipDeviceAttributeMaxBlockDimZ as i32
        ]
    );
    assert_eq!(
        a.max_grid,
        [
            header::hipDeviceAttributeMaxGridDimX as i32,
            header::hipDeviceAttributeMaxGridDimY as i32,
            header::hipDeviceAttributeMaxGridDimZ as i32
        ]
    );
    assert_eq!(
        a.max_shared_per_block,
        header::hipDeviceAttributeMaxSharedMemoryPerBlock as i32
    );
    assert_eq!(a.warp_size, header::hipDeviceAttributeWarpSize as i32);
    assert_eq!(
        a.multiprocessor_count,
        header::hipDeviceAttributeMultiprocessorCount as i32
    );
    assert_eq!(
        a.memory_pools,
        Some(header::hipDeviceAttributeMemoryPoolsSupported as i32)
    );

    assert_eq!(codes::INVALID_VALUE, header::hipErrorInvalidValue as i32);
    assert_eq!(codes::OUT_OF_MEMORY, header::hipErrorOutOfMemory as i32);
    assert_eq!(codes::NO_DEVICE, header::hipErrorNoDevice as i32);
    assert_eq!(codes::INVALID_DEVICE, header::hipErrorInvalidDevice as i32);
    assert_eq!(codes::NOT_FOUND, header::hipErrorNotFound as i32);
    assert_eq!(codes::NOT_READY, header::hipErrorNotReady as i32);
    assert_eq!(
        codes::ILLEGAL_ADDRESS,
        header::hipErrorIllegalAddress as i32
    );
    assert_eq!(codes::LAUNCH_TIMEOUT, header::hipErrorLaunchTimeOut as i32);
    assert_eq!(
        codes::PEER_ACCESS_ALREADY_ENABLED,
        header::hipErrorPeerAccessAlreadyEnabled as i32
    );
    assert_eq!(codes::ASSERT, header::hipErrorAssert as i32);
    assert_eq!(codes::LAUNCH_FAILURE, header::hipErrorLaunchFailure as i32);

    // The capture error codes, modes and statuses (conv's numbering).
    assert_eq!(
        conv::CAPTURE_CODES,
        header::hipErrorStreamCaptureUnsupported as i32
            ..=header::hipErrorStreamCaptureWrongThread as i32
    );
    for (code, known) in [
        (header::hipErrorStreamCaptureUnsupported, true),
        (header::hipErrorStreamCaptureInvalidated, true),
        (header::hipErrorStreamCaptureMerge, true),
        (header::hipErrorStreamCaptureUnmatched, true),
        (header::hipErrorStreamCaptureUnjoined, true),
        (header::hipErrorStreamCaptureIsolation, true),
        (header::hipErrorStreamCaptureImplicit, true),
        (header::hipErrorCapturedEvent, true),
        (header::hipErrorStreamCaptureWrongThread, true),
    ] {
        assert_eq!(
            unihal_gpu::graph::capture_code_meaning(code as i64).is_some(),
            known,
            "capture code {code}"
        );
    }
    use unihal_hal::CaptureMode;
    assert_eq!(
        conv::capture_mode(CaptureMode::Global),
        header::hipStreamCaptureModeGlobal as i32
    );
    assert_eq!(
        conv::capture_mode(CaptureMode::ThreadLocal),
        header::hipStreamCaptureModeThreadLocal as i32
    );
    assert_eq!(
        conv::capture_mode(CaptureMode::Relaxed),
        header::hipStreamCaptureModeRelaxed as i32
    );
    use unihal_gpu::runtime::RawCaptureStatus;
    assert_eq!(
        conv::capture_status(header::hipStreamCaptureStatusNone as i32, 7).unwrap(),
        RawCaptureStatus::None
    );
    assert_eq!(
        conv::capture_status(header::hipStreamCaptureStatusActive as i32, 7).unwrap(),
        RawCaptureStatus::Active(7)
    );
    assert_eq!(
        conv::capture_status(header::hipStreamCaptureStatusInvalidated as i32, 7).unwrap(),
        RawCaptureStatus::Invalidated(7)
    );

    assert_eq!(ffi::STREAM_NON_BLOCKING, header::hipStreamNonBlocking);
    assert_eq!(ffi::EVENT_DEFAULT, header::hipEventDefault);
    assert_eq!(ffi::EVENT_DISABLE_TIMING, header::hipEventDisableTiming);
    assert_eq!(ffi::HOST_MALLOC_DEFAULT, header::hipHostMallocDefault);
}

#[test]
fn the_properties_layout_matches_the_header() {
    // The plain hipGetDeviceProperties fills this layout; the backend reads gcnArchName at the
    // offset device.rs names, and the simulated runtime writes the same fields.
    assert_eq!(std::mem::size_of::<header::hipDeviceProp_t>(), 792);
    assert_eq!(
        std::mem::offset_of!(header::hipDeviceProp_t, gcnArchName),
        396
    );
    assert_eq!(
        std::mem::offset_of!(header::hipDeviceProp_t, totalGlobalMem),
        256
    );
    assert_eq!(std::mem::offset_of!(header::hipDeviceProp_t, warpSize), 276);
    assert_eq!(
        std::mem::offset_of!(header::hipDeviceProp_t, multiProcessorCount),
        336
    );
    assert_eq!(unihal_hip::device::ARCH_OFFSET_R0000, 396);
}
