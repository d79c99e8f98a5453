//! A plugin written in C (tests/c/minimal_plugin.c, compiled here with the system C compiler):
//! memory, streams and events only. It loads, passes every memory, stream and event case the
//! suite runs on it, and every other case is reported as a skip (its manifest declares kernels,
//! ops and collectives unsupported; the rest need capabilities it does not claim).

mod support;

use unihal_conformance::{discover, run, Outcome, RunOptions};

fn main() {
    // A static, not a leaked box: reachable to the end, so LeakSanitizer does not report it.
    static REGISTRY: std::sync::OnceLock<unihal_hal::Registry> = std::sync::OnceLock::new();
    let registry = REGISTRY.get_or_init(unihal_hal::Registry::new);
    unihal_conformance::run_child_if_requested(registry);
    let lib = support::compile_c_plugin("minimal", &[]);
    let name = unihal_plugin::host::register(registry, &lib, &[], &[])
        .unwrap_or_else(|e| panic!("the C plugin {} must load: {e}", lib.display()));
    assert_eq!(name, "cminimal");
    let backend = registry.get("cminimal").unwrap();
    let info = backend.info();
    assert_eq!(info.libraries[0].name, "C standard library");
    assert!(info.version.contains("0.1.0-minimal-c"), "{}", info.version);
    let (targets, unavailable) = discover(registry, None).expect("the registry lists it");
    assert!(unavailable.is_empty(), "{unavailable:?}");
    assert_eq!(targets.len(), 2, "two devices");
    let cases = unihal_conformance::cases::all();
    let report = run(&targets, Vec::new(), &cases, &RunOptions::default());
    let (mut passed, mut skipped, mut failed) = (0, 0, Vec::new());
    let mut passed_areas = std::collections::BTreeSet::new();
    for t in &report.targets {
        for r in &t.results {
            match &r.outcome {
                Outcome::Passed => {
                    passed += 1;
                    passed_areas.insert(r.id.split('.').next().unwrap_or("").to_string());
                }
                Outcome::Skipped { .. } => skipped += 1,
                other => failed.push(format!("{} {}: {other:?}", t.device.id, r.id)),
            }
        }
    }
    assert!(
        failed.is_empty(),
        "the C plugin failed:\n{}",
        failed.join("\n")
    );
    for area in ["memory", "streams", "events"] {
        assert!(
            passed_areas.contains(area),
            "no {area} case passed: {passed_areas:?}"
        );
    }
    support::assert_unsupported_areas_skipped(&report, "minimal C plugin");
    println!(
        "C plugin: {passed} passed, {skipped} skipped, 0 failed over {} devices",
        report.targets.len()
    );
}
