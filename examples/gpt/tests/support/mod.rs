//! The backend a test runs on: `UNIHAL_GPT_BACKEND` names it (CI sets it, with the variables that
//! point the backend at its simulated runtime, once per backend); unset, the Ascend backend on the
//! simulated CANN stack, which every build can make. A named backend that is not there fails the
//! test, never skips it.

use std::sync::Arc;
use unihal::Backend;

/// Devices every backend under test must have (the largest data-parallel run).
pub const DEVICES: usize = 4;

pub fn backend_under_test() -> Arc<dyn Backend> {
    static B: std::sync::OnceLock<Arc<dyn Backend>> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        let name = std::env::var("UNIHAL_GPT_BACKEND").unwrap_or_else(|_| "ascend".into());
        if name == "ascend" && std::env::var_os("UNIHAL_ASCEND_LIB").is_none() {
            unihal_sim_cann::layout::install_for_tests(
                "gpt-cann",
                unihal_sim_cann::layout::Layout::Classic,
                DEVICES,
            )
            .expect("the simulated CANN install");
        }
        let b = unihal::registry()
            .get(&name)
            .expect("UNIHAL_GPT_BACKEND names a backend");
        let n = b
            .probe()
            .unwrap_or_else(|e| panic!("backend {name} has no devices: {e}"));
        assert!(
            n >= DEVICES,
            "backend {name} has {n} devices, the tests need {DEVICES}"
        );
        b
    })
    .clone()
}

pub fn cpu() -> Arc<dyn Backend> {
    unihal::registry().get("cpu").unwrap()
}
