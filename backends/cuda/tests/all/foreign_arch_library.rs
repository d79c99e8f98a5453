//! `UNIHAL_CUDA_LIB` naming a driver built for another machine (here the C math library with an
//! AArch64 header): `Unavailable` saying so, where the loader alone says "No such file or
//! directory" about a file that exists. (Its own process: the driver is opened once per process.)

use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, HalError};

#[test]
fn an_override_built_for_another_machine_is_named_as_such() {
    if crate::own_process() {
        return;
    }
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("the C math library");
    let mut bytes = std::fs::read(libm).unwrap();
    bytes[18..20].copy_from_slice(&183u16.to_le_bytes());
    let f = std::env::temp_dir().join(format!("libcuda-aarch64-{}.so", std::process::id()));
    std::fs::write(&f, &bytes).unwrap();
    std::env::set_var("UNIHAL_CUDA_LIB", &f);
    let r = CudaBackend::new().probe();
    let _ = std::fs::remove_file(&f);
    match r {
        Err(HalError::Unavailable { reason, .. }) => {
            assert!(reason.contains("is built for AArch64"), "{reason}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
