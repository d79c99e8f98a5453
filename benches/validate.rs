//! The validation layer's cost, each case with and without the layer in the same run (CPU
//! backend, one device):
//!
//! * `fill_64B`: enqueue of a 64-byte fill (the worker drains meanwhile; synchronised per batch):
//!   the per-enqueue bookkeeping (a clock tick, the allocation's records, a commit).
//! * `event_handoff`: a fill on stream A, an event recorded on A and waited on B, a copy on B, and
//!   a synchronisation of B: the clock traffic of a cross-stream dependency.
//!
//! Run: `cargo bench --bench validate`.

use criterion::{criterion_group, criterion_main, Criterion};
use std::sync::Arc;
use std::time::Instant;
use unihal::layer::{wrap, Mode};
use unihal::{Backend, EventFlags, FillValue};

fn backends() -> [(&'static str, Arc<dyn Backend>); 2] {
    let cpu = || -> Arc<dyn Backend> {
        let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), None, Some("1")).unwrap();
        Arc::new(unihal_cpu::CpuBackend::with_config(cfg))
    };
    [("plain", cpu()), ("validated", wrap(cpu(), Mode::Report))]
}

fn fill(c: &mut Criterion) {
    let mut g = c.benchmark_group("fill_64B");
    for (name, backend) in backends() {
        let dev = backend.open(0).unwrap();
        let s = dev.create_stream().unwrap();
        let buf = dev.alloc(64).unwrap();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t0 = Instant::now();
                for _ in 0..iters {
                    s.fill(&buf, 0, 64, FillValue::U8(1)).unwrap();
                }
                let t = t0.elapsed();
                s.synchronize().unwrap();
                t
            })
        });
    }
    g.finish();
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
    targets = fill, handoff
}
criterion_main!(benches);
