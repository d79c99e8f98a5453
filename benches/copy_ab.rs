//! 256 MiB device-to-device copy on a CPU stream against a plain slice copy of the same bytes,
//! interleaved round by round so that drift and noise on a shared machine hit both sides alike.
//! Prints the median of each and the median of the per-round ratios.
//!
//! Run: `cargo bench --bench copy_ab` (optionally `-- ROUNDS`).

use std::hint::black_box;
use std::time::Instant;
use unihal::Backend;

use unihal::bench::median;

fn main() {
    const LEN: usize = 256 << 20;
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(41);
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), None, Some("1")).unwrap();
    let backend = unihal_cpu::CpuBackend::with_config(cfg);
    let dev = backend.open(0).unwrap();
    let s = dev.create_stream().unwrap();
    let (a, b) = (dev.alloc(LEN).unwrap(), dev.alloc(LEN).unwrap());
    s.fill(&a, 0, LEN as u64, unihal::FillValue::U8(7)).unwrap();
    s.fill(&b, 0, LEN as u64, unihal::FillValue::U8(0)).unwrap();
    s.synchronize().unwrap();
    let src = vec![7u8; LEN];
    let mut dst = vec![1u8; LEN];
    let (mut ours, mut peer, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds + 1 {
        let t0 = Instant::now();
        s.copy_d2d(&a, 0, &b, 0, LEN as u64).unwrap();
        s.synchronize().unwrap();
        let t_ours = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        black_box(&mut dst).copy_from_slice(black_box(&src));
        let t_peer = t0.elapsed().as_secs_f64();
        if round > 0 {
            // round 0 warms both up
            ours.push(t_ours);
            peer.push(t_peer);
            ratio.push(t_peer / t_ours);
        }
    }
    let gib = |t: f64| LEN as f64 / t / (1u64 << 30) as f64;
    let (mo, mp) = (median(ours), median(peer));
    println!("copy 256 MiB, {rounds} interleaved rounds (medians):");
    println!(
        "  unihal cpu copy_d2d + synchronize: {:.2} ms ({:.2} GiB/s)",
        mo * 1e3,
        gib(mo)
    );
    println!(
        "  slice copy_from_slice:             {:.2} ms ({:.2} GiB/s)",
        mp * 1e3,
        gib(mp)
    );
    println!(
        "  speed ratio unihal/slice (median of per-round ratios): {:.3}",
        median(ratio)
    );
}
