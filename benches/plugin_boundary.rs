//! What the plugin boundary costs per call: the CPU backend linked in against the same backend
//! loaded as a plugin (`libunihal_cpu_plugin.so`, through the C ABI), in the same run, for the
//! three calls a framework makes most: an event record, a stream query and the enqueue of an
//! empty host callback. The difference of the two medians is the boundary's cost. The host
//! callback is also timed through the plugin's `host_callback` entry of ABI 1.0 (`plugin-1.1`:
//! the same table without `host_callback_node`, which the host then does not use).
//!
//! Run: `cargo bench --bench plugin_boundary` (figures in docs/BENCHMARKS.md).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use unihal::plugin::abi::{UhError, UhHostApi, UhPluginApi};
use unihal::plugin::host;
use unihal::{Backend, Device, EventFlags, Stream};

/// Calls timed between two synchronisations (untimed), so queues stay short.
const BATCH: u64 = 256;

/// The CPU plugin's table without `host_callback_node` (as a plugin of ABI 1.1 has it).
static OLDER: AtomicPtr<UhPluginApi> = AtomicPtr::new(std::ptr::null_mut());

unsafe extern "C" fn older_entry(_: *const UhHostApi, _: *mut UhError) -> *const UhPluginApi {
    OLDER.load(Ordering::SeqCst)
}

fn backends() -> Vec<(&'static str, Arc<dyn Backend>)> {
    let registry = unihal::Registry::new();
    let lib = unihal_sim::built_library("libunihal_cpu_plugin.so");
    unihal::plugin::host::register(&registry, &lib, &[], &[])
        .unwrap_or_else(|e| panic!("the CPU plugin {} must load: {e}", lib.display()));
    let mut older = *host::load(&lib).unwrap().api();
    older.host_callback_node = None;
    OLDER.store(Box::leak(Box::new(older)), Ordering::SeqCst);
    // SAFETY: the CPU plugin's own entries (its library stays loaded), kept forever.
    let older = unsafe { host::load_entry("cpu plugin without host_callback_node", older_entry) };
    vec![
        (
            "linked",
            Arc::new(unihal_cpu::CpuBackend::new()) as Arc<dyn Backend>,
        ),
        ("plugin", registry.get("cpu").unwrap()),
        (
            "plugin-1.1",
            Arc::new(host::PluginBackend::new(older.unwrap())) as Arc<dyn Backend>,
        ),
    ]
}

/// Times `f` `iters` times in batches. Each batch is enqueued behind a host callback that holds
/// the stream (a gate), so the worker never races the enqueues and the time is the enqueue
/// path alone; the gate opens and the stream drains between batches (not timed).
fn batched(s: &Arc<dyn Stream>, iters: u64, mut f: impl FnMut()) -> Duration {
    let mut t = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        s.host_callback(Box::new(move || {
            let mut open = g.0.lock().unwrap();
            while !*open {
                open = g.1.wait(open).unwrap();
            }
        }))
        .unwrap();
        let t0 = Instant::now();
        for _ in 0..n {
            f();
        }
        t += t0.elapsed();
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        s.synchronize().unwrap();
        left -= n;
    }
    t
}

fn boundary(c: &mut Criterion) {
    let mut g = c.benchmark_group("plugin_boundary");
    for (name, b) in backends() {
        let dev: Arc<dyn Device> = b.open(0).unwrap();
        let s = dev.create_stream().unwrap();
        let ev = dev
            .create_event(EventFlags {
                disable_timing: true,
            })
            .unwrap();
        if name == "plugin-1.1" {
            g.bench_with_input(BenchmarkId::new("host_callback", name), &(), |bch, _| {
                bch.iter_custom(|iters| {
                    batched(&s, iters, || s.host_callback(Box::new(|| {})).unwrap())
                })
            });
            continue;
        }
        g.bench_with_input(BenchmarkId::new("event_record", name), &(), |bch, _| {
            bch.iter_custom(|iters| batched(&s, iters, || s.record_event(&ev).unwrap()))
        });
        g.bench_with_input(BenchmarkId::new("stream_query", name), &(), |bch, _| {
            bch.iter(|| s.query().unwrap())
        });
        g.bench_with_input(BenchmarkId::new("host_callback", name), &(), |bch, _| {
            bch.iter_custom(|iters| {
                batched(&s, iters, || s.host_callback(Box::new(|| {})).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, boundary);
criterion_main!(benches);
