//! The portable tiled GEMM kernel (what GPUs without a vendor BLAS run) through the matmul
//! conformance cases, on the CPU backend switched to it (`MatmulEngine::Dialect`).

use std::sync::Arc;
use unihal_conformance::manifest::Manifest;
use unihal_conformance::report::Outcome;
use unihal_conformance::runner::{run_case, RunOptions, Target};
use unihal_cpu::{CpuBackend, CpuConfig, MatmulEngine};
use unihal_hal::Backend;

#[test]
fn dialect_gemm_passes_the_matmul_cases() {
    let mut config = CpuConfig::from_values(Some("1"), Some("4G"), Some("2")).unwrap();
    config.matmul = MatmulEngine::Dialect;
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::with_config(config));
    let t = Target {
        device: backend.open(0).unwrap(),
        backend,
        manifest: Manifest::default(),
        world: None,
    };
    let cases: Vec<_> = unihal_conformance::cases::all()
        .into_iter()
        .filter(|c| c.id.starts_with("ops.matmul."))
        .collect();
    assert_eq!(cases.len(), 4, "one matmul case per float dtype");
    for c in &cases {
        let r = run_case(c, &t, &RunOptions::default());
        assert_eq!(r.outcome, Outcome::Passed, "{}", c.id);
    }
}
