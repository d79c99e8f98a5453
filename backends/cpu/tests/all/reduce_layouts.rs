//! A reduction gives bit-identical results whatever the layout of the reduced axis: along a
//! dense axis (the row walk with lane partials) and along a strided one whose consecutive outputs
//! are consecutive in memory (the column-tiled walk of a leading-axis reduction, e.g. a bias
//! gradient). Values of mixed magnitude make any change of summation order visible.

use unihal_hal::{Backend, DType, OpCall, OpId, TensorView};

fn f32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn leading_axis_reductions_match_dense_axis_reductions_bit_for_bit() {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("1G"), Some("2")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    let s = dev.create_stream().unwrap();
    // 67 rows (not a multiple of the 16 lanes) by 45 columns (two full tiles and a partial one).
    let (rows, cols) = (67u64, 45u64);
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let x: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let m = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 10f32.powi((state % 9) as i32 - 4)
        })
        .collect();
    // x as [rows, cols] and its transpose stored densely as [cols, rows].
    let xt: Vec<f32> = (0..cols * rows)
        .map(|i| x[((i % rows) * cols + i / rows) as usize])
        .collect();
    let upload = |v: &[f32]| {
        let b = dev.alloc(v.len() * 4).unwrap();
        let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
        s.write(&b, 0, &bytes).unwrap();
        b
    };
    let (bx, bxt) = (upload(&x), upload(&xt));
    for op in [
        OpId::ReduceSum,
        OpId::ReduceMean,
        OpId::ReduceMax,
        OpId::ReduceMin,
    ] {
        let strided_out = dev.alloc(cols as usize * 4).unwrap();
        let dense_out = dev.alloc(cols as usize * 4).unwrap();
        // Over axis 0 of [rows, cols]: a strided axis, consecutive outputs consecutive in x.
        s.run_op(&OpCall::reduce(
            op,
            TensorView::contiguous(&bx, DType::F32, &[rows, cols]),
            TensorView::contiguous(&strided_out, DType::F32, &[1, cols]),
            0,
        ))
        .unwrap();
        // The same sums over the dense axis 1 of the transposed copy.
        s.run_op(&OpCall::reduce(
            op,
            TensorView::contiguous(&bxt, DType::F32, &[cols, rows]),
            TensorView::contiguous(&dense_out, DType::F32, &[cols, 1]),
            1,
        ))
        .unwrap();
        let mut a = vec![0u8; cols as usize * 4];
        let mut b = vec![0u8; cols as usize * 4];
        s.read(&strided_out, 0, &mut a).unwrap();
        s.read(&dense_out, 0, &mut b).unwrap();
        assert_eq!(
            f32s(&a),
            f32s(&b),
            "{op}: leading-axis and dense-axis results differ"
        );
    }
}
