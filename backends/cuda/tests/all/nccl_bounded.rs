//! NCCL's blocking calls that wait for every rank (`ncclCommInitRank`, `ncclCommSplit`) never
//! hang the caller: past the communicator's timeout it gets `Timeout`, although the simulated
//! NCCL (like the real one) would wait far longer. Its own process: the abandoned calls stay
//! blocked on helper threads until it exits.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::simulated_driver;
use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, CommConfig, HalError};

#[test]
fn init_and_split_with_a_missing_rank_time_out_instead_of_hanging() {
    if crate::own_process() {
        return;
    }
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_CUDA_LIB", &lib);
    std::env::set_var("UNIHAL_NCCL_LIB", &lib);
    // The simulated NCCL waits a minute for absent ranks; the communicators' timeout is 300 ms.
    std::env::set_var("UNIHAL_SIM_WATCHDOG_MS", "60000");
    let cfg = CommConfig {
        timeout: Some(Duration::from_millis(300)),
    };
    let backend = Arc::new(CudaBackend::new());
    let ccl = backend.collectives().expect("simulated NCCL loads");
    let (d0, d1) = (backend.open(0).unwrap(), backend.open(1).unwrap());

    // Rank 1 of 2 never joins.
    times_out("ncclCommInitRank", || {
        ccl.init_rank(&ccl.unique_id().unwrap(), 2, 0, &d0, &cfg)
            .map(|_| ())
    });

    // Rank 1 never splits: rank 0's split times out and its parent takes no more work.
    let comms = ccl.init_all(&[d0.clone(), d1], &cfg).unwrap();
    times_out("ncclCommSplit", || {
        comms[0]
            .split(Some(0), 0, &CommConfig::default())
            .map(|_| ())
    });
    assert!(matches!(
        comms[0].async_error(),
        Some(HalError::Timeout { .. })
    ));
    let s = d0.create_stream().unwrap();
    let b = d0.alloc(64).unwrap();
    assert!(comms[0]
        .all_reduce(
            &b,
            &b,
            16,
            unihal_hal::DType::F32,
            unihal_hal::ReduceOp::Sum,
            &s
        )
        .is_err());
}

/// `call` fails with a `Timeout` naming `what` after the 300 ms timeout, well before the
/// simulated NCCL would give up.
fn times_out(what: &str, call: impl FnOnce() -> unihal_hal::Result<()>) {
    let t0 = Instant::now();
    let r = call();
    let el = t0.elapsed();
    assert!(
        matches!(&r, Err(HalError::Timeout { what: w, .. }) if w.contains(what)),
        "{what}: {r:?}"
    );
    assert!(
        el >= Duration::from_millis(300) && el < Duration::from_secs(3),
        "{what}: {el:?}"
    );
}
