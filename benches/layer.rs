//! The layer's cost, each case plain, validated and traced in the same run (CPU backend, one
//! device):
//!
//! * `fill_64B`: enqueue of a 64-byte fill (the worker drains meanwhile; synchronised per batch):
//!   validation's per-enqueue bookkeeping (a clock tick, the allocation's records, a commit);
//!   the timeline's host span, timing event and resolution. The traced case starts a fresh trace
//!   for each sample, so that the records of earlier samples do not pile up.
//! * `event_handoff`: a fill on stream A, an event recorded on A and waited on B, a copy on B, and
//!   a synchronisation of B: the clock traffic of a cross-stream dependency.
//! * `counters_off`: what a program without `UNIHAL_TRACE` pays per allocator change for the
//!   timeline's counters (`unihal_hal::counters::sample` with no sink installed). Without
//!   `UNIHAL_TRACE` and `UNIHAL_VALIDATE` nothing else is wrapped: the rest of the layer costs 0.
//!
//! Run: `cargo bench --bench layer`.

use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::Arc;
use std::time::Instant;
use unihal::layer::{wrap, wrap_with, Mode, Observers, Trace};
use unihal::{Backend, DeviceId, EventFlags, FillValue};

fn cpu() -> Arc<dyn Backend> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), None, Some("1")).unwrap();
    Arc::new(unihal_cpu::CpuBackend::with_config(cfg))
}

/// A CPU backend recording into a fresh trace (never written).
fn traced() -> Arc<dyn Backend> {
    let trace = Trace::new(std::env::temp_dir().join("unihal-bench-trace.json"));
    wrap_with(
        cpu(),
        Observers {
            validate: None,
            trace: Some(trace),
        },
    )
}

fn backends() -> [(&'static str, Arc<dyn Backend>); 2] {
    [("plain", cpu()), ("validated", wrap(cpu(), Mode::Report))]
}

fn fill_on(backend: &dyn Backend, iters: u64) -> std::time::Duration {
    let dev = backend.open(0).unwrap();
    let s = dev.create_stream().unwrap();
    let buf = dev.alloc(64).unwrap();
    let t0 = Instant::now();
    for _ in 0..iters {
        s.fill(&buf, 0, 64, FillValue::U8(1)).unwrap();
    }
    let t = t0.elapsed();
    s.synchronize().unwrap();
    t
}

fn fill(c: &mut Criterion) {
    let mut g = c.benchmark_group("fill_64B");
    for (name, backend) in backends() {
        g.bench_function(name, |b| b.iter_custom(|iters| fill_on(&*backend, iters)));
    }
    g.bench_function("traced", |b| {
        b.iter_custom(|iters| fill_on(&*traced(), iters))
    });
    g.finish();
}

fn counters_off(c: &mut Criterion) {
    let dev = DeviceId {
        backend: "cpu",
        ordinal: 0,
    };
    c.bench_function("counters_off", |b| {
        b.iter(|| {
            unihal::hal::counters::sample(
                std::hint::black_box(dev),
                "memory",
                std::hint::black_box(&[("allocated", 1), ("reserved", 2)]),
            )
        })
    });
}

fn handoff(c: &mut Criterion) {
    let mut g = c.benchmark_group("event_handoff");
    for (name, backend) in backends() {
        let dev = backend.open(0).unwrap();
        let (a, b2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
        let ev = dev
            .create_event(EventFlags {
                disable_timing: true,
            })
            .unwrap();
        let (x, y) = (dev.alloc(64).unwrap(), dev.alloc(64).unwrap());
        g.bench_function(name, |b| {
            b.iter(|| {
                a.fill(&x, 0, 64, FillValue::U8(2)).unwrap();
                a.record_event(&ev).unwrap();
                b2.wait_event(&ev).unwrap();
                b2.copy_d2d(&x, 0, &y, 0, 64).unwrap();
                b2.synchronize().unwrap();
            })
        });
        assert_eq!(
            backend
                .as_any()
                .downcast_ref::<unihal::layer::LayerBackend>()
                .map_or(0, |v| v.findings().len()),
            0,
            "the ordered handoff made findings"
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = fill, handoff, counters_off
}
criterion_main!(benches);
