//! The CUDA backend's own code on unihal's simulated CUDA driver (deferred mode), in CI without a
//! GPU: the driver is found through `UNIHAL_CUDA_LIB`, named as simulated, and every conformance
//! case that is not a library op or a collective passes (the ops need NVRTC and run in `.ci/run`
//! through `unihal conformance --backend cuda`). A case that needs a kernel running concurrently
//! with the host is skipped with that reason; no other case may skip for lack of a feature the
//! backend claims.

mod support;

use std::sync::Arc;
use support::simulated_driver;
use unihal_conformance::manifest::Manifest;
use unihal_conformance::report::Outcome;
use unihal_conformance::runner::{run_case, RunOptions, Target};
use unihal_cuda::CudaBackend;
use unihal_hal::Backend;

#[test]
fn non_op_cases_pass_on_the_simulated_driver() {
    std::env::set_var("UNIHAL_CUDA_LIB", simulated_driver());
    std::env::set_var("UNIHAL_SIM_MODE", "deferred");
    let backend: Arc<dyn Backend> = Arc::new(CudaBackend::new());
    assert_eq!(
        backend.probe().unwrap(),
        2,
        "the simulator's default device count"
    );
    let info = backend.info();
    assert!(
        info.simulated,
        "a simulated driver must be reported as such"
    );
    let device = backend.open(0).unwrap();
    assert!(
        device.info().name.contains("simulated"),
        "{}",
        device.info().name
    );
    let t = Target {
        device,
        backend,
        manifest: Manifest::default(),
        world: None,
    };
    let mut ran = 0;
    for c in unihal_conformance::cases::all()
        .into_iter()
        .filter(|c| !c.id.starts_with("ops.") && !c.id.starts_with("ccl."))
    {
        // Fault cases run in-process here (no unihal binary to isolate them): skip them, the
        // CLI run in CI isolates them.
        if c.faults {
            continue;
        }
        let r = run_case(&c, &t, &RunOptions::default());
        match &r.outcome {
            Outcome::Passed => ran += 1,
            // The only need deferred mode lacks. Stream-ordered allocation, peer devices and
            // host callbacks exist on the simulated driver: a skip for them is a regression.
            Outcome::Skipped { reason } if reason.contains("concurrently with the host") => {}
            other => panic!("{}: {other:?}", c.id),
        }
    }
    assert!(ran >= 40, "only {ran} cases ran");
}
