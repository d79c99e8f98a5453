//! Shared by the tests that run the backend on the simulated driver.
#![allow(dead_code)] // each test uses what it needs

use std::path::PathBuf;

/// The simulated driver and NCCL built for these tests (one object, `libunihal_sim_cuda.so`).
pub fn simulated_driver() -> PathBuf {
    unihal_sim_cuda::built_library()
}

/// The backend, its devices 0 and 1, and a communicator of one rank on each.
pub type TwoRanks = (
    std::sync::Arc<unihal_cuda::CudaBackend>,
    [std::sync::Arc<dyn unihal_hal::Device>; 2],
    Vec<std::sync::Arc<dyn unihal_hal::Communicator>>,
);

/// A two-rank NCCL communicator on simulated devices 0 and 1: the backend on the simulated
/// driver and NCCL, with the simulator settings `env` (set before the driver loads; each test
/// binary loads it once).
pub fn two_ranks(env: &[(&str, &str)]) -> TwoRanks {
    use unihal_hal::Backend;
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_CUDA_LIB", &lib);
    std::env::set_var("UNIHAL_NCCL_LIB", &lib);
    for (k, v) in env {
        std::env::set_var(k, v);
    }
    let backend = std::sync::Arc::new(unihal_cuda::CudaBackend::new());
    let ccl = backend.collectives().expect("simulated NCCL loads");
    let devs = [backend.open(0).unwrap(), backend.open(1).unwrap()];
    let comms = ccl
        .init_all(&devs, &unihal_hal::CommConfig::default())
        .unwrap();
    (backend, devs, comms)
}

/// The simulated driver's test controls (see `conformance/sim/cuda/src/fault.rs`), called in
/// the same loaded copy of the library as the backend's.
pub mod controls {
    use std::ffi::{c_char, c_int, c_uint, CString};
    use std::sync::OnceLock;

    fn lib() -> &'static libloading::Library {
        static LIB: OnceLock<libloading::Library> = OnceLock::new();
        // SAFETY: the simulated driver, already loaded by the backend (same path, same copy);
        // its initialisers are benign.
        LIB.get_or_init(|| unsafe { libloading::Library::new(super::simulated_driver()) }.unwrap())
    }

    /// The calling thread's `n`th call (from now) of entry point `name` returns `code`.
    pub fn fail(name: &str, n: u32, code: i32) {
        let name = CString::new(name).unwrap();
        // SAFETY: the signature of `unihal_sim_fail`; a NUL-terminated name.
        let r = unsafe {
            let f = lib()
                .get::<unsafe extern "C" fn(*const c_char, c_uint, c_int) -> c_int>(
                    b"unihal_sim_fail",
                )
                .unwrap();
            f(name.as_ptr(), n, code)
        };
        assert_eq!(r, 0);
    }

    /// Disarms the calling thread's injected failures.
    pub fn clear() {
        // SAFETY: the signature of `unihal_sim_fail_clear`.
        unsafe {
            lib()
                .get::<unsafe extern "C" fn()>(b"unihal_sim_fail_clear")
                .unwrap()()
        }
    }

    /// The violations the simulator recorded in this process, and the latest one's message.
    pub fn violations() -> (u32, String) {
        let mut buf = vec![0 as c_char; 1024];
        // SAFETY: the signature of `unihal_sim_last_violation`; a buffer of its length.
        let n = unsafe {
            let f = lib()
                .get::<unsafe extern "C" fn(*mut c_char, usize) -> c_uint>(
                    b"unihal_sim_last_violation",
                )
                .unwrap();
            f(buf.as_mut_ptr(), buf.len())
        };
        // SAFETY: NUL-terminated by the callee.
        let msg = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        (n, msg.to_string_lossy().into_owned())
    }

    /// Starts counting (from zero) every entry point's calls, or stops (`false`).
    pub fn count_calls(on: bool) {
        // SAFETY: the signature of `unihal_sim_count_calls`.
        unsafe {
            lib()
                .get::<unsafe extern "C" fn(c_int)>(b"unihal_sim_count_calls")
                .unwrap()(c_int::from(on))
        }
    }

    /// How many times entry point `name` was called since counting started.
    pub fn calls(name: &str) -> u64 {
        let mut buf = vec![0 as c_char; 1 << 16];
        // SAFETY: the signature of `unihal_sim_calls`; a buffer of its length.
        unsafe {
            lib()
                .get::<unsafe extern "C" fn(*mut c_char, usize) -> usize>(b"unihal_sim_calls")
                .unwrap()(buf.as_mut_ptr(), buf.len())
        };
        // SAFETY: NUL-terminated by the callee.
        let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .find(|(n, _)| *n == name)
            .and_then(|(_, c)| c.trim().parse().ok())
            .unwrap_or(0)
    }
}
