//! The fuzz binaries export their symbols, so that an AddressSanitizer-built simulated driver
//! (`libunihal_sim_cuda.so`) loaded at run time finds the sanitizer's runtime in them.
fn main() {
    println!("cargo:rustc-link-arg-bins=-Wl,--export-dynamic");
}
