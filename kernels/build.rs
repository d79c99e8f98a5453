//! Builds the portable kernel library for the CPU backend: `device/uh_cpu.cpp` compiled by the
//! system C++ compiler, always at -O3 (whatever the cargo profile, so tests run the code that is
//! benchmarked), never with -ffast-math (only -fno-math-errno and -fno-trapping-math, which change no value), without floating-point contraction (so every ISA variant
//! and every backend round identically), once per ISA level for run-time dispatch.

#[path = "src/catalogue.rs"]
#[allow(dead_code)]
mod catalogue;

use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("uh_kernels.def"), catalogue::def_file())
        .expect("write uh_kernels.def");
    for f in [
        "device/uh_dialect.h",
        "device/uh_ops.h",
        "device/uh_nn.h",
        "device/uh_gemm.h",
        "device/uh_optim.h",
        "device/uh_cpu.cpp",
        "src/catalogue.rs",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut variants: Vec<(&str, &[&str])> = vec![("uh_base", &[])];
    if arch == "x86_64" {
        variants.push(("uh_avx2", &["-mavx2", "-mfma", "-mf16c"]));
        variants.push((
            "uh_avx512",
            &[
                "-mavx512f",
                "-mavx512bw",
                "-mavx512vl",
                "-mavx512dq",
                "-mprefer-vector-width=512",
            ],
        ));
        println!("cargo:rustc-cfg=unihal_x86_variants");
    }
    println!("cargo:rustc-check-cfg=cfg(unihal_x86_variants)");
    for (variant, flags) in variants {
        let mut b = cc::Build::new();
        b.cpp(true)
            .file("device/uh_cpu.cpp")
            .include("device")
            .include(&out)
            .define("UH_CPU", "1")
            .define("UH_VARIANT", variant)
            .opt_level(3)
            .debug(false)
            .flag("-std=c++14")
            .flag("-fno-exceptions")
            .flag("-fno-rtti")
            // First: -fno-fast-math resets -fmath-errno and -ftrapping-math to their defaults.
            .flag("-fno-fast-math")
            .flag("-ffp-contract=off")
            .flag("-fno-math-errno")
            // No FP exception flags are observed, so selects on comparisons if-convert and the
            // row kernels' branch-free math vectorises; results are unchanged (unlike fast-math).
            .flag("-fno-trapping-math")
            .warnings(false);
        for f in flags {
            b.flag(f);
        }
        b.compile(&format!("unihal_kernels_{variant}"));
        println!(
            "cargo:rustc-env=UNIHAL_KERNELS_LIB_{}={}",
            variant.to_uppercase(),
            out.join(format!("libunihal_kernels_{variant}.a")).display()
        );
    }
}
