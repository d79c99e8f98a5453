//! # unihal-hip: the HIP backend (AMD ROCm and Hygon DTK)
//!
//! AMD Instinct and Radeon GPUs (ROCm) and Hygon DCUs (DTK) through the HIP runtime API, opened
//! at run time, so one unihal binary builds with no ROCm and runs wherever it lands.
//!
//! * **The shared GPU layer**: devices, memory, streams, events and modules are `unihal_gpu`'s
//!   (the same code as the CUDA backend's) over [`Hip`], this backend's implementation of its
//!   `Runtime` trait ([`runtime`]): each HIP call once, failures named with HIP's call name and
//!   `hipError_t` ([`conv`]).
//! * **Loading** ([`loader`], symbol table in [`ffi`]): `UNIHAL_HIP_LIB`, else ROCm's
//!   `libamdhip64.so.6`/`.5`/`.so` and DTK's `libgalaxyhip.so.5`, also under `ROCM_PATH`/`HIP_PATH`
//!   and `DTKROOT` (default `/opt/dtk`). Never unloaded (DTK's runtime crashes at exit if it is).
//!   `hipInit` = 101 or `hipGetDeviceCount` = 100 (a machine without a device) is
//!   `Unavailable` "no device", naming the library found.
//! * **Devices** ([`device`]): capabilities from `hipDeviceGetAttribute` and
//!   `hipDeviceTotalMem`, never from the properties struct, whose layout changed between ROCm 5
//!   and 6, except `gcnArchName` (read from the layout of the entry called, validated). The
//!   attribute numbering is probed (DTK keeps the pre-ROCm-5 numbering while reporting HIP 6.x):
//!   the warp-size query must answer 32 or 64. Wavefront width is the device's (64 on Instinct and
//!   DCUs, 32 on RDNA); the vendor is Hygon for DCU architectures or DTK's runtime, else AMD.
//! * **Modules** (`unihal_codeobj::amdgpu`): AMDGPU ELF code objects and uncompressed offload bundles,
//!   launches size-checked from the `amdhsa.kernels` metadata (hidden arguments skipped).
//! * **Library ops**: the portable library compiled by hiprtc ([`loader::hiprtc`]) for the
//!   device's exact architecture through the shared kernel cache (`unihal_gpu::library`) and
//!   loaded as a code object ([`device`]); architectures this hiprtc may abort on are compiled in
//!   the `unihal-hiprtc-helper` process (`unihal_kernels::rtc::helper`). Without hiprtc the device reports no ops.
//! * **Matmul** through rocBLAS opened at run time ([`loader`]; `Runtime::blas_gemm` in [`runtime`]), with the shared GEMM mapping;
//!   the portable tiled GEMM otherwise.
//! * **Collectives** through RCCL on the shared collective engine (`unihal-ccl`'s `RCCL`
//!   flavour of the NCCL C API, DTK's RCCL paths included) on [`HipPlatform`].
//! * **Peers, pools**: `hipMemcpyPeerAsync` with access enabled on first use, stream-ordered
//!   allocation (`hipMallocAsync`, returned with `hipFreeAsync`) where the device has pools.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod conv;
pub mod device;
pub mod ffi;
pub mod loader;
pub mod runtime;

pub use loader::Hip;
pub use runtime::{HipDevice, HipStream};

/// The NCCL-API engine's platform on HIP devices and streams.
pub type HipPlatform = unihal_gpu::platform::GpuPlatform<Hip>;

use std::sync::Arc;
use unihal_gpu::backend::{compiler_info, Loaded, RuntimeBackend, VendorRuntime};
use unihal_gpu::device::GpuDevice;
use unihal_hal::{DeviceId, HalError, LibraryInfo, ModuleSource, Result};

/// Registry name of this backend.
pub const NAME: &str = "hip";

/// The HIP backend: the shared GPU backend over [`Hip`], collectives through RCCL. Devices are
/// opened on first use and live as long as the backend.
pub type HipBackend = RuntimeBackend<Hip>;

impl VendorRuntime for Hip {
    const NAME: &'static str = NAME;
    const MANIFEST: &'static str = include_str!("../conformance.manifest");
    type Ccl = unihal_ccl::NcclEngine;

    fn collective_engine() -> unihal_ccl::NcclEngine {
        unihal_gpu::platform::nccl_api_engine::<Hip>(unihal_ccl::RCCL)
    }

    fn load() -> Result<Loaded<Hip>> {
        let h = loader::runtime()?;
        Ok(Loaded {
            rt: h,
            devices: h.devices,
            line: LibraryInfo::found(
                "runtime",
                if h.dtk {
                    "HIP runtime (Hygon DTK)"
                } else {
                    "HIP runtime"
                },
                h.file.clone().unwrap_or_else(|| h.path.clone()),
                Some(conv::version_string(h.version)),
            ),
            identity: h.identity,
        })
    }

    fn missing_line(error: &HalError) -> LibraryInfo {
        let mut l = LibraryInfo::missing("runtime", "HIP runtime", error.to_string());
        // Found but unusable (no device): say which library answered.
        if let Some((path, version)) = loader::found() {
            l.path = Some(path.clone());
            l.version = Some(conv::version_string(*version));
        }
        l
    }

    fn library_lines(_: &Loaded<Hip>) -> Vec<LibraryInfo> {
        vec![
            compiler_info(
                "hiprtc",
                loader::hiprtc().map(|r| (r.path().to_string(), r.version())),
            ),
            match loader::rocblas() {
                Ok((api, path)) => LibraryInfo::found(
                    "BLAS",
                    "rocBLAS",
                    path.clone(),
                    loader::rocblas_version(api),
                ),
                Err(e) => LibraryInfo::missing(
                    "BLAS",
                    "rocBLAS",
                    format!("{e}; matmul runs the portable GEMM"),
                ),
            },
        ]
    }

    fn open_device(loaded: &Loaded<Hip>, id: DeviceId) -> Result<Arc<GpuDevice<Hip>>> {
        device::open(loaded.rt, id)
    }

    fn test_kernels(device: &HipDevice) -> Option<ModuleSource> {
        match device::test_kernels(device) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!(target: "unihal::kernel", "no test kernels for {}: {e}", device.core().id);
                None
            }
        }
    }
}
