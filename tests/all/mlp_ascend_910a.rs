//! The MLP on the Atlas 910 profile (simulated `Ascend910A`): the capability gap that keeps it
//! from running as written is stated by the device, and a call into the gap is a typed
//! `Unsupported`, never a wrong result. The 910 refuses f32 matmul with `KEEP_DTYPE` (it computes
//! f32 products through f16, which is not an f32 matmul), and has none of the AMP operators the
//! bf16 variant needs (`aclnnForeachNonFiniteCheckAndUnscale`, `aclnnAmpUpdateScale`).

use unihal::{Backend, DType, HalError, OpCall, OpId, TensorView};

#[test]
fn the_910_states_what_the_mlp_lacks() {
    if crate::own_process() {
        return;
    }
    unihal_sim_cann::layout::install_for_tests(
        "mlp-910a",
        unihal_sim_cann::layout::Layout::Classic,
        1,
    )
    .expect("the simulated CANN install");
    std::env::set_var("UNIHAL_SIM_SOC", "Ascend910A");
    let dev = unihal_ascend::AscendBackend::new()
        .open(0)
        .expect("the simulated NPU");
    let caps = dev.capabilities();
    assert_eq!(caps.optional.arch.as_deref(), Some("Ascend910A"));
    assert!(
        !caps.supports(OpId::Matmul, DType::F32),
        "no f32 matmul on the 910"
    );
    assert!(
        caps.supports(OpId::Matmul, DType::F16),
        "f16 matmul is the 910's"
    );
    for op in [OpId::AmpUnscale, OpId::AmpUpdateScale] {
        assert!(
            !caps.optional.ops.contains_key(&op),
            "{op} is not on the 910"
        );
    }
    // What the MLP runs besides: present, through operators or compositions.
    for op in [
        OpId::Add,
        OpId::Relu,
        OpId::ReluBackward,
        OpId::CrossEntropy,
        OpId::CrossEntropyBackward,
        OpId::ReduceSum,
        OpId::AdamW,
        OpId::Argmax,
    ] {
        assert!(caps.supports(op, DType::F32), "{op} in f32");
    }
    let s = dev.create_stream().unwrap();
    let b = dev.alloc(64).unwrap();
    let m = TensorView::contiguous(&b, DType::F32, &[2, 2]);
    let e = s
        .run_op(&OpCall::matmul(m.clone(), m.clone(), m, 1.0, 0.0))
        .unwrap_err();
    assert!(matches!(e, HalError::Unsupported { .. }), "{e:?}");
}
