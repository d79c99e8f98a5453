//! The portable library compiled by the real NVRTC, as the CUDA backend will compile it, loaded by
//! the simulator: every entry of the PTX is found with one `uh_args` parameter and has a host
//! function to run it; the cubin of the same compile is rejected as an invalid image (so the
//! backend's cubin-first loading falls back to PTX). Needs NVRTC: ignored unless asked for
//! (`cargo test -p unihal-sim --test all -- --ignored nvrtc_library::`, as `.ci/run` does after
//! installing it): a missing compiler then fails, never skips.

use unihal_kernels::args::UhArgs;
use unihal_kernels::rtc::nvrtc::Nvrtc;
use unihal_kernels::source::{entry_names, library_source, GpuTarget};
use unihal_sim::{Device, Kernels, Limits, Mode, SimError};

#[test]
#[ignore = "needs NVIDIA's NVRTC: run with --ignored (CI does)"]
fn the_simulator_loads_every_kernel_of_the_nvrtc_library() {
    if crate::own_process() {
        return;
    }
    let nvrtc = Nvrtc::load().unwrap_or_else(|e| panic!("NVRTC must be installed: {e}"));
    let out = nvrtc
        .compile(
            &library_source(GpuTarget::Cuda),
            "unihal_kernels.cu",
            "sm_80",
        )
        .unwrap_or_else(|e| panic!("NVRTC: {e}"));
    let mut kernels = Kernels::new();
    let table = unihal_kernels::cpu::host_symbols();
    for name in table.names() {
        kernels.insert(name.to_string(), table.get(name).expect("listed").func);
    }
    let d = Device::with_kernels(1 << 24, Mode::Deferred, kernels.clone(), Limits::default());
    let m = d
        .load_module(unihal_sim::module::parse_ptx(out.ptx.as_bytes()).unwrap())
        .unwrap();
    let names = entry_names();
    for name in &names {
        let f = d
            .function(m, name)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let e = d.entry(f).unwrap();
        assert_eq!(e.param_sizes, vec![std::mem::size_of::<UhArgs>()], "{name}");
        assert!(kernels.get(name).is_some(), "{name} has no host function");
    }
    // A cubin is not PTX: the face refuses it before the core sees it.
    assert!(matches!(
        unihal_sim::module::parse_ptx(&out.cubin),
        Err(SimError::InvalidImage(_))
    ));
    eprintln!(
        "{} entries of NVRTC {:?} PTX load, each with its host function",
        names.len(),
        nvrtc.version()
    );
}
