//! The caching allocator against the backend's raw allocation, measured in the same run, and the
//! memory efficiency of a training workload's allocation trace.
//!
//! * `alloc_free/caching_hit/<size>` vs `alloc_free/device/<size>`: allocate and free one buffer
//!   from a warm cache, against `Device::alloc` and drop on the CPU backend (an aligned `calloc`
//!   with accounting).
//! * `mlp_trace` (printed before the timings): the allocation trace of `tests/mlp_training.rs`
//!   (its first 10 steps, recorded by the allocator), every size scaled so the peak allocation
//!   passes 1 GiB, replayed on a fresh allocator: peak allocated / peak reserved, and
//!   `Device::alloc` calls per step. Fails when the ratio is below 0.90 or a step after the
//!   second calls the device.
//!
//! Run: `cargo bench --bench alloc`.

#[path = "../tests/support/mlp.rs"]
#[allow(dead_code)]
mod mlp;

use criterion::Criterion;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use unihal::alloc::{AllocatorConfig, CachingAllocator, TraceEvent};
use unihal::{Backend, DType, Device};

fn device(memory: &str) -> Arc<dyn Device> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some(memory), Some("1")).unwrap();
    unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap()
}

const GIB: u64 = 1 << 30;
const TRACE_STEPS: usize = 10;

fn mlp_trace() {
    let mut steps: Vec<Vec<TraceEvent>> = Vec::new();
    mlp::train(DType::F32, |i, a| {
        if i < TRACE_STEPS {
            steps.push(a.take_history());
        }
    });
    // The unscaled peak of live requested bytes, to choose the scale.
    let (mut live, mut peak, mut sizes) = (0u64, 0u64, HashMap::new());
    for e in steps.iter().flatten() {
        match *e {
            TraceEvent::Alloc { id, size, .. } => {
                sizes.insert(id, size);
                live += size;
                peak = peak.max(live);
            }
            TraceEvent::Free { id } => live -= sizes[&id],
        }
    }
    let scale = GIB.div_ceil(peak);
    let dev = device("64G");
    let s = dev.create_stream().unwrap();
    // `UNIHAL_ALLOC_CONF` applies (e.g. `max_split_size_mb:64`), to compare settings.
    let a = CachingAllocator::from_env(dev).unwrap();
    let mut held = HashMap::new();
    let mut calls = Vec::new();
    for events in &steps {
        for e in events {
            match *e {
                TraceEvent::Alloc { id, size, .. } => {
                    held.insert(id, a.alloc(&s, (size * scale) as usize).unwrap());
                }
                TraceEvent::Free { id } => {
                    held.remove(&id);
                }
            }
        }
        calls.push(a.stats().num_device_alloc);
    }
    let st = a.stats();
    let (pa, pr) = (st.allocated_bytes.all.peak, st.reserved_bytes.all.peak);
    let ratio = pa as f64 / pr as f64;
    let events: usize = steps.iter().map(Vec::len).sum();
    println!(
        "mlp_trace: {events} events over {} steps, sizes x{scale}: peak requested {:.3} GiB, \
         peak allocated {:.3} GiB, peak reserved {:.3} GiB, allocated/reserved {ratio:.3}; \
         Device::alloc calls after each step {calls:?}",
        steps.len(),
        (peak * scale) as f64 / GIB as f64,
        pa as f64 / GIB as f64,
        pr as f64 / GIB as f64,
    );
    assert!(pa >= GIB, "peak allocation {pa} below 1 GiB");
    assert!(ratio >= 0.90, "allocated/reserved {ratio:.3} below 0.90");
    assert!(
        calls[2..].iter().all(|&c| c == calls[1]),
        "Device::alloc after step 2: {calls:?}"
    );
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
