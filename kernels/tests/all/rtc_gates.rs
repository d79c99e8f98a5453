//! CI gates with the vendors' real compilers: every library kernel compiles with NVIDIA's NVRTC to
//! PTX and cubin for sm_80 and sm_90, and with AMD's hiprtc to code objects for gfx906, gfx908 and
//! gfx90a. Ignored unless asked for (`cargo test -p unihal-kernels --test all -- --ignored
//! rtc_gates::`), as `.ci/run` does after installing pinned versions: a missing compiler is then a
//! failure, never a skip. `UNIHAL_RTC_ARCHS` (a comma-separated list, e.g. `sm_80,gfx908`) limits
//! the gates to those architectures, as CI's rotation does; unset, every architecture is compiled.

use unihal_kernels::rtc::{hiprtc::Hiprtc, nvrtc::Nvrtc, ptx_entries};
use unihal_kernels::source::{entry_names, library_source, GpuTarget};

/// The architectures of `all` this run compiles: those `UNIHAL_RTC_ARCHS` names, or all. A name
/// in the variable that neither gate knows fails the run (a typo would otherwise test nothing).
fn selected(all: &[&'static str]) -> Vec<&'static str> {
    const KNOWN: [&str; 5] = ["sm_80", "sm_90", "gfx906", "gfx908", "gfx90a"];
    let Ok(list) = std::env::var("UNIHAL_RTC_ARCHS") else {
        return all.to_vec();
    };
    let wanted: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    for a in &wanted {
        assert!(
            KNOWN.contains(a),
            "UNIHAL_RTC_ARCHS names {a:?}: not one of {KNOWN:?}"
        );
    }
    let chosen: Vec<_> = all.iter().copied().filter(|a| wanted.contains(a)).collect();
    eprintln!("UNIHAL_RTC_ARCHS={list}: compiling for {chosen:?} of {all:?}");
    chosen
}

#[test]
#[ignore = "needs NVIDIA's NVRTC: run with --ignored (CI does)"]
fn nvrtc_compiles_every_kernel_for_sm80_and_sm90() {
    let nvrtc =
        Nvrtc::load().unwrap_or_else(|e| panic!("NVRTC must be installed for this gate: {e}"));
    eprintln!("NVRTC {:?} from {}", nvrtc.version(), nvrtc.path());
    let src = library_source(GpuTarget::Cuda);
    let names = entry_names();
    for arch in selected(&["sm_80", "sm_90"]) {
        let t = std::time::Instant::now();
        let out = nvrtc
            .compile(&src, "unihal_kernels.cu", arch)
            .unwrap_or_else(|e| panic!("NVRTC {arch}: {e}"));
        eprintln!(
            "{arch}: PTX {} bytes, cubin {} bytes in {:?}",
            out.ptx.len(),
            out.cubin.len(),
            t.elapsed()
        );
        assert!(
            out.ptx.contains(&format!(".target {arch}")),
            "PTX for {arch} has no matching .target"
        );
        assert!(!out.cubin.is_empty(), "empty cubin for {arch}");
        assert_eq!(
            &out.cubin[..4],
            b"\x7fELF",
            "cubin for {arch} is not an ELF image"
        );
        let entries = ptx_entries(&out.ptx);
        for n in &names {
            assert!(
                entries.contains(n),
                "{arch}: entry {n} missing from the PTX"
            );
        }
        assert_eq!(entries.len(), names.len(), "{arch}: unexpected entries");
    }
}

#[test]
#[ignore = "needs AMD's hiprtc: run with --ignored (CI does)"]
fn hiprtc_compiles_every_kernel_for_gfx906_gfx908_gfx90a() {
    let hiprtc =
        Hiprtc::load().unwrap_or_else(|e| panic!("hiprtc must be installed for this gate: {e}"));
    eprintln!("hiprtc {:?} from {}", hiprtc.version(), hiprtc.path());
    let src = library_source(GpuTarget::Hip);
    let names = entry_names();
    for arch in selected(&["gfx906", "gfx908", "gfx90a"]) {
        let t = std::time::Instant::now();
        let out = hiprtc
            .compile(&src, "unihal_kernels.hip", arch)
            .unwrap_or_else(|e| panic!("hiprtc {arch}: {e}"));
        eprintln!(
            "{arch}: code object {} bytes in {:?}",
            out.code.len(),
            t.elapsed()
        );
        assert_eq!(&out.code[..4], b"\x7fELF", "{arch}: not an ELF code object");
        let text = String::from_utf8_lossy(&out.code);
        for n in &names {
            assert!(
                text.contains(&format!("{n}.kd")),
                "{arch}: kernel descriptor {n}.kd missing"
            );
        }
    }
    // Architectures that abort this hiprtc are refused before reaching it.
    let e = hiprtc.compile(&src, "x", "gfx942").unwrap_err();
    assert!(e.to_string().contains("aborts the process"), "{e}");
}

/// The committed PTX of the conformance test kernels is NVRTC's output for their CUDA source
/// (`UNIHAL_BLESS=1` rewrites it), and it has every test entry.
#[test]
#[ignore = "needs NVIDIA's NVRTC: run with --ignored (CI does)"]
fn test_kernels_ptx_is_nvrtc_output_of_their_source() {
    let nvrtc =
        Nvrtc::load().unwrap_or_else(|e| panic!("NVRTC must be installed for this gate: {e}"));
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("device");
    let src = std::fs::read_to_string(dir.join("uh_testing.cu")).unwrap();
    let out = nvrtc
        .compile(&src, "uh_testing.cu", "sm_80")
        .unwrap_or_else(|e| panic!("NVRTC: {e}"));
    let committed = dir.join("uh_testing.ptx");
    if std::env::var_os("UNIHAL_BLESS").is_some() {
        std::fs::write(&committed, &out.ptx).unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(&committed).unwrap(),
        out.ptx,
        "kernels/device/uh_testing.ptx is stale: rerun this test with UNIHAL_BLESS=1"
    );
    let entries = ptx_entries(&out.ptx);
    for n in unihal_kernels::testing::names::ALL {
        assert!(entries.iter().any(|e| e == n), "{n} missing from the PTX");
    }
    assert_eq!(entries.len(), unihal_kernels::testing::names::ALL.len());
}
