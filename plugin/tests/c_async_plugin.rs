//! The asynchronous C plugin (tests/c/async_plugin.c, compiled here with the system C compiler
//! as docs/PORTING.md compiles a C plugin): a queue thread per stream, events recorded and waited
//! on through the queues, host callbacks on the queue threads. It passes every memory, stream,
//! event and host-callback case the suite runs on it, including those that hold a stream with a
//! blocking host callback (the suite's way to observe queued state on a backend without test
//! kernels); every other case is a skip (its manifest declares kernels, ops and collectives
//! unsupported; the rest need capabilities it does not claim).

mod support;

use unihal_conformance::{discover, run, Outcome, RunOptions};

fn main() {
    // A static, not a leaked box: reachable to the end, so LeakSanitizer does not report it.
    static REGISTRY: std::sync::OnceLock<unihal_hal::Registry> = std::sync::OnceLock::new();
    let registry = REGISTRY.get_or_init(unihal_hal::Registry::new);
    unihal_conformance::run_child_if_requested(registry);
    let lib = support::compile_c("async_plugin.c", "async", &[]);
    let name = unihal_plugin::host::register(registry, &lib, &[], &[])
        .unwrap_or_else(|e| panic!("the C plugin {} must load: {e}", lib.display()));
    assert_eq!(name, "casync");
    let (targets, unavailable) = discover(registry, None).expect("the registry lists it");
    assert!(unavailable.is_empty(), "{unavailable:?}");
    assert_eq!(targets.len(), 2, "two devices");
    assert!(targets[0].device.capabilities().optional.host_callbacks);
    let cases = unihal_conformance::cases::all();
    let report = run(&targets, Vec::new(), &cases, &RunOptions::default());
    let (mut passed, mut skipped, mut failed) = (Vec::new(), 0, Vec::new());
    for t in &report.targets {
        for r in &t.results {
            match &r.outcome {
                Outcome::Passed => passed.push(r.id.to_string()),
                Outcome::Skipped { .. } => skipped += 1,
                other => failed.push(format!("{} {}: {other:?}", t.device.id, r.id)),
            }
        }
    }
    assert!(
        failed.is_empty(),
        "the asynchronous C plugin failed:\n{}",
        failed.join("\n")
    );
    // The areas it claims, and the cases only an asynchronous queue with host callbacks runs:
    // streams held by a blocking callback, callbacks in order, a callback's wait on its own
    // stream refused, a host buffer mapped after a callback.
    for must in [
        "memory.copy.h2d_d2h.async",
        "memory.buffer.drop_with_queued_work",
        "memory.host.map_after.host_callback",
        "streams.async.enqueue_returns_before_completion",
        "streams.query.pending_then_done",
        "streams.drop.pending_work_completes",
        "streams.synchronize.device",
        "streams.host_callback.order",
        "streams.host_callback.waiting_on_own_stream_is_an_error",
        "events.query.pending_then_complete",
        "events.wait.cross_stream",
        "events.wait.cross_device",
        "events.record.latest_wins",
        "events.elapsed.measures_work",
    ] {
        assert!(
            passed.iter().filter(|p| *p == must).count() == 2,
            "{must} did not pass on both devices"
        );
    }
    support::assert_unsupported_areas_skipped(&report, "asynchronous C plugin");
    println!(
        "asynchronous C plugin: {} passed, {skipped} skipped, 0 failed over {} devices",
        passed.len(),
        report.targets.len()
    );
}
