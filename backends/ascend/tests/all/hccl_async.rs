//! HCCL's own failures reach the HAL as it defines them: with the simulated HCCL's limit shorter
//! than the communicators' timeout, HCCL itself times out first, and the engine maps what it
//! reports (`HcclCommInitRootInfo`'s `HCCL_E_TIMEOUT`, naming the ranks that never came, and
//! `HcclGetCommAsyncError`'s) to `Timeout`, sticky on the communicator.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use unihal_hal::{Backend, CommConfig, DType, HalError, ReduceOp};

fn backend() -> Arc<unihal_ascend::AscendBackend> {
    simulated(&[("UNIHAL_SIM_WATCHDOG_MS", "400")])
}

#[test]
fn hccls_init_timeout_is_a_timeout_naming_the_missing_rank() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let ccl = b.collectives().unwrap();
    let dev = b.open(3).unwrap();
    let cfg = CommConfig {
        timeout: Some(Duration::from_secs(20)),
    };
    let t0 = Instant::now();
    let r = ccl
        .init_rank(&ccl.unique_id().unwrap(), 2, 0, &dev, &cfg)
        .map(|c| c.rank());
    match r {
        Err(HalError::Timeout { what, .. }) => {
            assert!(what.contains("HcclCommInitRootInfo"), "{what}");
            assert!(what.contains("ranks 1 never joined"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn an_asynchronous_hccl_timeout_fails_the_communicator_with_timeout() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let comms = ranks(&b, 2, Duration::from_secs(20));
    let c = &comms[0];
    let s = c.device().create_stream().unwrap();
    let buf = c.device().alloc(64).unwrap();
    c.all_reduce(&buf, &buf, 16, DType::F32, ReduceOp::Sum, &s)
        .unwrap();
    // Rank 1 never calls: the simulated HCCL gives up after 400 ms, the stream fails.
    assert!(s.synchronize().is_err());
    assert!(
        eventually(Duration::from_secs(3), || matches!(
            c.async_error(),
            Some(HalError::Timeout { what, .. }) if what.contains("HCCL_E_TIMEOUT")
        )),
        "{:?}",
        c.async_error()
    );
    // Sticky; the peer stopped too.
    let r = c.all_reduce(&buf, &buf, 16, DType::F32, ReduceOp::Sum, &s);
    assert!(matches!(r, Err(HalError::Timeout { .. })), "{r:?}");
    assert!(matches!(
        comms[1].async_error(),
        Some(HalError::Aborted { .. })
    ));
}
