//! Fault sweeps (`unihal_conformance::faults`) on every backend this machine can run: the CPU
//! backend through its own fault points, and the CUDA, HIP and Ascend backends through their
//! simulated runtimes, each with the shared training-step workload. Calls the step makes fail
//! once, in turn (here every point at its first, middle and last call; every call with
//! `UNIHAL_SWEEP_MAX_N=all`): each failure must surface as a typed error naming its code (or be
//! absorbed with the exact clean result), with no panic, no hang and no leaked object.
//!
//! In CI the simulated GPU runtimes run with their compilers (NVRTC, hiprtc) on the path, so the
//! step's library ops run too; without them the step moves the same data with copies and fills.
//!
//! Each sweep runs in a process of its own (`own_process`), with its own fault controls (the CPU
//! backend's statics, each simulated library's): the sweeps run side by side without seeing each
//! other's injections, and the Ascend sweep, the longest (each trial opens a fresh backend whose
//! operator probe makes thousands of calls), does not wait for the others.

#[path = "support/isolation.rs"]
mod isolation;
#[path = "support/simulated.rs"]
mod simulated;

use isolation::own_process;

use simulated::{ascend, ascend_library, cpu, cuda, cuda_library, hip, hip_library, quiesce};
use std::sync::Arc;
use unihal::Backend;
use unihal_conformance::faults::{self, sim::SimInjector, Code, Injector, Live, SweepOptions};

fn check(report: &faults::SweepReport) {
    eprintln!("{report}");
    assert!(report.problems.is_empty(), "{report}");
    assert!(
        report.surfaced() > 0,
        "no injected failure surfaced: {report}"
    );
}

/// Every point, at its first, middle and last call, in the test run; `UNIHAL_SWEEP_MAX_N=all`
/// (the long sweep of docs/RELIABILITY.md) fails every call, or `=N` up to N calls per point.
fn options() -> SweepOptions {
    SweepOptions {
        max_n_per_point: match std::env::var("UNIHAL_SWEEP_MAX_N").as_deref() {
            Ok("all") => u32::MAX,
            Ok(n) => n.parse().expect("UNIHAL_SWEEP_MAX_N: a number or `all`"),
            Err(_) => 3,
        },
        // `UNIHAL_SWEEP_ONLY=a,b`: only the points whose names contain a or b.
        only: std::env::var("UNIHAL_SWEEP_ONLY")
            .map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default(),
        ..SweepOptions::default()
    }
}

/// The CPU backend's own fault points (feature `fault-injection`).
struct CpuInjector;

impl Injector for CpuInjector {
    fn describe(&self) -> String {
        "the CPU backend's own code".into()
    }
    fn count_calls(&self, on: bool) {
        unihal_cpu::fault::injection::count_calls(on)
    }
    fn calls(&self) -> std::collections::BTreeMap<String, u64> {
        unihal_cpu::fault::injection::calls()
    }
    fn arm(&self, point: &str, n: u32, code: i32) {
        unihal_cpu::fault::injection::arm(point, n, code)
    }
    fn disarm(&self) -> usize {
        unihal_cpu::fault::injection::disarm()
    }
    fn codes(&self, point: &str) -> Vec<Code> {
        use unihal_cpu::fault::injection::{DEVICE_LOST, OUT_OF_MEMORY};
        let mut v = vec![
            Code::new(DEVICE_LOST, "device lost"),
            Code::new(17, "a failure of the call"),
        ];
        if point.contains("alloc") {
            v.insert(0, Code::oom(OUT_OF_MEMORY, "out of memory"));
        }
        v
    }
    fn live(&self) -> Live {
        let [allocations, bytes, streams, events, modules] = unihal_cpu::fault::injection::live();
        Live {
            allocations,
            bytes,
            streams,
            events,
            modules,
        }
    }
}

#[test]
fn every_failure_of_the_cpu_backends_own_calls_surfaces() {
    if own_process() {
        return;
    }
    check(&faults::sweep(
        Arc::new(CpuInjector),
        cpu,
        faults::workload::training_step,
        &options(),
    ));
}

#[test]
fn every_failure_of_the_simulated_cuda_driver_and_nccl_surfaces() {
    if own_process() {
        return;
    }
    let inj = SimInjector::open(cuda_library(), "the simulated CUDA driver and NCCL")
        .unwrap()
        .with_quiesce(|| quiesce(cuda));
    check(&faults::sweep(
        Arc::new(inj),
        cuda,
        faults::workload::training_step,
        &options(),
    ));
}

#[test]
fn every_failure_of_the_simulated_hip_runtime_rccl_and_rocblas_surfaces() {
    if own_process() {
        return;
    }
    let inj = SimInjector::open(hip_library(), "the simulated HIP runtime, RCCL and rocBLAS")
        .unwrap()
        .with_quiesce(|| quiesce(hip));
    check(&faults::sweep(
        Arc::new(inj),
        hip,
        faults::workload::training_step,
        &options(),
    ));
}

/// Every call that makes a device current, failing in turn (not a sample): the failure that
/// found the GPU layer keeping BLAS operands, host-copy ranges and kernel-library operands by a
/// second enqueue, which dropped them under the queued work when it failed (RELIABILITY.md,
/// defect 24: a 256-byte buffer freed under a queued GEMM, the free refused, the memory leaked).
#[test]
fn every_failure_to_make_a_device_current_surfaces_on_hip_and_cuda() {
    if own_process() {
        return;
    }
    let every = |point: &str| SweepOptions {
        only: vec![point.to_string()],
        ..SweepOptions::default()
    };
    let hip_inj = SimInjector::open(hip_library(), "the simulated HIP runtime, RCCL and rocBLAS")
        .unwrap()
        .with_quiesce(|| quiesce(hip));
    check(&faults::sweep(
        Arc::new(hip_inj),
        hip,
        faults::workload::training_step,
        &every("hipSetDevice"),
    ));
    let cuda_inj = SimInjector::open(cuda_library(), "the simulated CUDA driver and NCCL")
        .unwrap()
        .with_quiesce(|| quiesce(cuda));
    check(&faults::sweep(
        Arc::new(cuda_inj),
        cuda,
        faults::workload::training_step,
        &every("cuCtxSetCurrent"),
    ));
}

#[test]
fn every_failure_of_the_simulated_cann_stack_surfaces() {
    if own_process() {
        return;
    }
    let inj = SimInjector::open(
        ascend_library(),
        "the simulated CANN stack (ACL, aclnn, HCCL)",
    )
    .unwrap()
    .with_quiesce(|| quiesce(ascend));
    check(&faults::sweep(
        Arc::new(inj),
        ascend,
        faults::workload::training_step,
        &options(),
    ));
}

// The sweep catches what it claims to: a leak, a swallowed error and a hang, each planted in a
// workload around the CPU step (the sweep judges what reaches it, whoever caused it).

/// Leaks a buffer whenever the step fails.
fn leaks_on_failure(b: &Arc<dyn Backend>) -> unihal::Result<Vec<u8>> {
    let r = faults::workload::training_step(b);
    if r.is_err() {
        std::mem::forget(b.open(0)?.alloc(64)?);
    }
    r
}

/// Reports success with made-up results when the step fails.
fn swallows_failures(b: &Arc<dyn Backend>) -> unihal::Result<Vec<u8>> {
    Ok(faults::workload::training_step(b).unwrap_or_default())
}

/// Never returns when the step fails.
fn hangs_on_failure(b: &Arc<dyn Backend>) -> unihal::Result<Vec<u8>> {
    let r = faults::workload::training_step(b);
    if r.is_err() {
        loop {
            std::thread::park();
        }
    }
    r
}

fn planted(workload: faults::Workload) -> faults::SweepReport {
    let opts = SweepOptions {
        max_n_per_point: 1,
        only: vec!["alloc".into()],
        trial_deadline: std::time::Duration::from_secs(2),
        ..SweepOptions::default()
    };
    faults::sweep(Arc::new(CpuInjector), cpu, workload, &opts)
}

#[test]
fn the_sweep_catches_a_planted_leak() {
    if own_process() {
        return;
    }
    let r = planted(leaks_on_failure);
    assert!(
        r.problems.iter().any(|p| p.contains("leaked")),
        "the planted leak went unnoticed: {r}"
    );
}

#[test]
fn the_sweep_catches_a_planted_swallowed_error() {
    if own_process() {
        return;
    }
    let r = planted(swallows_failures);
    assert!(
        r.problems.iter().any(|p| p.contains("swallowed")),
        "the planted swallowed error went unnoticed: {r}"
    );
}

#[test]
fn the_sweep_catches_a_planted_hang() {
    if own_process() {
        return;
    }
    let r = planted(hangs_on_failure);
    assert!(
        r.problems.iter().any(|p| p.contains("hang")),
        "the planted hang went unnoticed: {r}"
    );
}
