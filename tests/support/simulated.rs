//! The CPU backend and the three GPU backends on their simulated runtimes, for tests that run
//! one workload on every backend (tests/fault_sweep.rs, tests/all/stress.rs). Each simulated
//! runtime reads its settings when it loads, once per test binary: two devices, kernels on their
//! own threads as on a GPU.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use unihal::Backend;

fn simulated_devices() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        std::env::set_var("UNIHAL_SIM_DEVICES", "2");
        std::env::set_var("UNIHAL_SIM_MODE", "concurrent");
    });
}

/// A CPU backend of two devices.
pub fn cpu() -> Arc<dyn Backend> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("2"), Some("1G"), Some("1")).unwrap();
    Arc::new(unihal_cpu::CpuBackend::with_config(cfg))
}

/// The simulated CUDA driver and NCCL (one library), set up for [`cuda`].
pub fn cuda_library() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        simulated_devices();
        let lib = unihal_sim_cuda::built_library();
        std::env::set_var("UNIHAL_CUDA_LIB", &lib);
        std::env::set_var("UNIHAL_NCCL_LIB", &lib);
        lib
    })
}

/// A fresh CUDA backend on the simulated driver and NCCL.
pub fn cuda() -> Arc<dyn Backend> {
    cuda_library();
    Arc::new(unihal_cuda::CudaBackend::new())
}

/// The simulated HIP runtime, RCCL and rocBLAS (one library), set up for [`hip`].
pub fn hip_library() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        simulated_devices();
        let lib = unihal_sim_hip::built_library();
        for var in ["UNIHAL_HIP_LIB", "UNIHAL_RCCL_LIB", "UNIHAL_ROCBLAS_LIB"] {
            std::env::set_var(var, &lib);
        }
        std::env::set_var("UNIHAL_SIM_NCCL_FLAVOR", "rccl");
        lib
    })
}

/// A fresh HIP backend on the simulated runtime.
pub fn hip() -> Arc<dyn Backend> {
    hip_library();
    Arc::new(unihal_hip::HipBackend::new())
}

/// The simulated CANN stack's ACL library (classic layout), set up for [`ascend`].
pub fn ascend_library() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        simulated_devices();
        let lib64 = unihal_sim_cann::layout::install_for_tests(
            "simulated-backends",
            unihal_sim_cann::layout::Layout::Classic,
            2,
        )
        .expect("the simulated CANN install");
        lib64.join("libascendcl.so")
    })
}

/// A fresh Ascend backend on the simulated CANN stack.
pub fn ascend() -> Arc<dyn Backend> {
    ascend_library();
    Arc::new(unihal_ascend::AscendBackend::new())
}

/// Brings the simulated devices to rest: the backends' deferred releases run, and every device
/// runs what its streams queued (a simulated device makes progress in runtime calls, where a GPU
/// does on its own), releases queued behind work included.
pub fn quiesce(make: fn() -> Arc<dyn Backend>) {
    unihal_gpu::deferred::flush();
    let backend = make();
    for ordinal in 0..2 {
        if let Ok(dev) = backend.open(ordinal) {
            let _ = dev.synchronize();
        }
    }
    drop(backend);
    unihal_gpu::deferred::flush();
}
