//! CI gates with the vendors' real compilers: every library kernel compiles with NVIDIA's NVRTC to
//! PTX and cubin for sm_80 and sm_90, and with AMD's hiprtc to code objects for gfx906, gfx908 and
//! gfx90a. Built only with the `rtc-gates` feature; a missing compiler is a failure, never a skip
//! (`.ci/run` installs pinned versions).
#![cfg(feature = "rtc-gates")]

use unihal_kernels::rtc::{hiprtc::Hiprtc, nvrtc::Nvrtc, ptx_entries};
use unihal_kernels::source::{entry_names, library_source, GpuTarget};

#[test]
fn nvrtc_compiles_every_kernel_for_sm80_and_sm90() {
    let nvrtc =
        Nvrtc::load().unwrap_or_else(|e| panic!("NVRTC must be installed for this gate: {e}"));
    eprintln!("NVRTC {:?} from {}", nvrtc.version(), nvrtc.path());
    let src = library_source(GpuTarget::Cuda);
    let names = entry_names();
    for arch in ["sm_80", "sm_90"] {
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
fn hiprtc_compiles_every_kernel_for_gfx906_gfx908_gfx90a() {
    let hiprtc =
        Hiprtc::load().unwrap_or_else(|e| panic!("hiprtc must be installed for this gate: {e}"));
    eprintln!("hiprtc {:?} from {}", hiprtc.version(), hiprtc.path());
    let src = library_source(GpuTarget::Hip);
    let names = entry_names();
    for arch in ["gfx906", "gfx908", "gfx90a"] {
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
