//! The null runtime as a backend: the shared GPU backend runs over it, the conformance suite
//! reaches its report with every case skipped for the template's reason (as the plugin
//! template does), and each raw call's error names the vendor calls it maps to.

use std::sync::Arc;
use unihal_conformance::{discover, run, Outcome, RunOptions};
use unihal_gpu::runtime::Runtime;
use unihal_hal::{Backend, HalError};
use unihal_null::NullBackend;

#[test]
fn the_suite_skips_every_case_for_the_templates_reason() {
    let registry = unihal_hal::Registry::new();
    registry
        .register(unihal_null::NAME, || {
            Arc::new(NullBackend::new()) as Arc<dyn Backend>
        })
        .unwrap();
    let (targets, unavailable) = discover(&registry, Some(unihal_null::NAME)).unwrap();
    assert!(unavailable.is_empty(), "{unavailable:?}");
    assert_eq!(targets.len(), 1, "one null device");
    let cases = unihal_conformance::cases::all();
    let report = run(&targets, Vec::new(), &cases, &RunOptions::default());
    let results = &report.targets[0].results;
    assert_eq!(results.len(), cases.len());
    let wrong: Vec<String> = results
        .iter()
        .filter(|r| !matches!(&r.outcome, Outcome::Skipped { reason } if reason.contains("the null runtime implements nothing yet")))
        .map(|r| format!("{}: {:?}", r.id, r.outcome))
        .collect();
    assert!(
        wrong.is_empty(),
        "not skipped with the template's reason:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_raw_call_names_the_vendor_calls_it_maps_to() {
    match unihal_null::runtime::NULL.malloc(256) {
        Err(HalError::Unsupported { what: m }) => {
            assert!(
                m.contains("malloc") && m.contains("cuMemAlloc") && m.contains("memory.alloc"),
                "{m}"
            )
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let b = NullBackend::new();
    assert_eq!(b.probe().unwrap(), 1);
    let info = b.info();
    assert!(!info.simulated);
    assert!(info
        .libraries
        .iter()
        .any(|l| l.role == "collectives" && l.error.is_some()));
    let dev = b.open(0).unwrap();
    assert!(matches!(dev.alloc(256), Err(HalError::Unsupported { .. })));
}
