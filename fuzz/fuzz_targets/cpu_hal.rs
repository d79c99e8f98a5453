//! Public HAL calls on the CPU backend (two virtual devices, 64 MiB each, collectives included).
#![no_main]

use std::sync::{Arc, OnceLock};
use unihal_cpu::{CpuBackend, CpuConfig};
use unihal_fuzz::Target;

fn target() -> &'static Target {
    static T: OnceLock<Target> = OnceLock::new();
    T.get_or_init(|| {
        let config = CpuConfig::from_values(Some("2"), Some("64M"), Some("1")).expect("config");
        Target {
            backend: Arc::new(CpuBackend::with_config(config)),
            zeroed_device_memory: true,
            vendor_errors: false,
        }
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| unihal_fuzz::run(target(), data));
