//! Public HAL calls on the CUDA backend over unihal's simulated CUDA driver and NCCL (two
//! simulated devices, concurrent mode), built in this fuzz build with the same sanitizer.
//! `UNIHAL_CUDA_LIB` chooses the simulated driver; by default the one next to this binary's build.
#![no_main]

use std::sync::{Arc, OnceLock};
use unihal_fuzz::Target;

fn target() -> &'static Target {
    static T: OnceLock<Target> = OnceLock::new();
    T.get_or_init(|| {
        if std::env::var_os("UNIHAL_CUDA_LIB").is_none() {
            // target/<triple>/release/cuda_sim_hal -> target/<triple>/release/deps/
            let exe = std::env::current_exe().expect("current exe");
            let lib = exe.with_file_name("deps").join("libunihal_sim_cuda.so");
            std::env::set_var("UNIHAL_CUDA_LIB", &lib);
        }
        let lib = std::env::var_os("UNIHAL_CUDA_LIB").expect("set above");
        std::env::set_var("UNIHAL_NCCL_LIB", &lib);
        std::env::set_var("UNIHAL_SIM_DEVICES", "2");
        std::env::set_var("UNIHAL_SIM_MODE", "concurrent");
        std::env::set_var("UNIHAL_SIM_MEMORY", "67108864");
        if std::env::var_os("UNIHAL_KERNEL_CACHE").is_none() {
            // Compiled kernels from a cache dir the caller names (CI fills one before fuzzing);
            // otherwise NVRTC compiles the library once per process, if it is on the path.
            std::env::set_var("UNIHAL_KERNEL_CACHE", "off");
        }
        let backend = Arc::new(unihal_cuda::CudaBackend::new());
        use unihal_hal::Backend;
        if let Err(e) = backend.probe() {
            panic!("the simulated CUDA driver did not load ({lib:?}): {e}");
        }
        Target {
            backend,
            zeroed_device_memory: false,
            vendor_errors: true,
        }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| unihal_fuzz::run(target(), data));
