//! Times elementwise ops on the CPU backend for `benches/ops_vs_numpy.py`: f32 add and a
//! device-to-device copy of the same array, `reps` times each, printing one JSON line of medians.
//!
//! Run: `cargo run --release --example ops_bench -- [elements] [reps]` (defaults 33554432, 7).
//! Uses one virtual device with one compute thread unless `UNIHAL_CPU_THREADS` says otherwise.

use std::time::Instant;
use unihal::{Backend, DType, FillValue, OpCall, OpId, TensorView};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), unihal::HalError> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(32 << 20);
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(7);
    let threads = std::env::var("UNIHAL_CPU_THREADS").ok();
    let cfg =
        unihal_cpu::CpuConfig::from_values(Some("1"), None, threads.as_deref().or(Some("1")))?;
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0)?;
    let s = dev.create_stream()?;
    let bytes = n as usize * 4;
    let (a, b, c) = (dev.alloc(bytes)?, dev.alloc(bytes)?, dev.alloc(bytes)?);
    for (buf, v) in [(&a, 1u32), (&b, 2), (&c, 0)] {
        s.fill(buf, 0, bytes as u64, FillValue::U32(v))?;
    }
    s.synchronize()?;
    let t = |buf| TensorView::contiguous(buf, DType::F32, &[n]);
    let add = OpCall::binary(OpId::Add, t(&a), t(&b), t(&c));
    let (mut t_add, mut t_copy) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t0 = Instant::now();
        s.run_op(&add)?;
        s.synchronize()?;
        t_add.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        s.copy_d2d(&a, 0, &c, 0, bytes as u64)?;
        s.synchronize()?;
        t_copy.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "{{\"elements\": {n}, \"isa\": \"{}\", \"add_s\": {:.6}, \"copy_s\": {:.6}}}",
        unihal_kernels::cpu::Isa::selected().name(),
        median(t_add),
        median(t_copy)
    );
    Ok(())
}
