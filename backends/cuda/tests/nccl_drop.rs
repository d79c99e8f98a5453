//! Dropping an NCCL communicator with an operation in flight whose peer never comes returns at
//! once: it aborts the communicator (`ncclCommDestroy` would wait for the operation, which the
//! simulated NCCL does, as NCCL does, for up to its watchdog, 4 s here).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{controls, simulated_driver};
use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, CommConfig, DType, ReduceOp, Stream};

#[test]
fn dropping_a_communicator_with_an_operation_waiting_for_a_peer_returns_at_once() {
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_CUDA_LIB", &lib);
    std::env::set_var("UNIHAL_NCCL_LIB", &lib);
    std::env::set_var("UNIHAL_SIM_WATCHDOG_MS", "4000");
    let backend = Arc::new(CudaBackend::new());
    let ccl = backend.collectives().expect("simulated NCCL loads");
    let (d0, d1) = (backend.open(0).unwrap(), backend.open(1).unwrap());
    let mut comms = ccl
        .init_all(&[d0.clone(), d1], &CommConfig::default())
        .unwrap();
    let s: Arc<dyn Stream> = d0.create_stream().unwrap();
    let b = d0.alloc(64).unwrap();
    // Rank 1 never joins this all-reduce.
    comms[0]
        .all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &s)
        .unwrap();
    let rank0 = comms.remove(0);
    let t0 = Instant::now();
    drop(rank0);
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(1500), "drop took {took:?}");
    // Its stream reports the failure instead of waiting.
    assert!(s.synchronize().is_err());
    drop(comms);
    assert_eq!(controls::violations().0, 0, "{}", controls::violations().1);
}
