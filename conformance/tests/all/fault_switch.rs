//! The permanent guard that the suite catches ordering bugs: with each fault of the CPU backend's
//! test-only fault switch, named conformance cases must fail; without it, they pass.

use std::sync::Arc;
use std::time::Duration;
use unihal_conformance::manifest::Manifest;
use unihal_conformance::report::Outcome;
use unihal_conformance::runner::{run_case, RunOptions, Target};
use unihal_cpu::{CpuBackend, CpuConfig, Fault};
use unihal_hal::Backend;

fn config() -> CpuConfig {
    CpuConfig::from_values(Some("2"), Some("2G"), Some("1")).unwrap()
}

fn target(backend: CpuBackend) -> Target {
    let backend: Arc<dyn Backend> = Arc::new(backend);
    Target {
        device: backend.open(0).unwrap(),
        backend,
        manifest: Manifest::default(),
        world: None,
    }
}

/// The cases that must catch each fault.
fn catchers(f: Fault) -> &'static [&'static str] {
    match f {
        Fault::InlineExecution => &[
            "streams.async.enqueue_returns_before_completion",
            "streams.query.pending_then_done",
        ],
        Fault::IgnoreEventWaits => &["events.wait.cross_stream", "events.wait.cross_device"],
        Fault::ReorderQueue => &[
            "streams.order.blocked_queue",
            "kernels.launch.args_reusable_after_launch",
        ],
        Fault::EarlyEventCompletion => &[
            "events.query.pending_then_complete",
            "events.record.latest_wins",
        ],
    }
}

fn case(id: &str) -> unihal_conformance::Case {
    unihal_conformance::cases::all()
        .into_iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no case {id}"))
}

#[test]
fn named_cases_pass_without_faults() {
    let t = target(CpuBackend::with_config(config()));
    for f in Fault::ALL {
        for id in catchers(f) {
            let r = run_case(&case(id), &t, &RunOptions::default());
            assert_eq!(r.outcome, Outcome::Passed, "{id} without faults");
        }
    }
}

#[test]
fn every_injected_ordering_fault_fails_its_cases() {
    // Inline execution turns the blocking kernel into a host hang: the watchdog must end it.
    let opts = RunOptions {
        timeout: Duration::from_secs(2),
        ..RunOptions::default()
    };
    for f in Fault::ALL {
        for id in catchers(f) {
            // A fresh backend per case, so a hang in one case cannot decide the next one's outcome.
            let t = target(CpuBackend::with_fault(config(), f));
            let r = run_case(&case(id), &t, &opts);
            match &r.outcome {
                Outcome::Failed { message } => assert!(
                    !message.starts_with("not run"),
                    "{id} under {f:?} was not run: {message}"
                ),
                other => panic!("{id} under {f:?}: {other:?}"),
            }
        }
    }
}
