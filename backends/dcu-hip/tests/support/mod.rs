//! Shared by the tests that run the HIP backend on the simulated HIP runtime.
#![allow(dead_code)] // each test uses what it needs

use std::sync::Arc;
use unihal_conformance::manifest::Manifest;
use unihal_conformance::runner::{run_non_op_cases, Target};
use unihal_hal::{Backend, Device};
use unihal_hip::HipBackend;

/// The backend on the simulated runtime, RCCL and rocBLAS (`libunihal_sim_hip.so`), with the simulator
/// settings `env` (set before the runtime loads; each test binary loads it once).
pub fn simulated(env: &[(&str, &str)]) -> Arc<HipBackend> {
    let lib = unihal_sim_hip::built_library();
    std::env::set_var("UNIHAL_HIP_LIB", &lib);
    std::env::set_var("UNIHAL_RCCL_LIB", &lib);
    std::env::set_var("UNIHAL_ROCBLAS_LIB", &lib);
    std::env::set_var("UNIHAL_SIM_NCCL_FLAVOR", "rccl");
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    Arc::new(HipBackend::new())
}

/// Runs every conformance case that is not a library op or a collective (those need hiprtc and
/// run through `unihal conformance --backend hip` in CI) on `device`; returns how many passed.
/// A skip is allowed only for a kernel running concurrently with the host (deferred mode) and,
/// on a machine without hiprtc, for the test kernels it compiles and the capture of library ops
/// (captured ops run the kernel library, which hiprtc compiles).
pub fn non_op_cases(backend: Arc<HipBackend>, device: Arc<dyn Device>) -> usize {
    let has_hiprtc = unihal_hip::loader::hiprtc().is_ok();
    let t = Target {
        device,
        backend: backend as Arc<dyn Backend>,
        manifest: Manifest::default(),
        world: None,
    };
    run_non_op_cases(&t, |reason| {
        reason.contains("concurrently with the host")
            || (!has_hiprtc
                && (reason.contains("test kernels") || reason.contains("cannot capture Ops")))
    })
    .unwrap_or_else(|e| panic!("{e}"))
}
