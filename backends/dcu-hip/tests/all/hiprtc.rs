//! The HIP backend's compile path against AMD's real hiprtc (Debian's ROCm 5.2, installed by
//! .ci/run; ignored unless asked for with `--ignored`, as CI does, and then fails when hiprtc is
//! missing):
//! * the test kernels and the portable library compile for gfx906 (a Hygon-class DCU) and gfx90a
//!   (an AMD Instinct) in this process, and their code objects' metadata gives every kernel's
//!   explicit argument sizes;
//! * an architecture this hiprtc aborts on (gfx942, Hygon's gfx928) is compiled in the helper:
//!   the error names the architecture, and this process survives (twice: remembered).

use unihal_codeobj::amdgpu as code_object;
use unihal_hal::HalError;
use unihal_hip::{device, loader};
use unihal_kernels::source::{entry_names, library_source, GpuTarget};
use unihal_kernels::testing::{names, HIP_SOURCE};

fn cache_off() {
    // Every compile is real: no cache entry from an earlier run may answer.
    std::env::set_var("UNIHAL_KERNEL_CACHE", "off");
}

#[test]
#[ignore = "needs AMD's hiprtc (Debian's libamdhip64-5): run with --ignored (CI does)"]
fn test_kernels_and_library_compile_with_their_argument_sizes() {
    if crate::own_process() {
        return;
    }
    cache_off();
    let rtc = loader::hiprtc().unwrap_or_else(|e| panic!("hiprtc must be installed: {e}"));
    eprintln!("hiprtc {:?} from {}", rtc.version(), rtc.path());
    for arch in ["gfx906", "gfx90a"] {
        let code = device::code_object(HIP_SOURCE, "uh_testing.hip", arch)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(&code[..4], b"\x7fELF", "{arch}: not an ELF");
        let args = code_object::kernel_args(&code).unwrap();
        assert_eq!(args[names::IOTA_U32], vec![8, 4], "{arch}");
        assert_eq!(args[names::AXPY_F32], vec![4, 4, 8, 8], "{arch}");
        assert_eq!(
            args[names::ARGS_PROBE],
            vec![8, 1, 2, 4, 8, 4, 8, 8],
            "{arch}"
        );
        assert_eq!(args[names::FAIL], vec![4], "{arch}");
        for n in names::ALL {
            assert!(args.contains_key(n), "{arch}: {n} missing");
        }
        let lib = device::code_object(&library_source(GpuTarget::Hip), "unihal_kernels.hip", arch)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        let args = code_object::kernel_args(&lib).unwrap();
        for e in entry_names() {
            // One `uh_args` parameter passed by value.
            assert_eq!(args.get(&e).map(Vec::len), Some(1), "{arch}: {e}");
        }
    }
}

#[test]
#[ignore = "needs AMD's hiprtc (Debian's libamdhip64-5): run with --ignored (CI does)"]
fn an_architecture_hiprtc_aborts_on_is_an_error_naming_it() {
    if crate::own_process() {
        return;
    }
    cache_off();
    loader::hiprtc().unwrap_or_else(|e| panic!("hiprtc must be installed: {e}"));
    unihal_kernels::rtc::helper::helper_path()
        .unwrap_or_else(|e| panic!("the helper must be built: {e}"));
    for arch in ["gfx942", "gfx928"] {
        for attempt in 0..2 {
            let e = device::code_object(HIP_SOURCE, "uh_testing.hip", arch)
                .expect_err("this hiprtc cannot compile it");
            let text = e.to_string();
            assert!(matches!(e, HalError::Vendor { .. }), "{arch}: {e:?}");
            assert!(text.contains(arch), "{arch} (attempt {attempt}): {text}");
            assert!(text.contains("hiprtc"), "{text}");
        }
    }
}
