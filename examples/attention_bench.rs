//! Times the fused attention op on the CPU backend for `benches/attention_vs_torch.py`: the
//! forward pass, and the forward plus backward pass, of f32 `(B, H, S, D)` attention, `reps`
//! times each, printing one JSON line of medians.
//!
//! Run: `cargo run --release --example attention_bench -- <B> <H> <S> <D> <causal 0|1> <reps>`.
//! Uses one virtual device with `UNIHAL_CPU_THREADS` compute threads (default 1).

use std::time::Instant;
use unihal::bench::median;
use unihal::{AttentionOptions, Backend, DType, OpCall, RngState, TensorView};

fn main() -> Result<(), unihal::HalError> {
    let nums: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: B H S D causal reps"))
        .collect();
    let [b, h, s, d, causal, reps] = nums[..] else {
        eprintln!("usage: attention_bench B H S D CAUSAL(0|1) REPS");
        std::process::exit(2);
    };
    let threads = std::env::var("UNIHAL_CPU_THREADS").ok();
    let cfg =
        unihal_cpu::CpuConfig::from_values(Some("1"), None, threads.as_deref().or(Some("1")))?;
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0)?;
    let st = dev.create_stream()?;
    let shape = [b, h, s, d];
    let n = (b * h * s * d) as usize;
    let t = |buf: &unihal::Buffer, shape: &[u64]| TensorView::contiguous(buf, DType::F32, shape);
    let tensor = |seed: u64| -> Result<TensorView, unihal::HalError> {
        let v = t(&dev.alloc(n * 4)?, &shape);
        st.run_op(&OpCall::normal(
            v.clone(),
            0.0,
            1.0,
            RngState { seed, offset: 0 },
        ))?;
        Ok(v)
    };
    let (q, k, v, dout) = (tensor(1)?, tensor(2)?, tensor(3)?, tensor(4)?);
    let (out, dq, dk, dv) = (tensor(5)?, tensor(6)?, tensor(7)?, tensor(8)?);
    let lse = t(&dev.alloc((b * h * s) as usize * 4)?, &[b, h, s]);
    let o = AttentionOptions {
        causal: causal != 0,
        ..AttentionOptions::new(d)
    };
    let fwd = OpCall::attention(
        q.clone(),
        k.clone(),
        v.clone(),
        None,
        out.clone(),
        lse.clone(),
        o,
    );
    let bwd = OpCall::attention_backward(q, k, v, None, out, dout, lse, dq, dk, dv, o);
    st.run_op(&fwd)?; // warm-up
    st.run_op(&bwd)?;
    st.synchronize()?;
    let (mut t_fwd, mut t_both) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t0 = Instant::now();
        st.run_op(&fwd)?;
        st.synchronize()?;
        t_fwd.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        st.run_op(&fwd)?;
        st.run_op(&bwd)?;
        st.synchronize()?;
        t_both.push(t0.elapsed().as_secs_f64());
    }
    println!(
        "{{\"shape\": {shape:?}, \"causal\": {}, \"fwd_s\": {:.6}, \"fwd_bwd_s\": {:.6}}}",
        causal != 0,
        median(t_fwd),
        median(t_both)
    );
    Ok(())
}
