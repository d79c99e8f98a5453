//! A replay of a graph holding a captured collective is watched as an eager collective is: when
//! the peer never replays its graph, the replaying rank's stream fails with the communicator's
//! `Timeout` (or `Aborted`) past its timeout instead of hanging. Its own process: an abandoned
//! replay may stay blocked in the simulated NCCL until it exits.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::simulated_driver;
use unihal_cuda::CudaBackend;
use unihal_hal::{Backend, CaptureMode, CommConfig, DType, HalError, ReduceOp};

#[test]
fn a_replay_whose_peer_never_replays_times_out() {
    if crate::own_process() {
        return;
    }
    let lib = simulated_driver();
    std::env::set_var("UNIHAL_CUDA_LIB", &lib);
    std::env::set_var("UNIHAL_NCCL_LIB", &lib);
    std::env::set_var("UNIHAL_SIM_MODE", "concurrent");
    // The simulated NCCL would wait a minute for the absent rank; the timeout is 300 ms.
    std::env::set_var("UNIHAL_SIM_WATCHDOG_MS", "60000");
    let cfg = CommConfig {
        timeout: Some(Duration::from_millis(300)),
    };
    let backend = Arc::new(CudaBackend::new());
    let ccl = backend.collectives().expect("simulated NCCL loads");
    let (d0, d1) = (backend.open(0).unwrap(), backend.open(1).unwrap());
    let comms = ccl.init_all(&[d0.clone(), d1.clone()], &cfg).unwrap();
    let n = 256u64;

    // Both ranks capture the all-reduce; only rank 0 ever replays.
    let graphs: Vec<_> = [&d0, &d1]
        .into_iter()
        .zip(&comms)
        .map(|(d, c)| {
            let s = d.create_stream().unwrap();
            let b = d.alloc(4 * n as usize).unwrap();
            s.begin_capture(CaptureMode::Relaxed).unwrap();
            c.all_reduce(&b, &b, n, DType::F32, ReduceOp::Sum, &s)
                .unwrap();
            let g = s.end_capture().unwrap();
            (s, g, b)
        })
        .collect();
    // Nothing was run by the captures: the communicators are healthy.
    assert!(comms.iter().all(|c| c.async_error().is_none()));

    let (s0, g0, _) = &graphs[0];
    let (s0, g0) = (s0.clone(), g0.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        s0.launch_graph(&g0).unwrap();
        let r = s0.synchronize();
        let _ = tx.send((r, t0.elapsed()));
    });
    let (r, el) = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the replay's synchronize hung: the captured collective was not watched");
    assert!(
        matches!(r, Err(HalError::Timeout { .. } | HalError::Aborted { .. })),
        "{r:?}"
    );
    assert!(el >= Duration::from_millis(300), "{el:?}");
    assert!(comms[0].async_error().is_some());
}
