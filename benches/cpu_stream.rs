//! CPU backend stream benchmarks, each beside its peer measured in the same run:
//!
//! * `enqueue/empty_op`: enqueue of an empty operation (a no-op host callback) while the worker drains.
//! * `round_trip/unihal_enqueue_sync` vs `round_trip/bare_channel`: enqueue + synchronize, against a
//!   bare channel send to a thread that replies on a second channel.
//! * `copy_256MiB/unihal_d2d` vs `copy_256MiB/slice_copy`: a device-to-device copy on a CPU stream
//!   against `copy_from_slice` of the same bytes.
//!
//! Run: `cargo bench --bench cpu_stream`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use unihal::Backend;

fn device() -> std::sync::Arc<dyn unihal::Device> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), None, Some("1")).unwrap();
    let b = unihal_cpu::CpuBackend::with_config(cfg);
    b.open(0).unwrap()
}

fn enqueue(c: &mut Criterion) {
    let dev = device();
    let s = dev.create_stream().unwrap();
    let mut g = c.benchmark_group("enqueue");
    g.bench_function("empty_op", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                s.host_callback(Box::new(|| {})).unwrap();
            }
            let t = t0.elapsed();
            s.synchronize().unwrap();
            t
        })
    });
    g.finish();
}

fn round_trip(c: &mut Criterion) {
    let dev = device();
    let s = dev.create_stream().unwrap();
    let mut g = c.benchmark_group("round_trip");
    g.bench_function("unihal_enqueue_sync", |b| {
        b.iter(|| {
            s.host_callback(Box::new(|| {})).unwrap();
            s.synchronize().unwrap();
        })
    });
    let (to_tx, to_rx) = mpsc::channel::<()>();
    let (back_tx, back_rx) = mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        while to_rx.recv().is_ok() {
            if back_tx.send(()).is_err() {
                break;
            }
        }
    });
    g.bench_function("bare_channel", |b| {
        b.iter(|| {
            to_tx.send(()).unwrap();
            back_rx.recv().unwrap();
        })
    });
    // The same two round trips after 200 µs of idleness, so both sides have gone to sleep and
    // each round trip pays the full wake-up (the idle time is not measured).
    let idle = |iters: u64, f: &mut dyn FnMut()| {
        let mut t = Duration::ZERO;
        for _ in 0..iters {
            std::thread::sleep(Duration::from_micros(200));
            let t0 = Instant::now();
            f();
            t += t0.elapsed();
        }
        t
    };
    g.bench_function("unihal_enqueue_sync_after_idle", |b| {
        b.iter_custom(|iters| {
            idle(iters, &mut || {
                s.host_callback(Box::new(|| {})).unwrap();
                s.synchronize().unwrap();
            })
        })
    });
    g.bench_function("bare_channel_after_idle", |b| {
        b.iter_custom(|iters| {
            idle(iters, &mut || {
                to_tx.send(()).unwrap();
                back_rx.recv().unwrap();
            })
        })
    });
    g.finish();
    drop(to_tx);
    worker.join().unwrap();
}

fn copy(c: &mut Criterion) {
    const LEN: usize = 256 << 20;
    let dev = device();
    let s = dev.create_stream().unwrap();
    let a = dev.alloc(LEN).unwrap();
    let b_ = dev.alloc(LEN).unwrap();
    s.fill(&a, 0, LEN as u64, unihal::FillValue::U8(7)).unwrap();
    s.fill(&b_, 0, LEN as u64, unihal::FillValue::U8(0))
        .unwrap();
    s.synchronize().unwrap();
    let src = vec![7u8; LEN];
    let mut dst = vec![0u8; LEN];
    let mut g = c.benchmark_group("copy_256MiB");
    g.throughput(Throughput::Bytes(LEN as u64))
        .sample_size(20)
        .measurement_time(Duration::from_secs(8));
    g.bench_function("unihal_d2d", |b| {
        b.iter(|| {
            s.copy_d2d(&a, 0, &b_, 0, LEN as u64).unwrap();
            s.synchronize().unwrap();
        })
    });
    g.bench_function("slice_copy", |b| {
        b.iter(|| {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = enqueue, round_trip, copy
}
criterion_main!(benches);
