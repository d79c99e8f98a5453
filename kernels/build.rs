//! Builds the portable kernel library for the CPU backend: `device/uh_cpu.cpp` compiled by the
//! system C++ compiler, the AVX2 and AVX-512 variants at -O3 whatever the cargo profile (so
//! tests run the code that is benchmarked), the baseline (SSE2) one, which only a machine
//! without AVX2 runs, at -O2 with -O3's vectoriser cost model (half the compile time), never
//! with -ffast-math (only -fno-math-errno and -fno-trapping-math, which change no value),
//! without floating-point contraction (so every ISA variant and every backend round
//! identically), once per ISA level for run-time dispatch. The variants
//! compile side by side (one compiler process each), and with `UNIHAL_KERNELS_BUILD_CACHE` set
//! their archives are reused by every other build that would compile them identically
//! (`build_cache.rs`).

#[path = "src/catalogue.rs"]
#[allow(dead_code)]
mod catalogue;

#[path = "build_cache.rs"]
mod build_cache;

use std::path::PathBuf;

/// Every file the library's compile reads, relative to the crate (the generated catalogue,
/// `uh_kernels.def` in OUT_DIR, comes on top).
const SOURCES: [&str; 7] = [
    "device/uh_dialect.h",
    "device/uh_ops.h",
    "device/uh_nn.h",
    "device/uh_attention.h",
    "device/uh_gemm.h",
    "device/uh_optim.h",
    "device/uh_cpu.cpp",
];

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("uh_kernels.def"), catalogue::def_file())
        .expect("write uh_kernels.def");
    for f in SOURCES
        .iter()
        .chain(&["src/catalogue.rs", "build_cache.rs"])
    {
        println!("cargo:rerun-if-changed={f}");
    }
    let mut sources: Vec<PathBuf> = SOURCES.iter().map(PathBuf::from).collect();
    sources.push(out.join("uh_kernels.def"));
    let cache = build_cache::dir();
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    // (name, optimisation level, flags). Without x86 variants the base one is all there is: -O3.
    let x86 = arch == "x86_64";
    // The baseline at -O2 keeps -O3's vectoriser cost model, so its hot loops stay packed SSE.
    let mut variants: Vec<(&str, u32, &[&str])> = if x86 {
        vec![("uh_base", 2, &["-fvect-cost-model=dynamic"])]
    } else {
        vec![("uh_base", 3, &[])]
    };
    if x86 {
        variants.push(("uh_avx2", 3, &["-mavx2", "-mfma", "-mf16c"]));
        variants.push((
            "uh_avx512",
            3,
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
    let builds: Vec<(&str, cc::Build)> = variants
        .into_iter()
        .map(|(variant, opt, flags)| {
            let mut b = cc::Build::new();
            b.cpp(true)
                .file("device/uh_cpu.cpp")
                .include("device")
                .include(&out)
                .define("UH_CPU", "1")
                .define("UH_VARIANT", variant)
                .opt_level(opt)
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
                .warnings(false)
                // The link lines are printed below, once per archive whether compiled or cached.
                .cargo_metadata(false);
            for f in flags {
                b.flag(f);
            }
            (variant, b)
        })
        .collect();
    // One thread per variant: each is a single compiler process of about a minute, so on a
    // machine with free cores they overlap instead of queueing behind one another.
    std::thread::scope(|scope| {
        for (variant, b) in &builds {
            let (out, sources, cache) = (&out, &sources, &cache);
            scope.spawn(move || {
                let lib = format!("unihal_kernels_{variant}");
                let file = format!("lib{lib}.a");
                // A copy with cargo metadata on, for the `rerun-if-env-changed` lines of the
                // variables the compiler's command reads (CXX, CXXFLAGS, ...).
                let mut probe = b.clone();
                probe.cargo_metadata(true);
                let key = match cache {
                    Some(_) => Some(build_cache::key(&probe, out, sources)),
                    None => {
                        probe.get_compiler();
                        None
                    }
                };
                let cached = match (cache, &key) {
                    (Some(dir), Some(key)) => build_cache::fetch(dir, key, &file, out),
                    _ => false,
                };
                if !cached {
                    // Each variant's objects in a directory of its own: all three compile the
                    // same source, whose object file name cc derives from the source path, so
                    // side by side in one directory they would overwrite one another.
                    let own = out.join(variant);
                    let mut b = b.clone();
                    b.out_dir(&own);
                    b.compile(&lib);
                    std::fs::copy(own.join(&file), out.join(&file)).unwrap_or_else(|e| {
                        panic!("cannot copy {file} into {}: {e}", out.display())
                    });
                    if let (Some(dir), Some(key)) = (cache, &key) {
                        build_cache::store(dir, key, &file, out);
                    }
                }
            });
        }
    });
    println!("cargo:rustc-link-search=native={}", out.display());
    for (variant, _) in &builds {
        println!("cargo:rustc-link-lib=static=unihal_kernels_{variant}");
        println!(
            "cargo:rustc-env=UNIHAL_KERNELS_LIB_{}={}",
            variant.to_uppercase(),
            out.join(format!("libunihal_kernels_{variant}.a")).display()
        );
    }
    println!("cargo:rustc-link-lib=stdc++");
}
