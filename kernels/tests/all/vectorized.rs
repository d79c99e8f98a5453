//! The CPU build of the hot kernels is vectorised: the object code of `uh_add_f32` uses packed SSE
//! instructions in the base variant and 256-bit AVX registers in the AVX2 variant; the row kernels
//! (sum, softmax with its exp) use packed instructions too, which needs the build flags in the
//! right order (`-fno-fast-math` first) and `-fno-trapping-math`.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::process::Command;

/// Disassembly of `symbol` from the static library `lib`, if it has that symbol.
fn try_disassemble(lib: &str, symbol: &str) -> Option<String> {
    let out = Command::new("objdump")
        .args(["-d", "-C", "--no-show-raw-insn", lib])
        .output()
        .expect("objdump (binutils) is installed with the C toolchain");
    assert!(out.status.success(), "objdump failed on {lib}");
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find(&format!("<{symbol}>:"))?;
    let body = &text[start..];
    let end = body[1..].find("\n\n").map_or(body.len(), |e| e + 1);
    Some(body[..end].to_string())
}

/// Disassembly of `symbol` from the static library `lib`.
fn disassemble(lib: &str, symbol: &str) -> String {
    try_disassemble(lib, symbol).unwrap_or_else(|| panic!("{symbol} not found in {lib}"))
}

/// Disassembly of a kernel: its entry point and, when the compiler kept the kernel template's
/// `run` out of line, that function too.
fn kernel(lib: &str, entry: &str, run: &str) -> String {
    let mut text = disassemble(lib, entry);
    text.push_str(&try_disassemble(lib, run).unwrap_or_default());
    text
}

#[test]
fn add_f32_is_vectorised_in_every_variant() {
    let base = disassemble(env!("UNIHAL_KERNELS_LIB_UH_BASE"), "uh_base_uh_add_f32");
    assert!(
        base.contains("addps"),
        "base uh_add_f32 has no packed adds:\n{base}"
    );
    let avx2 = disassemble(env!("UNIHAL_KERNELS_LIB_UH_AVX2"), "uh_avx2_uh_add_f32");
    assert!(
        avx2.contains("vaddps") && avx2.contains("ymm"),
        "avx2 uh_add_f32 has no 256-bit adds:\n{avx2}"
    );
    let avx512 = disassemble(env!("UNIHAL_KERNELS_LIB_UH_AVX512"), "uh_avx512_uh_add_f32");
    assert!(
        avx512.contains("vaddps") && avx512.contains("zmm"),
        "avx512 uh_add_f32 has no 512-bit adds:\n{avx512}"
    );
}

#[test]
fn row_kernels_are_vectorised_in_the_avx2_variant() {
    let lib = env!("UNIHAL_KERNELS_LIB_UH_AVX2");
    let softmax = kernel(
        lib,
        "uh_avx2_uh_softmax_f32",
        "uh_softmax_k<uh_f32_t, 0, 0>::run(uh_host_ctx const*, uh_args const&)",
    );
    // The exp of every element: packed float -> int conversions and packed multiplies on ymm.
    assert!(
        softmax.contains("vcvttps2dq") && softmax.contains("vmulps") && softmax.contains("ymm"),
        "avx2 softmax f32 does not vectorise its exp:\n{softmax}"
    );
    let sum = kernel(
        lib,
        "uh_avx2_uh_reduce_sum_f32",
        "uh_reduce_k<uh_f32_t, 0>::run(uh_host_ctx const*, uh_args const&)",
    );
    assert!(
        sum.contains("vaddps") && sum.contains("ymm"),
        "avx2 reduce_sum f32 has no packed adds:\n{sum}"
    );
}

#[test]
fn gelu_tanh_is_vectorised_without_libm_calls() {
    // GELU (tanh form) and its gradient carry a transformer's MLP: their tanh is uh_tanh_fast,
    // branch-free, so both vectorise instead of calling tanhf once per element.
    let lib = env!("UNIHAL_KERNELS_LIB_UH_AVX2");
    for (entry, run, name) in [
        (
            "uh_avx2_uh_gelu_tanh_f32",
            "uh_unary_k<uh_f32_t, uh_op_gelu_tanh>::run(uh_host_ctx const*, uh_args const&)",
            "gelu_tanh",
        ),
        (
            "uh_avx2_uh_gelu_tanh_backward_f32",
            "uh_unary_backward_k<uh_f32_t, uh_op_gelu_tanh_backward>::run(uh_host_ctx const*, uh_args const&)",
            "gelu_tanh_backward",
        ),
    ] {
        let code = kernel(lib, entry, run);
        assert!(
            code.contains("vdivps") && code.contains("ymm"),
            "avx2 {name} f32 has no packed divides:\n{code}"
        );
        assert!(!code.contains("tanhf"), "avx2 {name} f32 calls tanhf:\n{code}");
    }
}

#[test]
fn variants_export_only_their_own_entry_points() {
    // A C++ symbol with external linkage in a variant library (a template instance's weak, COMDAT
    // definition) is merged with the other variants' copies at link time, and the linker keeps
    // one: the AVX-512 entry points then run the base variant's SSE code. Every global symbol a
    // variant defines must be its own, prefixed entry point or table.
    for (lib, prefix) in [
        (env!("UNIHAL_KERNELS_LIB_UH_BASE"), "uh_base_"),
        (env!("UNIHAL_KERNELS_LIB_UH_AVX2"), "uh_avx2_"),
        (env!("UNIHAL_KERNELS_LIB_UH_AVX512"), "uh_avx512_"),
    ] {
        let out = Command::new("nm")
            .args(["-g", "--defined-only", lib])
            .output()
            .expect("nm (binutils) is installed with the C toolchain");
        assert!(out.status.success(), "nm failed on {lib}");
        let foreign: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|s| !s.starts_with(prefix))
            .map(str::to_string)
            .collect();
        assert!(
            foreign.is_empty(),
            "{lib} defines {} global symbols outside its prefix {prefix}, e.g. {:?}",
            foreign.len(),
            &foreign[..foreign.len().min(5)]
        );
    }
}
