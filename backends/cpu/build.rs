//! With feature `gloo`: compiles the gloo shim (`src/ccl/gloo/shim.cpp`) and links the system's
//! gloo (Debian's `libgloo-dev`: headers under /usr/include/gloo, `libgloo.so`). Without it:
//! nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "gloo")]
    {
        let shim = "src/ccl/gloo/shim.cpp";
        println!("cargo:rerun-if-changed={shim}");
        println!("cargo:rerun-if-env-changed=UNIHAL_GLOO_PREFIX");
        let prefix = std::env::var("UNIHAL_GLOO_PREFIX").unwrap_or_else(|_| "/usr".into());
        let header = std::path::Path::new(&prefix).join("include/gloo/rendezvous/store.h");
        if !header.exists() {
            panic!(
                "feature `gloo` needs gloo's headers ({} is missing): install Debian's \
                 libgloo-dev (apt-get install libgloo-dev), or set UNIHAL_GLOO_PREFIX to where \
                 gloo is installed",
                header.display()
            );
        }
        cc::Build::new()
            .cpp(true)
            .std("c++17")
            .file(shim)
            .include(format!("{prefix}/include"))
            .warnings(true)
            .compile("unihal_gloo_shim");
        println!("cargo:rustc-link-search=native={prefix}/lib");
        println!("cargo:rustc-link-search=native={prefix}/lib/x86_64-linux-gnu");
        println!("cargo:rustc-link-lib=dylib=gloo");
    }
}
