//! The blocker's host-callback mode, as a backend without the conformance test kernels uses it: the
//! CPU backend behind a wrapper that hides its test kernels runs every case that holds a stream
//! (`Need::StreamHold`), and the cases that name an ordering fault of the CPU backend's fault
//! switch still catch it with a blocking host callback instead of the spinning kernel.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;
use unihal_conformance::blocker::{Blocker, HoldMode, RELEASED_WORD};
use unihal_conformance::manifest::Manifest;
use unihal_conformance::report::Outcome;
use unihal_conformance::runner::{plan, run_case, Plan, RunOptions, Target};
use unihal_conformance::{Case, Ctx, Need};
use unihal_cpu::{CpuBackend, CpuConfig, Fault};
use unihal_hal::{Backend, BackendInfo, Device, ModuleSource, Result};

/// A backend that delegates everything but has no test kernels.
struct NoTestKernels(Arc<dyn Backend>);

impl Backend for NoTestKernels {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn info(&self) -> BackendInfo {
        self.0.info()
    }
    fn probe(&self) -> Result<usize> {
        self.0.probe()
    }
    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        self.0.open(ordinal)
    }
    fn collectives(&self) -> Option<&dyn unihal_hal::Collectives> {
        self.0.collectives()
    }
    fn conformance_manifest(&self) -> &'static str {
        self.0.conformance_manifest()
    }
    fn test_kernels(&self, _device: &dyn Device) -> Option<ModuleSource> {
        None
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn config() -> CpuConfig {
    CpuConfig::from_values(Some("2"), Some("2G"), Some("1")).unwrap()
}

fn target(cpu: CpuBackend) -> Target {
    let backend: Arc<dyn Backend> = Arc::new(NoTestKernels(Arc::new(cpu)));
    Target {
        device: backend.open(0).unwrap(),
        backend,
        manifest: Manifest::default(),
        world: None,
    }
}

fn holding_cases() -> Vec<Case> {
    unihal_conformance::cases::all()
        .into_iter()
        .filter(|c| c.needs.contains(&Need::StreamHold))
        .collect()
}

#[test]
fn the_blocker_holds_with_a_host_callback_without_test_kernels() {
    let t = target(CpuBackend::with_config(config()));
    assert_eq!(
        HoldMode::of(&*t.backend, &*t.device),
        Some(HoldMode::HostCallback)
    );
    let ctx = Ctx::new(t.backend.clone(), t.device.clone());
    let s = ctx.stream().unwrap();
    let mut first = Blocker::new(&ctx, &s).unwrap();
    assert_eq!(first.mode(), HoldMode::HostCallback);
    let mut second = Blocker::behind(&ctx, &s).unwrap();
    let word = |b: &Blocker| {
        let w = ctx.download(b.out()).unwrap();
        u32::from_le_bytes([w[0], w[1], w[2], w[3]])
    };
    std::thread::sleep(Duration::from_millis(20));
    assert!(!s.query().unwrap(), "a held stream reports completion");
    assert_eq!(word(&first), 0, "the word before the release");
    // Released out of order: the second hold lets its callback through at once when it runs.
    second.release().unwrap();
    assert!(!s.query().unwrap(), "the first hold still holds the stream");
    first.release().unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        (word(&first), word(&second)),
        (RELEASED_WORD, RELEASED_WORD)
    );
}

#[test]
fn stream_hold_cases_pass_with_host_callbacks() {
    let t = target(CpuBackend::with_config(config()));
    let cases = holding_cases();
    // Every case that holds a stream only to observe ordering (the kernel cases that also launch
    // test kernels behind the hold keep needing them).
    assert_eq!(
        cases.len(),
        18,
        "{:?}",
        cases.iter().map(|c| &c.id).collect::<Vec<_>>()
    );
    let mut failed = Vec::new();
    for c in &cases {
        let r = run_case(c, &t, &RunOptions::default());
        if r.outcome != Outcome::Passed {
            failed.push((c.id.clone(), r.outcome));
        }
    }
    assert!(failed.is_empty(), "in host-callback mode: {failed:#?}");
}

#[test]
fn test_kernel_cases_skip_with_the_reason() {
    let t = target(CpuBackend::with_config(config()));
    let mut n = 0;
    for c in unihal_conformance::cases::all() {
        if !c.needs.contains(&Need::TestKernels) {
            continue;
        }
        n += 1;
        match plan(&c, &t) {
            Plan::Skip(reason) => assert!(
                reason.contains("has no conformance test kernels for this device"),
                "{}: {reason}",
                c.id
            ),
            Plan::Run { .. } => panic!("{} runs without test kernels", c.id),
        }
    }
    assert!(n > 0);
}

/// The fault-switch cases that hold a stream without test kernels.
fn catchers(f: Fault) -> &'static [&'static str] {
    match f {
        Fault::InlineExecution => &[
            "streams.async.enqueue_returns_before_completion",
            "streams.query.pending_then_done",
        ],
        Fault::IgnoreEventWaits => &["events.wait.cross_stream", "events.wait.cross_device"],
        // Its catchers launch test kernels behind the hold.
        Fault::ReorderQueue => &[],
        Fault::EarlyEventCompletion => &[
            "events.query.pending_then_complete",
            "events.record.latest_wins",
        ],
    }
}

#[test]
fn host_callback_holds_catch_ordering_faults() {
    // Inline execution runs the blocking callback inside the enqueue: the watchdog must end it.
    let opts = RunOptions {
        timeout: Duration::from_secs(2),
        ..RunOptions::default()
    };
    let all = holding_cases();
    for f in Fault::ALL {
        for id in catchers(f) {
            let c = all
                .iter()
                .find(|c| c.id == *id)
                .unwrap_or_else(|| panic!("{id} does not hold a stream"));
            let t = target(CpuBackend::with_fault(config(), f));
            let r = run_case(c, &t, &opts);
            match &r.outcome {
                Outcome::Failed { message } => assert!(
                    !message.starts_with("not run"),
                    "{id} under {f:?} was not run: {message}"
                ),
                other => panic!("{id} under {f:?} in host-callback mode: {other:?}"),
            }
        }
    }
}
