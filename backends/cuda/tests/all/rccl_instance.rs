//! The RCCL instance of the shared NCCL-API engine runs, not only resolves: on the CUDA platform
//! and the simulated driver, with the simulated library loaded as RCCL (`UNIHAL_RCCL_LIB`,
//! answering as RCCL: `UNIHAL_SIM_NCCL_FLAVOR=rccl`), an all-to-all between two ranks goes
//! through RCCL's `ncclAllToAll` (an injected failure of that entry point, and only that one,
//! fails it) and errors carry RCCL's name.

use crate::support;

use std::sync::Arc;
use support::{controls, simulated_driver};
use unihal_ccl::{NcclEngine as Engine, RCCL};
use unihal_cuda::CudaBackend;
use unihal_cuda::CudaPlatform;
use unihal_hal::{Backend, Collectives, CommConfig, DType, HalError, Stream};

#[test]
fn the_rccl_instance_runs_all_to_all_through_rccls_entry_point() {
    if crate::own_process() {
        return;
    }
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_CUDA_LIB", &lib);
    std::env::set_var("UNIHAL_RCCL_LIB", &lib);
    std::env::set_var("UNIHAL_SIM_NCCL_FLAVOR", "rccl");
    let backend = Arc::new(CudaBackend::new());
    let rccl = Engine::new(RCCL, Arc::new(CudaPlatform::default()));
    assert!(
        rccl.capabilities().engine.starts_with("RCCL "),
        "{}",
        rccl.capabilities().engine
    );
    let devs = [backend.open(0).unwrap(), backend.open(1).unwrap()];
    let comms = rccl.init_all(&devs, &CommConfig::default()).unwrap();
    let results: Vec<Vec<u32>> = std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                sc.spawn(move || {
                    let dev = c.device();
                    let s: Arc<dyn Stream> = dev.create_stream().unwrap();
                    let r = c.rank() as u32;
                    // Block j of rank r's send goes to rank j: 4 elements r*100 + j*10 + i.
                    let v: Vec<u8> = (0..2u32)
                        .flat_map(|j| (0..4u32).map(move |i| r * 100 + j * 10 + i))
                        .flat_map(|x| x.to_le_bytes())
                        .collect();
                    let send = dev.alloc(32).unwrap();
                    let recv = dev.alloc(32).unwrap();
                    s.write(&send, 0, &v).unwrap();
                    c.all_to_all(&send, &recv, 4, DType::U32, &s).unwrap();
                    let mut out = vec![0u8; 32];
                    s.read(&recv, 0, &mut out).unwrap();
                    out.chunks(4)
                        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, got) in results.iter().enumerate() {
        let want: Vec<u32> = (0..2u32)
            .flat_map(|j| (0..4u32).map(move |i| j * 100 + r as u32 * 10 + i))
            .collect();
        assert_eq!(got, &want, "rank {r}");
    }
    // The entry point the RCCL instance calls is RCCL's spelling: failing it fails the call.
    controls::fail("ncclAllToAll", 1, 5);
    let c = &comms[0];
    let s = c.device().create_stream().unwrap();
    let (a, b) = (c.device().alloc(32).unwrap(), c.device().alloc(32).unwrap());
    match c.all_to_all(&a, &b, 4, DType::U32, &s) {
        Err(HalError::Vendor { library, code, .. }) => {
            assert_eq!((library.as_str(), code), ("RCCL", 5))
        }
        other => panic!("all-to-all with ncclAllToAll failing: {other:?}"),
    }
    controls::clear();
}
