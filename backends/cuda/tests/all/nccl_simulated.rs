//! The NCCL engine on unihal's simulated NCCL (the same object as the simulated driver): an
//! all-reduce between two ranks (threads), in `cargo test`. The other collectives, groups,
//! timeouts and aborts run as conformance cases through `unihal conformance --backend cuda` in
//! `.ci/run`.

use crate::support;

use std::sync::Arc;
use support::simulated_driver;
use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, CommConfig, DType, ReduceOp, Stream};

#[test]
fn all_reduce_between_two_ranks() {
    if crate::own_process() {
        return;
    }
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_CUDA_LIB", &lib);
    std::env::set_var("UNIHAL_NCCL_LIB", &lib);
    let backend = Arc::new(CudaBackend::new());
    let ccl = backend.collectives().expect("simulated NCCL loads");
    let id = ccl.unique_id().unwrap();
    let threads: Vec<_> = (0..2usize)
        .map(|r| {
            let (backend, id) = (backend.clone(), id.clone());
            std::thread::spawn(move || {
                let dev = backend.open(r).unwrap();
                let ccl = backend.collectives().unwrap();
                let comm = ccl
                    .init_rank(&id, 2, r, &dev, &CommConfig::default())
                    .unwrap();
                let s: Arc<dyn Stream> = dev.create_stream().unwrap();
                let v: Vec<u8> = (0..64u32)
                    .flat_map(|i| ((i + 100 * r as u32) as f32).to_le_bytes())
                    .collect();
                let send = dev.alloc(256).unwrap();
                let recv = dev.alloc(256).unwrap();
                s.write(&send, 0, &v).unwrap();
                comm.all_reduce(&send, &recv, 64, DType::F32, ReduceOp::Sum, &s)
                    .unwrap();
                let mut out = vec![0u8; 256];
                s.read(&recv, 0, &mut out).unwrap();
                out
            })
        })
        .collect();
    for t in threads {
        let out = t.join().unwrap();
        let got: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want: Vec<f32> = (0..64).map(|i| (2 * i + 100) as f32).collect();
        assert_eq!(got, want);
    }
}
