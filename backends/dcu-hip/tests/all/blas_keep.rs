//! A library matmul through (simulated) rocBLAS is one enqueue with the operands it keeps: a
//! failure of the next call that makes the device current can no longer drop them under the
//! queued GEMM (RELIABILITY.md, defect 24: they were kept by a second enqueue; when that one
//! failed, a 256-byte operand was freed under the GEMM, the free refused, the memory leaked).
//! Deferred mode: the GEMM stays queued until the synchronisation.

use crate::support;

use unihal_conformance::faults::{sim::SimInjector, Injector};
use unihal_hal::{Backend, DType, OpCall, TensorView};

#[test]
fn a_matmul_keeps_its_operands_in_the_enqueue_that_queues_it() {
    if crate::own_process() {
        return;
    }
    let backend =
        support::simulated(&[("UNIHAL_SIM_MODE", "deferred"), ("UNIHAL_SIM_DEVICES", "1")]);
    let dev = backend.open(0).unwrap();
    let s = dev.create_stream().unwrap();
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (a, b, c) = (
        dev.alloc(16).unwrap(),
        dev.alloc(16).unwrap(),
        dev.alloc(16).unwrap(),
    );
    s.write(&a, 0, &f32s(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    s.write(&b, 0, &f32s(&[1.0, 0.0, 0.0, 1.0])).unwrap();
    let view = |x| TensorView::contiguous(x, DType::F32, &[2, 2]);
    let inj = SimInjector::open(
        &unihal_sim_hip::built_library(),
        "the simulated HIP runtime",
    )
    .unwrap();
    // The matmul's own call succeeds; the next one that makes the device current fails.
    inj.arm("hipSetDevice", 2, 999);
    let r = s.run_op(&OpCall::matmul(view(&a), view(&b), view(&c), 1.0, 0.0));
    inj.disarm();
    r.unwrap();
    drop((a, b));
    let mut out = [0u8; 16];
    s.read(&c, 0, &mut out).unwrap();
    assert_eq!(out.to_vec(), f32s(&[1.0, 2.0, 3.0, 4.0]));
}
