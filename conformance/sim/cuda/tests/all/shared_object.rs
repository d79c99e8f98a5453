//! The built shared object is what a backend will load: its SONAME is `libcuda.so` (the first name
//! cudarc opens) and it exports every driver symbol of the path cudarc's safe API takes, and the
//! NCCL subset.

use std::path::PathBuf;

/// The 34 symbols of cudarc's safe path (memory, streams, events, modules, launches), plus the
/// plain allocation pair, error names and the cuda-13 variants.
const SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetUuid",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8Async",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuEventElapsedTime",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuGetErrorString",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuGetErrorName",
    "cuEventElapsedTime_v2",
    "cuDeviceGetUuid_v2",
    "cuDriverGetVersion",
    "cuMemsetD16Async",
    "cuMemsetD32Async",
    "cuCtxGetDevice",
    "cuDeviceCanAccessPeer",
    "cuMemHostAlloc",
    "cuMemAllocHost_v2",
    "cuMemFreeHost",
    "cuStreamQuery",
    "cuLaunchHostFunc",
    "cuCtxEnablePeerAccess",
    "cuCtxDisablePeerAccess",
    "cuMemcpyPeerAsync",
    // Stream capture and graphs.
    "cuStreamBeginCapture",
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamIsCapturing",
    "cuStreamGetCaptureInfo",
    "cuStreamGetCaptureInfo_v2",
    "cuStreamGetCaptureInfo_v3",
    "cuThreadExchangeStreamCaptureMode",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
    "cuGraphGetNodes",
];

/// The NCCL subset (same object: its collectives run on the simulated driver's streams).
const NCCL_SYMBOLS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommGetAsyncError",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclCommSplit",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclBcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclAlltoAll",
    "ncclAllToAll",
    "ncclSend",
    "ncclRecv",
];

/// The built object: `target/<profile>/deps/libunihal_sim_cuda.so` next to this test (`cargo
/// test`), or `target/<profile>/libunihal_sim_cuda.so` (`cargo build`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("libunihal_sim_cuda.so"),
        deps.parent().unwrap().join("libunihal_sim_cuda.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| deps.join("libunihal_sim_cuda.so"))
}

#[test]
fn the_shared_object_is_libcuda_and_exports_the_driver_and_nccl_symbols() {
    if crate::own_process() {
        return;
    }
    let path = library();
    assert!(path.exists(), "{} not built", path.display());
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes.windows(11).any(|w| w == b"libcuda.so\0"),
        "no libcuda.so SONAME string in {}",
        path.display()
    );
    // SAFETY: loading the simulator runs no initialisers beyond Rust's; the symbols are only
    // resolved, and cuInit(0) called with the driver API's signature.
    unsafe {
        let lib = libloading::Library::new(&path).unwrap();
        for s in SYMBOLS.iter().chain(NCCL_SYMBOLS) {
            lib.get::<*const ()>(s.as_bytes())
                .unwrap_or_else(|e| panic!("{s} not exported: {e}"));
        }
        let init: libloading::Symbol<unsafe extern "C" fn(u32) -> i32> =
            lib.get(b"cuInit").unwrap();
        assert_eq!(init(0), 0);
        assert_eq!(init(1), 1, "flags must be 0: CUDA_ERROR_INVALID_VALUE");
        let version: libloading::Symbol<unsafe extern "C" fn(*mut i32) -> i32> =
            lib.get(b"ncclGetVersion").unwrap();
        let mut v = 0;
        assert_eq!(version(&mut v), 0);
        assert_eq!(v, 23007);
    }
}
