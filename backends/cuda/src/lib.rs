//! # unihal-cuda: the CUDA backend
//!
//! NVIDIA GPUs through the CUDA driver API, opened at run time through cudarc's loader (its types
//! and library lookup; the entry points themselves are declared with integer results in `ffi`, so
//! a result code `cuda.h` does not list stays a number instead of an invalid enum value), so one
//! unihal binary builds with no CUDA toolkit and runs wherever it lands.
//!
//! * **Loading** ([`loader`]): `UNIHAL_CUDA_LIB=/path/to/libcuda.so*` chooses the driver (unihal's
//!   simulated driver in CI, `conformance/sim/cuda`); otherwise the system loader finds
//!   `libcuda.so`. cudarc panics on a missing library or symbol, so the backend probes the library
//!   first (`is_culib_present`) and runs every driver call under a guard that turns a panic into
//!   [`unihal_hal::HalError::Unavailable`]. No driver, or no device, is `Unavailable` with the
//!   names tried and the driver's code; never a panic, never "0 devices". A Hygon DCU behind
//!   DTK's CUDA-compatible libraries (its name, or a driver file under DTK) is not claimed: it is
//!   `Unavailable` pointing at the `hip` backend.
//! * **The shared GPU layer**: devices, memory, streams, events and modules are `unihal_gpu`'s
//!   (the same code as the HIP backend's) over [`runtime::Cuda`], this backend's implementation
//!   of its `Runtime` trait: each driver call once, failures named with the driver's call name.
//! * **Devices** ([`device`]) use each GPU's primary context (`device::Context`), bound to the calling
//!   thread before every driver call, so any host thread may use any device. Capabilities come from
//!   the driver's attributes (compute capability, SM count, warp size, limits, memory). A kernel
//!   fault poisons a CUDA context: `fault_poisons_device` says so, and such errors are sticky on
//!   every stream.
//! * **Memory**: `cuMemAlloc` device memory and `cuMemHostAlloc` pinned host memory.
//! * **Streams** are non-blocking `CUstream`s. What queued work uses (buffers, host
//!   buffers, functions, events) is kept until an event recorded after the work completes (or a
//!   synchronisation that began after it was queued), so dropping a buffer that queued work still
//!   uses is safe; when that cannot be tracked (a failed driver call), it is kept longer or
//!   leaked, never released early. Host callbacks must not call the driver: backend calls made
//!   there fail with `InvalidArgument`, releases they trigger are deferred, and a panic in one
//!   fails its stream.
//! * **Events** with timing unless disabled; cross-device waits are the driver's.
//! * **Modules**: PTX (JIT-compiled by the driver; parameter sizes read from the PTX,
//!   so launches are size-checked) and cubin.
//!
//! * **Library ops**: `run_op` plans with `unihal_kernels::plan` (the same planner as every
//!   backend) and launches the portable library, compiled by NVRTC ([`loader::nvrtc`]) for the
//!   device's exact architecture through the shared kernel cache (`unihal_gpu::library`) and
//!   loaded as a cubin, PTX as the fallback ([`device`]). Without NVRTC the device reports no ops.
//!
//! * **Matmul** through cuBLAS (`Runtime::blas_gemm` in [`runtime`]) opened at run time (a handle per stream), for every
//!   layout it expresses; otherwise, and without cuBLAS, the library's tiled GEMM.
//! * **Collectives** through NCCL on the shared collective engine (`unihal-ccl`, the same
//!   engine RCCL and HCCL run on), with a watchdog per communicator so nothing hangs; [`CudaPlatform`] is
//!   the CUDA side of it.
//! * **Peers, pools and split**: peer copies through `cuMemcpyPeerAsync` (access enabled on first
//!   use), stream-ordered allocation from the device's default memory pool, `ncclCommSplit` (the
//!   engine's emulated split before NCCL 2.18): the capabilities say which a device and library have.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod conv;
pub mod device;
mod ffi;
pub mod loader;
pub mod runtime;

pub use runtime::{Cuda, CudaDevice, CudaStream};

/// The NCCL-API engine's platform on CUDA devices and streams.
pub type CudaPlatform = unihal_gpu::platform::GpuPlatform<Cuda>;

use std::sync::Arc;
use unihal_gpu::backend::{compiler_info, Loaded, RuntimeBackend, VendorRuntime};
use unihal_hal::{DeviceId, HalError, LibraryInfo, ModuleSource, Result};

/// Registry name of this backend.
pub const NAME: &str = "cuda";

/// The CUDA backend: the shared GPU backend over [`Cuda`], collectives through NCCL. Devices are
/// opened on first use and live as long as the backend.
pub type CudaBackend = RuntimeBackend<Cuda>;

impl VendorRuntime for Cuda {
    const NAME: &'static str = NAME;
    const MANIFEST: &'static str = include_str!("../conformance.manifest");
    type Ccl = unihal_ccl::NcclEngine;

    fn collective_engine() -> unihal_ccl::NcclEngine {
        unihal_gpu::platform::nccl_api_engine::<Cuda>(unihal_ccl::NCCL)
    }

    fn load() -> Result<Loaded<Cuda>> {
        let d = loader::driver()?;
        Ok(Loaded {
            rt: &runtime::CUDA,
            devices: d.devices,
            line: LibraryInfo::found(
                "driver",
                "CUDA driver",
                d.path.clone(),
                Some(format!("{}.{}", d.version / 1000, d.version % 1000 / 10)),
            ),
            identity: d.identity,
        })
    }

    fn missing_line(error: &HalError) -> LibraryInfo {
        LibraryInfo::missing("driver", "CUDA driver", error.to_string())
    }

    fn library_lines(_: &Loaded<Cuda>) -> Vec<LibraryInfo> {
        vec![
            compiler_info(
                "NVRTC",
                loader::nvrtc().map(|n| (n.path().to_string(), n.version())),
            ),
            if loader::cublas_available() {
                LibraryInfo::found("BLAS", "cuBLAS", "libcublas (system loader)".into(), None)
            } else {
                LibraryInfo::missing(
                    "BLAS",
                    "cuBLAS",
                    format!(
                        "not found through the system loader (tried {:?}); matmul runs the \
                         portable GEMM",
                        cudarc::get_lib_name_candidates("cublas")
                    ),
                )
            },
        ]
    }

    fn open_device(_: &Loaded<Cuda>, id: DeviceId) -> Result<Arc<CudaDevice>> {
        device::open(id)
    }

    fn test_kernels(device: &CudaDevice) -> Option<ModuleSource> {
        unihal_kernels::testing::module_for(
            &unihal_hal::Device::capabilities(device)
                .mandatory
                .module_formats,
        )
    }
}
