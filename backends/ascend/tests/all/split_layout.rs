//! The backend on the split CANN layout (`libacl_rt.so`, `libopapi_math.so`, `libopapi_nn.so`)
//! of the simulated CANN stack, as an Atlas 910 (`Ascend910A`): the runtime and the operators are
//! found across the split libraries, the SoC's table and the phase-1 probe give the
//! capabilities, ops run through aclnn, and every conformance case that is not an op or a
//! collective passes (skips only for raw kernel launches).

use std::sync::Arc;
use unihal_ascend::AscendBackend;
use unihal_conformance::manifest::Manifest;
use unihal_conformance::runner::{run_non_op_cases, Target};
use unihal_hal::{Backend, DType, HalError, OpCall, OpId, TensorView};
use unihal_sim_cann::layout::{self, Layout};

fn backend() -> Arc<AscendBackend> {
    let root = std::env::temp_dir().join(format!("unihal-ascend-split-{}", std::process::id()));
    let lib64 = layout::make(&root, Layout::Split, &unihal_sim_cann::built_library()).unwrap();
    std::env::set_var("UNIHAL_ASCEND_LIB", &lib64);
    std::env::set_var("UNIHAL_SIM_DEVICES", "2");
    std::env::set_var("UNIHAL_SIM_SOC", "Ascend910A");
    std::env::set_var("UNIHAL_SIM_MODE", "concurrent");
    Arc::new(AscendBackend::new())
}

#[test]
fn the_split_layout_on_an_atlas_910() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    assert_eq!(b.probe().unwrap(), 2);
    let info = b.info();
    assert!(
        info.simulated,
        "a simulated runtime must be reported as such"
    );
    assert!(
        info.concurrent,
        "UNIHAL_SIM_MODE=concurrent: the runtime says so through its identity"
    );
    let rt = &info.libraries[0];
    assert!(
        rt.name.contains("split layout") && rt.name.contains("Ascend910A"),
        "{}",
        rt.name
    );
    assert!(
        rt.path
            .as_deref()
            .is_some_and(|p| p.ends_with("libacl_rt.so")),
        "{rt:?}"
    );
    let ops = &info.libraries[1];
    let paths = ops.path.clone().unwrap_or_default();
    assert!(
        paths.contains("libopapi_math.so") && paths.contains("libopapi_nn.so"),
        "{paths}"
    );

    let dev = b.open(0).unwrap();
    assert!(dev.info().name.contains("simulated"), "{}", dev.info().name);
    assert_eq!(dev.info().vendor, "Huawei");
    let caps = dev.capabilities();
    assert_eq!(caps.optional.arch.as_deref(), Some("Ascend910A"));
    assert!(!caps.optional.bitwise_rng, "the NPU's own generator");
    assert!(
        caps.optional.negative_strides_copied,
        "aclnn takes no negative stride"
    );
    // The 910's table: no RMS norm, no Exp, f16 matmul only, no BF16 arithmetic.
    assert!(!caps.optional.ops.contains_key(&OpId::RmsNorm));
    assert!(!caps.optional.ops.contains_key(&OpId::Exp));
    assert_eq!(caps.optional.ops[&OpId::Matmul], vec![DType::F16]);
    assert!(caps.supports(OpId::Add, DType::F32) && !caps.supports(OpId::Add, DType::Bf16));
    assert_eq!(caps.optional.peer_devices, vec![1]);

    // An op through aclnn on a transposed (strided) view, read back.
    let s = dev.create_stream().unwrap();
    let (a, o) = (dev.alloc(24).unwrap(), dev.alloc(24).unwrap());
    let vals: Vec<u8> = [1f32, 2., 3., 4., 5., 6.]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    s.write(&a, 0, &vals).unwrap();
    let at = TensorView::contiguous(&a, DType::F32, &[2, 3]).strided(0, &[1, 2]); // (2,3) view of a 3x2
    let ot = TensorView::contiguous(&o, DType::F32, &[2, 3]);
    s.run_op(&OpCall::binary_scalar(
        OpId::MulScalar,
        at,
        unihal_hal::Scalar::F64(10.0),
        ot,
    ))
    .unwrap();
    let mut back = vec![0u8; 24];
    s.read(&o, 0, &mut back).unwrap();
    let got: Vec<f32> = back
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, vec![10., 30., 50., 20., 40., 60.]);

    // An op × dtype outside the 910's table is Unsupported, never a wrong answer.
    let h = TensorView::contiguous(&o, DType::Bf16, &[4]);
    let e = s
        .run_op(&OpCall::binary(OpId::Add, h.clone(), h.clone(), h))
        .unwrap_err();
    assert!(matches!(e, HalError::Unsupported { .. }), "{e:?}");

    let t = Target {
        device: dev,
        backend: b as Arc<dyn Backend>,
        manifest: Manifest::default(),
        world: None,
    };
    // Stream capture (aclmdlRI) is not in the backend yet: the graph cases skip saying so.
    let ran = run_non_op_cases(&t, |reason| {
        reason.contains("test kernels") || reason.contains("no stream capture")
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(ran >= 60, "only {ran} cases ran");
}
