//! Stress (`unihal_conformance::stress`) on every backend this machine can run: 16 host threads,
//! each with 8 streams of one device, fills and cross-stream copies ordered by events, random
//! extra waits and host reads, checked exactly; a deadlock fails the run at its deadline.
//!
//! 10,000 operations per thread (160,000 per backend; about 14 s for all four backends in a
//! debug build on 2 cores); `UNIHAL_STRESS_OPS=N` changes it. Figures: docs/RELIABILITY.md,
//! from `cargo test --test all -- --nocapture stress::`.

use crate::simulated;

use std::sync::Arc;
use unihal::Backend;
use unihal_conformance::stress::{stress, StressOptions};

/// One backend at a time: each runs 16 threads x 8 streams.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(name: &str, backend: Arc<dyn Backend>) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let opts = StressOptions {
        ops_per_thread: std::env::var("UNIHAL_STRESS_OPS")
            .map(|v| v.parse().expect("UNIHAL_STRESS_OPS: a number"))
            .unwrap_or(10_000),
        ..StressOptions::default()
    };
    let dev = backend.open(0).unwrap();
    let report = stress(dev, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!(
        "stress on {name}: {} threads x {} streams: {report}",
        opts.threads, opts.streams_per_thread
    );
    assert_eq!(report.ops, (opts.threads * opts.ops_per_thread) as u64);
}

#[test]
fn stress_on_the_cpu_backend() {
    if crate::own_process() {
        return;
    }
    run("cpu", simulated::cpu());
}

#[test]
fn stress_on_cuda_over_the_simulated_driver() {
    if crate::own_process() {
        return;
    }
    run("cuda (simulated driver)", simulated::cuda());
}

#[test]
fn stress_on_hip_over_the_simulated_runtime() {
    if crate::own_process() {
        return;
    }
    run("hip (simulated runtime)", simulated::hip());
}

#[test]
fn stress_on_ascend_over_the_simulated_cann_stack() {
    if crate::own_process() {
        return;
    }
    run("ascend (simulated CANN)", simulated::ascend());
}

/// The stress run catches a missing wait: the CPU backend built to ignore event waits (its
/// test-only fault switch) must give a result that differs from the model.
#[test]
fn stress_catches_a_planted_missing_wait() {
    if crate::own_process() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("1G"), Some("1")).unwrap();
    let backend = unihal_cpu::CpuBackend::with_fault(cfg, unihal_cpu::Fault::IgnoreEventWaits);
    let opts = StressOptions {
        threads: 4,
        ops_per_thread: 2_000,
        ..StressOptions::default()
    };
    match stress(backend.open(0).unwrap(), &opts) {
        Err(unihal::HalError::Internal(m)) => eprintln!("caught: {m}"),
        other => panic!("a stream that ignores event waits went unnoticed: {other:?}"),
    }
}
