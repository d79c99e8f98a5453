//! The simulated driver's shared object calls itself `libcuda.so`, the first name cudarc opens.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so");
}
