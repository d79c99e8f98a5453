//! The caching allocator against the backend's raw allocation, measured in the same run, and the
//! memory efficiency of a training workload's allocation trace.
//!
//! * `alloc_free/caching_hit/<size>` vs `alloc_free/device/<size>`: allocate and free one buffer
//!   from a warm cache, against `Device::alloc` and drop on the CPU backend (an aligned `calloc`
//!   with accounting).
//! * `mlp_trace` (printed before the timings): the allocation trace of `tests/all/mlp_training.rs`
//!   (its first 10 steps, recorded by the allocator), every size scaled so the peak allocation
//!   passes 1 GiB, replayed on a fresh allocator (`mlp::trace_replay`): peak allocated / peak
//!   reserved, and `Device::alloc` calls per step, against PyTorch's best-fit rule
//!   (`thrifty:false`) replayed in the same run. Fails when unihal's ratio is below 0.90 or a
//!   step after the second calls the device.
//!
//! Run: `cargo bench --bench alloc`.

#[path = "../tests/support/mlp.rs"]
#[allow(dead_code)]
mod mlp;

use criterion::Criterion;
use std::sync::Arc;
use std::time::Duration;
use unihal::alloc::{AllocatorConfig, CachingAllocator};
use unihal::{Backend, Device};

fn device(memory: &str) -> Arc<dyn Device> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some(memory), Some("1")).unwrap();
    unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap()
}

fn mlp_trace() {
    let ours = mlp::trace_replay(AllocatorConfig::default());
    let pytorch = mlp::trace_replay(AllocatorConfig {
        thrifty: false,
        ..AllocatorConfig::default()
    });
    println!("mlp_trace unihal: {ours}");
    println!("mlp_trace PyTorch's best fit (thrifty:false): {pytorch}");
    println!(
        "mlp_trace allocated/reserved: unihal {:.3}, PyTorch's rule {:.3}",
        ours.efficiency(),
        pytorch.efficiency()
    );
    ours.check();
}

fn alloc_free(c: &mut Criterion) {
    let dev = device("8G");
    let s = dev.create_stream().unwrap();
    let a = CachingAllocator::new(dev.clone(), AllocatorConfig::default()).unwrap();
    let mut g = c.benchmark_group("alloc_free");
    for (name, size) in [("512B", 512usize), ("64KiB", 64 << 10), ("4MiB", 4 << 20)] {
        drop(a.alloc(&s, size).unwrap()); // warm the cache
        g.bench_function(format!("caching_hit/{name}"), |b| {
            b.iter(|| drop(std::hint::black_box(a.alloc(&s, size).unwrap())))
        });
        g.bench_function(format!("device/{name}"), |b| {
            b.iter(|| drop(std::hint::black_box(dev.alloc(size).unwrap())))
        });
    }
    g.finish();
}

fn main() {
    mlp_trace();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    alloc_free(&mut c);
    c.final_summary();
}
