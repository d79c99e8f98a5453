//! The template backend built as a port builds it (copied out of the workspace, beside a link to
//! this checkout: support::build_template): the suite run against it has no failure, and every
//! case is skipped with the template's reason (its manifest), as docs/PORTING.md promises a
//! porting team starting from it. scripts/porting-trial.sh takes the whole route, a rename
//! included, with the `unihal` binary.

mod support;

use unihal_conformance::{discover, run, Outcome, RunOptions};

fn main() {
    // A static, not a leaked box: reachable to the end, so LeakSanitizer does not report it.
    static REGISTRY: std::sync::OnceLock<unihal_hal::Registry> = std::sync::OnceLock::new();
    let registry = REGISTRY.get_or_init(unihal_hal::Registry::new);
    unihal_conformance::run_child_if_requested(registry);
    let lib = support::build_template();
    unihal_plugin::host::register(registry, &lib, &[], &[])
        .unwrap_or_else(|e| panic!("the template plugin {} must load: {e}", lib.display()));
    let (targets, unavailable) = discover(registry, None).expect("the registry lists it");
    assert!(unavailable.is_empty(), "{unavailable:?}");
    assert_eq!(targets.len(), 1, "one template device");
    let cases = unihal_conformance::cases::all();
    let report = run(&targets, Vec::new(), &cases, &RunOptions::default());
    let results = &report.targets[0].results;
    assert_eq!(results.len(), cases.len());
    let mut wrong = Vec::new();
    for r in results {
        match &r.outcome {
            Outcome::Skipped { reason }
                if reason.contains("the template backend implements nothing yet") => {}
            other => wrong.push(format!("{}: {other:?}", r.id)),
        }
    }
    assert!(
        wrong.is_empty(),
        "cases not skipped with the template's reason:\n{}",
        wrong.join("\n")
    );
    println!(
        "template plugin: {} cases, 0 failures, every one skipped with the template's reason",
        results.len()
    );
}
