//! Shared by the tests that run the backend on the simulated driver.

use std::path::PathBuf;

/// The simulated driver built for these tests: `target/<profile>/deps/libunihal_sim_cuda.so`
/// (`cargo test`) or `target/<profile>/libunihal_sim_cuda.so` (`cargo build`).
pub fn simulated_driver() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("libunihal_sim_cuda.so"),
        deps.parent().unwrap().join("libunihal_sim_cuda.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| {
        panic!(
            "the simulated driver (libunihal_sim_cuda.so) is not built next to {}",
            deps.display()
        )
    })
}
