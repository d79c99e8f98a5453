//! With feature `abi-check`: bindgen's reading of Debian's real HIP headers
//! (`/usr/include/hip/hip_runtime_api.h`, `-D__HIP_PLATFORM_AMD__`), written to
//! `$OUT_DIR/hip_abi.rs` for `tests/abi.rs`. Needs libclang and libamdhip64-dev (.ci/run installs
//! them). Without the feature nothing is generated.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "abi-check")]
    abi::generate();
}

#[cfg(feature = "abi-check")]
mod abi {
    pub fn generate() {
        let include = std::env::var("UNIHAL_HIP_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
        let header = format!("{include}/hip/hip_runtime_api.h");
        println!("cargo:rerun-if-env-changed=UNIHAL_HIP_INCLUDE");
        println!("cargo:rerun-if-changed={header}");
        let bindings = bindgen::Builder::default()
            .header(&header)
            .clang_arg("-D__HIP_PLATFORM_AMD__")
            .clang_arg(format!("-I{include}"))
            .allowlist_function("hip.*")
            .allowlist_type("hip.*")
            .allowlist_var("hip.*")
            .default_enum_style(bindgen::EnumVariation::Consts)
            .prepend_enum_name(false)
            .dynamic_library_name("HipHeader")
            .dynamic_link_require_all(false)
            .layout_tests(false)
            .generate()
            .unwrap_or_else(|e| {
                panic!("bindgen over {header} failed (is libamdhip64-dev installed?): {e}")
            });
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
        bindings
            .write_to_file(out.join("hip_abi.rs"))
            .expect("writing the bindings");
    }
}
