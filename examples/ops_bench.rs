//! Times ops on the CPU backend for `benches/ops_vs_numpy.py`: one op on f32 data, `reps` times,
//! and a device-to-device copy of the op's input bytes as the bandwidth yardstick, printing one
//! JSON line of medians.
//!
//! Run: `cargo run --release --example ops_bench -- <op> <dims...> <reps>` with
//! `add <n>`, `sum <rows> <cols>`, `softmax <rows> <cols>`, `layer_norm <rows> <cols>` or
//! `matmul <n>` (n x n x n), `mm <m> <k> <n>` (an m x k by k x n matmul). Uses one virtual device with `UNIHAL_CPU_THREADS` compute threads
//! (default 1).

use std::time::Instant;
use unihal::{Backend, DType, FillValue, OpCall, OpId, RngState, Scalar, TensorView};

use unihal::bench::median;

fn main() -> Result<(), unihal::HalError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let op = args
        .first()
        .map(String::as_str)
        .unwrap_or("add")
        .to_string();
    let nums: Vec<u64> = args[1.min(args.len())..]
        .iter()
        .filter_map(|a| a.parse().ok())
        .collect();
    let dims_needed = match op.as_str() {
        "add" | "matmul" => 1,
        "mm" => 3,
        _ => 2,
    };
    let default_dims: Vec<u64> = match op.as_str() {
        "add" => vec![32 << 20],
        "matmul" => vec![2048],
        "mm" => vec![2048, 64, 256],
        _ => vec![8192, 4096],
    };
    let dims: Vec<u64> = if nums.len() > dims_needed {
        nums[..dims_needed].to_vec()
    } else {
        default_dims
    };
    let reps = nums.get(dims_needed).copied().unwrap_or(7) as usize;
    let threads = std::env::var("UNIHAL_CPU_THREADS").ok();
    let cfg =
        unihal_cpu::CpuConfig::from_values(Some("1"), None, threads.as_deref().or(Some("1")))?;
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0)?;
    let s = dev.create_stream()?;
    let (in_shape, out_shape): (Vec<u64>, Vec<u64>) = match op.as_str() {
        "add" => (dims.clone(), dims.clone()),
        "matmul" => (vec![dims[0], dims[0]], vec![dims[0], dims[0]]),
        "mm" => (vec![dims[0], dims[1]], vec![dims[0], dims[2]]),
        "sum" => (dims.clone(), vec![dims[0], 1]),
        _ => (dims.clone(), dims.clone()),
    };
    let n_in: u64 = in_shape.iter().product();
    let n_out: u64 = out_shape.iter().product();
    let buf = |n: u64| dev.alloc(n as usize * 4);
    // mm's right operand is k x n; every other op's second input has the first's shape. The
    // second buffer is also the copy yardstick's destination (n_in elements).
    let b_shape = match op.as_str() {
        "mm" => vec![dims[1], dims[2]],
        _ => in_shape.clone(),
    };
    let n_x2 = n_in.max(b_shape.iter().product());
    let (x, x2, y) = (buf(n_in)?, buf(n_x2)?, buf(n_out)?);
    let rows = dims[0];
    let (w, b, st1, st2) = (
        buf(dims[dims.len() - 1])?,
        buf(dims[dims.len() - 1])?,
        buf(rows)?,
        buf(rows)?,
    );
    let t = |b: &unihal::Buffer, shape: &[u64]| TensorView::contiguous(b, DType::F32, shape);
    s.run_op(&OpCall::normal(
        t(&x, &in_shape),
        0.0,
        1.0,
        RngState { seed: 1, offset: 0 },
    ))?;
    s.run_op(&OpCall::normal(
        t(&x2, &b_shape),
        0.0,
        1.0,
        RngState { seed: 2, offset: 0 },
    ))?;
    s.fill(&y, 0, n_out * 4, FillValue::U32(0))?;
    let cols = *dims.last().unwrap();
    s.run_op(&OpCall::fill(t(&w, &[cols]), Scalar::F64(1.0)))?;
    s.run_op(&OpCall::fill(t(&b, &[cols]), Scalar::F64(0.0)))?;
    s.synchronize()?;
    let call = match op.as_str() {
        "add" => OpCall::binary(
            OpId::Add,
            t(&x, &in_shape),
            t(&x2, &in_shape),
            t(&y, &out_shape),
        ),
        "sum" => OpCall::reduce(OpId::ReduceSum, t(&x, &in_shape), t(&y, &out_shape), 1),
        "softmax" => OpCall::softmax(OpId::Softmax, t(&x, &in_shape), t(&y, &out_shape)),
        "layer_norm" => OpCall::layer_norm(
            t(&x, &in_shape),
            t(&w, &[cols]),
            t(&b, &[cols]),
            t(&y, &out_shape),
            t(&st1, &[rows]),
            t(&st2, &[rows]),
            1e-5,
        ),
        "matmul" | "mm" => OpCall::matmul(
            t(&x, &in_shape),
            t(&x2, &b_shape),
            t(&y, &out_shape),
            1.0,
            0.0,
        ),
        other => {
            eprintln!("unknown op {other}: add, sum, softmax, layer_norm, matmul or mm");
            std::process::exit(2);
        }
    };
    let (mut t_op, mut t_copy) = (Vec::new(), Vec::new());
    s.run_op(&call)?; // warm-up
    s.synchronize()?;
    for _ in 0..reps {
        let t0 = Instant::now();
        s.run_op(&call)?;
        s.synchronize()?;
        t_op.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        s.copy_d2d(&x, 0, &x2, 0, n_in * 4)?;
        s.synchronize()?;
        t_copy.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "{{\"op\": \"{op}\", \"dims\": {dims:?}, \"isa\": \"{}\", \"op_s\": {:.6}, \"copy_s\": {:.6}}}",
        unihal_kernels::cpu::Isa::selected().name(),
        median(t_op),
        median(t_copy)
    );
    Ok(())
}
