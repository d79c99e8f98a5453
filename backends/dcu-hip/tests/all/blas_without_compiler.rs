//! A machine with rocBLAS but no runtime compiler keeps BLAS matmul: the device reports matmul
//! in rocBLAS's element types (and no other library op), a matmul runs exactly, and a layout
//! rocBLAS cannot express is a typed `Unsupported`, not an "unavailable" failure. hiprtc is hidden
//! for this binary (`UNIHAL_HIPRTC_LIB` naming a file that does not exist), as on a bare machine
//! with rocBLAS installed. Before the fix the device reported no ops at all and every matmul
//! failed with "Unsupported: op matmul in f32".

use crate::support;

use unihal_hal::{Backend, DType, HalError, OpCall, OpId, TensorView};

#[test]
fn matmul_runs_through_rocblas_without_hiprtc() {
    if crate::own_process() {
        return;
    }
    std::env::set_var("UNIHAL_HIPRTC_LIB", "/nonexistent/libhiprtc.so");
    let backend = support::simulated(&[("UNIHAL_SIM_DEVICES", "1")]);
    assert!(
        unihal_hip::loader::hiprtc().is_err(),
        "hiprtc should be hidden for this test"
    );
    let dev = backend.open(0).unwrap();
    let ops = &dev.capabilities().optional.ops;
    assert_eq!(
        ops.keys().copied().collect::<Vec<_>>(),
        vec![OpId::Matmul],
        "only rocBLAS's matmul without a compiler: {ops:?}"
    );
    for d in [DType::F32, DType::F64, DType::F16, DType::Bf16] {
        assert!(dev.capabilities().supports(OpId::Matmul, d), "{d}");
    }
    let s = dev.create_stream().unwrap();
    let f32s = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let (a, b, c) = (
        dev.alloc(24).unwrap(),
        dev.alloc(24).unwrap(),
        dev.alloc(16).unwrap(),
    );
    // [2, 3] · [3, 2]
    s.write(&a, 0, &f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
        .unwrap();
    s.write(&b, 0, &f32s(&[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]))
        .unwrap();
    let va = TensorView::contiguous(&a, DType::F32, &[2, 3]);
    let vb = TensorView::contiguous(&b, DType::F32, &[3, 2]);
    let vc = TensorView::contiguous(&c, DType::F32, &[2, 2]);
    s.run_op(&OpCall::matmul(
        va.clone(),
        vb.clone(),
        vc.clone(),
        1.0,
        0.0,
    ))
    .unwrap();
    let mut out = [0u8; 16];
    s.read(&c, 0, &mut out).unwrap();
    assert_eq!(out.to_vec(), f32s(&[4.0, 5.0, 10.0, 11.0]));

    // A transposed output is a layout the BLAS call cannot express (gemm_of refuses it).
    let mut vt = vc.clone();
    vt.strides = vec![1, 2];
    match s.run_op(&OpCall::matmul(va, vb, vt, 1.0, 0.0)) {
        Err(HalError::Unsupported { what }) => {
            assert!(what.contains("kernel library is unavailable"), "{what}")
        }
        other => panic!("a layout rocBLAS cannot express: {other:?}"),
    }
    s.synchronize().unwrap();
}
