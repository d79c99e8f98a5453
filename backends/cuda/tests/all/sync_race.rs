//! A stream synchronisation releases only what the work queued before it used, not what another
//! thread enqueued while the driver synchronised (simulated driver, deferred mode: the later work
//! has certainly not run). The synchronisation is held in the driver by an all-reduce whose
//! second rank comes late.

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::two_ranks;
use unihal_hal::{DType, ReduceOp, Stream};

#[test]
fn synchronize_keeps_what_work_enqueued_meanwhile_uses() {
    if crate::own_process() {
        return;
    }
    let (_backend, [d0, d1], comms) = two_ranks(&[("UNIHAL_SIM_MODE", "deferred")]);
    let (s0, s1): (Arc<dyn Stream>, Arc<dyn Stream>) =
        (d0.create_stream().unwrap(), d1.create_stream().unwrap());
    let (b0, b1) = (d0.alloc(64).unwrap(), d1.alloc(64).unwrap());
    comms[0]
        .all_reduce(&b0, &b0, 16, DType::F32, ReduceOp::Sum, &s0)
        .unwrap();
    // Rank 0's synchronisation waits in the driver for rank 1.
    let syncing = {
        let s0 = s0.clone();
        std::thread::spawn(move || s0.synchronize())
    };
    std::thread::sleep(Duration::from_millis(300));
    // Meanwhile: a copy into a host buffer, queued after the synchronisation began.
    let h = d0.alloc_host(64).unwrap();
    s0.copy_d2h(&b0, 0, &h, 0, 64).unwrap();
    // Rank 1 arrives: the synchronisation returns.
    comms[1]
        .all_reduce(&b1, &b1, 16, DType::F32, ReduceOp::Sum, &s1)
        .unwrap();
    syncing.join().unwrap().unwrap();
    assert!(
        h.map().is_err(),
        "the host buffer is mappable while the copy queued after the synchronisation began has \
         not run"
    );
    s0.synchronize().unwrap();
    assert!(h.map().is_ok());
    s1.synchronize().unwrap();
}
