//! Dropping an NCCL communicator with an operation in flight whose peer never comes returns at
//! once: it aborts the communicator (`ncclCommDestroy` would wait for the operation, which the
//! simulated NCCL does, as NCCL does, for up to its watchdog, 4 s here).

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{controls, two_ranks};
use unihal_hal::{DType, ReduceOp, Stream};

#[test]
fn dropping_a_communicator_with_an_operation_waiting_for_a_peer_returns_at_once() {
    if crate::own_process() {
        return;
    }
    let (_backend, [d0, _d1], mut comms) = two_ranks(&[("UNIHAL_SIM_WATCHDOG_MS", "4000")]);
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
