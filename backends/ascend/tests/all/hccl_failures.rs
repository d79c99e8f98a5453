//! The HCCL engine never hangs although HCCL has no abort: a missing rank times out within the
//! communicator's timeout (the simulated HCCL, like the real one, would wait far longer: its
//! watchdog is a minute here), an abort fails the pending work of every in-process rank at
//! once, and a communicator given up is destroyed once its operations drained. The tests run
//! one at a time (their bounds are timings).

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use unihal_hal::{Backend, CommConfig, Communicator, DType, HalError, ReduceOp, Stream};

fn backend() -> Arc<unihal_ascend::AscendBackend> {
    // The simulated HCCL's own limit: far beyond every bound below.
    simulated(&[("UNIHAL_SIM_WATCHDOG_MS", "60000")])
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// HCCL's `HCCL_E_PTR`: what the simulated HCCL answers for a destroyed communicator.
const E_PTR: i32 = 2;

/// Every handle in `handles` is destroyed within `limit`.
fn destroyed(handles: &[usize], limit: Duration) {
    for &h in handles {
        assert!(
            eventually(limit, || sim::rank_size(h) == Err(E_PTR)),
            "communicator {h:#x} not destroyed: {:?}",
            sim::rank_size(h)
        );
    }
}

fn all_reduce(c: &Arc<dyn Communicator>, s: &Arc<dyn Stream>) -> unihal_hal::Result<()> {
    let buf = c.device().alloc(64).unwrap();
    c.all_reduce(&buf, &buf, 16, DType::F32, ReduceOp::Sum, s)
}

#[test]
fn init_with_a_rank_that_never_comes_times_out_within_its_bound() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let ccl = b.collectives().unwrap();
    let id = ccl.unique_id().unwrap();
    let devs = devices(&b, 2);
    let cfg = CommConfig {
        timeout: Some(Duration::from_millis(300)),
    };
    let t0 = Instant::now();
    // Ranks 0 and 1 of 3 call; rank 2 never does.
    let results: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = devs
            .iter()
            .enumerate()
            .map(|(r, d)| {
                let (id, cfg) = (&id, &cfg);
                sc.spawn(move || ccl.init_rank(id, 3, r, d, cfg).map(|c| c.rank()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let el = t0.elapsed();
    for r in &results {
        assert!(
            matches!(r, Err(HalError::Timeout { what, .. }) if what.contains("HcclCommInitRootInfo")),
            "{r:?}"
        );
    }
    assert!(
        el >= Duration::from_millis(300) && el < Duration::from_secs(3),
        "{el:?}"
    );
}

#[test]
fn an_operation_whose_peer_never_comes_times_out_and_ends() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let limit = Duration::from_millis(300);
    let comms = ranks(&b, 3, limit);
    let handles: Vec<usize> = comms.iter().map(native).collect();
    let t0 = Instant::now();
    let results = each(&comms, |c, s| {
        if c.rank() == 2 {
            return (Ok(()), Duration::ZERO); // never calls
        }
        all_reduce(c, s).unwrap();
        (s.synchronize(), t0.elapsed())
    });
    let mut timeouts = 0;
    for (r, (res, el)) in results.iter().enumerate().take(2) {
        match res {
            Err(HalError::Timeout { .. }) => timeouts += 1,
            // The first rank to time out fails its in-process peers.
            Err(HalError::Aborted { .. }) => {}
            other => panic!("rank {r}: {other:?}"),
        }
        // Unblocked by the stand-ins of rank 2, long before the simulated HCCL's minute.
        assert!(
            *el < limit + Duration::from_millis(1500),
            "rank {r}: {el:?}"
        );
    }
    assert!(timeouts >= 1, "{results:?}");
    // Sticky on every rank, the one that never called included; no more work is taken.
    for c in &comms {
        assert!(
            matches!(
                c.async_error(),
                Some(HalError::Timeout { .. } | HalError::Aborted { .. })
            ),
            "rank {}",
            c.rank()
        );
        let s = c.device().create_stream().unwrap();
        assert!(all_reduce(c, &s).is_err());
        // Handed to its reaper by the failing rank's thread once it has stopped every rank and
        // issued their stand-ins: shortly after the sticky error is visible, not with it.
        assert!(
            eventually(Duration::from_secs(5), || native(c) == 0),
            "rank {} not given up: {:#x}",
            c.rank(),
            native(c)
        );
    }
    destroyed(&handles, Duration::from_secs(5));
}

#[test]
fn abort_fails_pending_work_stops_issuing_and_destroys_after_drain() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let comms = ranks(&b, 2, Duration::from_secs(30));
    let handles: Vec<usize> = comms.iter().map(native).collect();
    let results = each(&comms, |c, s| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(100));
            c.abort();
            return (c.async_error().map(Err).unwrap_or(Ok(())), Duration::ZERO);
        }
        all_reduce(c, s).unwrap();
        let t0 = Instant::now();
        (s.synchronize(), t0.elapsed())
    });
    match &results[0] {
        (Err(HalError::Aborted { what }), el) => {
            assert!(what.contains("rank 1 aborted"), "{what}");
            assert!(*el < Duration::from_secs(3), "{el:?}");
        }
        other => panic!("rank 0's pending all_reduce: {other:?}"),
    }
    assert!(
        matches!(&results[1].0, Err(HalError::Aborted { what }) if what.contains("was aborted")),
        "{results:?}"
    );
    for c in &comms {
        let s = c.device().create_stream().unwrap();
        let r = all_reduce(c, &s);
        assert!(matches!(r, Err(HalError::Aborted { .. })), "{r:?}");
        // Nothing was pending on the new stream: it stays healthy.
        s.synchronize().unwrap();
        c.abort(); // again: nothing happens
    }
    destroyed(&handles, Duration::from_secs(5));
}

#[test]
fn abort_with_nothing_pending_destroys_at_once() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let comms = ranks(&b, 3, Duration::from_secs(30));
    let handles: Vec<usize> = comms.iter().map(native).collect();
    // One collective that completed: nothing is pending.
    each(&comms, |c, s| {
        all_reduce(c, s).unwrap();
        s.synchronize().unwrap();
    });
    comms[2].abort();
    for c in &comms {
        assert!(matches!(c.async_error(), Some(HalError::Aborted { .. })));
    }
    destroyed(&handles, Duration::from_secs(2));
}

#[test]
fn dropped_communicators_are_destroyed_and_their_late_work_times_out() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    // Healthy: destroyed when dropped.
    let comms = ranks(&b, 2, Duration::from_secs(30));
    each(&comms, |c, s| {
        all_reduce(c, s).unwrap();
        s.synchronize().unwrap();
    });
    let handles: Vec<usize> = comms.iter().map(native).collect();
    drop(comms);
    destroyed(&handles, Duration::from_secs(2));
    // Dropped with an operation whose peer never comes: its stream still fails at the
    // deadline (nothing hangs a query), though the communicator cannot be destroyed yet.
    let comms = ranks(&b, 2, Duration::from_millis(300));
    let s = comms[0].device().create_stream().unwrap();
    all_reduce(&comms[0], &s).unwrap();
    let h0 = native(&comms[0]);
    drop(comms);
    assert!(
        eventually(Duration::from_secs(3), || matches!(
            s.query(),
            Err(HalError::Timeout { .. })
        )),
        "{:?}",
        s.query()
    );
    assert_eq!(
        sim::rank_size(h0),
        Ok(2),
        "destroying would wait for the operation"
    );
}
