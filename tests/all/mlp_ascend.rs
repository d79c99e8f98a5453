//! The MLP of `support/mlp.rs`, unchanged, on the Ascend backend through the simulated CANN stack
//! (Ascend910B2, the simulator's default SoC: every op it needs is an aclnn operator or a
//! composition there): the same loss bar and allocator bar as on the CPU.
//!
//! On the Atlas 910 (Ascend910A) it cannot run as written; `tests/all/mlp_ascend_910a.rs` checks
//! that the capabilities say why: no f32 matmul (the 910 refuses f32 with KEEP_DTYPE; through
//! f16 it would not be f32), and none of the AMP operators the bf16 variant uses.

// The allocation-trace replay of the shared MLP is the CPU test's.
use crate::mlp;

use std::sync::Arc;
use unihal::{Backend, DType, Device};

fn ascend() -> Arc<dyn Device> {
    static DEV: std::sync::OnceLock<Arc<dyn Device>> = std::sync::OnceLock::new();
    DEV.get_or_init(|| {
        unihal_sim_cann::layout::install_for_tests(
            "mlp-ascend",
            unihal_sim_cann::layout::Layout::Split,
            1,
        )
        .expect("the simulated CANN install");
        let dev = unihal_ascend::AscendBackend::new()
            .open(0)
            .expect("the simulated NPU");
        assert!(dev.info().name.contains("simulated"), "{}", dev.info().name);
        dev
    })
    .clone()
}

#[test]
fn mlp_trains_in_f32_on_ascend() {
    if crate::own_process() {
        return;
    }
    mlp::check(DType::F32, Some(ascend()));
}

#[test]
fn mlp_trains_in_bf16_with_f32_master_weights_on_ascend() {
    if crate::own_process() {
        return;
    }
    mlp::check(DType::Bf16, Some(ascend()));
}
