//! The CPU build of the hot elementwise kernels is vectorised: the object code of `uh_add_f32`
//! uses packed SSE instructions in the base variant and 256-bit AVX registers in the AVX2 variant.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::process::Command;

/// Disassembly of `symbol` from the static library `lib`.
fn disassemble(lib: &str, symbol: &str) -> String {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", lib])
        .output()
        .expect("objdump (binutils) is installed with the C toolchain");
    assert!(out.status.success(), "objdump failed on {lib}");
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text
        .find(&format!("<{symbol}>:"))
        .unwrap_or_else(|| panic!("{symbol} not found in {lib}"));
    let body = &text[start..];
    let end = body[1..].find("\n\n").map_or(body.len(), |e| e + 1);
    body[..end].to_string()
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
