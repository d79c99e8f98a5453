//! Every use of an NCCL communicator's raw handle is serialised (NCCL communicators are not
//! thread-safe), and abort releases it under the same lock: the simulated NCCL, which records a
//! use after abort and two threads inside one communicator at once as violations, records none
//! while one thread aborts and others poll the asynchronous error and issue collectives (each
//! simulated NCCL call holds the communicator 1 ms here, so unserialised calls overlap).

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::{controls, two_ranks};
use unihal_hal::{DType, HalError, ReduceOp, Stream};

#[test]
fn abort_is_serialised_with_every_other_use_of_the_communicator() {
    if crate::own_process() {
        return;
    }
    let (_backend, [d0, _d1], comms) = two_ranks(&[("UNIHAL_SIM_NCCL_CALL_US", "1000")]);
    let before = controls::violations().0;
    let comm = comms[0].clone();
    let poller = {
        let comm = comm.clone();
        std::thread::spawn(move || {
            for _ in 0..5000 {
                if comm.async_error().is_some() {
                    return;
                }
            }
        })
    };
    let issuer = {
        let (comm, d0) = (comm.clone(), d0.clone());
        std::thread::spawn(move || {
            let s: Arc<dyn Stream> = d0.create_stream().unwrap();
            let b = d0.alloc(64).unwrap();
            for _ in 0..5000 {
                if comm
                    .all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &s)
                    .is_err()
                {
                    return;
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    comm.abort();
    poller.join().unwrap();
    issuer.join().unwrap();
    let (after, last) = controls::violations();
    assert_eq!(after, before, "the simulated NCCL saw misuse: {last}");
    // After the abort: typed errors, never a call on the released handle.
    let s = d0.create_stream().unwrap();
    let b = d0.alloc(64).unwrap();
    let r = comm.all_reduce(&b, &b, 16, DType::F32, ReduceOp::Sum, &s);
    assert!(matches!(r, Err(HalError::Aborted { .. })), "{r:?}");
    assert!(comm.async_error().is_some());
    comm.abort();
    drop(comms);
    drop(comm);
    assert_eq!(
        controls::violations().0,
        before,
        "{}",
        controls::violations().1
    );
}

#[test]
fn a_failing_async_error_query_is_an_error_not_health() {
    if crate::own_process() {
        return;
    }
    let (_backend, _devs, comms) = two_ranks(&[("UNIHAL_SIM_NCCL_CALL_US", "1000")]);
    assert!(comms[0].async_error().is_none());
    // ncclCommGetAsyncError itself fails (ncclInternalError): its out-value means nothing.
    controls::fail("ncclCommGetAsyncError", 1, 3);
    let e = comms[0].async_error();
    controls::clear();
    assert!(
        matches!(&e, Some(HalError::Vendor { code: 3, call, .. }) if call == "ncclCommGetAsyncError"),
        "{e:?}"
    );
}
