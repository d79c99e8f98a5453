//! Graph replay against eager enqueue on the CPU backend, side by side in one run (issue: the
//! launch ceiling of small work). The node is an empty operation: a zero-length fill, which
//! passes every check and queues work that does nothing, so the figures are the runtime's own
//! cost per operation.
//!
//! For N = 1, 100 and 10,000 nodes:
//! * `host/launch_graph/N`: the host time of one `launch_graph` of a captured graph of N nodes;
//! * `host/eager/N`: the host time of N eager enqueues of the same operation (both timed in
//!   batches of about 1,000 nodes between untimed synchronisations);
//! * `run/launch_graph/N` and `run/eager/N`: the same followed by `synchronize`, so the time the
//!   stream takes to run them is in too.
//!
//! Criterion's throughput is in nodes, so its "elem/s" reads as nodes per second; per-node times
//! are the median divided by N. Run: `cargo bench --bench graph_replay`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal::{Backend, Buffer, CaptureMode, FillValue, Graph, Stream};

fn device() -> Arc<dyn unihal::Device> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), None, Some("1")).unwrap();
    unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap()
}

/// The empty operation.
fn node(s: &Arc<dyn Stream>, b: &Buffer) {
    s.fill(b, 0, 0, FillValue::U8(0)).unwrap();
}

fn graph_of(s: &Arc<dyn Stream>, b: &Buffer, n: usize) -> Arc<dyn Graph> {
    s.begin_capture(CaptureMode::Global).unwrap();
    for _ in 0..n {
        node(s, b);
    }
    let g = s.end_capture().unwrap();
    assert_eq!(g.node_count(), n);
    g
}

/// The host time of `iters` calls of `f` (each N nodes' worth), run back to back in batches of
/// about 1,000 nodes with an untimed `synchronize` between batches: the queue stays short, and a
/// sleeping worker's wake-up is paid once per batch on both sides, not once per call.
fn batched(iters: u64, n: usize, s: &Arc<dyn Stream>, mut f: impl FnMut()) -> Duration {
    let per_sync = (1000 / n as u64).max(1);
    let mut t = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let k = left.min(per_sync);
        let t0 = Instant::now();
        for _ in 0..k {
            f();
        }
        t += t0.elapsed();
        s.synchronize().unwrap();
        left -= k;
    }
    t
}

fn replay(c: &mut Criterion) {
    let dev = device();
    let s = dev.create_stream().unwrap();
    let b = dev.alloc(64).unwrap();
    let mut host = c.benchmark_group("host");
    for n in [1usize, 100, 10_000] {
        let g = graph_of(&s, &b, n);
        host.throughput(Throughput::Elements(n as u64));
        host.bench_with_input(BenchmarkId::new("launch_graph", n), &n, |bch, &n| {
            bch.iter_custom(|iters| {
                batched(iters, n, &s, || {
                    s.launch_graph(&g).unwrap();
                })
            })
        });
        host.bench_with_input(BenchmarkId::new("eager", n), &n, |bch, &n| {
            bch.iter_custom(|iters| {
                batched(iters, n, &s, || {
                    for _ in 0..n {
                        node(&s, &b);
                    }
                })
            })
        });
    }
    host.finish();
    let mut run = c.benchmark_group("run");
    for n in [1usize, 100, 10_000] {
        let g = graph_of(&s, &b, n);
        run.throughput(Throughput::Elements(n as u64));
        run.bench_with_input(BenchmarkId::new("launch_graph", n), &n, |bch, _| {
            bch.iter(|| {
                s.launch_graph(&g).unwrap();
                s.synchronize().unwrap();
            })
        });
        run.bench_with_input(BenchmarkId::new("eager", n), &n, |bch, &n| {
            bch.iter(|| {
                for _ in 0..n {
                    node(&s, &b);
                }
                s.synchronize().unwrap();
            })
        });
    }
    run.finish();
}

criterion_group!(benches, replay);
criterion_main!(benches);
