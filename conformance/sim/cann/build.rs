//! With feature `abi-check`: bindgen's reading of Huawei's real ACL and HCCL headers (those the
//! torch-npu wheel ships, pinned by .ci/run; `UNIHAL_TORCH_NPU_INCLUDE` names its
//! `torch_npu/include`), written to `$OUT_DIR/cann_abi.rs` for `tests/abi.rs`. Needs libclang.
//! Without the feature nothing is generated.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "abi-check")]
    abi::generate();
}

#[cfg(feature = "abi-check")]
mod abi {
    pub fn generate() {
        println!("cargo:rerun-if-env-changed=UNIHAL_TORCH_NPU_INCLUDE");
        let include = std::env::var("UNIHAL_TORCH_NPU_INCLUDE").unwrap_or_else(|_| {
            panic!(
                "UNIHAL_TORCH_NPU_INCLUDE must name the torch-npu wheel's torch_npu/include \
                 (the real ACL and HCCL headers; .ci/run downloads torch-npu==2.14.0)"
            )
        });
        let acl = format!("{include}/third_party/acl/inc");
        let hccl = format!("{include}/third_party/hccl/inc");
        for h in [format!("{acl}/acl/acl_rt.h"), format!("{hccl}/hccl/hccl.h")] {
            println!("cargo:rerun-if-changed={h}");
        }
        let bindings = bindgen::Builder::default()
            .header_contents("cann.h", "#include <acl/acl.h>\n#include <hccl/hccl.h>\n")
            .clang_args(["-xc++", "-std=c++14"])
            .clang_arg(format!("-I{include}"))
            .clang_arg(format!("-I{acl}"))
            .clang_arg(format!("-I{hccl}"))
            .allowlist_function("acl.*|Hccl.*")
            .allowlist_type("acl.*|Hccl.*")
            .allowlist_var("ACL_.*|HCCL_.*")
            .default_enum_style(bindgen::EnumVariation::Consts)
            .prepend_enum_name(false)
            .dynamic_library_name("CannHeader")
            .dynamic_link_require_all(false)
            .layout_tests(false)
            .generate()
            .unwrap_or_else(|e| {
                panic!("bindgen over the ACL/HCCL headers in {include} failed: {e}")
            });
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
        bindings
            .write_to_file(out.join("cann_abi.rs"))
            .expect("writing the bindings");
    }
}
