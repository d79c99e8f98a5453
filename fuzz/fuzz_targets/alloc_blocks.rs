//! Blocks of the caching allocator (`unihal-alloc`) on the CPU backend (two virtual devices,
//! 64 MiB each, collectives across them): see `unihal_fuzz::alloc_blocks`.
#![no_main]

use std::sync::{Arc, OnceLock};
use unihal_cpu::{CpuBackend, CpuConfig};
use unihal_hal::Backend;

fn backend() -> &'static Arc<dyn Backend> {
    static B: OnceLock<Arc<dyn Backend>> = OnceLock::new();
    B.get_or_init(|| {
        // The fixed defect planted back (`UNIHAL_FUZZ_PLANTED=uncounted-slice`): a view does
        // not count as a handle, so dropping one frees its block; this target must fail on it.
        unihal_hal::planted::set_uncounted_slice(unihal_fuzz::planted::uncounted_slice());
        let config = CpuConfig::from_values(Some("2"), Some("64M"), Some("1")).expect("config");
        Arc::new(CpuBackend::with_config(config))
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| unihal_fuzz::alloc_blocks::run(backend(), data));
